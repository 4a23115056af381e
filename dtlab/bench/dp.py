"""dtlab's OverlappedDP beside ``torch.nn.parallel.DistributedDataParallel``: time per training step.

The same small GPT, the same data, the same world size, the same bucket
size: only the data-parallel wrapper and its all-reduce differ. dtlab's runs on
dtlab's own collectives (``--collectives dtlab``: on one machine the ring over
shared memory, :mod:`dtlab.comm.shared_memory`), DDP on gloo's ring over TCP; a
third column, OverlappedDP on torch's collectives, separates the wrapper from
the transport. Each repeat builds one copy of the model for each of the three
and trains them in turn, one step of each on the same batch (the order
reverses every step), so that a drift in a shared machine's speed falls on all
alike; the figure is the median step time of the slowest rank, and the
copies' parameters end equal (printed). Beside it, ``overlap_s``: how long some bucket's
all-reduce was in flight while the rank computed, for dtlab from its tracer's
records, for DDP from its own timings (:mod:`dtlab.bench._overlap`), median of
a few steps measured apart from the timed ones. Headline: dtlab's step time
over DDP's on the most ranks (lower is better).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dtlab.bench._overlap import ddp_overlap_s, ddp_timing_hook, median_overlap, steps_overlap
from dtlab.comm.ring_backend import collectives
from dtlab.comm.tracer import CommTracer, tracing
from dtlab.config import MODEL_PRESETS
from dtlab.config.command_progress import current
from dtlab.data import rank_batch
from dtlab.launch import RankPool
from dtlab.model import build_model
from dtlab.parallel.data_parallel import OverlappedDP

WORLD_SIZES = (2, 4)
MODEL = "small"
SEQUENCES_PER_RANK = 8
BUCKET_CAP_MB = 0.25  # the small GPT's ~1 MB of gradients in a few buckets, so overlap matters
WARMUP_STEPS, TIMED_STEPS = 2, 6
OVERLAP_STEPS = 4
KINDS = ("dtlab", "dtlab_torch", "ddp")
"""OverlappedDP on dtlab's collectives, OverlappedDP on torch's, DDP."""
COLLECTIVES = {"dtlab": "dtlab", "dtlab_torch": "torch", "ddp": "torch"}


def _wrap(kind: str, model: torch.nn.Module) -> torch.nn.Module:
    if kind != "ddp":
        return OverlappedDP(model, bucket_cap_mb=BUCKET_CAP_MB)
    return DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB)


def _train_step(kind: str, model, optimizer, x, y) -> None:
    optimizer.zero_grad(set_to_none=True)
    with collectives(COLLECTIVES[kind], "gloo"):
        model(x, y).backward()  # DDP waits for its last bucket at the end of backward
        if kind != "ddp":
            model.finish_gradient_sync()
    optimizer.step()


def _paired_step_times(ctx) -> dict:
    """Seconds per training step of the slowest rank, for each timed step of each of :data:`KINDS`.

    Each trains its own copy of the model on the same ranks and the same batches, one step each in
    turn (the order reverses every step), so that a drift in the machine's speed, which on this
    2-core VM moves by a fifth within seconds, falls on all alike. ``max_param_difference``: the
    largest difference between DDP's parameters and either OverlappedDP's afterwards (they trained
    the same).
    """
    cfg = MODEL_PRESETS[MODEL]
    runs = {}
    for kind in KINDS:
        model = _wrap(kind, build_model(cfg, seed=0).to(ctx.device))
        runs[kind] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for step in range(WARMUP_STEPS + TIMED_STEPS):
        x, y = rank_batch(
            step, per_rank=SEQUENCES_PER_RANK, seq_len=cfg.seq_len, seed=0, rank=ctx.rank, world_size=ctx.world_size
        )
        x, y = x.to(ctx.device), y.to(ctx.device)  # (B / N, T)
        for kind in KINDS if step % 2 == 0 else KINDS[::-1]:
            start = time.perf_counter()
            _train_step(kind, *runs[kind], x, y)
            times[kind].append(time.perf_counter() - start)
    slowest = torch.tensor([times[kind][WARMUP_STEPS:] for kind in KINDS], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    theirs = list(runs["ddp"][0].module.parameters())
    difference = max(
        (a - b).abs().max().item() for kind in KINDS[:-1] for a, b in zip(runs[kind][0].module.parameters(), theirs)
    )
    return {**dict(zip(KINDS, slowest.tolist())), "max_param_difference": difference}


def _overlaps(ctx, kind: str) -> tuple[list[float], int]:
    """``overlap_s`` of each of a few steps after one warm-up (dtlab: its tracer; DDP: a timing hook),
    and the number of buckets."""
    cfg = MODEL_PRESETS[MODEL]
    model = _wrap(kind, build_model(cfg, seed=0).to(ctx.device))
    calls: list = []
    if kind == "ddp":
        model.register_comm_hook(None, ddp_timing_hook(calls))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = rank_batch(
        0, per_rank=SEQUENCES_PER_RANK, seq_len=cfg.seq_len, seed=0, rank=ctx.rank, world_size=ctx.world_size
    )
    x, y = x.to(ctx.device), y.to(ctx.device)  # (B / N, T)

    def step():
        _train_step(kind, model, optimizer, x, y)

    if kind != "ddp":
        tracer = CommTracer(device=ctx.device)
        with tracing(tracer):
            step()
            return steps_overlap(tracer, step, OVERLAP_STEPS), len(model.buckets)
    figures = []
    for _ in range(1 + OVERLAP_STEPS):
        calls.clear()
        step()
        figures.append(ddp_overlap_s(calls))
    return figures[1:], len(calls)


def overlap_figures(ctx) -> dict:
    """On each rank: ``overlap_s`` and the bucket count of dtlab's wrapper and of DDP."""
    figures = {}
    for kind in ("dtlab", "ddp"):
        overlaps, figures[f"{kind}_buckets"] = _overlaps(ctx, kind)
        figures[f"{kind}_overlap_s"] = median_overlap(overlaps)
    return figures


def _add_repeat(samples: dict, paired: dict) -> None:
    for kind in KINDS:
        samples[kind] += paired[kind]
    samples["max_param_difference"] = max(samples["max_param_difference"], paired["max_param_difference"])


def _measure_on(pool, n: int, repeats: int) -> dict:
    """Every timed step of each wrapper on ``n`` ranks of ``pool`` (a fresh trio of models each repeat, a
    run each, so that each is a stage said on stderr), then their overlap."""
    progress = current()
    samples: dict = {kind: [] for kind in KINDS}
    samples["max_param_difference"] = 0.0
    for r in range(repeats):
        progress.stage(
            f"{n} ranks: OverlappedDP and DDP step times, repeat {r + 1} of {repeats}",
            f"{n} 个 rank：OverlappedDP 与 DDP 的单步时间，第 {r + 1} 次，共 {repeats} 次",
        )
        _add_repeat(samples, pool.run(_paired_step_times, n, timeout=300.0).wait()[0])
    progress.stage(f"{n} ranks: overlap of communication", f"{n} 个 rank：通信与计算的重叠")
    return {**samples, **pool.run(overlap_figures, n, timeout=300.0).wait()[0]}


def run(args) -> dict:
    repeats = max(1, getattr(args, "repeats", 3))
    current().more(len(WORLD_SIZES) * (repeats + 1))
    pool = RankPool(max_size=max(WORLD_SIZES))
    results = {}
    try:
        for n in WORLD_SIZES:
            samples = _measure_on(pool, n, repeats)
            medians = {kind: statistics.median(samples[kind]) for kind in KINDS}
            results[str(n)] = {
                "dtlab_step_s": medians["dtlab"],
                "ddp_step_s": medians["ddp"],
                "ratio": medians["dtlab"] / medians["ddp"],
                "dtlab_torch_step_s": medians["dtlab_torch"],
                "torch_collectives_ratio": medians["dtlab_torch"] / medians["ddp"],
                "steps_timed": len(samples["dtlab"]),
                "max_param_difference": samples["max_param_difference"],
                **{k: v for k, v in samples.items() if k.endswith(("_overlap_s", "_buckets"))},
            }
    finally:
        pool.close()
    cfg = MODEL_PRESETS[MODEL]
    print(
        f"\ndata parallelism: {MODEL} GPT ({cfg.param_count() / 1e6:.2f}M parameters), "
        f"{SEQUENCES_PER_RANK} x {cfg.seq_len} tokens per rank, buckets of {BUCKET_CAP_MB:g} MB, gloo"
    )
    print(
        f"数据并行：{MODEL} GPT，每个 rank {SEQUENCES_PER_RANK} x {cfg.seq_len} 个 token，"
        f"桶大小 {BUCKET_CAP_MB:g} MB，gloo"
    )
    print(
        f"{'ranks':>6}{'dtlab OverlappedDP (ms)':>25}{'torch DDP (ms)':>16}{'ratio':>7}"
        f"{'on torch all-reduce (ms)':>26}{'ratio2':>7}{'buckets':>9}{'overlap dtlab (ms)':>20}"
        f"{'overlap DDP (ms)':>18}"
    )
    for n, r in results.items():
        print(
            f"{n:>6}{r['dtlab_step_s'] * 1e3:>25.1f}{r['ddp_step_s'] * 1e3:>16.1f}{r['ratio']:>7.2f}"
            f"{r['dtlab_torch_step_s'] * 1e3:>26.1f}{r['torch_collectives_ratio']:>7.2f}"
            f"{r['dtlab_buckets']:>9}{r['dtlab_overlap_s'] * 1e3:>20.2f}{r['ddp_overlap_s'] * 1e3:>18.2f}"
        )
    print(
        "dtlab OverlappedDP: buckets all-reduced by dtlab's collectives (--collectives dtlab: on one\n"
        " machine the ring over shared memory); 'on torch all-reduce': the same wrapper on torch's (gloo's\n"
        " ring over TCP), as DDP"
    )
    print(
        "dtlab OverlappedDP：桶由 dtlab 自己的集合通信全归约（--collectives dtlab：单机上经共享内存跑环）；\n"
        " “on torch all-reduce”：同一个封装改用 torch 的全归约（gloo 的环，走 TCP），与 DDP 相同"
    )
    difference = max(r["max_param_difference"] for r in results.values())
    same = (
        ("the three trained the same", "三者训练结果相同")
        if difference < 1e-4
        else ("they did NOT train the same", "它们的训练结果不同")
    )
    print(f"{same[0]}: largest parameter difference {difference:.1e} / {same[1]}：参数最大差值 {difference:.1e}")
    print(
        "(median step time of the slowest rank; ratio = dtlab / DDP, ratio2 = the same wrapper on torch's\n"
        " all-reduce / DDP, lower is better; overlap: rank 0's median time with a bucket's all-reduce in\n"
        " flight while backward computed, dtlab/bench/_overlap.py)"
    )
    print(
        "（最慢 rank 每步时间的中位数；ratio = dtlab / DDP，ratio2 = 同一封装改用 torch 的全归约 / DDP，越低越好；\n"
        " overlap：rank 0 上桶的全归约在反向传播计算期间处于传输中的时间的中位数，见 dtlab/bench/_overlap.py）",
        flush=True,
    )
    headline = str(max(WORLD_SIZES))
    return {
        "bench": "dp",
        "backend": "gloo",
        "model": MODEL,
        "headline": f"median step time on {headline} ranks, dtlab OverlappedDP / torch DDP (lower is better)",
        "ratio": results[headline]["ratio"],
        "repeats": repeats,
        "results": results,
    }
