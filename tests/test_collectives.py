"""dtlab's ring collectives against PyTorch's, and the ring schedule as pure data.

One launch per world size runs every check on real gloo ranks and returns
what it measured; the assertions are made here, in the parent.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict

import pytest
import torch
import torch.distributed as dist

from dtlab import bench
from dtlab.bench import allreduce as allreduce_bench
from dtlab.comm import collectives, ring_pipeline
from dtlab.comm.collectives import (
    ALL_GATHER,
    AVG,
    REDUCE_SCATTER,
    SUM,
    CommMeter,
    naive_all_reduce,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
    ring_schedule,
)
from dtlab.i18n import ConfigError, DtlabError
from dtlab.planner.communication import ring_allreduce_time, ring_bytes_sent_per_rank
from dtlab.planner.hardware import Link
from tests.harness import run_ranks

SIZES = (1, 7, 1000, 1024)  # fewer elements than ranks, uneven chunks, even chunks
EVEN = 1024  # divisible by 1, 2 and 4: exact byte counts
SLOW = Link(name="slow", latency_s=0.01, bandwidth_Bps=1e6)


def _error(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0


def _checks_on_rank(ctx) -> dict:
    out: dict = {"errors": {}, "bytes": {}, "calls": {}}
    whole = collectives.SEGMENT_BYTES
    try:
        # Also with 64-byte segments, so that chunks travel in many pipelined pieces.
        for segment_bytes in (whole, 64):
            collectives.SEGMENT_BYTES = segment_bytes
            _compare_with_torch(ctx, out, segment_bytes)
    finally:
        collectives.SEGMENT_BYTES = whole
    _more_checks(ctx, out)
    return out


def _compare_with_torch(ctx, out: dict, segment_bytes: int) -> None:
    n, rank = ctx.world_size, ctx.rank
    for numel in SIZES:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(100 * numel + rank))
        total = x.clone()
        dist.all_reduce(total)  # PyTorch's answer: the SUM
        mine = torch.tensor_split(total, n)[rank]
        gathered = torch.zeros(numel)  # all-gather via torch: a sum of
        torch.tensor_split(gathered, n)[rank].copy_(torch.tensor_split(x, n)[rank])  # disjoint chunks
        dist.all_reduce(gathered)
        meter = CommMeter()
        errors = {
            "ring SUM": _error(ring_all_reduce(x.clone(), SUM, meter=meter), total),
            "ring AVG": _error(ring_all_reduce(x.clone(), AVG), total / n),
            "naive SUM": _error(naive_all_reduce(x.clone(), SUM, meter=meter), total),
            "naive AVG": _error(naive_all_reduce(x.clone(), AVG), total / n),
            "reduce-scatter SUM": _error(ring_reduce_scatter(torch.empty(mine.numel()), x, SUM, meter=meter), mine),
            "reduce-scatter AVG": _error(ring_reduce_scatter(torch.empty(mine.numel()), x, AVG), mine / n),
            "all-gather": _error(
                ring_all_gather(torch.empty(numel), torch.tensor_split(x, n)[rank], meter=meter), gathered
            ),
        }
        out["errors"][numel, segment_bytes] = errors
        out["bytes"][numel, segment_bytes] = dict(meter.bytes_sent)
        out["calls"][numel, segment_bytes] = dict(meter.calls)
    trace: list = []
    ring_all_reduce(torch.ones(EVEN), trace=trace)  # records the steps this rank executed
    out.setdefault("traces", []).append(trace)


def _more_checks(ctx, out: dict) -> None:
    n, rank = ctx.world_size, ctx.rank
    # A non-contiguous 2-D tensor: reduced in a flat copy, written back in place.
    m = torch.arange(12.0).view(3, 4).t() * (rank + 1)  # (4, 3), not contiguous
    expected = m.clone()
    dist.all_reduce(expected)
    ring_all_reduce(m)
    out["errors"]["non-contiguous"] = {"ring SUM": _error(m, expected)}
    # A simulated slow link: the same result, and never faster than the model says.
    y = torch.full((EVEN,), float(rank))
    started = time.perf_counter()
    ring_all_reduce(y, link=SLOW)
    out["slow_s"] = time.perf_counter() - started
    out["slow_error"] = _error(y, torch.full((EVEN,), float(sum(range(n)))))
    if n == 4:
        out["group"] = _group_checks(rank)


def _group_checks(rank: int) -> dict:
    """Ranks 1, 2, 3 form a group of three (rank 0 stays out): group rank 0 is world rank 1."""
    group = dist.new_group([1, 2, 3])
    if rank == 0:
        return {}
    x = torch.randn(1000, generator=torch.Generator().manual_seed(rank))
    expected = x.clone()
    dist.all_reduce(expected, group=group)
    me = dist.get_rank(group)
    out = ring_reduce_scatter(torch.empty(torch.tensor_split(x, 3)[me].numel()), x, group=group)
    gathered = ring_all_gather(torch.empty(1000), out, group=group)
    return {
        "ring": _error(ring_all_reduce(x.clone(), group=group), expected),
        "naive": _error(naive_all_reduce(x.clone(), AVG, group=group), expected / 3),
        "reduce-scatter then all-gather": _error(gathered, expected),
    }


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_ring_collectives_equal_torch_and_send_the_predicted_bytes(world_size):
    n, nbytes = world_size, 4 * EVEN
    for rank, got in enumerate(run_ranks(_checks_on_rank, world_size)):
        for case, errors in got["errors"].items():
            for name, error in errors.items():
                assert error < 1e-5, (rank, case, name, error)
        for segment_bytes in (collectives.SEGMENT_BYTES, 64):
            sent = got["bytes"][EVEN, segment_bytes]
            # Exactly the model's figures: every rank sends 2(N-1)/N of the tensor in an
            # all-reduce, (N-1)/N in each half, however many segments carry it.
            for kind in ("all_reduce", "reduce_scatter", "all_gather"):
                assert sent.get(kind, 0) == ring_bytes_sent_per_rank(nbytes, n, kind), kind
            assert sent.get("all_reduce", 0) == 2 * (n - 1) * nbytes // n
            # Naive: rank 0 sends the whole tensor to every other rank; the others send it once.
            assert sent.get("naive_all_reduce", 0) == ((n - 1) * nbytes if rank == 0 else nbytes)
            calls = 0 if n == 1 else 1
            assert got["calls"][EVEN, segment_bytes] == {
                k: calls for k in ("all_reduce", "naive_all_reduce", "reduce_scatter", "all_gather") if calls
            }
        for trace in got["traces"]:
            assert trace == [asdict(s) for s in ring_schedule(n) if s.rank == rank]
        assert got["slow_error"] == 0.0
        # A lower bound enforced by sleeping, so a slow machine cannot break it.
        assert got["slow_s"] >= ring_allreduce_time(nbytes, n, SLOW)
        if n == 4 and rank > 0:
            assert max(got["group"].values()) < 1e-5, got["group"]


# ------------------------------------------------------------------- the schedule, no processes


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_ring_schedule_reduces_then_gathers_every_chunk_on_every_rank(n):
    schedule = ring_schedule(n)
    assert len(schedule) == 2 * (n - 1) * n  # 2(N-1) steps of N transfers
    # Run the schedule on sets: which ranks' contributions each copy of each chunk holds.
    holds = [[{r} for _ in range(n)] for r in range(n)]  # holds[rank][chunk]
    for phase in (REDUCE_SCATTER, ALL_GATHER):
        receivers = {c: set() for c in range(n)}
        for s in range(n - 1):
            step = [t for t in schedule if t.phase == phase and t.step == s]
            assert [t.rank for t in step] == list(range(n))
            before = [[set(c) for c in row] for row in holds]  # all ranks move at once
            for t in step:
                left = step[(t.rank - 1) % n]
                assert t.recv_chunk == left.send_chunk  # I receive what my left sends
                arriving = before[left.rank][left.send_chunk]
                if phase == REDUCE_SCATTER:
                    holds[t.rank][t.recv_chunk] = before[t.rank][t.recv_chunk] | arriving
                else:
                    holds[t.rank][t.recv_chunk] = set(arriving)
                receivers[t.recv_chunk].add(t.rank)
        # Every chunk reaches every rank but the one it starts from.
        assert all(len(ranks) == n - 1 for ranks in receivers.values())
        if phase == REDUCE_SCATTER:
            # rank r owns chunk r, reduced over all N ranks
            assert all(holds[r][r] == set(range(n)) for r in range(n))
    assert all(chunk == set(range(n)) for row in holds for chunk in row)


def test_without_a_process_group_collectives_are_a_world_of_one():
    x = torch.arange(5.0)
    assert ring_all_reduce(x.clone(), AVG).equal(x)
    assert naive_all_reduce(x.clone()).equal(x)
    assert ring_reduce_scatter(torch.empty(5), x).equal(x)
    assert ring_all_gather(torch.empty(5), x).equal(x)
    with pytest.raises(ConfigError, match="4 elements") as error:
        ring_reduce_scatter(torch.empty(4), x)
    assert "元素" in str(error.value)
    with pytest.raises(ConfigError, match="PRODUCT") as error:  # SUM, AVG, MAX and MIN it has
        ring_all_reduce(x, dist.ReduceOp.PRODUCT)
    assert "MIN" in str(error.value) and "不支持" in str(error.value)


def test_the_ring_keeps_its_landing_buffers_and_drops_them_when_a_ring_fails(monkeypatch):
    """Reduce-scatter lands segments in buffers kept per thread, dtype and device between calls
    (fresh ones cost a 4 MiB all-reduce page faults); a ring that raised may leave a receive in
    flight into them, so they are forgotten, and the next ring allocates new ones."""
    first = ring_pipeline.landing_buffers(torch.empty(6), 2)
    again = ring_pipeline.landing_buffers(torch.empty(4), 2)
    assert [b.shape for b in again] == [torch.Size([4])] * 2
    assert again[0].data_ptr() == first[0].data_ptr()  # the same memory, reused
    assert again[1].data_ptr() != again[0].data_ptr()  # two distinct buffers
    assert ring_pipeline.landing_buffers(torch.empty(2, dtype=torch.float64), 2)[0].data_ptr() != first[0].data_ptr()
    grown = ring_pipeline.landing_buffers(torch.empty(64), 2)
    assert grown[1].numel() == 64 and grown[0].data_ptr() != first[0].data_ptr()

    class Sent:
        def wait(self):
            return True

    def refused(*args, **kwargs):
        raise RuntimeError("the neighbour is gone")

    monkeypatch.setattr(ring_pipeline.comm.Messages, "isend", lambda *args, **kwargs: Sent())
    monkeypatch.setattr(ring_pipeline.comm.Messages, "irecv", refused)
    ring = ring_pipeline.PipelinedRing(
        torch.zeros(64).tensor_split(2),
        (REDUCE_SCATTER, ALL_GATHER),
        rank=0,
        n=2,
        right=1,
        left=1,
        group=None,
        kind="all_reduce",
        meter=None,
        trace=None,
        segment_bytes=1 << 20,
        recv_ahead=2,
    )
    with pytest.raises(RuntimeError, match="neighbour"):
        ring.run()
    fresh = ring_pipeline.landing_buffers(torch.empty(32), 2)
    assert fresh[0].data_ptr() != ring.landing[0].data_ptr()


# ------------------------------------------------------------------- the benchmark's plumbing


def test_the_allreduce_benchmark_measures_both_and_unknown_names_are_refused():
    seconds = run_ranks(allreduce_bench.measure, 2, (1024, 4096), 1)
    assert seconds[0] == seconds[1]  # the slowest rank's time, on both
    assert all(t > 0 for per_size in seconds[0].values() for t in per_size.values())
    assert {"allreduce", "dp"} <= set(bench.available())
    with pytest.raises(DtlabError, match="allreduce") as error:
        bench.main(argparse.Namespace(name="nope", json=False, repeats=1))
    assert "基准" in str(error.value)
