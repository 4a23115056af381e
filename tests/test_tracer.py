"""The communication tracer: its arithmetic, its door (dtlab.comm.calls), and real calls on gloo ranks.

The layouts' traced counts and bytes, the straggler test and the trace file
of a real training run are in tests/test_layouts.py (one warm pool of 8).
"""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import pytest
import torch

from dtlab.comm import calls as comm
from dtlab.comm.collectives import ring_all_reduce
from dtlab.comm.tracer import CommCall, CommTracer, length, segments, step_figures, subtract, tracing, union, wire_bytes
from dtlab.measure.chrome_trace import chrome_trace
from tests.harness import run_ranks

PACKAGE = Path(__file__).resolve().parent.parent / "dtlab"
COMMUNICATING = {
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
    "isend",
    "irecv",
    "barrier",
    "all_gather_object",
    "broadcast_object_list",
    "gather",
    "scatter",
    "reduce",
    "batch_isend_irecv",
    "monitored_barrier",
    "gather_object",
    "scatter_object_list",
}
# What may call torch.distributed directly: the door itself, the benchmarks, and the course
# plane's lesson experiments and exercises, which set PyTorch's own collectives beside dtlab's
# (or a learner's), outside any training step.
EXEMPT = ("comm/calls.py", "bench/", "course/", "cluster/allreduce_bench.py")


def test_every_component_communicates_through_dtlab_comm():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name.startswith(EXEMPT):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "dist"
                and node.func.attr in COMMUNICATING
            ):
                offenders.append(f"{name}:{node.lineno} dist.{node.func.attr}")
    assert not offenders, "communicate through dtlab.comm.calls (so the tracer sees it): " + ", ".join(offenders)


def test_interval_arithmetic():
    assert union([(3, 4), (0, 1), (0.5, 2), (5, 5)]) == [(0, 2), (3, 4)]
    assert subtract([(0, 10)], [(2, 3), (5, 7)]) == [(0, 2), (3, 5), (7, 10)]
    assert length([(0, 1), (0.5, 2)]) == 2


def _call(kind, start, wait, end, done=None, nbytes=100):
    return CommCall(kind, "dp", nbytes, wire_bytes(kind, nbytes, 2), start, wait, end, done)


def test_a_window_splits_into_compute_blocked_overlap_and_idle():
    """Window 0..10: compute regions 1..6 and 7..9; a blocking call 2..3 inside the first; an
    asynchronous one issued at 4, waited for at 8, over at 8.5; a blocking call 9.5..10 outside."""
    calls = [
        _call("all_reduce.forward", 2, 2, 3),
        _call("all_reduce", 4, 8, 8.5),
        _call("all_gather_object.records", 9.5, 9.5, 10),
    ]
    figures = step_figures((0, 10), [(1, 6), (7, 9)], calls)
    assert figures["comm_s"] == pytest.approx(1 + 0.5 + 0.5)
    assert figures["compute_s"] == pytest.approx(5 + 2 - 1 - 0.5)  # regions minus waits inside
    assert figures["overlap_s"] == pytest.approx(2 + 1)  # 4..6 and 7..8: while computing
    assert figures["idle_s"] == pytest.approx(10 - 2 - 5.5)
    assert figures["comm"]["all_reduce"] == {"count": 1, "bytes": 100, "wire_bytes": 100, "seconds": 0.5}
    cut = segments((0, 10), [(1, 6), (7, 9)], calls)
    assert length(cut["compute"]) + length(cut["blocked"]) + length(cut["idle"]) == pytest.approx(10)
    # finished early (done at 5): in flight only until then
    early = step_figures((0, 10), [(1, 6), (7, 9)], [_call("all_reduce", 4, 8, 8.01, done=5)])
    assert early["overlap_s"] == pytest.approx(1)


def test_wire_bytes_follow_the_ring():
    assert wire_bytes("all_reduce", 1000, 4) == 1500  # 2(N-1)/N
    assert wire_bytes("reduce_scatter", 1000, 4) == 750  # (N-1)/N
    assert wire_bytes("all_gather.checkpoint", 1000, 4) == 750
    assert wire_bytes("send.forward", 1000, 2) == 1000 and wire_bytes("recv.forward", 1000, 2) == 0
    assert wire_bytes("all_reduce", 1000, 1) == 0


def test_a_step_without_communication_is_compute_and_idle():
    tracer = CommTracer()
    with tracing(tracer), tracer.compute():
        time.sleep(0.001)
    figures = tracer.end_step()
    assert figures["comm"] == {} and figures["comm_s"] == 0 and figures["compute_s"] > 0


def _traced_calls_on_rank(ctx) -> dict:
    """A blocking all-reduce that waits for a late peer, an asynchronous one overlapped with compute,
    dtlab's own ring (one call, its messages inside it) and point-to-point, all traced."""
    tracer = CommTracer(device=ctx.device)
    late = 0.3 if ctx.rank == 1 else 0.0
    with tracing(tracer):
        with tracer.compute():
            time.sleep(late)  # rank 1 arrives late
            comm.all_reduce(torch.ones(8), kind="all_reduce.forward")
            work = comm.all_reduce(torch.ones(1024), async_op=True)
            time.sleep(0.05)  # computes while it travels
            work.wait()
            ring_all_reduce(torch.ones(1000))
            peer = 1 - ctx.rank
            if ctx.rank == 0:
                comm.send(torch.ones(16), peer, kind="send.forward")
            else:
                comm.recv(torch.empty(16), peer, kind="recv.forward")
        figures = tracer.end_step()
    return figures


def test_real_calls_are_timed_and_counted_on_gloo_ranks():
    r0, r1 = run_ranks(_traced_calls_on_rank, 2)
    for r in (r0, r1):
        assert r["comm"]["all_reduce.forward"]["count"] == 1
        assert r["comm"]["all_reduce"] == {
            **r["comm"]["all_reduce"],
            "count": 2,
            "bytes": 4 * 1024 + 4 * 1000,
            "wire_bytes": 4 * 1024 + 4 * 1000,
        }
        assert r["overlap_s"] > 0 and r["comm_s"] > 0
        assert json.loads(json.dumps(r["spans"])) == r["spans"]
    assert r0["comm"]["send.forward"]["wire_bytes"] == 64 and r1["comm"]["recv.forward"]["wire_bytes"] == 0
    # rank 0 waited for late rank 1 inside its compute region: booked as communication, not compute
    assert r0["comm"]["all_reduce.forward"]["seconds"] > 0.15
    assert r1["compute_s"] > 0.3 and r0["compute_s"] < r1["compute_s"]


def test_the_chrome_trace_has_a_process_per_rank_and_spans_with_bytes_and_group():
    spans = {
        "window": [0.0, 1.0],
        "compute": [[0.1, 0.9]],
        "comm": [
            {
                "kind": "all_reduce.forward",
                "group": "tp",
                "bytes": 64,
                "start": 0.2,
                "wait": 0.2,
                "end": 0.3,
                "done": None,
            }
        ],
    }
    rank = {
        "rank": 0,
        "dp": 0,
        "tp": 0,
        "pp": 0,
        "compute_s": 0.7,
        "comm_s": 0.1,
        "overlap_s": 0.0,
        "idle_s": 0.2,
        "spans": spans,
    }
    trace = json.loads(json.dumps(chrome_trace([{"step": 0, "ranks": [rank, {**rank, "rank": 1}]}])))
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    call = next(e for e in spans if e["name"] == "all_reduce.forward")
    assert call["args"]["bytes"] == 64 and call["args"]["group"] == "tp" and call["dur"] == 1e5
