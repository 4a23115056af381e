"""``dtlab calibrate``: measure this machine's FLOP/s and link costs, for ``dtlab plan --gpu local``.

The planner's GPUs are datasheet numbers; a learner's laptop is not on any
datasheet. This command runs on the same warm pool of local ranks that
``dtlab train`` uses (so each rank has the one thread a training rank has),
in under a minute, and writes a :class:`~dtlab.planner.profile.MachineProfile`:

* **compute**, with 1, 2 and 4 ranks running at once (4 ranks on 2 cores get
  about half a core each): the small GPT's forward and backward at a few
  micro-batch sizes, under the memory accounting a training step runs with
  (dtlab.measure.memory's meter and ledger), fitted to ``time = overhead + FLOPs / FLOP/s``; one
  matmul at the model's shapes (the machine's peak, for MFU); AdamW's step
  per parameter. Each rank measures; the profile keeps the median rank.
* **links**, at 2 and 4 ranks: gloo's all-reduce, all-gather, reduce-scatter
  and one send/recv message at a few sizes, each call after a block's forward
  and backward as in training, and kept as what it adds to that loop of
  compute on the slowest rank (:func:`measure_links`), fitted to Hockney's
  ``time = alpha + beta * n``.
* **the step's own cost**, at 1, 2 and 4 ranks: a few real ``dtlab train``
  steps, less what the profile prices of them (:func:`dtlab.planner.whole_steps.measure_steps`).

Each stage is said on stderr as it begins (dtlab/config/command_progress.py). The fitting and the file
are :mod:`dtlab.planner.profile`'s; this module only measures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path

from dtlab.config.command_progress import Progress, current, library_call
from dtlab.config.machine import describe_machine
from dtlab.planner.profile import check_profile_target
from dtlab.planner.whole_steps import WORLD_SIZES, measure_steps

LINK_SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20)  # bytes: the small GPTs' messages, and
QUICK_LINK_SIZES = (4 << 10, 256 << 10, 4 << 20)  # one large enough that beta shows
BATCHES = (1, 2, 4, 8)  # micro-batch sizes, sequences
BURST = 4  # buckets in flight at once (measure_links)


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        default=None,
        help="where to write the profile (default: $DTLAB_PROFILE, "
        "else machine.json in your dtlab directory) / 测量结果（本机性能档案）写到哪里",
    )
    parser.add_argument(
        "--model", default="small", help="the preset whose shapes are measured / 按哪个模型预设的形状测量"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer sizes and repeats (a few seconds) / 少测几种大小、少重复几次（几秒钟）",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the profile as one JSON object / 把测量结果输出为一个 JSON 对象"
    )


def run_calibrate(args: argparse.Namespace) -> int:
    from dtlab.config import MODEL_PRESETS
    from dtlab.i18n import ConfigError
    from dtlab.planner.profile import save_profile

    if args.model not in MODEL_PRESETS:
        raise ConfigError(
            f"--model {args.model!r} is not allowed; expected one of {sorted(MODEL_PRESETS)}",
            f"--model {args.model!r} 不合法；应为 {sorted(MODEL_PRESETS)} 之一",
        )
    out = check_profile_target(args.out)  # before half a minute of measuring, not after it
    with Progress("dtlab calibrate"):  # calibrate() says its stages
        profile = calibrate(model=args.model, quick=args.quick)
    path = save_profile(profile, out)
    print(json.dumps(profile.to_dict()) if args.json else format_profile(profile, path))
    return 0


def calibrate(*, model: str = "small", quick: bool = False, pool=None):
    """Measure this machine on local ranks; returns the :class:`MachineProfile` (not yet saved)."""
    from dtlab.launch import RankPool

    own = pool is None
    pool = pool or RankPool(max_size=max(WORLD_SIZES))
    try:
        with library_call("calibrate"):  # in a notebook, a progress bar; in the command, its stages
            return _measure(model, quick, pool)
    finally:
        if own:
            pool.close()


def _measure(model: str, quick: bool, pool):
    """:func:`calibrate`'s work, stage by stage: each world size's compute and links, then a few steps."""
    from dtlab.planner.profile import ComputeCost, LinkCost, MachineProfile

    compute, links = {}, {}
    current().more(len(WORLD_SIZES) + 1)
    for world in WORLD_SIZES:
        current().stage(*_stage(world))
        ranks = pool.run(measure, world, model, quick, timeout=300.0).wait()
        compute[world] = ComputeCost(
            **{key: statistics.median(r["compute"][key] for r in ranks) for key in ranks[0]["compute"]}
        )
        if world > 1:  # every rank saw the same slowest-rank times
            links[world] = {kind: LinkCost.fit(*ranks[0]["links"][kind]) for kind in ranks[0]["links"]}
    import torch

    created = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    profile = MachineProfile(
        machine=describe_machine(),
        torch=torch.__version__,
        model=model,
        created=created.replace("+00:00", "Z"),
        compute=compute,
        links=links,
    )
    current().stage(*_stage(None))
    return measure_steps(profile, pool, quick=quick)


def _stage(world: int | None) -> tuple[str, str]:
    """What :func:`calibrate` measures next, in English and Chinese: ``world`` ranks' compute and links, or
    (None) a few training steps on each world size."""
    if world is None:
        sizes = ", ".join(map(str, WORLD_SIZES))
        return f"a few training steps on {sizes} ranks", f"在 {sizes} 个 rank 上各训练几步"
    if world == 1:
        return (
            "1 rank: compute (the model's forward and backward, a matmul, AdamW)",
            "1 个 rank：计算（模型前向与反向、矩阵乘、AdamW）",
        )
    return (
        f"{world} ranks at once: compute, and the links' collectives by size",
        f"{world} 个 rank 同时：计算，以及各种大小的集合通信",
    )


# --- on each rank -------------------------------------------------------------


def _median_time(fn, repeats: int, calls: int = 1) -> float:
    """Median seconds per call over ``repeats`` samples of ``calls`` calls, every rank starting each
    sample together (a barrier first), so that what shares the cores shares them while it is timed."""
    from dtlab.comm import calls as comm

    fn()  # warm-up: allocations, connections
    samples = []
    for _ in range(repeats):
        comm.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def measure(ctx, model: str, quick: bool) -> dict:
    """This rank's compute figures and, with more than one rank, the links' times by size (rank function)."""
    from dtlab.comm import calls as comm

    comm.barrier()
    out = {"compute": measure_compute(model, repeats=3 if quick else 9)}
    if ctx.world_size > 1:
        sizes = QUICK_LINK_SIZES if quick else LINK_SIZES
        out["links"] = measure_links(ctx, model, sizes, repeats=3 if quick else 4)
    return out


def measure_compute(model: str, *, repeats: int) -> dict:
    """The small GPT's forward and backward fitted to overhead + FLOPs / FLOP/s; a matmul; AdamW."""
    import torch

    from dtlab.comm import calls as comm
    from dtlab.config import MODEL_PRESETS
    from dtlab.measure.memory import ActivationMeter, LiveBytes, counting
    from dtlab.model import build_model
    from dtlab.planner.architectures import from_model_config
    from dtlab.planner.formulas import flops_per_iteration
    from dtlab.planner.profile import fit_nonnegative

    cfg = MODEL_PRESETS[model]
    gpt = build_model(cfg, seed=0)
    arch = from_model_config(cfg)
    meter, ledger = ActivationMeter(gpt), LiveBytes()

    def forward_backward(x):  # (b, T), with the memory accounting a training step runs under
        with counting(ledger):
            with meter.track():
                loss = gpt(x, x)
            loss.backward()

    batches = {b: torch.randint(0, cfg.vocab_size, (b, cfg.seq_len)) for b in BATCHES}
    samples = {b: [] for b in BATCHES}
    for _ in range(repeats + 1):  # every size in each round, so that a change in load falls on all
        comm.barrier()
        for b, x in batches.items():
            start = time.perf_counter()
            forward_backward(x)
            samples[b].append(time.perf_counter() - start)
    seconds = [statistics.median(samples[b][1:]) for b in BATCHES]  # the first round warms up
    flops = [flops_per_iteration(arch, batch_size=b) for b in BATCHES]
    overhead, per_flop = fit_nonnegative(flops, seconds)
    d, tokens = cfg.d_model, BATCHES[-1] * cfg.seq_len
    a, w = torch.randn(tokens, d), torch.randn(d, 4 * d)  # (b T, h) @ (h, 4h): the MLP's first
    matmul = 2 * tokens * d * 4 * d / _median_time(lambda: a @ w, repeats, calls=50)
    params = list(gpt.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    step = _median_time(optimizer.step, repeats, calls=5)
    per_flop = per_flop or seconds[-1] / flops[-1]  # no slope in the noise: the largest size's rate
    return {
        "flop_s": 1 / per_flop,
        "overhead_s": overhead / cfg.n_layer,
        "matmul_flop_s": matmul,
        "optimizer_s_per_param": step / sum(p.numel() for p in params),
    }


def measure_links(ctx, model: str, sizes: tuple[int, ...], *, repeats: int) -> dict[str, tuple[list, list]]:
    """``{kind: (sizes, seconds)}``: what one call adds to a training rank's time, at each size.

    In training a collective comes between pieces of compute, never back to back: the ranks reach it
    at different times (they share the cores) and gloo's threads have gone idle. So each call here
    follows one block's forward and backward of ``model`` (4 sequences), and what is kept is the call's
    cost on the critical path: a loop of ``work(); call()`` against a loop of ``work()`` alone, per
    call (:func:`_added_by_call`, :func:`_link_call`). Timing only the call would also count the time
    a rank that got to it first waits for one still computing: that is not a cost of the call, the
    slower rank's computing is on the step's path either way.
    """
    import torch

    from dtlab.config import MODEL_PRESETS
    from dtlab.model import Block
    from dtlab.planner.profile import BURST_KINDS, LINK_KINDS

    n, rank = ctx.world_size, ctx.rank
    cfg = MODEL_PRESETS[model]
    block, x = Block(cfg), torch.randn(4, cfg.seq_len, cfg.d_model, requires_grad=True)  # (b, T, h)

    def work():  # one block's forward and backward, as between TP's calls
        block(x).sum().backward()

    calls = 4
    out = {}
    for kind in LINK_KINDS + tuple(BURST_KINDS):
        times = []
        for nbytes in sizes:
            call, per = _link_call(kind, nbytes, rank, n)
            times.append(_added_by_call(work, call, repeats, calls) / per)
        out[kind] = (list(sizes), times)
    return out


def _link_call(kind: str, nbytes: int, rank: int, n: int):
    """``(call, calls per call())`` for :func:`measure_links`: one collective of ``kind`` on ``nbytes``,
    a round trip of two messages for ``send_recv``, or BURST calls for a burst kind: in flight together
    and then waited for (DP's and ZeRO-2's buckets), or ZeRO-2's all-gathers one after another."""
    import torch

    from dtlab.comm import calls as comm
    from dtlab.planner.profile import BURST_KINDS

    bursts = BURST if kind in BURST_KINDS else 1
    whole = [torch.zeros(nbytes // 4) for _ in range(bursts)]  # (n / 4,) fp32 each
    piece = [torch.zeros(nbytes // 4 // n) for _ in range(bursts)]  # (n / 4N,)
    used = piece[0].numel() * n
    issue = {
        "all_reduce": lambda i, **kw: comm.all_reduce(whole[i], **kw),
        "all_gather": lambda i, **kw: comm.all_gather_single(whole[i][:used], piece[i], **kw),
        "reduce_scatter": lambda i, **kw: comm.reduce_scatter_single(piece[i], whole[i][:used], **kw),
    }

    def in_flight(one):
        for pending in [issue[one](i, async_op=True) for i in range(BURST)]:
            pending.wait()

    def back_to_back(one):
        for i in range(BURST):
            issue[one](i)

    if kind == "send_recv":
        return (lambda: _ping_pong(whole[0], rank, rank ^ 1, n)), 2  # pairs (0, 1), (2, 3)
    if kind == "all_gather_buckets":
        return (lambda: back_to_back("all_gather")), BURST
    if kind in BURST_KINDS:
        return (lambda: in_flight(BURST_KINDS[kind])), BURST
    return (lambda: issue[kind](0)), 1


def _added_by_call(work, call, repeats: int, calls: int) -> float:
    """Median over ``repeats`` of what ``call()`` adds per ``work()`` on the slowest rank (every rank calls this).

    Each repeat times a loop of ``work()`` alone and then a loop of ``work(); call()``, both as the
    slowest rank saw them: with nothing to call the ranks run apart and the slowest sets the pace a
    step would have; with a collective every rank's loop ends with the last one's. Their difference,
    per call, is the cost the call adds to a step; taking it pair by pair keeps a drift in the
    machine's speed (other work, the clock) out of it.
    """
    import torch

    from dtlab.comm import calls as comm

    def loop(with_call: bool) -> float:
        comm.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            work()
            if with_call:
                call()
        return (time.perf_counter() - start) / calls

    work(), call()  # warm-up
    samples = torch.tensor([[loop(False), loop(True)] for _ in range(repeats)])  # (repeats, 2)
    comm.all_reduce(samples, op=torch.distributed.ReduceOp.MAX)  # the slowest rank's
    return statistics.median((samples[:, 1] - samples[:, 0]).tolist())


def _ping_pong(tensor, rank: int, peer: int, n: int) -> None:
    from dtlab.comm import calls as comm

    if peer >= n:  # an odd rank out: nothing to exchange
        return
    if rank % 2 == 0:
        comm.send(tensor, peer)
        comm.recv(tensor, peer)
    else:
        comm.recv(tensor, peer)
        comm.send(tensor, peer)


# --- the table ------------------------------------------------------------------


def format_profile(profile, path) -> str:
    """What was measured, in English and Chinese."""
    lines = [
        f"dtlab calibrate: {profile.machine['description']}, torch {profile.torch}",
        f"dtlab calibrate：本机 {profile.machine['cores']} 核，torch {profile.torch}（测量值）",
        "",
        f"compute per rank, {profile.precision}, {profile.model} GPT's shapes / "
        f"每个 rank 的计算（{profile.precision}，{profile.model} GPT 的形状）",
        f"{'ranks':>5}  {'matmul GFLOP/s':>14}  {'model GFLOP/s':>13}  {'per block':>9}  {'AdamW':>11}"
        f"  {'per step':>9}",
        "(rank 数 / 矩阵乘 GFLOP/s / 模型前向+反向 GFLOP/s / 每个 block 的固定开销 / AdamW 每参数耗时 / 每个训练步的簿记开销)",
    ]
    for world, c in sorted(profile.compute.items()):
        lines.append(
            f"{world:>5}  {c.matmul_flop_s / 1e9:>14.2f}  {c.flop_s / 1e9:>13.2f}  "
            f"{c.overhead_s * 1e3:>6.2f} ms  {c.optimizer_s_per_param * 1e9:>6.2f} ns/p"
            f"  {c.step_s * 1e3:>6.2f} ms"
        )
    lines += [
        "",
        "links (gloo): time = alpha + beta x bytes / 链路（gloo）：时间 = alpha + beta x 字节数",
        f"{'ranks':>5}  {'collective':<22}  {'alpha (latency)':>15}  {'beta':>11}  {'1/beta':>10}",
        "(rank 数 / 集合通信 / alpha：延迟 / beta：每字节耗时 / 1/beta：带宽)",
    ]
    for world, kinds in sorted(profile.links.items()):
        for kind, cost in kinds.items():
            beta = (
                f"{cost.beta_s_per_byte * 1e9:>6.3f} ns/B  {1e-9 / cost.beta_s_per_byte:>5.2f} GB/s"
                if cost.beta_s_per_byte > 1e-13
                else f"{'-':>11}  {'-':>10}"
            )  # both clamped by the fit
            alpha = f"{cost.alpha_s * 1e6:>12.1f} µs" if cost.alpha_s > 0 else f"{'-':>15}"
            lines.append(f"{world:>5}  {kind:<22}  {alpha}  {beta}")
    from dtlab.planner.profile import default_path

    gpu = "local" if path is None or Path(path) == default_path() else str(path)
    lines += [
        "",
        f"saved / 已保存: {path}",
        f"use it / 使用: dtlab plan --gpu {gpu} ...   (the machine was as busy as it is now / "
        "测量时本机的负载会影响结果)",
    ]
    if any(c.beta_s_per_byte <= 1e-13 for kinds in profile.links.values() for c in kinds.values()):
        lines.append("(-: no bandwidth term showed above the noise / -：带宽项没有超出测量噪声)")
    if any(c.alpha_s <= 0 for kinds in profile.links.values() for c in kinds.values()):  # the fit's clamp at 0
        lines.append(
            "(alpha -: no per-message cost showed above the noise / alpha -：每条消息的固定开销没有超出测量噪声)"
        )
    return "\n".join(lines)
