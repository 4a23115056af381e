"""What the communication tracer costs: step time with it recording, over step time without.

The same small GPT, data and layout, with every collective going through
:mod:`dtlab.comm.calls` either way; only whether a :class:`dtlab.comm.tracer.CommTracer`
is active differs (inactive, each call of the door is its torch namesake).
The traced steps also summarise the window and pickle the result, as the
training loop does for its record. Two layouts: tensor parallelism over 2
ranks (the most calls per step: 4 all-reduces per block per pass) and
overlapped data parallelism over 2 ranks (asynchronous buckets, timed at
their wait). Traced and untraced steps alternate, so that the load of a shared
machine hits both alike; the figure is the median step time of the slowest
rank. Headline: traced over
untraced on the TP layout (lower is better; the goal is below 1.05).
"""

from __future__ import annotations

import pickle
import statistics
import time

import torch
import torch.distributed as dist

from dtlab.comm.tracer import CommTracer, tracing
from dtlab.config import MODEL_PRESETS
from dtlab.config.command_progress import current
from dtlab.data import rank_batch
from dtlab.launch import RankPool
from dtlab.model import build_model
from dtlab.parallel.data_parallel import OverlappedDP
from dtlab.parallel.tensor_parallel import apply_tensor_parallel

LAYOUTS = ("tp", "dp")
WORLD_SIZE = 2
MODEL = "small"
SEQUENCES = 8
WARMUP_STEPS, TIMED_STEPS = 2, 8


def _build(ctx, layout: str):
    cfg = MODEL_PRESETS[MODEL]
    model = build_model(cfg, seed=0).to(ctx.device)
    if layout == "tp":
        return apply_tensor_parallel(model, group=None), 0, 1  # every rank: the whole batch
    return OverlappedDP(model, bucket_cap_mb=0.25), ctx.rank, ctx.world_size


def _step_times(ctx, layout: str) -> dict[str, list[float]]:
    """Seconds per step of the slowest rank, traced and not: the two alternate step by step, so
    that a shared machine's drift hits both alike."""
    model, index, count = _build(ctx, layout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tracer, seq_len = CommTracer(device=ctx.device), MODEL_PRESETS[MODEL].seq_len
    times = {"traced": [], "plain": [], "calls": []}
    for step in range(WARMUP_STEPS + 2 * TIMED_STEPS):
        x, y = rank_batch(step, per_rank=SEQUENCES, seq_len=seq_len, seed=0, rank=index, world_size=count)
        x, y = x.to(ctx.device), y.to(ctx.device)  # (B, T)
        traced = step % 2 == 0
        start = time.perf_counter()
        if traced:
            with tracing(tracer), tracer.compute():
                _train_step(model, optimizer, x, y)
            times["calls"].append(len(tracer.calls))
            pickle.dumps(tracer.end_step())  # what the loop gathers into the record
        else:
            _train_step(model, optimizer, x, y)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's
        if step >= WARMUP_STEPS:
            times["traced" if traced else "plain"].append(elapsed.item())
    return times


def _train_step(model, optimizer, x, y) -> None:
    optimizer.zero_grad(set_to_none=True)
    model(x, y).backward()
    if isinstance(model, OverlappedDP):
        model.finish_gradient_sync()
    optimizer.step()


def measure(ctx, repeats: int) -> dict:
    """On each rank: every timed step of each layout, traced and not."""
    samples = {f"{layout}/{mode}": [] for layout in LAYOUTS for mode in ("traced", "plain", "calls")}
    for _ in range(repeats):
        for layout in LAYOUTS:
            for mode, times in _step_times(ctx, layout).items():
                samples[f"{layout}/{mode}"] += times
    return samples


def bookkeeping_s(calls: int, *, steps: int = 200) -> float:
    """Seconds the tracer itself spends per step with ``calls`` calls (no network: its own cost)."""
    tracer = CommTracer()
    start = time.perf_counter()
    for _ in range(steps):
        with tracing(tracer), tracer.compute():
            for _ in range(calls):
                with tracer.blocking("all_reduce.forward", 131072, None, 2):
                    pass
        pickle.dumps(tracer.end_step())
    return (time.perf_counter() - start) / steps


def run(args) -> dict:
    repeats = max(1, getattr(args, "repeats", 3))
    progress = current()
    progress.more(repeats)
    pool = RankPool(max_size=WORLD_SIZE)
    samples: dict = {}
    try:
        for r in range(repeats):  # a run per repeat, so that each is a stage said on stderr
            progress.stage(
                f"TP and DP on {WORLD_SIZE} ranks, traced and not, repeat {r + 1} of {repeats}",
                f"{WORLD_SIZE} 个 rank 上的 TP 与 DP，追踪与不追踪，第 {r + 1} 次，共 {repeats} 次",
            )
            for key, values in pool.run(measure, WORLD_SIZE, 1, timeout=600.0).wait()[0].items():
                samples.setdefault(key, []).extend(values)
    finally:
        pool.close()
    medians = {key: statistics.median(v) for key, v in samples.items()}
    results = {}
    for layout in LAYOUTS:
        plain, calls = medians[f"{layout}/plain"], round(medians[f"{layout}/calls"])
        own = bookkeeping_s(calls)
        results[layout] = {
            "traced_step_s": medians[f"{layout}/traced"],
            "plain_step_s": plain,
            "ratio": medians[f"{layout}/traced"] / plain,
            "calls_per_step": calls,
            "bookkeeping_s": own,
            "bookkeeping_share": own / plain,
        }
    print(f"\ncommunication tracer: {MODEL} GPT, {WORLD_SIZE} ranks, {SEQUENCES} sequences per step, gloo")
    print(f"通信追踪器：{MODEL} GPT，{WORLD_SIZE} 个 rank，每步 {SEQUENCES} 条序列，gloo")
    print(
        f"{'layout':>8}{'traced (ms)':>14}{'untraced (ms)':>16}{'ratio':>8}{'calls':>7}{'tracer (us)':>13}{'share':>8}"
    )
    for layout, r in results.items():
        print(
            f"{layout:>8}{r['traced_step_s'] * 1e3:>14.1f}{r['plain_step_s'] * 1e3:>16.1f}{r['ratio']:>8.3f}"
            f"{r['calls_per_step']:>7}{r['bookkeeping_s'] * 1e6:>13.0f}{r['bookkeeping_share']:>8.2%}"
        )
    print(
        "(median step time of the slowest rank; ratio = traced / untraced, lower is better; tracer: its own\n"
        " bookkeeping per step for that many calls, timed alone, and its share of the untraced step)"
    )
    print(
        "（最慢 rank 每步时间的中位数；ratio = 追踪 / 不追踪，越低越好；tracer：单独计时的追踪器自身每步开销，\n"
        " 以及它占不追踪时一步的比例）",
        flush=True,
    )
    return {
        "bench": "tracer",
        "backend": "gloo",
        "model": MODEL,
        "headline": "median step time at tp=2, with the tracer / without (lower is better; goal < 1.05)",
        "ratio": results["tp"]["ratio"],
        "repeats": repeats,
        "results": results,
    }
