"""Step records -> a Chrome trace-event file, to open in Perfetto (ui.perfetto.dev) or chrome://tracing.

The trace-event format (Google's "Trace Event Format" document) is JSON: an
object whose ``traceEvents`` is a list of events. dtlab writes three kinds:

* ``"ph": "M"`` metadata naming each process (a rank, with its coordinates)
  and each thread (a lane of that rank);
* ``"ph": "X"`` complete events: a span with a start ``ts`` and a duration
  ``dur``, both in microseconds, on one ``pid`` (the rank) and ``tid`` (the lane).

Each rank has three lanes::

    tid 0  steps           one span per step window: "step 3"
    tid 1  compute         the compute regions, and inside them (nested) the
                           time blocked in a collective: "wait all_reduce.forward"
    tid 2  communication   every call from issue to end, with its kind, group,
                           bytes and blocked seconds in ``args``: an asynchronous
                           call that overlapped compute shows here alone

Times are seconds since the tracer's origin (each rank set it just after the
same barrier), so the ranks line up on one time axis.
"""

from __future__ import annotations

import json
import sys

LANES = {"steps": 0, "compute": 1, "communication": 2}


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)


def _span(name: str, start: float, end: float, *, pid: int, tid: int, cat: str, args: dict) -> dict:
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": _us(start),
        "dur": _us(max(0.0, end - start)),
        "pid": pid,
        "tid": tid,
        "args": args,
    }


def _metadata(rank: dict) -> list[dict]:
    pid = rank["rank"]
    coords = " ".join(f"{axis}={rank[axis]}" for axis in ("dp", "tp", "pp", "cp") if axis in rank)
    events = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"rank {pid} ({coords})"}},
        {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}},
    ]
    events += [
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": lane}}
        for lane, tid in LANES.items()
    ]
    return events


def rank_events(step: int, rank: dict) -> list[dict]:
    """The trace events of one rank's part of one step record (it needs the rank's ``spans``)."""
    spans, pid = rank["spans"], rank["rank"]
    start, end = spans["window"]
    events = [
        _span(
            f"step {step}",
            start,
            end,
            pid=pid,
            tid=LANES["steps"],
            cat="step",
            args={
                "step": step,
                "compute_s": rank["compute_s"],
                "comm_s": rank["comm_s"],
                "overlap_s": rank["overlap_s"],
                "idle_s": rank["idle_s"],
            },
        )
    ]
    for a, b in spans["compute"]:
        events.append(_span("compute", a, b, pid=pid, tid=LANES["compute"], cat="compute", args={"step": step}))
    for call in spans["comm"]:
        args = {
            "step": step,
            "group": call["group"],
            "bytes": call["bytes"],
            "blocked_s": round(call["end"] - call["wait"], 6),
        }
        events.append(
            _span(call["kind"], call["start"], call["end"], pid=pid, tid=LANES["communication"], cat="comm", args=args)
        )
        if call["end"] > call["wait"]:
            events.append(
                _span(
                    f"wait {call['kind']}",
                    call["wait"],
                    call["end"],
                    pid=pid,
                    tid=LANES["compute"],
                    cat="blocked",
                    args=args,
                )
            )
    return events


def chrome_trace(records) -> dict:
    """A trace-event JSON object for these step records (summaries and records without spans skipped)."""
    events, named = [], set()
    for record in records:
        events += _record_events(record, named)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"producer": "dtlab", "ranks": len(named)}}


def _record_events(record: dict, named: set) -> list[dict]:
    """One record's events, with each rank's metadata the first time ``named`` sees it."""
    events = []
    if record.get("summary"):
        return events
    for rank in record["ranks"]:
        if "spans" not in rank:
            continue
        if rank["rank"] not in named:
            named.add(rank["rank"])
            events += _metadata(rank)
        events += rank_events(record["step"], rank)
    return events


class TraceWriter:
    """Writes :func:`chrome_trace` of records as they come, a step at a time, to ``path``.

    Nothing is held in memory but the names already written. Until
    :meth:`close`, the file lacks its closing ``]}``, which Perfetto and
    chrome://tracing accept (a run cut short still opens); after it, the file
    is strict JSON.
    """

    def __init__(self, path: str):
        self.path, self._named, self._first, self.error = path, set(), True, None
        self._file = None
        self._write(lambda: open(path, "w", encoding="utf-8"))
        self._write(
            lambda: self._file.write('{"displayTimeUnit": "ms", "otherData": {"producer": "dtlab"}, "traceEvents": [\n')
        )

    def add(self, record: dict) -> None:
        for event in _record_events(record, self._named):
            self._write(
                lambda e=event: self._file.write(("" if self._first else ",\n") + json.dumps(e, allow_nan=False))
            )
            self._first = False
        self._write(lambda: self._file.flush())

    def close(self) -> str:
        if self._file is not None and not self._file.closed:
            self._write(lambda: self._file.write("\n]}\n"))
            self._write(lambda: self._file.close())
        return self.path

    def _write(self, action):
        """``action()``, unless writing the trace already failed; a failure (a full disk) stops the trace, not
        the training: it is said once, in both languages, and the steps and their checkpoints go on."""
        if self.error is not None:
            return None
        try:
            result = action()
        except OSError as error:
            self.error = error
            print(
                f"dtlab: writing the trace {self.path} failed ({error.strerror}); the trace stops here, the "
                f"training goes on\ndtlab: 写入 trace 文件 {self.path} 失败（{error.strerror}）；trace 到此为止，训练继续",
                file=sys.stderr,
                flush=True,
            )
            return None
        if self._file is None:
            self._file = result
        return result
