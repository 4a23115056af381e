"""Collectives built from point-to-point messages: the ring all-reduce and its two halves.

An *all-reduce* leaves on every rank the sum (or mean) of every rank's tensor.
The *ring* algorithm does it with each rank talking only to its two
neighbours, so no link carries more than any other (Patarasuk and Yuan,
"Bandwidth optimal all-reduce algorithms for clusters of workstations",
JPDC 2009; the form Baidu brought to deep learning and Horovod and NCCL use).

Cut the tensor into N chunks, one per rank, and arrange the ranks in a ring::

    rank 0 --> rank 1 --> rank 2 --> rank 3 --+
      ^                                       |
      +---------------------------------------+

1. *Reduce-scatter*, N-1 steps: in each, every rank sends one chunk to its
   right neighbour and adds the chunk arriving from its left into its own copy.
   A chunk travels N-1 hops, picking up one rank's contribution per hop, so at
   the end rank r holds chunk r summed over all N ranks.
2. *All-gather*, N-1 steps: the finished chunks travel round the ring once
   more, now copied instead of added, until every rank has all of them.

Each step moves nbytes/N per rank, so each rank sends 2(N-1)/N x nbytes in
all: for 64 MB on 4 ranks, 96 MB, *whatever N is* almost 2x the tensor. That
is the factor nccl-tests calls the all-reduce bus bandwidth factor
(PERFORMANCE.md: busbw = algbw x 2(N-1)/N). :func:`naive_all_reduce`, which
gathers everything to rank 0 and sends the sum back, is here for contrast: rank
0 alone sends and receives (N-1) x nbytes.

:func:`ring_schedule` (in :mod:`dtlab.comm.ring_schedule`) is the algorithm as data (which chunk each rank sends and
receives at each step), with no process group: the collectives below execute
exactly that schedule, and a lesson draws it.

Every function takes ``group=`` (``None`` is the whole world); ranks and chunk
numbers are ranks *within the group*. A world of one rank has nothing to
exchange. Optional extras, none of which change the result:

* ``meter=``: a :class:`~dtlab.comm.meter.CommMeter` counting calls and bytes this rank sent;
* ``trace=``: a list that receives one dict per ring step
  ``{phase, step, rank, send_chunk, recv_chunk}``, as this rank executed it;
* ``link=``: a :class:`dtlab.planner.hardware.Link`. **A simulation of the
  wire**: every transfer is made to last at least as long as the alpha-beta
  model says it would take on that link (``alpha + n / beta``), by sleeping for
  whatever the real (loopback) transfer left over. The bytes still move over
  the real backend; only the time is made slower, so a laptop can show what a
  slow network does to scaling.

The sends and receives themselves, and ranks within a group, are
:mod:`dtlab.comm.point_to_point`'s; the meter is :mod:`dtlab.comm.meter`'s.
Both are importable from here as before (``from dtlab.comm.collectives import
CommMeter, group_size_and_rank``).
"""

from __future__ import annotations

from dataclasses import asdict

import torch
import torch.distributed as dist

from dtlab.comm import calls as comm
from dtlab.comm.meter import CommMeter
from dtlab.comm.point_to_point import _Transfer, global_rank, group_size_and_rank
from dtlab.comm.ring_pipeline import PipelinedRing, fits_a_slot, reduce_into, ring_steps_in_slots
from dtlab.comm.ring_schedule import ALL_GATHER, REDUCE_SCATTER, RingStep, ring_schedule  # noqa: F401 (re-exported)
from dtlab.comm.shared_memory import SLOT_BYTES
from dtlab.i18n import ConfigError
from dtlab.planner.hardware import Link

SUM, AVG, MAX, MIN = dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.MIN


SEGMENT_BYTES = 4 << 20
"""Chunks larger than this travel in pipelined segments of about this size (see :func:`_ring`).

Large, because every message pays the backend's start-up latency (alpha):
over gloo's TCP on a laptop that is a fraction of a millisecond, and 256 KiB
segments made a 64 MiB all-reduce several times slower."""


SHARED_MEMORY_SEGMENT_BYTES = SLOT_BYTES
"""Segments over shared memory: one slot each (:data:`dtlab.comm.shared_memory.SLOT_BYTES`). Measured on the
2-core machine (4 ranks, 2026-12-03, benchmarks/HISTORY.md), 1 MiB segments ran as fast as 512 KiB
and faster than 256 or 128 KiB (1.8-2.1x torch's busbw at 4-64 MiB, against 1.4-1.5 and 1.1-1.5)."""


RECV_AHEAD = 2
"""Receives kept posted ahead of the one being waited for (:class:`dtlab.comm.ring_pipeline.PipelinedRing`)."""


def _ring(
    chunks: tuple[torch.Tensor, ...],
    phases: tuple[str, ...],
    op=SUM,
    *,
    group,
    kind: str,
    meter: CommMeter | None,
    trace: list | None,
    link: Link | None,
    wire=None,
) -> None:
    """Run this rank's steps of ``phases`` of :func:`ring_schedule` on ``chunks``, in place.

    In reduce-scatter a received chunk is added into this rank's copy of it;
    in all-gather it replaces it. With ``op=AVG`` the chunk a rank owns is
    divided by N once, when its last contribution has arrived. Pipelined, as
    gloo and NCCL do it, in segments of about SEGMENT_BYTES with RECV_AHEAD
    receives posted ahead (:class:`dtlab.comm.ring_pipeline.PipelinedRing`), over gloo's sends and
    receives or, given a shared-memory ``wire`` (:func:`dtlab.comm.shared_memory_setup.wire_for`), over that in
    segments of at most SHARED_MEMORY_SEGMENT_BYTES (chunks no larger than one segment: one message
    each, added where they land, :func:`dtlab.comm.ring_pipeline.ring_steps_in_slots`); under
    a simulated ``link`` chunks travel whole, one message per step, as the
    alpha-beta model counts them (:func:`_ring_in_lockstep`). The whole ring
    is one traced call of ``kind`` (see dtlab.comm.calls).
    """
    with comm.traced(kind, sum(c.numel() * c.element_size() for c in chunks), group=group):
        if link is not None:
            _ring_in_lockstep(chunks, phases, op, group=group, kind=kind, meter=meter, trace=trace, link=link)
        else:
            n, rank = group_size_and_rank(group)
            segment_bytes = SEGMENT_BYTES if wire is None else SHARED_MEMORY_SEGMENT_BYTES
            if wire is not None and fits_a_slot(chunks):
                wire.run(
                    ring_steps_in_slots(
                        chunks, phases, op, rank=rank, n=n, wire=wire, kind=kind, meter=meter, trace=trace
                    )
                )
                return
            PipelinedRing(
                chunks,
                phases,
                op,
                rank=rank,
                n=n,
                right=(rank + 1) % n,
                left=(rank - 1) % n,
                group=group,
                kind=kind,
                meter=meter,
                trace=trace,
                segment_bytes=segment_bytes,
                recv_ahead=RECV_AHEAD,
                wire=wire,
            ).run()


def _ring_in_lockstep(
    chunks: tuple[torch.Tensor, ...],
    phases: tuple[str, ...],
    op=SUM,
    *,
    group,
    kind: str,
    meter: CommMeter | None,
    trace: list | None,
    link: Link,
) -> None:
    """:func:`_ring` on a simulated ``link``: one step after another, each chunk one message, each send
    and receive lasting at least the link's alpha + n / beta (:class:`_Transfer`)."""
    n, rank = group_size_and_rank(group)
    right, left = global_rank(group, (rank + 1) % n), global_rank(group, (rank - 1) % n)
    landing = torch.empty_like(chunks[0]) if REDUCE_SCATTER in phases else None
    for step in ring_schedule(n):
        if step.rank != rank or step.phase not in phases:
            continue
        mine = chunks[step.recv_chunk]
        incoming = landing[: mine.numel()] if step.phase == REDUCE_SCATTER else mine
        _Transfer(chunks[step.send_chunk], right, incoming, left, group=group).wait(kind=kind, meter=meter, link=link)
        reduce_into(step, mine, incoming, op, n)
        if trace is not None:
            trace.append(asdict(step))


def check_op(op) -> None:
    if op not in (SUM, AVG, MAX, MIN):
        raise ConfigError(
            f"op={op!r} is not supported; use dist.ReduceOp.SUM, AVG, MAX or MIN",
            f"不支持 op={op!r}；请使用 dist.ReduceOp.SUM、AVG、MAX 或 MIN",
        )


def _check_chunk(what: str, got: torch.Tensor, expected: int, full: int, n: int, rank: int) -> None:
    if got.numel() != expected:
        raise ConfigError(
            f"{what} has {got.numel()} elements, but rank {rank}'s chunk of a {full}-element "
            f"tensor split {n} ways (torch.tensor_split) has {expected}",
            f"{what} 有 {got.numel()} 个元素，但 {full} 个元素的张量按 torch.tensor_split "
            f"分成 {n} 份后，rank {rank} 的那一份有 {expected} 个",
        )


# --------------------------------------------------------------------------- the collectives


def ring_all_reduce(
    tensor: torch.Tensor,
    op=SUM,
    *,
    group=None,
    meter: CommMeter | None = None,
    trace: list | None = None,
    link: Link | None = None,
    wire=None,
) -> torch.Tensor:
    """Ring all-reduce of ``tensor`` in place: a reduce-scatter, then an all-gather.

    Any size works: the N chunks are ``torch.tensor_split``'s, whose sizes
    differ by at most one element (empty when the tensor has fewer than N).
    ``op`` is ``dist.ReduceOp.SUM`` or ``AVG``; for AVG each rank divides only
    the chunk it owns after reduce-scatter, so the division is shared N ways.
    """
    n, _, flat = begin_all_reduce(tensor, op, group, meter)
    if n == 1:
        return tensor
    chunks = torch.tensor_split(flat, n)  # N views of ~numel / N
    _ring(
        chunks,
        (REDUCE_SCATTER, ALL_GATHER),
        op,
        group=group,
        kind="all_reduce",
        meter=meter,
        trace=trace,
        link=link,
        wire=wire,
    )
    return end_all_reduce(tensor, flat)


def begin_all_reduce(tensor: torch.Tensor, op, group, meter: CommMeter | None) -> tuple[int, int, torch.Tensor]:
    """What every all-reduce of dtlab's starts with: ``op`` checked, (N, rank) in ``group``, the call
    counted (N > 1), and ``tensor`` as a flat tensor to reduce in place (a copy if not contiguous)."""
    check_op(op)
    n, rank = group_size_and_rank(group)
    if n > 1 and meter is not None:
        meter.record_call("all_reduce", tensor)
    return n, rank, tensor.view(-1) if tensor.is_contiguous() else tensor.flatten()  # (numel,)


def end_all_reduce(tensor: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """``tensor``, holding the reduction made in ``flat`` (copied back if it was a flat copy)."""
    if not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))
    return tensor


def ring_reduce_scatter(
    output: torch.Tensor,
    input: torch.Tensor,
    op=SUM,
    *,
    group=None,
    meter: CommMeter | None = None,
    trace: list | None = None,
    link: Link | None = None,
    wire=None,
) -> torch.Tensor:
    """Ring reduce-scatter: ``output`` <- chunk ``rank`` of the reduction of every rank's ``input``.

    The first half of :func:`ring_all_reduce`, like
    ``dist.reduce_scatter_tensor(output, input)`` but for any size: ``output``
    must have as many elements as chunk ``rank`` of ``torch.tensor_split(
    input.flatten(), N)``. ``input`` is left unchanged. Each rank sends
    (N-1)/N of ``input``.
    """
    check_op(op)
    n, rank = group_size_and_rank(group)
    scratch = input.flatten().clone()  # (numel,): partial sums accumulate here
    chunks = torch.tensor_split(scratch, n)  # N views
    _check_chunk("output", output, chunks[rank].numel(), input.numel(), n, rank)
    if n > 1:
        if meter is not None:
            meter.record_call(REDUCE_SCATTER, input)
        _ring(
            chunks,
            (REDUCE_SCATTER,),
            op,
            group=group,
            kind=REDUCE_SCATTER,
            meter=meter,
            trace=trace,
            link=link,
            wire=wire,
        )
    return output.copy_(chunks[rank].view(output.shape))


def ring_all_gather(
    output: torch.Tensor,
    input: torch.Tensor,
    *,
    group=None,
    meter: CommMeter | None = None,
    trace: list | None = None,
    link: Link | None = None,
    wire=None,
) -> torch.Tensor:
    """Ring all-gather: every rank's ``input`` laid end to end in ``output``, on every rank.

    The second half of :func:`ring_all_reduce`, like
    ``dist.all_gather_into_tensor(output, input)`` but for any size: rank r's
    ``input`` becomes chunk r of ``torch.tensor_split(output.flatten(), N)``.
    Each rank sends (N-1)/N of ``output``.
    """
    n, rank = group_size_and_rank(group)
    flat = (
        output.view(-1)
        if output.is_contiguous()
        else torch.empty(output.numel(), dtype=output.dtype, device=output.device)
    )  # (numel,)
    chunks = torch.tensor_split(flat, n)
    _check_chunk("input", input, chunks[rank].numel(), output.numel(), n, rank)
    chunks[rank].copy_(input.flatten())
    if n > 1:
        if meter is not None:
            meter.record_call(ALL_GATHER, output)
        _ring(chunks, (ALL_GATHER,), group=group, kind=ALL_GATHER, meter=meter, trace=trace, link=link, wire=wire)
    if not output.is_contiguous():
        output.copy_(flat.view_as(output))
    return output


def naive_all_reduce(
    tensor: torch.Tensor, op=SUM, *, group=None, meter: CommMeter | None = None, link: Link | None = None
) -> torch.Tensor:
    """All-reduce the obvious way: everyone sends to rank 0, which reduces and sends the result back.

    Correct, and the reason rings exist: rank 0 receives N-1 whole tensors and
    sends N-1 back, one after the other, so its link carries (N-1) x nbytes
    each way while the others' links idle. The time grows with N; a ring's
    stays almost flat.
    """
    check_op(op)
    n, rank = group_size_and_rank(group)
    if n == 1:
        return tensor
    if meter is not None:
        meter.record_call("naive_all_reduce", tensor)
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.flatten()  # (numel,)
    wait = dict(kind="naive_all_reduce", meter=meter, link=link)
    root = global_rank(group, 0)
    if rank == 0:
        incoming = torch.empty_like(flat)
        for peer in range(1, n):  # gather, one message at a time
            _Transfer(None, None, incoming, global_rank(group, peer), group=group).wait(**wait)
            flat.add_(incoming)
        if op == AVG:
            flat.div_(n)
        for peer in range(1, n):  # then broadcast, one message at a time
            _Transfer(flat, global_rank(group, peer), None, None, group=group).wait(**wait)
    else:
        _Transfer(flat, root, None, None, group=group).wait(**wait)
        _Transfer(None, None, flat, root, group=group).wait(**wait)
    if not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))
    return tensor
