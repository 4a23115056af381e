"""The ring's steps, pipelined: each segment sent as soon as it is final, receives posted ahead.

:func:`dtlab.comm.collectives.ring_all_reduce` and its two halves run here
(:class:`PipelinedRing`). What a rank sends at step s is the chunk it
received at step s-1, so it need not wait for the whole chunk (gloo and NCCL
pipeline the same way): each chunk travels as ``count`` segments of about
``segment_bytes``; a segment is sent as soon as it has arrived and been
reduced, and the receives of the next ``recv_ahead`` segments are posted
before this one is waited for, so that a neighbour's send never waits for
this rank to ask for it (gloo hands a message over only once its receive is
posted). Each round posts the receives before the sends: over a shaped link
a ring of two whose sends went first took turns instead of using both
directions at once (dtlab bench allreduce --cluster: the cross-node ring
took 521-538 ms, 1.5 times the link's bound, and 357 ms with receives first).
Two rules keep that safe:

* a reduce-scatter segment lands in one of ``recv_ahead`` landing buffers,
  reused only once the segment it held has been added;
* an all-gather segment is received into a chunk only after this rank's
  earlier send of that chunk has completed.

A rank's part of the schedule is computed once per shape (:func:`_plan`), and
the landing buffers are kept from one call to the next (:func:`landing_buffers`): on
this 2-core machine, freshly allocated buffers' first-touch page faults and
the per-call bookkeeping cost a 4 MiB all-reduce more CPU than its additions.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import asdict
from functools import lru_cache

import torch
import torch.distributed as dist

from dtlab.comm import calls as comm
from dtlab.comm.ring_schedule import ALL_GATHER, REDUCE_SCATTER, RingStep, ring_schedule
from dtlab.comm.shared_memory import SLOT_BYTES

SUM, AVG, MAX, MIN = dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.MIN


def reduce_into(step: RingStep, mine: torch.Tensor, incoming: torch.Tensor, op, n: int) -> None:
    """Reduce-scatter: ``mine`` (this rank's partial sums of a segment) takes in ``incoming``; with AVG the
    chunk a rank owns is divided by N at its last step. All-gather received in place: nothing to do."""
    if step.phase != REDUCE_SCATTER:
        return
    combine(mine, incoming, op, out=mine)  # my partial sum += the ones this segment carried
    if op == AVG and step.step == n - 2:
        mine.div_(n)  # the chunk I own is complete: average it here


def combine(first: torch.Tensor, second: torch.Tensor, op, *, out: torch.Tensor) -> None:
    """``out`` <- ``first`` and ``second`` reduced by ``op`` (SUM and AVG add; AVG divides later)."""
    if op in (MAX, MIN):
        (torch.maximum if op == MAX else torch.minimum)(first, second, out=out)
    else:
        torch.add(first, second, out=out)


class PipelinedRing:
    """One rank's part of a ring over ``chunks`` (N views, this rank's copy), run by :meth:`run`."""

    def __init__(
        self,
        chunks,
        phases,
        op=SUM,
        *,
        rank: int,
        n: int,
        right: int,
        left: int,
        group,
        kind: str,
        meter,
        trace: list | None,
        segment_bytes: int,
        recv_ahead: int,
        wire=None,
    ):
        """``rank`` of ``n`` in ``group``; ``right`` and ``left``: its neighbours' ranks in ``group``;
        ``wire``: what carries the messages (``isend``, ``irecv``), by default gloo's (:class:`comm.Messages`)."""
        self.n, self.right, self.left = n, right, left
        self.wire = comm.Messages(group) if wire is None else wire
        self.op, self.kind, self.meter, self.trace = op, kind, meter, trace
        chunk_bytes = chunks[0].numel() * chunks[0].element_size()  # tensor_split: chunk 0 is largest
        self.count, self.ahead = max(1, -(-chunk_bytes // segment_bytes)), recv_ahead
        self.segments = [chunk.tensor_split(self.count) for chunk in chunks]  # [c][k]: (~numel / N / count,)
        self.transfers, self.overwrites = _plan(n, rank, tuple(phases), self.count)
        # Reduce-scatter lands the neighbour's partial sums here before adding them.
        self.landing = landing_buffers(self.segments[0][0], recv_ahead) if REDUCE_SCATTER in phases else []
        self.sends: dict[int, object] = {}
        self.recvs: deque = deque()  # (t, work, where it lands)
        self.posted_send = self.posted_recv = 0

    def run(self) -> None:
        try:
            self._run()
        except BaseException:
            drop_landing_buffers()  # a receive may still be in flight into one: never reuse it
            raise

    def _run(self) -> None:
        for finished in range(len(self.transfers)):
            self._post_recvs(finished)  # receives first: a neighbour's send is taken as soon as it starts
            self._post_sends(finished)
            self._post_recvs(finished)  # and those that waited for a send of this rank's to be posted
            t, work, incoming = self.recvs.popleft()
            assert t == finished, (t, finished)  # the receive being waited for is always posted by now
            if work is not None:
                work.wait()
            step, k = self.transfers[t]
            reduce_into(step, self.segments[step.recv_chunk][k], incoming, self.op, self.n)
            if self.trace is not None and k == self.count - 1:
                self.trace.append(asdict(step))
        self._post_sends(len(self.transfers))
        for work in self.sends.values():
            work.wait()

    def _post_sends(self, finished: int) -> None:
        """Send every segment whose data is final: the first step's own, then each one reduced."""
        while self.posted_send < len(self.transfers) and (
            self.posted_send < self.count or self.posted_send - self.count < finished
        ):
            step, k = self.transfers[self.posted_send]
            segment = self.segments[step.send_chunk][k]
            if segment.numel():  # a tensor smaller than the ring: both ends skip its empty chunks
                self.sends[self.posted_send] = self.wire.isend(segment, self.right)
                if self.meter is not None:
                    self.meter.record_sent(self.kind, segment.numel() * segment.element_size())
            self.posted_send += 1

    def _post_recvs(self, finished: int) -> None:
        """Post the receives of the next ``recv_ahead`` transfers, as far as their buffers are free."""
        while self.posted_recv < len(self.transfers) and self.posted_recv < finished + self.ahead:
            t = self.posted_recv
            step, k = self.transfers[t]
            mine = self.segments[step.recv_chunk][k]
            if step.phase == REDUCE_SCATTER:
                where = self.landing[t % self.ahead][: mine.numel()]
            else:
                before = self.overwrites[t]
                if before is not None and before >= self.posted_send:
                    return  # that send is not even posted: receive later
                if before in self.sends:
                    self.sends.pop(before).wait()  # delivered before its chunk is overwritten
                where = mine
            self.recvs.append((t, self.wire.irecv(where, self.left) if where.numel() else None, where))
            self.posted_recv += 1


def fits_a_slot(chunks) -> bool:
    """Whether each of ``chunks`` (``tensor_split``'s: the first is the largest) fits in one slot of a
    shared-memory wire (:data:`dtlab.comm.shared_memory.SLOT_BYTES`)."""
    return chunks[0].numel() * chunks[0].element_size() <= SLOT_BYTES


def ring_steps_in_slots(chunks, phases, op=SUM, *, rank: int, n: int, wire, kind: str, meter, trace: list | None):
    """The same steps as :class:`PipelinedRing`, one whole chunk per message, for chunks that fit in one
    slot of a shared-memory ``wire`` (:class:`dtlab.comm.shared_memory.SharedMemoryWire`); as a generator
    of the wire's steps, for the wire to run now (``wire.run``) or start and move on later
    (``wire.start``).

    Each step sends its chunk (waiting only while the neighbour's inbox is
    full) and then takes the left neighbour's where it lies in this rank's
    inbox: a reduce-scatter adds it from there, an all-gather copies it out.
    The same additions in the same order as the pipelined ring, so the same
    bits; none of the pipelining's bookkeeping, which for a tensor of a few
    hundred kilobytes (a data-parallel bucket) costs more than moving it.
    """
    transfers, _ = _plan(n, rank, tuple(phases), 1)
    for step, _ in transfers:
        outgoing, mine = chunks[step.send_chunk], chunks[step.recv_chunk]
        if outgoing.numel():  # a tensor smaller than the ring: both ends skip its empty chunks
            yield from wire.put(outgoing)
            if meter is not None:
                meter.record_sent(kind, outgoing.numel() * outgoing.element_size())
        if mine.numel():
            if step.phase == REDUCE_SCATTER:
                yield from wire.take(mine, lambda incoming: reduce_into(step, mine, incoming, op, n))  # noqa: B023 - called within this step
            else:
                yield from wire.take(mine, mine.copy_)
        if trace is not None:
            trace.append(asdict(step))


@lru_cache(maxsize=256)
def _plan(n: int, rank: int, phases: tuple[str, ...], count: int):
    """``rank``'s transfers (step, segment) in order, and for each all-gather receive the last
    earlier transfer that sends from the segment it overwrites (None if none)."""
    transfers = tuple(
        (step, k) for step in ring_schedule(n) if step.rank == rank and step.phase in phases for k in range(count)
    )
    sent_from: dict[tuple[int, int], int] = {}
    overwrites = []
    for t, (step, k) in enumerate(transfers):
        overwrites.append(sent_from.get((step.recv_chunk, k)) if step.phase == ALL_GATHER else None)
        sent_from[(step.send_chunk, k)] = t
    return transfers, tuple(overwrites)


_kept = threading.local()


def landing_buffers(like: torch.Tensor, number: int) -> list[torch.Tensor]:
    """``number`` buffers shaped like ``like`` (1-D), views of one buffer this thread keeps for its dtype and
    device (grown when a larger one is asked for). Every receive into them is waited for before
    :meth:`PipelinedRing.run` (or :func:`dtlab.comm.recursive_doubling.recursive_doubling_all_reduce`)
    returns, so the next call on this thread may reuse them."""
    kept = _kept.__dict__.setdefault("buffers", {})
    key, size = (like.dtype, like.device), like.numel()
    if key not in kept or kept[key].numel() < number * size:
        kept[key] = torch.empty(number * size, dtype=like.dtype, device=like.device)
    return list(kept[key][: number * size].view(number, size).unbind())


def drop_landing_buffers() -> None:
    """Forget this thread's landing buffers (after an error, a receive may still be writing into them)."""
    _kept.__dict__.pop("buffers", None)
