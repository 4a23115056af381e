"""``--collectives ring`` and ``dtlab``: the training path's collectives on dtlab's own algorithms, not torch's.

With :func:`collectives` ``("ring")`` active, every all-reduce, reduce-scatter
and all-gather a component makes through :mod:`dtlab.comm.calls` (data
parallelism's buckets, ZeRO's shards and units, tensor parallelism's f and g,
the loss for the record) runs as :func:`dtlab.comm.collectives.ring_all_reduce`,
:func:`~dtlab.comm.collectives.ring_reduce_scatter` or
:func:`~dtlab.comm.collectives.ring_all_gather`: sends and receives to the two
neighbours, the algorithm lesson 01 builds. With ``("dtlab")`` the transport
and the algorithm are chosen, as NCCL chooses them: when every rank of the
group is on this machine, every call runs on the same ring over shared
memory (:mod:`dtlab.comm.shared_memory`: no TCP, the same bits); otherwise an
all-reduce of at most :data:`dtlab.comm.recursive_doubling.SMALL_BYTES` runs by
recursive doubling (log2 N exchanges, for tensors whose time is the
messages' latencies; data parallelism's buckets), the rest on the ring over
gloo: an algorithm chosen by size, as MPICH chooses. Broadcasts, all-to-alls
and the pipeline's own sends stay torch's.

The tracer sees each call as it sees torch's: one call of its kind, its bytes,
the time the caller was blocked in it, and for an asynchronous call (data
parallelism's buckets) the time it was in flight beside the computation.

How it runs alongside: one worker thread per process executes the ring calls
one at a time, in the order they were issued, as gloo's own worker thread
does for torch's collectives. A synchronous call is put in the same queue and
waited for, so calls on one group keep the order every rank issued them in
(collectives must be issued in the same order everywhere), and the ring's
point-to-point messages of two calls never interleave. The worker's own
sends and receives are not traced separately: they are the call.

One exception, under ``dtlab`` where every rank of the machine has a core of
its own: an all-reduce over a shared-memory wire already set up, while the
worker has nothing queued or running, and either synchronous or issued with
``caller_progresses`` (data parallelism's buckets), starts on the calling
thread and is left in flight on the wire (:meth:`Ring._start_here`). It
moves whenever the wire is advanced, :func:`dtlab.comm.calls.progress` (data
parallelism's gradient hooks call it), or used by any thread, and its
``wait()`` finishes it: MPI calls this *weak progress*, the worker thread
*strong progress* (:mod:`dtlab.comm.shared_memory_flights`). It saves two hand-overs
between threads per call; measured with dtlab bench dp on 2 ranks, OverlappedDP
went from 0.94-1.01 of DDP's step time (five runs) to 0.81-0.98 (26 runs;
benchmarks/HISTORY.md). With more ranks than cores
it is the other way round (4 ranks on 2 cores: 1.24-1.29 against 0.82-0.87):
a rank that is not running cannot move its messages on, and its neighbours
wait, while a worker sleeping on the neighbour's message runs the moment it
arrives.
"""

from __future__ import annotations

import functools
import os
import queue
import threading
import typing
from concurrent.futures import Future
from contextlib import contextmanager

import torch
import torch.distributed as dist

from dtlab.comm import calls as comm
from dtlab.comm.collectives import (
    ALL_GATHER,
    REDUCE_SCATTER,
    begin_all_reduce,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
)
from dtlab.comm.recursive_doubling import SMALL_BYTES, all_reduce_by_size
from dtlab.comm.ring_pipeline import fits_a_slot, ring_steps_in_slots
from dtlab.comm.shared_memory_setup import in_flight_wires, known_wire, wire_for
from dtlab.config import Collectives
from dtlab.i18n import ConfigError

RING_OPS = (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.MIN)
"""The reductions the ring implements; any other one stays torch's."""

CHOICES: tuple[str, ...] = typing.get_args(Collectives)
"""``--collectives``: torch's own, dtlab's ring for everything, or dtlab's algorithm chosen by size."""


class RingWork:
    """A ring call queued on the worker: ``wait()`` blocks until it ran, and raises what it raised."""

    def __init__(self, future: Future):
        self.future = future

    def wait(self, timeout=None) -> bool:
        """Block until the call ran (at most ``timeout``: seconds or a ``timedelta``, as torch's ``Work.wait``).

        Without ``timeout``, the group's own timeout bounds the ring's sends
        and receives. Past ``timeout``, ``TimeoutError``.
        """
        if timeout is not None and hasattr(timeout, "total_seconds"):
            timeout = timeout.total_seconds()
        self.future.result(timeout)
        return True

    def is_completed(self) -> bool:
        return self.future.done()

    def get_future(self) -> Future:
        """What the tracer hooks its 'finished' time onto (``add_done_callback``)."""
        return self.future


class _Worker:
    """One daemon thread running queued ring calls in order, untraced (the caller traces them)."""

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.submitted = self.finished = 0  # calls; each counter has one writer (no lock needed)
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="dtlab-ring", daemon=True)
        self.thread.start()

    def submit(self, job) -> RingWork:
        future: Future = Future()
        self.submitted += 1
        self.jobs.put((job, future))
        return RingWork(future)

    @property
    def pending(self) -> int:
        """Calls submitted and not yet finished."""
        return self.submitted - self.finished

    def stop(self) -> None:
        """Cancel what is still queued and end the thread once its current call returns (or fails)."""
        self.stopping = True
        self.jobs.put(None)

    def _loop(self) -> None:
        with comm.untraced():
            while True:
                item = self.jobs.get()
                if item is None:
                    return
                job, future = item
                if self.stopping or not future.set_running_or_notify_cancel():
                    self.finished += 1
                    future.cancel()
                    continue
                try:
                    result, error = job(), None
                except BaseException as raised:  # noqa: BLE001 - handed to the waiting caller
                    result, error = None, raised
                self.finished += 1  # before the caller wakes: it may issue its next call at once
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)


class Ring:
    """What :mod:`dtlab.comm.calls` calls instead of torch's collectives while the ring is selected.

    ``small_bytes``: an all-reduce of at most this many bytes runs by recursive doubling
    (``--collectives dtlab``); None: every one on the ring (``--collectives ring``). ``worker``:
    the thread that runs the calls (but the all-reduces begun in flight on the caller's thread,
    :meth:`_start_here`), one per process whatever the choice, so that calls issued
    under ``ring`` and under ``dtlab`` never run at once.
    """

    def __init__(self, small_bytes: int | None = None, worker: _Worker | None = None):
        self.worker = _Worker() if worker is None else worker
        self.small_bytes = small_bytes

    def handles(self, op) -> bool:
        return op in RING_OPS

    def all_reduce(self, tensor, op, group, caller_progresses: bool = False):
        """``caller_progresses``: the caller will move the call on (:func:`dtlab.comm.calls.progress`) and wait
        for it before it blocks on anything else (:func:`_start_here`); a synchronous call does."""
        flight = self._start_here(tensor, op, group) if caller_progresses else None
        if flight is not None:
            return flight

        def run():
            wire = self._wire(group)
            if wire is None and self.small_bytes is not None:
                return all_reduce_by_size(tensor, op, group=group, small_bytes=self.small_bytes)
            return ring_all_reduce(tensor, op, group=group, wire=wire)

        return self.worker.submit(run)

    def reduce_scatter(self, output, input, op, group) -> RingWork:
        return self.worker.submit(lambda: ring_reduce_scatter(output, input, op, group=group, wire=self._wire(group)))

    def all_gather(self, output, input, group) -> RingWork:
        return self.worker.submit(lambda: ring_all_gather(output, input, group=group, wire=self._wire(group)))

    def _start_here(self, tensor, op, group):
        """Begin the all-reduce on this thread and return it in flight, when its group's wire is set up,
        the worker has nothing queued or running (calls keep their order), every rank of this machine
        has a core of its own (:func:`ranks_have_cores`) and each chunk fits one slot; else None, and
        the worker runs it.

        The call then moves whenever the wire is advanced (:func:`dtlab.comm.calls.progress`, from data
        parallelism's gradient hooks) or used, and its ``wait()`` finishes it: weak progress
        (:mod:`dtlab.comm.shared_memory_flights`). With a core per rank that beats handing every call to
        the worker and back (dtlab bench dp, 2 ranks); with more ranks than cores, a rank that is
        descheduled holds up its neighbours until it runs again, while the worker sleeps until the
        neighbour's message and runs at once, so the worker it is.
        """
        if self.small_bytes is None or self.worker.pending:
            return None
        wire = known_wire(group)
        if wire is None or not ranks_have_cores():
            return None
        return start_ring_all_reduce(tensor, op, group=group, wire=wire)

    def progress(self) -> None:
        """Move every call in flight on this process's wires on, without waiting."""
        for wire in in_flight_wires():
            wire.advance()

    def _wire(self, group):
        """``--collectives dtlab``: the group's shared-memory wire where its ranks share a machine
        (:mod:`dtlab.comm.shared_memory`), else None; ``ring``: always None, gloo's sends and receives."""
        return wire_for(group) if self.small_bytes is not None else None


def start_ring_all_reduce(tensor, op, *, group, wire):
    """Begin :func:`dtlab.comm.collectives.ring_all_reduce` of ``tensor`` on a shared-memory ``wire`` and
    return it in flight (:meth:`dtlab.comm.shared_memory_flights.InFlight.start`); None where it cannot be
    begun so: one rank, a tensor not contiguous, or chunks that do not fit one slot each."""
    if not tensor.is_contiguous():
        return None
    n, rank, flat = begin_all_reduce(tensor, op, group, None)
    chunks = torch.tensor_split(flat, n)  # N views of ~numel / N
    if n == 1 or not fits_a_slot(chunks):
        return None
    return wire.start(
        ring_steps_in_slots(
            chunks,
            (REDUCE_SCATTER, ALL_GATHER),
            op,
            rank=rank,
            n=n,
            wire=wire,
            kind="all_reduce",
            meter=None,
            trace=None,
        )
    )


def ranks_have_cores() -> bool:
    """Whether this machine has a core for each of its ranks (``LOCAL_WORLD_SIZE``, as torchrun sets it;
    else the whole world's size, as on one machine). Lesson 16's namespace "nodes" share one
    machine's cores but each counts only its own ranks: there the answer can be too kind, which
    costs speed, not correctness."""
    return _have_cores(os.environ.get("LOCAL_WORLD_SIZE", ""), dist.get_world_size())


@functools.lru_cache(maxsize=64)
def _have_cores(local_world_size: str, world_size: int) -> bool:
    try:
        ranks = int(local_world_size or world_size)
    except ValueError:
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return ranks <= cores


_rings: dict[str, Ring] = {}
"""The ring of each choice but torch's, made when first selected and kept for the next run; all on one
worker thread."""


def check_backend(name: str, backend: str | None) -> None:
    """Refuse dtlab's collectives (``ring``, ``dtlab``) on any backend but gloo (bilingual ConfigError).

    Under NCCL the ring's sends and receives, issued from the worker thread,
    would wait on pair communicators NCCL creates lazily (the ranks can
    deadlock), and a CUDA work's ``wait()`` does not block the host, so the
    worker could not keep the calls in order.
    """
    if name != "torch" and backend is not None and backend != "gloo":
        raise ConfigError(
            f"collectives={name!r} runs on the gloo backend only, not on {backend!r}; "
            "use --collectives torch (the default) here",
            f"collectives={name!r} 只能在 gloo 后端上运行，不能用 {backend!r}；此处请使用 --collectives torch（默认）",
        )


@contextmanager
def collectives(name: str, backend: str | None = None):
    """Inside, :mod:`dtlab.comm.calls`'s collectives run on ``name``: ``"torch"``, ``"ring"`` or ``"dtlab"``.

    The trainer wraps a whole run in it (``TrainConfig.collectives``), giving
    its ``backend``: dtlab's are gloo's only (:func:`check_backend`). On the
    way out the previous choice is back, so a pool's process that runs
    something else next gets torch's collectives again. Leaving normally, the
    ring's queue is drained and what is in flight finished first (every call
    issued has run); leaving on an
    error, the ring is dropped: its queued calls are cancelled and its thread
    ends (it may be blocked in a receive on a group about to be destroyed),
    and the next run starts a fresh one.
    """
    if name not in CHOICES:
        *others, last = map(repr, CHOICES)
        raise ConfigError(
            f"collectives={name!r} is not allowed; expected {', '.join(others)} or {last}",
            f"collectives={name!r} 不合法；应为 {'、'.join(others)} 或 {last}",
        )
    check_backend(name, backend)
    if name != "torch" and name not in _rings:
        worker = next(iter(_rings.values())).worker if _rings else None
        _rings[name] = Ring(SMALL_BYTES if name == "dtlab" else None, worker)
    ring = _rings.get(name)
    previous = comm.set_ring(ring)
    finished = False
    try:
        yield
        finished = True
    finally:
        comm.set_ring(previous)
        if ring is not None and finished:
            ring.worker.submit(lambda: None).wait()
            for wire in in_flight_wires():  # and every call left in flight on a wire has finished
                wire.finish_flights()
        elif ring is not None:
            ring.worker.stop()
            _rings.clear()  # every choice shares the stopped thread: the next run starts afresh
