"""Lesson 01: dtlab's ring all-reduce on real ranks, beside torch.distributed's.

The functions return plain numbers, booleans and lists; the notebook prints
the deterministic ones (bytes, steps, equalities) and only plots the timings.
"""

from __future__ import annotations

import time
from dataclasses import asdict

import torch
import torch.distributed as dist

from dtlab.comm.collectives import (
    CommMeter,
    group_size_and_rank,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
    ring_schedule,
)
from dtlab.comm.shared_memory_setup import wire_for
from dtlab.planner.hardware import Link


def _small_integers(numel: int, rank: int, device: str) -> torch.Tensor:
    """(numel,) float32 holding small whole numbers: their sums are exact in any order,
    so the ring's result can be compared with torch's for *equality*, not closeness."""
    return (torch.arange(numel, device=device) % 7 + rank).float()


def ring_versus_torch(ctx, nbytes: int = 4 << 20) -> dict:
    """One ring all-reduce of an ``nbytes`` float32 tensor, metered and traced, and the same
    tensor through ``dist.all_reduce``; then the two halves, reduce-scatter and all-gather."""
    n, rank = group_size_and_rank(None)
    x = _small_integers(nbytes // 4, rank, ctx.device)  # (nbytes / 4,)
    ours, theirs = x.clone(), x.clone()
    meter, trace = CommMeter(), []
    ring_all_reduce(ours, meter=meter, trace=trace)
    dist.all_reduce(theirs)

    halves = CommMeter()
    mine = torch.empty(torch.tensor_split(x, n)[rank].numel(), device=ctx.device)  # (nbytes / 4 / N,)
    ring_reduce_scatter(mine, x, meter=halves)  # chunk `rank` of the sum
    gathered = torch.empty_like(x)  # (nbytes / 4,)
    ring_all_gather(gathered, mine, meter=halves)

    # Random floats, whose sums do depend on the order of the additions: the same ring over gloo's
    # sends and receives and over shared memory (dtlab/comm/shared_memory.py), compared bit for bit.
    noise = torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(rank)).to(ctx.device)
    over_gloo, over_shared = noise.clone(), noise.clone()
    ring_all_reduce(over_gloo)
    wire = wire_for(None) if ctx.device == "cpu" else None
    if wire is not None:
        ring_all_reduce(over_shared, wire=wire)

    expected = [asdict(s) for s in ring_schedule(n) if s.rank == rank]
    return {
        "rank": rank,
        "nbytes": x.numel() * x.element_size(),
        "calls": meter.calls["all_reduce"],
        "bytes_sent": meter.bytes_sent["all_reduce"],
        "steps": len(trace),
        "trace_is_schedule": trace == expected,
        "equal_to_torch": torch.equal(ours, theirs),
        "reduce_scatter_sent": halves.bytes_sent["reduce_scatter"],
        "all_gather_sent": halves.bytes_sent["all_gather"],
        "halves_equal_whole": torch.equal(gathered, ours),
        "shared_memory": wire is not None,
        "shared_equals_gloo": wire is not None and torch.equal(over_gloo, over_shared),
    }


def simulated_link(ctx, nbytes: int, latency_s: float, bandwidth_Bps: float, repeats: int = 2) -> float:
    """Seconds of a ring all-reduce of ``nbytes`` under ``link=`` (a simulated slower wire).

    The bytes move over the real backend; each transfer is then stretched to
    last at least alpha + n / beta. Returns the slowest rank's time of the last repeat.
    """
    link = Link(name="simulated", latency_s=latency_s, bandwidth_Bps=bandwidth_Bps)
    x = torch.ones(nbytes // 4, device=ctx.device)  # (nbytes / 4,)
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        ring_all_reduce(x, link=link)
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()
