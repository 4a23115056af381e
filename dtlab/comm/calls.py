"""The one door to the network: torch.distributed's calls, each reported to the rank's tracer.

Every dtlab component communicates through these functions instead of
calling ``torch.distributed`` itself (``tests/test_tracer.py`` checks it), so
the tracer (:mod:`dtlab.comm.tracer`) sees every byte a rank sends and every
second it waits. Each function takes the same arguments as its
``torch.distributed`` namesake plus ``kind``: the primitive, then what the
call is for, e.g. ``"all_reduce.forward"`` for tensor parallelism's g or
``"recv.backward"`` for a pipeline stage receiving a gradient. Data
parallelism's and ZeRO's gradient and parameter traffic keeps the bare
primitive (``"all_reduce"``, ``"reduce_scatter"``, ``"all_gather"``), the
names dtlab's meters have always counted it under.

``group=`` as everywhere in dtlab (``None``: the whole world). With no active
tracer, or inside another traced call, a function is its namesake and
nothing more. ``async_op=True`` returns a :class:`dtlab.comm.tracer.TracedWork`,
whose ``wait()`` is timed as blocked.

:func:`traced` wraps an algorithm of dtlab's own (the ring all-reduce, the
pairwise all-to-all) so that it counts as one call of its kind, its
point-to-point messages inside it.
"""

from __future__ import annotations

import pickle
import threading
import time
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

from dtlab.comm.tracer import active

SUM = dist.ReduceOp.SUM
# torch 2.13 renamed the single-tensor all-gather and reduce-scatter (the old names warn).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _size(group) -> int:
    if not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


_quiet = threading.local()
_ring = None
"""dtlab's ring (:class:`dtlab.comm.ring_backend.Ring`) while ``--collectives ring`` or ``dtlab`` is selected, else None."""


def set_ring(ring):
    """Run all-reduce, reduce-scatter and all-gather on ``ring`` (None: torch's); returns the previous.

    Called by :func:`dtlab.comm.ring_backend.collectives`, which says how the ring runs.
    """
    global _ring
    previous, _ring = _ring, ring
    return previous


def ring_selected() -> bool:
    """True while ``--collectives ring`` or ``dtlab`` is selected (:func:`dtlab.comm.ring_backend.collectives`)."""
    return _ring is not None


def progress() -> None:
    """Let calls of dtlab's own still in flight move on, without waiting (nothing under torch's).

    Under ``--collectives dtlab`` with a core for every rank, an asynchronous
    all-reduce over shared memory issued with ``caller_progresses`` is left in
    flight and moves only when its wire is used or advanced (weak progress, as
    MPI's: :mod:`dtlab.comm.shared_memory_flights`); data parallelism's gradient
    hooks call this, dozens of times a backward.
    """
    if _ring is not None:
        _ring.progress()


@contextmanager
def untraced():
    """Calls made by this thread inside are not traced (the ring's worker: its caller traces the call)."""
    previous, _quiet.on = getattr(_quiet, "on", False), True
    try:
        yield
    finally:
        _quiet.on = previous


def _tracer():
    tracer = active()
    return None if tracer is None or tracer.nested or getattr(_quiet, "on", False) else tracer


def _call(kind: str, nbytes: int, group, run, async_op: bool):
    """Run ``run()`` (a torch.distributed call) traced as ``kind``; returns what it returns."""
    tracer = _tracer()
    if tracer is None:
        return run()
    if async_op:
        return tracer.issue(kind, nbytes, group, _size(group), run)
    with tracer.blocking(kind, nbytes, group, _size(group)):
        return run()


@contextmanager
def traced(kind: str, nbytes: int, *, group=None):
    """One traced call of ``kind`` on ``nbytes`` around a block that communicates (blocking)."""
    tracer = _tracer()
    with nullcontext() if tracer is None else tracer.blocking(kind, nbytes, group, _size(group)):
        yield


# --------------------------------------------------------------------------- collectives

RELEASE_TIMEOUT_S = 2.0
"""How long a finished call waits for gloo's worker thread to let go of its tensors (:func:`_until_released`)."""


def _until_released(tensors, counts: list[int]) -> None:
    """Wait until no finished call still holds ``tensors`` (each back to its use count ``counts``).

    gloo's worker thread drops its reference to a collective's work, and so to the work's tensors, a
    moment *after* ``wait()`` has returned. Were the rank to exit in that moment, the interpreter
    would free the tensors' Python objects first, leave each to the C++ tensor, and the worker would
    then free them without the interpreter: it aborts the process (issue 36, item 5: SIGABRT,
    "terminate called without an active exception", ``ProcessGroupGloo::runLoop`` on the stack). DDP's
    buckets are C++ tensors and never meet this; a Python-owned bucket must wait for its release.
    """
    deadline = time.monotonic() + RELEASE_TIMEOUT_S
    for tensor, count in zip(tensors, counts):
        while tensor._use_count() > count and time.monotonic() < deadline:
            time.sleep(0)  # gloo's worker is between finish() and dropping the work: microseconds


class _Releasing:
    """An asynchronous call on CPU tensors: its ``wait()`` also lets go of the work and waits until
    gloo's worker thread has let go of the tensors (:func:`_until_released`)."""

    def __init__(self, work, tensors, counts: list[int]):
        self.work, self.tensors, self.counts = work, tensors, counts

    def wait(self, timeout=None) -> bool:
        if self.work is None:
            return True
        result = self.work.wait() if timeout is None else self.work.wait(timeout)
        self.work = None  # the work, its future and the future's callbacks go here, on this thread
        _until_released(self.tensors, self.counts)
        return result

    def is_completed(self) -> bool:
        return self.work is None or self.work.is_completed()

    def get_future(self):
        return self.work.get_future()


def _released(run, tensors, async_op: bool):
    """``run()`` for a torch collective on ``tensors``; before the call counts as finished, gloo has let
    go of them. Only CPU tensors (gloo): NCCL keeps a work until its watchdog has seen it done."""
    if any(t.device.type != "cpu" for t in tensors):
        return run
    counts = []

    def start():
        counts[:] = [t._use_count() for t in tensors]
        work = run()
        if async_op:
            return _Releasing(work, tensors, counts)
        _until_released(tensors, counts)
        return work

    return start


def _collective(kind: str, nbytes: int, group, run, on_ring, async_op: bool, tensors=()):
    """``run()`` (torch's), or ``on_ring(ring)`` when the ring is selected (queued on its worker, or
    begun on this thread: :meth:`dtlab.comm.ring_backend.Ring.all_reduce`), waited for unless ``async_op``,
    traced like torch's call. ``tensors``: those the call reads and writes (:func:`_released`)."""
    ring = _ring
    if ring is None or not on_ring:
        return _call(kind, nbytes, group, _released(run, tensors, async_op), async_op)
    if async_op:
        return _call(kind, nbytes, group, lambda: on_ring(ring), True)
    return _call(kind, nbytes, group, lambda: on_ring(ring).wait() and None, False)


def all_reduce(
    tensor, op=SUM, *, group=None, kind: str = "all_reduce", async_op: bool = False, caller_progresses: bool = False
):
    """``dist.all_reduce``: every rank ends with the reduction of every rank's ``tensor``.

    ``caller_progresses`` (with ``async_op``): the caller promises to call :func:`progress` while it
    computes and to wait for the call before it blocks on anything else, so that under
    ``--collectives dtlab`` the call may be left in flight on this thread (weak progress,
    :mod:`dtlab.comm.shared_memory_flights`). A synchronous call is waited for at once, so it may always.
    """
    in_flight = caller_progresses or not async_op
    return _collective(
        kind,
        _nbytes(tensor),
        group,
        lambda: dist.all_reduce(tensor, op=op, group=group, async_op=async_op),
        _ring and _ring.handles(op) and (lambda ring: ring.all_reduce(tensor, op, group, in_flight)),
        async_op,
        (tensor,),
    )


def broadcast(tensor, src: int, *, group=None, kind: str = "broadcast", async_op: bool = False):
    """``dist.broadcast`` from global rank ``src``."""
    run = _released(lambda: dist.broadcast(tensor, src=src, group=group, async_op=async_op), (tensor,), async_op)
    return _call(kind, _nbytes(tensor), group, run, async_op)


def all_gather_single(output, input, *, group=None, kind: str = "all_gather", async_op: bool = False):
    """``dist.all_gather_single``: every rank's ``input`` end to end in ``output`` (its bytes count)."""
    return _collective(
        kind,
        _nbytes(output),
        group,
        lambda: _all_gather_single(output, input, group=group, async_op=async_op),
        lambda ring: ring.all_gather(output, input, group),
        async_op,
        (output, input),
    )


def reduce_scatter_single(output, input, op=SUM, *, group=None, kind: str = "reduce_scatter", async_op: bool = False):
    """``dist.reduce_scatter_single``: chunk r of the reduced ``input`` (its bytes count) to rank r."""
    return _collective(
        kind,
        _nbytes(input),
        group,
        lambda: _reduce_scatter_single(output, input, op=op, group=group, async_op=async_op),
        _ring and _ring.handles(op) and (lambda ring: ring.reduce_scatter(output, input, op, group)),
        async_op,
        (output, input),
    )


def all_to_all_single(
    output,
    input,
    output_split_sizes=None,
    input_split_sizes=None,
    *,
    group=None,
    kind: str = "all_to_all",
    async_op: bool = False,
):
    """``dist.all_to_all_single`` (the input's bytes count)."""
    return _call(
        kind,
        _nbytes(input),
        group,
        lambda: dist.all_to_all_single(
            output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op
        ),
        async_op,
    )


def all_gather_object(object_list: list, obj, *, group=None, kind: str = "all_gather_object"):
    """``dist.all_gather_object``: any picklable ``obj`` from every rank (bytes: N x its pickle)."""
    tracer = active()
    nbytes = 0 if tracer is None else len(pickle.dumps(obj)) * _size(group)
    return _call(kind, nbytes, group, lambda: dist.all_gather_object(object_list, obj, group=group), False)


def barrier(*, group=None, kind: str = "barrier"):
    """``dist.barrier``: no bytes, only waiting for every rank to arrive."""
    return _call(kind, 0, group, lambda: dist.barrier(group=group), False)


# --------------------------------------------------------------------------- point to point


def send(tensor, dst: int, *, group=None, kind: str = "send", tag: int = 0):
    """``dist.send`` to global rank ``dst``. ``tag``: a receive with the same tag takes it (gloo;
    NCCL ignores tags and matches messages between two ranks in order)."""
    return _call(kind, _nbytes(tensor), group, lambda: dist.send(tensor, dst, group=group, tag=tag), False)


def recv(tensor, src: int, *, group=None, kind: str = "recv", tag: int = 0):
    """``dist.recv`` from global rank ``src``: the time waiting for the message is blocked time."""
    return _call(kind, _nbytes(tensor), group, lambda: dist.recv(tensor, src, group=group, tag=tag), False)


def isend(tensor, dst: int, *, group=None, kind: str = "send", tag: int = 0):
    """``dist.isend``: in flight until its ``wait()``."""
    return _call(kind, _nbytes(tensor), group, lambda: dist.isend(tensor, dst, group=group, tag=tag), True)


def irecv(tensor, src: int, *, group=None, kind: str = "recv", tag: int = 0):
    """``dist.irecv``: in flight until its ``wait()``."""
    return _call(kind, _nbytes(tensor), group, lambda: dist.irecv(tensor, src, group=group, tag=tag), True)


class _Works:
    """The works of one ``dist.batch_isend_irecv``, waited for together."""

    def __init__(self, works):
        self.works = works

    def wait(self, timeout=None) -> bool:
        for work in self.works:
            work.wait() if timeout is None else work.wait(timeout)
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self.works)


def exchange(send_tensor, dst: int, recv_tensor, src: int, *, group=None, kind: str = "sendrecv"):
    """Send to global rank ``dst`` and receive from ``src`` as one batch; in flight until ``wait()``.

    ``dist.batch_isend_irecv`` lets NCCL run both at once: a separate send and
    receive with the same peer (a ring of two ranks) would otherwise queue one
    behind the other on both sides and wait for each other. Counted as one
    call of ``kind`` carrying the bytes sent.
    """

    def start():
        return _Works(
            dist.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, send_tensor, dst, group=group),
                    dist.P2POp(dist.irecv, recv_tensor, src, group=group),
                ]
            )
        )

    return _call(kind, _nbytes(send_tensor), group, start, True)


class Messages:
    """Point-to-point messages inside one of dtlab's own algorithms that is traced as one call
    (:func:`traced`: the ring), posted straight to the process group.

    Its messages are not traced one by one, so they can skip ``dist.isend``'s
    per-call bookkeeping (looking the default group up again, translating
    ranks, checking the tensor, viewing a complex tensor as real pairs: the
    ring carries real tensors only). Under cProfile that was about 40 us of
    Python per message, and the main thread's CPU for a 1 MiB ring all-reduce
    on 4 ranks fell from 2.4 to 1.9 ms; here 4 ranks share 2 cores, so CPU is
    wall time. ``peer`` is a
    rank *within* ``group``; ``wait()`` on what they return waits as
    ``dist.isend``'s work does (the process group's timeout).
    """

    def __init__(self, group=None):
        self.group = dist.group.WORLD if group is None else group

    def isend(self, tensor, peer: int, tag: int = 0):
        return self.group.send([tensor], peer, tag)

    def irecv(self, tensor, peer: int, tag: int = 0):
        return self.group.recv([tensor], peer, tag)
