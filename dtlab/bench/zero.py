"""dtlab's ZeRO stage 3 beside PyTorch's FSDP2 (``fully_shard``): time per training step and memory per rank.

The same small GPT, sharded in the same units (each block, each embedding,
the final LayerNorm and the head, as :func:`dtlab.parallel.zero.units.unit_modules`
lists them, then the root), the same data, the same AdamW, the same world
size. Each repeat trains a few steps with one and then with the other,
alternating which goes first, so that drift on a shared machine hits both;
the figure is the median step time of the slowest rank. Memory is the model
states each rank holds between steps (parameters, gradients, optimizer
state), counted from the tensors. ``overlap_s``: how long some all-gather or
reduce-scatter was in flight while the rank computed, for dtlab from its
tracer's records, for FSDP2 from its calls timed by the same rule
(:mod:`dtlab.bench._overlap`), median of a few steps apart from the timed ones.
dtlab runs twice: with prefetch 1 (FSDP2's default: the next unit's
all-gather in flight while this one computes) and 0 (one unit at a time).
Headline: dtlab's step time (prefetch 1) over FSDP2's on the most ranks (lower is better).

Beside it, ZeRO stage 2's gradient memory: the most gradient bytes alive at
once during a step (the trainer's ledger, :class:`dtlab.measure.memory.LiveBytes`,
without activations: each gradient as autograd accumulates it, ZeRO's
buckets, flat copies and shard), with ``--bucket-mb``'s default buckets
(DeepSpeed's ``overlap_comm``) against Ψ/N + two buckets, and with the whole
flat gradient reduce-scattered after backward against its Ψ + L ≈ 2Ψ.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from dtlab.bench._overlap import median_overlap, steps_overlap, torch_calls_traced
from dtlab.comm.tracer import CommTracer, tracing
from dtlab.config import MODEL_PRESETS, TrainConfig
from dtlab.config.command_progress import current
from dtlab.data import rank_batch
from dtlab.launch import RankPool
from dtlab.measure.memory import LiveBytes, counting, tensor_bytes
from dtlab.model import build_model
from dtlab.parallel.zero import apply_zero, unit_modules
from dtlab.parallel.zero.stage2_buckets import bucket_windows

WORLD_SIZES = (2, 4)
MODEL = "small"
SEQUENCES_PER_RANK = 8
WARMUP_STEPS, TIMED_STEPS = 2, 6
OVERLAP_STEPS = 4
KINDS = ("dtlab", "dtlab_p0", "fsdp2")
PREFETCH = {"dtlab": 1, "dtlab_p0": 0}
"""ZeRO-3's prefetch of each dtlab kind (:class:`dtlab.parallel.zero.stage3.ZeroStage3`)."""


def _fsdp2(model: torch.nn.Module):
    from torch.distributed.fsdp import fully_shard

    for unit in unit_modules(model):
        fully_shard(unit)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _local(t) -> int:
    """Bytes of this rank's part of a (possibly distributed) tensor."""
    return tensor_bytes(t.to_local() if hasattr(t, "to_local") else t)


def _fsdp2_memory(model, optimizer) -> dict[str, int]:
    state = sum(
        _local(v) for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0
    )
    return {
        "params": sum(_local(p) for p in model.parameters()),
        "grads": sum(_local(p.grad) for p in model.parameters() if p.grad is not None),
        "optimizer": state,
    }


def _train(ctx, kind: str) -> tuple[list[float], dict]:
    """Seconds per step of the slowest rank for each timed step, and this rank's memory."""
    cfg = MODEL_PRESETS[MODEL]
    model = build_model(cfg, seed=0).to(ctx.device)
    if kind in PREFETCH:
        model, optimizer = apply_zero(model, stage=3, lr=1e-3, prefetch=PREFETCH[kind])
    else:
        model, optimizer = _fsdp2(model)
    times = []
    for step in range(WARMUP_STEPS + TIMED_STEPS):
        x, y = rank_batch(
            step, per_rank=SEQUENCES_PER_RANK, seq_len=cfg.seq_len, seed=0, rank=ctx.rank, world_size=ctx.world_size
        )
        x, y = x.to(ctx.device), y.to(ctx.device)  # (B / N, T)
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model(x, y).backward()
        optimizer.step()
        if ctx.device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    memory = optimizer.memory_bytes() if kind in PREFETCH else _fsdp2_memory(model, optimizer)
    slowest = torch.tensor(times[WARMUP_STEPS:], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist(), memory


def _overlap_s(ctx, kind: str) -> float:
    """Median ``overlap_s`` of a few steps after one warm-up, traced (dtlab/bench/_overlap.py)."""
    cfg = MODEL_PRESETS[MODEL]
    model = build_model(cfg, seed=0).to(ctx.device)
    model, optimizer = (
        apply_zero(model, stage=3, lr=1e-3, prefetch=PREFETCH[kind]) if kind in PREFETCH else _fsdp2(model)
    )
    x, y = rank_batch(
        0, per_rank=SEQUENCES_PER_RANK, seq_len=cfg.seq_len, seed=0, rank=ctx.rank, world_size=ctx.world_size
    )
    x, y = x.to(ctx.device), y.to(ctx.device)  # (B / N, T)

    def step():
        optimizer.zero_grad(set_to_none=True)
        model(x, y).backward()
        optimizer.step()

    tracer = CommTracer(device=ctx.device)
    with tracing(tracer) if kind in PREFETCH else torch_calls_traced(tracer):
        step()
        return median_overlap(steps_overlap(tracer, step, OVERLAP_STEPS))


class _GradientLedger(LiveBytes):
    """The trainer's ledger without the loss moment (the logits): gradient bytes only."""

    def moment(self, source: str, extra: int) -> None:
        if source != "logits":
            super().moment(source, extra)


def _zero2_gradient_peak(ctx, bucket_mb: float | None) -> dict:
    """The most gradient bytes alive at once in ZeRO-2's second step on this rank, and what it keeps."""
    cfg = MODEL_PRESETS[MODEL]
    model, optimizer = apply_zero(build_model(cfg, seed=0).to(ctx.device), stage=2, bucket_mb=bucket_mb, lr=1e-3)
    ledger = _GradientLedger()
    ledger.watch_gradients(model.parameters())
    for step in range(2):
        x, y = rank_batch(
            step, per_rank=SEQUENCES_PER_RANK, seq_len=cfg.seq_len, seed=0, rank=ctx.rank, world_size=ctx.world_size
        )
        optimizer.zero_grad(set_to_none=True)
        ledger.start({})
        with counting(ledger):
            model(x.to(ctx.device), y.to(ctx.device)).backward()
            optimizer.finish_gradient_sync()
        optimizer.step()
    return {"peak": ledger.high, **optimizer.memory_bytes()}


def measure(ctx, repeats: int, first: int = 0) -> dict:
    """On each rank: every timed step of each implementation, alternating which runs first (repeats
    numbered from ``first``); the memory each held after its last."""
    samples: dict = {kind: [] for kind in KINDS}
    memory: dict = {}
    for repeat in range(first, first + repeats):
        for kind in KINDS if repeat % 2 == 0 else KINDS[::-1]:
            times, memory[kind] = _train(ctx, kind)
            samples[kind] += times
    return {"samples": samples, "memory": memory}


def measure_apart(ctx) -> dict:
    """On each rank: each implementation's overlap, and ZeRO-2's gradient peaks (apart from the timed steps)."""
    bucket_mb = TrainConfig().bucket_mb
    return {
        "overlap_s": {kind: _overlap_s(ctx, kind) for kind in KINDS},
        "zero2": {"buckets": _zero2_gradient_peak(ctx, bucket_mb), "whole": _zero2_gradient_peak(ctx, None)},
    }


def _measure_on(pool, n: int, repeats: int) -> list[dict]:
    """:func:`measure` then :func:`measure_apart` on ``n`` ranks of ``pool``, a run per repeat so that each
    is a stage said on stderr; per rank, the samples of every repeat and the rest."""
    progress = current()
    ranks = [{"samples": {kind: [] for kind in KINDS}} for _ in range(n)]
    for r in range(repeats):
        progress.stage(
            f"{n} ranks: ZeRO-3 and FSDP2 step times, repeat {r + 1} of {repeats}",
            f"{n} 个 rank：ZeRO-3 与 FSDP2 的单步时间，第 {r + 1} 次，共 {repeats} 次",
        )
        for mine, got in zip(ranks, pool.run(measure, n, 1, r, timeout=600.0).wait()):
            for kind in KINDS:
                mine["samples"][kind] += got["samples"][kind]
            mine["memory"] = got["memory"]
    progress.stage(f"{n} ranks: overlap, and ZeRO-2's gradient peak", f"{n} 个 rank：重叠，以及 ZeRO-2 的梯度峰值")
    for mine, got in zip(ranks, pool.run(measure_apart, n, timeout=600.0).wait()):
        mine.update(got)
    return ranks


def run(args) -> dict:
    repeats = max(1, getattr(args, "repeats", 3))
    current().more(len(WORLD_SIZES) * (repeats + 1))
    pool = RankPool(max_size=max(WORLD_SIZES))
    results = {}
    try:
        for n in WORLD_SIZES:
            measured = _measure_on(pool, n, repeats)
            medians = {kind: statistics.median(v) for kind, v in measured[0]["samples"].items()}
            results[str(n)] = {
                "dtlab_step_s": medians["dtlab"],
                "fsdp2_step_s": medians["fsdp2"],
                "ratio": medians["dtlab"] / medians["fsdp2"],
                "dtlab_p0_step_s": medians["dtlab_p0"],
                "ratio_p0": medians["dtlab_p0"] / medians["fsdp2"],
                "steps_timed": len(measured[0]["samples"]["dtlab"]),
                "memory_per_rank": [r["memory"] for r in measured],
                **{f"{kind}_overlap_s": measured[0]["overlap_s"][kind] for kind in KINDS},
                "zero2": _zero2_figures(measured, n),
            }
    finally:
        pool.close()
    _print(results)
    headline = str(max(WORLD_SIZES))
    return {
        "benchmark": "zero",
        "bench": "zero",
        "backend": "gloo",
        "model": MODEL,
        "headline": f"median step time on {headline} ranks, dtlab ZeRO-3 (prefetch 1) / torch FSDP2 (lower is better)",
        "ratio": results[headline]["ratio"],
        "repeats": repeats,
        "results": results,
    }


def _zero2_figures(measured: list[dict], n: int) -> dict:
    """ZeRO-2's measured gradient peak (the largest over ranks) beside its formulas, in bytes."""
    psi = MODEL_PRESETS[MODEL].param_count()
    bucket_mb = TrainConfig().bucket_mb
    windows = bucket_windows(psi, n, 4, bucket_mb)
    two = max((a + b for a, b in zip(windows, windows[1:])), default=windows[0])
    return {
        "bucket_mb": bucket_mb,
        "buckets": len(windows),
        "peak_bytes": max(r["zero2"]["buckets"]["peak"] for r in measured),
        "shard_plus_buckets_bytes": 4 * (-(-psi // n) + two),  # Ψ/N + two buckets (fp32)
        "whole_peak_bytes": max(r["zero2"]["whole"]["peak"] for r in measured),
        "whole_bytes": 4 * (psi + -(-psi // n) * n),
    }  # Ψ + L ≈ 2Ψ (fp32)


def _print(results: dict) -> None:
    cfg = MODEL_PRESETS[MODEL]
    print(
        f"\nZeRO stage 3: {MODEL} GPT ({cfg.param_count() / 1e6:.2f}M parameters), "
        f"{SEQUENCES_PER_RANK} x {cfg.seq_len} tokens per rank, gloo"
    )
    print(
        f"{'ranks':>6}{'dtlab ZeRO-3 (ms)':>20}{'prefetch 0 (ms)':>17}{'torch FSDP2 (ms)':>19}{'ratio':>8}"
        f"{'ratio p0':>10}{'dtlab KiB/rank':>17}{'FSDP2 KiB/rank':>17}{'overlap dtlab (ms)':>20}"
        f"{'overlap p0 (ms)':>17}{'overlap FSDP2 (ms)':>20}"
    )
    for n, r in results.items():
        mem = r["memory_per_rank"][0]
        states = {kind: sum(mem[kind][k] for k in ("params", "grads", "optimizer")) / 1024 for kind in KINDS}
        print(
            f"{n:>6}{r['dtlab_step_s'] * 1e3:>20.1f}{r['dtlab_p0_step_s'] * 1e3:>17.1f}"
            f"{r['fsdp2_step_s'] * 1e3:>19.1f}{r['ratio']:>8.2f}{r['ratio_p0']:>10.2f}"
            f"{states['dtlab']:>17.1f}{states['fsdp2']:>17.1f}{r['dtlab_overlap_s'] * 1e3:>20.2f}"
            f"{r['dtlab_p0_overlap_s'] * 1e3:>17.2f}{r['fsdp2_overlap_s'] * 1e3:>20.2f}"
        )
    print(
        "(median step time of the slowest rank; dtlab ZeRO-3 prefetches one unit ahead (FSDP2's default),\n"
        " prefetch 0 gathers one unit at a time; ratio = dtlab / FSDP2, lower is better;\n"
        " KiB/rank: parameters + gradients + optimizer state held by rank 0 between steps;\n"
        " overlap: rank 0's median time with a collective in flight while it computed)"
    )
    print(
        "（最慢 rank 每步时间的中位数；dtlab ZeRO-3 提前预取一个单元（FSDP2 的默认行为），prefetch 0\n"
        " 每次只收集一个单元；ratio = dtlab / FSDP2，越低越好；KiB/rank：rank 0 在两步之间持有的\n"
        " 参数 + 梯度 + 优化器状态；overlap：rank 0 计算期间有集合通信在传输中的时间的中位数）",
        flush=True,
    )
    first = next(iter(results.values()))["zero2"]
    print(
        f"\nZeRO stage 2, gradient bytes at their peak in a step (measured, largest rank), "
        f"--bucket-mb {first['bucket_mb']}"
    )
    print(
        f"{'ranks':>6}{'buckets':>9}{'measured KiB':>14}{'Ψ/N + 2 buckets':>17}"
        f"{'whole buffer KiB':>18}{'Ψ + L ≈ 2Ψ':>12}"
    )
    for n, r in results.items():
        z = r["zero2"]
        print(
            f"{n:>6}{z['buckets']:>9}{z['peak_bytes'] / 1024:>14.1f}{z['shard_plus_buckets_bytes'] / 1024:>17.1f}"
            f"{z['whole_peak_bytes'] / 1024:>18.1f}{z['whole_bytes'] / 1024:>12.1f}"
        )
    print(
        "(measured: each gradient as backward accumulates it, the buckets and the shard, no activations;\n"
        " beside it the formula Ψ/N + two buckets (one in flight, one filling; the gradient being staged\n"
        " adds at most one parameter's); whole buffer: the same model reduce-scattering the flat gradient\n"
        " after backward, against its formula Ψ + L, every gradient beside its flat copy)"
    )
    print(
        "（实测：反向传播中逐个累加的梯度、桶与分片，不含激活；旁边是公式 Ψ/N + 两个桶（一个在传输、一个在填充；\n"
        " 正在放入桶的梯度至多再加一个参数的大小）；整个缓冲区：同一模型在反向传播后对整个扁平梯度归约散射，\n"
        " 对照其公式 Ψ + L，即所有梯度与其扁平副本并存）",
        flush=True,
    )
