"""Recursive doubling: the all-reduce for small tensors, in log2(N) exchanges instead of the ring's 2(N-1).

At step k every rank swaps its *whole* tensor with the rank whose number
differs in bit k (``rank ^ 2**k``) and adds what arrives. After step 0 pairs
hold the pair's sum, after step 1 groups of four hold theirs, and after
log2(N) steps every rank holds the sum of all N::

    step 0:  0 <-> 1    2 <-> 3        each pair: a + b
    step 1:  0 <-> 2    1 <-> 3        each rank: (a + b) + (c + d)

In the alpha-beta model of lesson 01 a ring all-reduce of S bytes costs
2(N-1)(alpha + S / (N beta)), recursive doubling log2(N)(alpha + S / beta):
fewer message latencies, and from N = 3 on more bytes (at N = 2 both send
the tensor once, recursive doubling in one message instead of two). Small
tensors, whose time is the latencies, go faster by recursive doubling; large
ones by the ring, which sends only 2(N-1)/N of the tensor. Libraries choose
by size in the same way: MPICH all-reduces messages of up to 2 KiB by
recursive doubling and longer ones by Rabenseifner's reduce-scatter and
all-gather (Thakur, Rabenseifner and Gropp, "Optimization of collective
communication operations in MPICH", IJHPCA 2005), and NCCL picks a tree or a
ring. ``--collectives dtlab`` (:mod:`dtlab.comm.ring_backend`) uses recursive
doubling up to :data:`SMALL_BYTES`, 500 times MPICH's 2 KiB, because a
message costs far more here (gloo over TCP, 4 ranks on 2 cores), and the
ring above it, between ranks that do not share a machine (on one machine
it runs the ring over shared memory, :mod:`dtlab.comm.shared_memory`, faster at
every size).

Every rank ends with the same bits: both partners combine the same two
tensors in the same order, the lower rank's first (a sum would not need it,
IEEE 754 addition being commutative, but max and min may return either of
-0.0 and +0.0). When N is not a power of two, the P = 2**floor(log2 N) first
ranks do the doubling: each rank r >= P first hands its tensor to rank r - P,
which adds it in, and gets the result back at the end (two more messages on
those ranks).
"""

from __future__ import annotations

import torch

from dtlab.comm import calls as comm
from dtlab.comm.collectives import AVG, SUM, CommMeter, begin_all_reduce, end_all_reduce, ring_all_reduce
from dtlab.comm.ring_pipeline import combine, drop_landing_buffers, landing_buffers

SMALL_BYTES = 1 << 20
"""``--collectives dtlab`` all-reduces tensors of at most this many bytes by recursive doubling.

``dtlab bench allreduce`` on this 2-core machine (gloo, 4 ranks, 2026-12-03;
benchmarks/HISTORY.md): recursive doubling at 1.17-2.16 of torch's busbw from
1 to 256 KiB and 1.05-1.20 at 1 MiB, where the ring was 0.92-1.13; at 4 MiB
it was slower than the ring (a script the same day: 15.2 ms against 10.5), the
whole tensor on every step costing more than the latencies it saves."""


def recursive_doubling_all_reduce(
    tensor: torch.Tensor, op=SUM, *, group=None, meter: CommMeter | None = None
) -> torch.Tensor:
    """All-reduce ``tensor`` in place by recursive doubling; the same bits on every rank.

    ``op``: SUM, AVG (the sum, divided by N on every rank), MAX or MIN. One
    traced call of kind ``all_reduce`` (see :mod:`dtlab.comm.calls`), whose wire bytes
    the tracer counts by nccl-tests' convention for any all-reduce, 2(N-1)/N of
    the tensor; ``meter`` counts what this rank really sent, log2(P) tensors.
    """
    n, rank, flat = begin_all_reduce(tensor, op, group, meter)
    if n == 1:
        return tensor
    with comm.traced("all_reduce", flat.numel() * flat.element_size(), group=group):
        try:
            _exchange_all(flat, op, n, rank, comm.Messages(group), meter)
        except BaseException:
            drop_landing_buffers()  # a receive may still be in flight into the landing buffer
            raise
    if op == AVG:
        flat.div_(n)
    return end_all_reduce(tensor, flat)


def all_reduce_by_size(
    tensor: torch.Tensor, op=SUM, *, group=None, meter: CommMeter | None = None, small_bytes: int = SMALL_BYTES
) -> torch.Tensor:
    """``--collectives dtlab``'s all-reduce: recursive doubling up to ``small_bytes``, the ring above."""
    if tensor.numel() * tensor.element_size() <= small_bytes:
        return recursive_doubling_all_reduce(tensor, op, group=group, meter=meter)
    return ring_all_reduce(tensor, op, group=group, meter=meter)


def _exchange_all(flat: torch.Tensor, op, n: int, rank: int, wire: comm.Messages, meter) -> None:
    """The folds, log2(P) exchanges and unfolds of one rank (module docstring), into ``flat``."""
    p = 1 << (n.bit_length() - 1)  # the largest power of two <= n

    def send(peer: int) -> None:
        wire.isend(flat, peer).wait()
        if meter is not None:
            meter.record_sent("all_reduce", flat.numel() * flat.element_size())

    if rank >= p:  # an extra rank: fold in, wait for the result
        send(rank - p)
        wire.irecv(flat, rank - p).wait()
        return
    # (numel,): the partner's tensor lands here; a buffer this thread keeps (as large as the largest
    # tensor it has all-reduced so far: --collectives dtlab sends only tensors up to SMALL_BYTES here)
    incoming = landing_buffers(flat, 1)[0]
    if rank + p < n:  # take in an extra rank's tensor first
        wire.irecv(incoming, rank + p).wait()
        _combine(flat, incoming, op, mine_first=True)
    distance = 1
    while distance < p:
        partner = rank ^ distance
        receive = wire.irecv(incoming, partner)  # posted first: gloo hands a message over once asked
        send(partner)
        receive.wait()
        _combine(flat, incoming, op, mine_first=rank < partner)
        distance *= 2
    if rank + p < n:
        send(rank + p)


def _combine(mine: torch.Tensor, incoming: torch.Tensor, op, *, mine_first: bool) -> None:
    """``mine`` <- the two combined, the lower rank's operand first (the same bits on both ranks);
    AVG's sum is divided at the end."""
    first, second = (mine, incoming) if mine_first else (incoming, mine)
    combine(first, second, op, out=mine)
