"""The communication tracer: every message a rank sends or waits for, with its time.

A rank's step is a mix of computing and communicating, and the two overlap.
To say truthfully where the time went, every call that communicates goes
through :mod:`dtlab.comm.calls`, which reports it to the rank's tracer: its kind,
its process group (by axis name: ``"dp"``, ``"tp"``, ``"pp"``, ...), its
bytes, when it was issued, when the caller started to wait for it and when
that wait returned::

    issued ............ wait ----------- end        an asynchronous call (DP's buckets)
    |<-- in flight, the rank computes -->|<- blocked ->|
    issued/wait ----------------------- end         a blocking call (TP's f and g)
    |<------------- blocked ---------------->|

From these, per step (a *window*, from the previous record to this one):

* ``comm_s``: time the rank was blocked in communication, of every kind,
  wherever it was issued (inside forward, backward or the optimizer step);
* ``compute_s``: time in the step's compute regions with those waits taken out;
* ``overlap_s``: time communication was in flight while the rank computed
  (issued, not finished, not waited on): what overlapping buys;
* ``idle_s``: the rest of the window (loading data, assembling records);
* ``comm_groups`` = {group: {count, bytes, wire_bytes}}: the same calls by the
  group they ran on (``"dp_shard"``, ``"dp_replicate"``, ...), so the bytes on
  each link are read apart (hybrid sharding's two, say);
* ``comm`` = {kind: {count, bytes, wire_bytes, seconds}}: ``bytes`` is the size
  of the tensor the collective is called on, nccl-tests' "size" (the output of
  an all-gather, the input of a reduce-scatter, the message of a send);
  ``wire_bytes`` is what this rank puts on the wire with a bandwidth-optimal
  (ring) algorithm, ``bytes`` times nccl-tests' bus factor: 2(N-1)/N for an
  all-reduce, (N-1)/N for reduce-scatter, all-gather and all-to-all, 1 for a
  send or broadcast, 0 for a receive; ``seconds`` is the time blocked in it.

On CUDA the tracer synchronizes the device at every boundary it times, so
the figures are device time, not the time to launch kernels: work queued
before a collective counts as compute, and a collective ends when the device
has finished it. (The price: a blocking collective no longer overlaps queued
kernels on the GPU; asynchronous ones still overlap, since their issue is
not synchronized.)

The tracer is ambient, like ``torch.profiler``: the training loop makes one
per rank and activates it (:func:`tracing`); components only call
:mod:`dtlab.comm.calls`, which records into whichever tracer is active (none: it
records nothing). A call made inside another traced call (the point-to-point
messages of dtlab's own ring all-reduce) is part of it, not a call of its own.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

WIRE_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_gather_object": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 0.0,
    "barrier": lambda n: 0.0,
}
"""Primitive -> share of ``bytes`` this rank sends, for N ranks (nccl-tests' PERFORMANCE.md)."""


def primitive(kind: str) -> str:
    """``"all_reduce.forward"`` -> ``"all_reduce"``: a kind is a primitive, then what it is for."""
    return kind.split(".", 1)[0]


def wire_bytes(kind: str, nbytes: int, n: int) -> int:
    """Bytes this rank sends for a ``kind`` call on ``nbytes`` over ``n`` ranks (see the module doc)."""
    factor = WIRE_FACTORS.get(primitive(kind), lambda n: 1.0)
    return round(nbytes * factor(n)) if n > 1 else 0


@dataclass
class CommCall:
    """One traced call: what, over which group, how big, and its three times (seconds)."""

    kind: str
    group: str
    bytes: int
    wire_bytes: int
    start: float
    """Issued."""
    wait: float | None = None
    """The caller started waiting (the start itself, for a blocking call)."""
    end: float | None = None
    """The wait returned: the call is over for this rank."""
    done: float | None = None
    """The backend reported it complete (asynchronous calls whose backend says so)."""

    @property
    def blocked_s(self) -> float:
        return self.end - self.wait

    def in_flight(self) -> tuple[float, float]:
        """Issued until finished or waited for, whichever came first: the part that ran alongside."""
        stop = self.wait if self.done is None else min(self.done, self.wait)
        return (self.start, max(self.start, stop))


class TracedWork:
    """An asynchronous call in flight (what ``async_op=True`` returns): its ``wait()`` is timed."""

    def __init__(self, tracer: "CommTracer", call: CommCall, work):
        self.tracer, self.call, self.work = tracer, call, work
        if tracer.sync:
            return  # a CUDA future completes when the work is queued, not done: count to the wait
        try:  # gloo's collectives say when they finish; its point-to-point calls cannot
            work.get_future().add_done_callback(self._finished)
        except (RuntimeError, AttributeError):
            pass

    def _finished(self, _future) -> None:
        if self.call.done is None:
            self.call.done = time.perf_counter()

    def is_completed(self) -> bool:
        return self.work.is_completed()

    def wait(self, timeout=None) -> bool:
        if self.call.end is not None:
            return True
        self.call.wait = self.tracer.now()
        result = self.work.wait() if timeout is None else self.work.wait(timeout)
        self.call.end = self.tracer.now()
        self.tracer._finish(self.call)
        return result


class CommTracer:
    """One rank's record of its communication and compute, summarised per step by :meth:`end_step`."""

    def __init__(self, device: str = "cpu"):
        self.sync = str(device).startswith("cuda")
        self._names: dict[int, tuple[object, str]] = {}
        self._local = threading.local()
        self.calls: list[CommCall] = []  # finished in this window
        self.regions: list[list[float]] = []
        self.origin = self.window_start = self.now()

    def now(self) -> float:
        """The time, after the device has finished what was queued (CUDA), in seconds."""
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    # -- groups by axis name
    def name_group(self, group, name: str) -> None:
        """Call calls over ``group`` ``name`` (``"tp"``, ``"dp"``, ...) in records and traces."""
        if group is not None:
            self._names[id(group)] = (group, name)  # the group is kept, so its id stays its own

    def group_name(self, group) -> str:
        if group is None:
            return "world"
        return self._names.get(id(group), (None, "group"))[1]

    # -- what the components' calls do (through dtlab.comm.calls)
    @property
    def nested(self) -> bool:
        return getattr(self._local, "depth", 0) > 0

    @contextmanager
    def blocking(self, kind: str, nbytes: int, group, size: int):
        """Time a call the caller waits for until it returns; calls made inside it are part of it."""
        self._local.depth = getattr(self._local, "depth", 0) + 1
        call = CommCall(kind, self.group_name(group), nbytes, wire_bytes(kind, nbytes, size), start=self.now())
        try:
            yield call
        finally:
            self._local.depth -= 1
            call.wait, call.end = call.start, self.now()
            self._finish(call)

    def issue(self, kind: str, nbytes: int, group, size: int, start_work) -> TracedWork:
        """Start an asynchronous call (``start_work()`` returns its work); the wait is timed later."""
        call = CommCall(kind, self.group_name(group), nbytes, wire_bytes(kind, nbytes, size), start=time.perf_counter())
        return TracedWork(self, call, start_work())

    def _finish(self, call: CommCall) -> None:
        self.calls.append(call)

    # -- the training loop's side
    def start(self) -> None:
        """Begin measuring now: the origin of every span, and of the first window (call it on
        every rank just after a barrier, so that the ranks' times line up)."""
        self.calls, self.regions = [], []
        self.origin = self.window_start = self.now()

    @contextmanager
    def compute(self):
        """A region of the step where the rank computes (the waits inside are taken out)."""
        if getattr(self._local, "computing", False):
            yield
            return
        self._local.computing = True
        region = [self.now(), None]
        try:
            yield
        finally:
            region[1] = self.now()
            self.regions.append(region)
            self._local.computing = False

    def end_step(self) -> dict:
        """Close the window begun at the last call (or at the start): the rank's figures and spans."""
        end = self.now()
        window = (self.window_start, end)
        calls, regions = self.calls, [tuple(r) for r in self.regions]
        self.calls, self.regions, self.window_start = [], [], end
        figures = step_figures(window, regions, calls)
        figures["spans"] = self._spans(window, regions, calls)
        return figures

    def _spans(self, window, regions, calls) -> dict:
        """Times relative to :attr:`origin`, in seconds (rounded to the microsecond)."""

        def rel(t):
            return None if t is None else round(t - self.origin, 6)

        return {
            "window": [rel(window[0]), rel(window[1])],
            "compute": [[rel(a), rel(b)] for a, b in regions],
            "comm": [
                {
                    "kind": c.kind,
                    "group": c.group,
                    "bytes": c.bytes,
                    "start": rel(c.start),
                    "wait": rel(c.wait),
                    "end": rel(c.end),
                    "done": rel(c.done),
                }
                for c in calls
            ],
        }


# --------------------------------------------------------------------------- interval arithmetic


def union(intervals) -> list[tuple[float, float]]:
    """The intervals merged: sorted, disjoint, empty ones dropped."""
    merged: list[list[float]] = []
    for a, b in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def intersect(xs, ys) -> list[tuple[float, float]]:
    """Where both hold (one sweep over the two sorted unions)."""
    xs, ys, out, i, j = union(xs), union(ys), [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if b > a:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(xs, ys) -> list[tuple[float, float]]:
    """Where ``xs`` holds and ``ys`` does not (one sweep)."""
    ys, out, j = union(ys), [], 0
    for a, b in union(xs):
        while j < len(ys) and ys[j][1] <= a:
            j += 1
        k, start = j, a
        while k < len(ys) and ys[k][0] < b:
            if ys[k][0] > start:
                out.append((start, ys[k][0]))
            start, k = max(start, ys[k][1]), k + 1
        if start < b:
            out.append((start, b))
    return out


def length(intervals) -> float:
    return sum(b - a for a, b in union(intervals))


def segments(window, regions, calls) -> dict[str, list[tuple[float, float]]]:
    """One window cut into what the rank did: ``compute``, ``blocked``, ``idle`` (these three
    tile the window) and ``overlap`` (within ``compute``: communication in flight meanwhile).

    ``regions`` are (start, end) of the compute regions; ``calls`` have
    ``start``, ``wait``, ``end`` and ``done`` as :class:`CommCall`.
    """
    cut = _cut(window, regions, calls)
    cut["idle"] = subtract(subtract([tuple(window)], cut["compute"]), cut["blocked"])
    return cut


def _cut(window, regions, calls) -> dict[str, list[tuple[float, float]]]:
    clip = [tuple(window)]
    blocked = intersect([(c.wait, c.end) for c in calls], clip)
    compute = subtract(intersect(regions, clip), blocked)
    return {"compute": compute, "blocked": blocked, "overlap": intersect([c.in_flight() for c in calls], compute)}


def span_segments(spans: dict) -> dict[str, list[tuple[float, float]]]:
    """:func:`segments` of one rank's ``spans`` as a step record carries them."""
    calls = [
        CommCall(c["kind"], c["group"], c["bytes"], 0, c["start"], c["wait"], c["end"], c.get("done"))
        for c in spans["comm"]
    ]
    return segments(spans["window"], spans["compute"], calls)


def step_figures(window, regions, calls) -> dict:
    """``comm``, ``comm_s``, ``compute_s``, ``overlap_s``, ``idle_s`` of one window (see the module doc)."""
    cut = _cut(window, regions, calls)  # each a sorted union: its length is a plain sum
    comm: dict[str, dict] = {}
    groups: dict[str, dict] = {}
    for c in calls:
        entry = comm.setdefault(c.kind, {"count": 0, "bytes": 0, "wire_bytes": 0, "seconds": 0.0})
        entry["count"] += 1
        entry["bytes"] += c.bytes
        entry["wire_bytes"] += c.wire_bytes
        entry["seconds"] += c.blocked_s
        on = groups.setdefault(c.group, {"count": 0, "bytes": 0, "wire_bytes": 0})
        on["count"], on["bytes"], on["wire_bytes"] = (
            on["count"] + 1,
            on["bytes"] + c.bytes,
            on["wire_bytes"] + c.wire_bytes,
        )
    wall = window[1] - window[0]
    comm_s, compute_s = (sum(b - a for a, b in cut[key]) for key in ("blocked", "compute"))
    return {
        "comm": comm,
        "comm_groups": groups,
        "comm_s": comm_s,
        "compute_s": compute_s,
        "overlap_s": sum(b - a for a, b in cut["overlap"]),
        "idle_s": max(0.0, wall - comm_s - compute_s),
        "wall_s": wall,
    }


# --------------------------------------------------------------------------- the active tracer

_active: CommTracer | None = None


def active() -> CommTracer | None:
    """The tracer :mod:`dtlab.comm.calls` records into now, if any."""
    return _active


@contextmanager
def tracing(tracer: CommTracer):
    """Record every call through :mod:`dtlab.comm.calls` into ``tracer`` while inside."""
    global _active
    previous, _active = _active, tracer
    try:
        yield tracer
    finally:
        _active = previous
