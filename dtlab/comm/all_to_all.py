"""All-to-all from point-to-point messages: every rank sends a different piece to every other.

An *all-to-all* is a transpose across ranks. Rank r's input is cut along its
first dimension into N pieces, piece j addressed to rank j; afterwards rank j
holds, in rank order, the N pieces addressed to it::

    before                          after
    rank 0: [a0 a1 a2 a3]           rank 0: [a0 b0 c0 d0]
    rank 1: [b0 b1 b2 b3]    -->    rank 1: [a1 b1 c1 d1]
    rank 2: [c0 c1 c2 c3]           rank 2: [a2 b2 c2 d2]
    rank 3: [d0 d1 d2 d3]           rank 3: [a3 b3 c3 d3]

Pieces may have different sizes (*uneven splits*): that is the whole point in
a mixture of experts, where piece j holds the tokens this rank routed to the
experts living on rank j, and the router decides how many there are
(GShard, Lepikhin et al. 2020, Sec. 3.2; Switch Transformer, Fedus et al.
2021, Fig. 3).

The *pairwise exchange* algorithm (the one MPI libraries use for large
all-to-alls; Thakur, Rabenseifner and Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 2005, Sec. 4.5) takes N-1 steps.
In step s = 1 .. N-1, every rank r sends its piece for rank r+s and receives
the piece from rank r-s (mod N); its own piece (s = 0) is a local copy. Every
rank is busy in every step, each link carries one piece per step, and each
rank sends (N-1)/N of its input in all, the same volume as a reduce-scatter
but with no arithmetic: nccl-tests' PERFORMANCE.md gives all-to-all the bus
bandwidth factor (N-1)/N.

:func:`all_to_all_schedule` is the algorithm as data (who sends to whom in
each step), with no process group: :func:`all_to_all_single` executes exactly
that, and a lesson draws it. :class:`AllToAll` makes it differentiable: the
backward of an all-to-all is the all-to-all of the gradients with the splits
swapped (what went from r to j comes back from j to r).

Like :mod:`dtlab.comm.collectives`: ``group=`` (``None`` = the whole world; ranks
are group ranks), a world of one is a local copy, and the optional ``meter=``
(a :class:`~dtlab.comm.meter.CommMeter`, kind ``"all_to_all"``), ``trace=``
(one dict per step, as this rank executed it) and ``link=`` (a simulated
slower wire) change nothing in the result.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

import torch

from dtlab.comm import calls as comm
from dtlab.comm.meter import CommMeter
from dtlab.comm.point_to_point import _Transfer, global_rank, group_size_and_rank
from dtlab.i18n import ConfigError
from dtlab.planner.hardware import Link

ALL_TO_ALL = "all_to_all"


@dataclass(frozen=True)
class Exchange:
    """One rank's part in one step of the pairwise exchange."""

    step: int
    """1 .. N-1 (step 0, the local copy, sends nothing)."""
    rank: int
    """Rank in the group."""
    send_to: int
    """It sends its piece for this rank: rank + step (mod N) ..."""
    recv_from: int
    """... and receives the piece this rank holds for it: rank - step (mod N)."""


@lru_cache(maxsize=None)
def all_to_all_schedule(world_size: int) -> tuple[Exchange, ...]:
    """Every rank's send and receive in a pairwise-exchange all-to-all over ``world_size`` ranks.

    Ordered by step, then rank: N-1 steps of N transfers. In step s rank r
    sends to r + s and receives from r - s, so in each step the sends form a
    permutation (no rank receives twice), and over the N-1 steps every
    ordered pair (r, j), r != j, occurs exactly once.
    """
    n = world_size
    return tuple(Exchange(s, r, send_to=(r + s) % n, recv_from=(r - s) % n) for s in range(1, n) for r in range(n))


def _splits(sizes, rows: int, n: int, what: str) -> list[int]:
    """``sizes`` checked against a tensor of ``rows`` rows; ``None`` means N equal pieces."""
    if sizes is None:
        if rows % n:
            raise ConfigError(
                f"{what} has {rows} rows, which do not split into {n} equal pieces; pass "
                f"{what}_split_sizes (allowed: {n} sizes summing to {rows})",
                f"{what} 有 {rows} 行，无法平均分成 {n} 份；请传入 {what}_split_sizes"
                f"（允许：{n} 个之和为 {rows} 的大小）",
            )
        return [rows // n] * n
    sizes = [int(s) for s in sizes]
    if len(sizes) != n or sum(sizes) != rows or min(sizes) < 0:
        raise ConfigError(
            f"{what}_split_sizes={sizes} do not cut {rows} rows into {n} pieces "
            f"(allowed: {n} sizes >= 0 summing to {rows})",
            f"{what}_split_sizes={sizes} 不能把 {rows} 行切成 {n} 份（允许：{n} 个 >= 0 且之和为 {rows} 的大小）",
        )
    return sizes


def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes=None,
    input_split_sizes=None,
    *,
    group=None,
    meter: CommMeter | None = None,
    trace: list | None = None,
    link: Link | None = None,
) -> torch.Tensor:
    """Pairwise-exchange all-to-all along dim 0, like ``dist.all_to_all_single``; fills ``output``.

    ``input`` (rows, ...) is cut into pieces of ``input_split_sizes`` rows
    (``None``: N equal pieces), piece j sent to group rank j; ``output`` gets
    the piece from rank i at its ``output_split_sizes[i]`` rows, in rank
    order. Both ends must agree on every piece's size (rank i's
    ``input_split_sizes[j]`` == rank j's ``output_split_sizes[i]``): a mixture
    of experts first exchanges its counts with an even all-to-all.
    """
    n, rank = group_size_and_rank(group)
    send = torch.split(input, _splits(input_split_sizes, input.shape[0], n, "input"))
    recv = torch.split(output, _splits(output_split_sizes, output.shape[0], n, "output"))
    recv[rank].copy_(send[rank])  # step 0: my piece for myself stays here
    if n == 1:
        return output
    if meter is not None:
        meter.record_call(ALL_TO_ALL, input)
    landing = [piece if piece.is_contiguous() else torch.empty_like(piece) for piece in recv]
    with comm.traced(ALL_TO_ALL, input.numel() * input.element_size(), group=group):
        for exchange in all_to_all_schedule(n):
            if exchange.rank != rank:
                continue
            # Both posted before either is waited on: every rank sends and receives in the same step.
            transfer = _Transfer(
                send[exchange.send_to].contiguous(),
                global_rank(group, exchange.send_to),
                landing[exchange.recv_from],
                global_rank(group, exchange.recv_from),
                group=group,
            )
            transfer.wait(kind=ALL_TO_ALL, meter=meter, link=link)
            if trace is not None:
                trace.append(
                    {
                        **asdict(exchange),
                        "sent_rows": send[exchange.send_to].shape[0],
                        "received_rows": recv[exchange.recv_from].shape[0],
                    }
                )
    for piece, landed in zip(recv, landing):
        if landed is not piece:
            piece.copy_(landed)
    return output


class AllToAll(torch.autograd.Function):
    """Differentiable all-to-all of rows: forward with (send, recv) splits, backward with (recv, send)."""

    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group, meter):
        ctx.splits, ctx.group, ctx.meter = (send_splits, recv_splits), group, meter
        out = x.new_empty((sum(recv_splits), *x.shape[1:]))
        return all_to_all_single(out, x.contiguous(), recv_splits, send_splits, group=group, meter=meter)

    @staticmethod
    def backward(ctx, grad):
        send_splits, recv_splits = ctx.splits
        # What rank r sent to j came back to r as j's output; its gradient travels j -> r.
        back = grad.new_empty((sum(send_splits), *grad.shape[1:]))
        all_to_all_single(back, grad.contiguous(), send_splits, recv_splits, group=ctx.group, meter=ctx.meter)
        return back, None, None, None, None


def all_to_all(
    x: torch.Tensor, send_splits: list[int], recv_splits: list[int], *, group=None, meter: CommMeter | None = None
) -> torch.Tensor:
    """``x`` (sum(send_splits), ...) -> (sum(recv_splits), ...) through :func:`all_to_all_single`,
    with autograd: the gradient goes back by the same route."""
    if group_size_and_rank(group)[0] == 1:
        return x
    return AllToAll.apply(x, list(send_splits), list(recv_splits), group, meter)
