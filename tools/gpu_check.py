"""``make gpu-check``: the GPU report, what dtlab does on the GPUs of this machine, in about 3 minutes.

    python tools/gpu_check.py [--out notebooks/gpu_check.json]

1. **NCCL and layouts**: the small GPT trained for a few steps on every
   (dp, tp, pp) layout the GPU count allows (one rank per GPU, NCCL; with one
   GPU, NCCL at one rank), each compared with the one-GPU loss.
2. **Memory accountant vs the allocator** (:mod:`dtlab.measure.allocator`):
   each category of dtlab's accountant (fp32, the ``medium`` preset) against
   what ``torch.cuda.memory_allocated`` saw it add, after a warm-up step, within
   5%; what the allocator holds beyond them (``workspace``) and what the first
   step added beyond its categories (library workspaces on first use), named.
3. **MFU, step by step**, of a GPT of about 100M parameters (GPT-2 small's
   width, 14 blocks, byte vocabulary, 1024 tokens) in a plain PyTorch training
   loop (:func:`plain_loop`; dtlab's model class, nothing else of dtlab), bf16
   autocast, one change a row: dtlab's eager attention, then SDPA, fused
   AdamW, torch.compile, a larger batch (64, or 32 if 64 does not fit). Each
   row: the median of 10 steps after 3 warm-up ones, in ms, tokens/s, TFLOP/s
   and MFU against the dense bf16 peak of the GPU's datasheet
   (``DTLAB_PEAK_TFLOPS`` for a GPU not listed). A row that fails (compile
   unavailable, out of memory) keeps its error; the next row builds on the
   last one that ran.
4. **dtlab / plain**: dtlab's real training loop (``dtlab.train`` on one NCCL
   rank: its records' tokens/s, memory accounting, tracer and all) with the
   last row's settings, beside that row: the ratio of tokens/s, and dtlab's MFU.
   Passes at >= 0.98 of the plain loop and MFU >= 0.45.

Results go to a JSON file beside the lessons (device, torch/CUDA/NCCL
versions, date), so a lesson can show real GPU figures. Everything the
script could not check is listed with the reason, on screen and in the
file. Without a CUDA GPU it checks nothing, says so in both languages,
writes nothing and exits 2; it exits 0 when every check passes, else 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dtlab.config import ModelConfig, TrainConfig  # noqa: E402

DEFAULT_OUT = REPO / "notebooks" / "gpu_check.json"
PEAK_BF16_TFLOPS = {  # dense (no sparsity) bf16 tensor-core peak, vendor datasheets
    "H200": 989.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
}
GPT_100M = ModelConfig(vocab_size=256, seq_len=1024, n_layer=14, n_head=12, d_model=768)
"""About 100M parameters: GPT-2 small's width and heads, 14 blocks, dtlab's byte vocabulary."""
SHAPE_FIELDS = ("vocab_size", "seq_len", "n_layer", "n_head", "d_model")
DEVICE = "cuda:0"  # where the checks in this process run (the ranks pick their own)
MEMORY_PRESET = "medium"  # the accountant check's model, in fp32
LAYOUT_STEPS = 5
WARMUP, TIMED = 3, 10  # steps: warm-up ones (compiling, first-use allocations), then timed ones
BATCHES = (8, 64, 32)  # the steps table's batch, then the larger one: the first that fits
MFU_TARGET, RATIO_TARGET = 0.45, 0.98
STEPS = (  # (row, what it changes from the last row that ran)
    ("eager attention (dtlab's causal_attention)", {}),
    ("sdpa: F.scaled_dot_product_attention", {"attention": "sdpa"}),
    ("+ fused AdamW", {"fused": True}),
    ("+ torch.compile", {"compile": True}),
    ("+ larger batch", {"batch": BATCHES[1:]}),
)


def peak_flops(device_name: str) -> tuple[float | None, str]:
    """(peak bf16 FLOP/s, where the figure comes from) for a device name; None if unknown."""
    if os.environ.get("DTLAB_PEAK_TFLOPS"):
        return float(os.environ["DTLAB_PEAK_TFLOPS"]) * 1e12, "DTLAB_PEAK_TFLOPS"
    for key, tflops in PEAK_BF16_TFLOPS.items():  # the more specific names come first
        if key in device_name:
            return tflops * 1e12, f"{key} dense bf16 datasheet peak, {tflops:g} TFLOP/s"
    return None, f"unknown GPU {device_name!r}: set DTLAB_PEAK_TFLOPS"


def layouts(gpus: int) -> list[dict]:
    """Every dp x tp x pp on 1, 2, 4, 8 ranks (at most ``gpus``) the small GPT can split
    (tp <= 4 heads, pp <= 4 blocks, dp divides the batch of 8)."""
    out = []
    for world in (w for w in (1, 2, 4, 8) if w <= gpus):
        for tp in (1, 2, 4):
            for pp in (1, 2, 4):
                if world % (tp * pp) == 0 and 8 % (world // (tp * pp)) == 0:
                    out.append({"dp": world // (tp * pp), "tp": tp, "pp": pp, "micro_batches": 2 if pp > 1 else 1})
    return out


def model_flops_per_step(cfg: ModelConfig, params: int, tokens: int) -> float:
    """6N per token (forward 2N, backward 4N) plus attention 12 x layers x d x T (PaLM, App. B)."""
    return tokens * (6 * params + 12 * cfg.n_layer * cfg.d_model * cfg.seq_len)


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(device) if str(device).startswith("cuda") else "cpu"


def speed(cfg: ModelConfig, params: int, batch: int, step_s: list[float], device: str) -> dict:
    """The median step of ``step_s`` as ms, tokens/s, model TFLOP/s and MFU (None where the peak is unknown)."""
    step, tokens = statistics.median(step_s), batch * cfg.seq_len
    flops = model_flops_per_step(cfg, params, tokens)
    peak, _ = peak_flops(device_name(device))
    return {
        "ms": step * 1e3,
        "tokens_per_s": tokens / step,
        "tflops": flops / step / 1e12,
        "mfu": flops / step / peak if peak else None,
    }


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


class SDPA(nn.Module):
    """PyTorch's fused attention as an attention layer's ``core``: FlashAttention or memory-efficient on CUDA."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)


def plain_loop(
    cfg: ModelConfig,
    *,
    batch: int,
    device: str,
    attention: str = "sdpa",
    fused: bool = True,
    compile: bool = True,
    bf16: bool = True,
    steps: int = TIMED,
    warmup: int = WARMUP,
) -> dict:
    """The training loop a PyTorch user writes, for dtlab's GPT class: nothing else of dtlab in it.

    SDPA (``attention="sdpa"``; "eager": the model's own softmax(QK^T)V), fused
    AdamW, ``torch.compile`` of the whole model, bf16 autocast: each a switch, a
    row of the steps table. A step runs from reading the batch (the same
    batches as dtlab's) to the update done, the device synchronized: the
    median of ``steps`` after ``warmup``.
    """
    from dtlab.data import global_batch
    from dtlab.model import build_model, count_params

    model = build_model(cfg, seed=0).to(device)
    if attention == "sdpa":
        for block in model.blocks:
            block.attn.core = SDPA()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), fused=fused)
    forward = torch.compile(model, dynamic=False) if compile else model
    times = []
    for step in range(warmup + steps):
        _sync(device)
        start = time.perf_counter()
        x, y = global_batch(step, batch_size=batch, seq_len=cfg.seq_len, seed=0)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            loss = forward(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        times.append(time.perf_counter() - start)
    return {**speed(cfg, count_params(model), batch, times[warmup:], device), "loss": loss.item()}


def _row(name: str, settings: dict, cfg: ModelConfig, device: str, **loop) -> dict:
    """One row of the steps table: its settings, its speed or its error, and how long it took (compiling too)."""
    row, start = {"step": name, **settings}, time.perf_counter()
    try:
        row.update(plain_loop(cfg, device=device, **settings, **loop))
    except Exception as error:  # noqa: BLE001 - a row that fails must not hide the others
        row["error"] = f"{type(error).__name__}: {error}"[:600]
    finally:
        torch.compiler.reset()
        if str(device).startswith("cuda"):
            torch.cuda.empty_cache()
    row["wall_s"] = time.perf_counter() - start
    return row


def steps_table(cfg: ModelConfig, device: str, batches=BATCHES, **loop) -> list[dict]:
    """Each row of :data:`STEPS` is the last row that ran plus one change; the larger batch is the first that runs."""
    settings = {"attention": "eager", "fused": False, "compile": False, "batch": batches[0]}
    rows = []
    for name, change in STEPS:
        tries = [dict(settings, batch=b) for b in batches[1:]] if "batch" in change else [dict(settings, **change)]
        for tried in tries:
            row = _row(name, tried, cfg, device, **loop)
            if "error" not in row or "out of memory" not in row["error"].lower():
                break
        rows.append(row)
        if "error" not in row:
            settings = tried
    return rows


class GPT100MConfig(TrainConfig):
    """A TrainConfig whose model is :data:`GPT_100M` (dtlab's presets are sized for a CPU; none has its shape)."""

    def model_config(self, *args, **kwargs) -> ModelConfig:
        shape = {name: getattr(GPT_100M, name) for name in SHAPE_FIELDS}
        return dataclasses.replace(super().model_config(*args, **kwargs), **shape)


def dtlab_path(config: TrainConfig, pool, device: str, warmup: int = WARMUP) -> dict:
    """``dtlab.train(config)`` on ``pool``: the real loop's tokens/s (its records' median after ``warmup``).

    Beside it, the medians of rank 0's ``compute_s``, ``comm_s`` and ``idle_s``: what
    the loop spends outside the training work (gathering records, the loss, the
    next batch), with the device idle, and the last step's memory by category.
    """
    import dtlab

    run = dtlab.train(config, pool=pool).wait()
    cfg, records = config.model_config(), run.records[warmup:]
    step_s = [config.batch_size * cfg.seq_len / r["tokens_per_s"] for r in records]
    ranks = [r["ranks"][0] for r in records]
    return {
        **speed(cfg, cfg.param_count(), config.batch_size, step_s, device),
        "loss": run.records[-1]["loss"],
        **{key: statistics.median(r[key] for r in ranks) for key in ("compute_s", "comm_s", "idle_s")},
        "mem": run.records[-1]["ranks"][0]["mem"],
        "run_wall_s": run.summary["wall_s"] if run.summary else None,  # compiling included
    }


def environment() -> dict:
    cuda = torch.cuda.is_available()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": cuda,
        "gpus": torch.cuda.device_count() if cuda else 0,
        "device": torch.cuda.get_device_name(0) if cuda else None,
        "names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
    }


def check_layouts(pool, gpus: int, results: dict) -> None:
    """Train each layout on one NCCL pool; compare its losses with the one-GPU run's."""
    import dtlab

    reference = None
    for layout in layouts(gpus):
        name = "layout dp{dp} tp{tp} pp{pp}".format(**layout)
        try:
            run = dtlab.train(TrainConfig(**layout, steps=LAYOUT_STEPS, seed=0), pool=pool).wait()
        except Exception as error:  # noqa: BLE001 - one layout failing must not hide the others
            results["failed"][name] = repr(error)
            continue
        losses = run.losses()
        reference = reference or losses
        gap = max(abs(a - b) / abs(b) for a, b in zip(losses, reference))
        results["checked"][name] = {
            "ok": gap < 1e-3,
            "max_relative_loss_gap": gap,
            "final_loss": losses[-1],
            "backend": run.summary["backend"] if run.summary else None,
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in run.records[1:]),
        }
    if gpus == 1:
        results["not_checked"]["layouts of 2 or more ranks"] = (
            "one GPU: NCCL cannot put two ranks on the same device / 只有一张 GPU：NCCL 不能把两个 rank "
            "放在同一个设备上"
        )


def check_memory(results: dict) -> None:
    """Each category of dtlab's accountant beside what the CUDA allocator saw it add (fp32, medium, batch 8)."""
    from dtlab.config import MODEL_PRESETS
    from dtlab.measure.allocator import check_accountant
    from dtlab.model import build_model

    cfg, cuda = MODEL_PRESETS[MEMORY_PRESET], DEVICE.startswith("cuda")
    x, y = (torch.randint(0, cfg.vocab_size, (8, cfg.seq_len)) for _ in range(2))  # (B, T)
    if cuda:
        torch.cuda.reset_peak_memory_stats(DEVICE)
    found = check_accountant(build_model(cfg, seed=0), x, y, DEVICE)
    found["model"] = f"{MEMORY_PRESET}, fp32, batch 8, AdamW"
    found["max_memory_allocated"] = torch.cuda.max_memory_allocated(DEVICE) if cuda else None
    results["checked"]["memory accountant vs torch.cuda.memory_allocated"] = found
    if cuda:
        torch.cuda.empty_cache()


def check_steps(results: dict, found: dict) -> None:
    """The MFU steps table of the ~100M GPT in the plain loop; ``found["rows"]`` for the next check."""
    found["rows"] = rows = steps_table(GPT_100M, DEVICE, batches=BATCHES, steps=TIMED, warmup=WARMUP)
    peak, source = peak_flops(device_name(DEVICE))
    results["checked"]["MFU steps of a ~100M GPT (plain PyTorch loop, bf16 autocast)"] = {
        "ok": not any("error" in row for row in rows),
        "params": GPT_100M.param_count(),
        "seq_len": GPT_100M.seq_len,
        "steps": f"median of {TIMED} after {WARMUP} warm-up",
        "flops_per_token": "6N + 12 x layers x d_model x seq_len (PaLM, App. B)",
        "peak_flops_assumed": peak,
        "peak_source": source,
        "rows": rows,
    }


def fastest_config(row: dict) -> TrainConfig:
    """dtlab's training run with the settings of a row of the steps table: the ~100M GPT, bf16."""
    return GPT100MConfig(
        batch_size=row["batch"],
        precision="bf16",
        attention=row["attention"],
        compile=row["compile"],
        steps=WARMUP + TIMED,
        seed=0,
        timeout_s=600.0,  # compiling takes a while before the first record
    )


def check_dtlab_vs_plain(pool, results: dict, found: dict) -> None:
    """dtlab's real loop with the fastest row's settings, beside that row of the plain loop."""
    ran = [row for row in found.get("rows", []) if "error" not in row]
    if not ran:
        raise RuntimeError("no row of the steps table ran: nothing to compare dtlab with")
    plain = ran[-1]
    config = fastest_config(plain)
    dtlab_speed = dtlab_path(config, pool, DEVICE, warmup=WARMUP)
    ratio = dtlab_speed["tokens_per_s"] / plain["tokens_per_s"]
    mfu = dtlab_speed["mfu"]
    results["checked"]["dtlab / plain PyTorch loop"] = {
        "ok": ratio >= RATIO_TARGET and (mfu is None or mfu >= MFU_TARGET),
        "ratio_tokens_per_s": ratio,
        "targets": {"ratio": RATIO_TARGET, "mfu": MFU_TARGET},
        "dtlab": {"settings": "dtlab.train on one rank: " + repr(config), **dtlab_speed},
        "plain": plain,
    }


def refuse(env: dict) -> int:
    print(
        "gpu-check: no CUDA GPU here (torch.cuda.is_available() is False); nothing was checked "
        "and nothing written.\ngpu-check：本机没有 CUDA GPU（torch.cuda.is_available() 为 False）；"
        "没有检查任何项目，也没有写入文件。",
        file=sys.stderr,
    )
    print(f"torch {env['torch']}, CUDA build: {env['cuda']}", file=sys.stderr)
    for item in (
        "NCCL initialisation and every layout / NCCL 初始化与各种布局",
        "memory accountant vs torch.cuda allocator / 内存统计与 CUDA 分配器对照",
        "MFU step by step of a ~100M GPT (eager, sdpa, fused AdamW, compile, batch) / "
        "约 1 亿参数 GPT 的逐步 MFU（eager、sdpa、融合 AdamW、compile、批大小）",
        "dtlab's training loop vs a plain PyTorch loop / dtlab 训练循环与纯 PyTorch 循环对比",
    ):
        print(f"  not checked / 未检查: {item}", file=sys.stderr)
    return 2


def table(rows: list[dict]) -> str:
    """The steps table as Markdown: the figures, or the error of a row that failed."""
    lines = ["| step | batch | ms | tokens/s | TFLOP/s | MFU |", "|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['step']} | {row['batch']} | failed: {row['error'][:80]} | | | |")
        else:
            mfu = "?" if row["mfu"] is None else f"{row['mfu']:.3f}"
            figures = f"{row['ms']:.1f} | {row['tokens_per_s']:,.0f} | {row['tflops']:.1f} | {mfu}"
            lines.append(f"| {row['step']} | {row['batch']} | {figures} |")
    return "\n".join(lines)


def report(results: dict, out: str) -> int:
    for name, value in results["checked"].items():
        brief = {k: v for k, v in value.items() if k not in ("rows", "steps", "why")}
        print(("✓" if value["ok"] else "✗"), name, json.dumps(brief, default=str)[:2000])
        if "rows" in value:
            print(table(value["rows"]))
    for name, why in {**results["not_checked"], **results["failed"]}.items():
        print("- not checked / 未检查:", name, "—", why)
    print(f"gpu-check: {results['elapsed_s']:.0f} s; results written to / 结果已写入 {out}")
    ok = not results["failed"] and all(v["ok"] for v in results["checked"].values())
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/gpu_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="where the JSON results go")
    args = parser.parse_args(argv)
    env = environment()
    if not env["cuda_available"]:
        return refuse(env)
    from dtlab.launch import RankPool

    started, found = time.perf_counter(), {}
    results = {"environment": env, "checked": {}, "not_checked": {}, "failed": {}}
    pool = RankPool(max_size=env["gpus"])
    checks = {
        "layouts": lambda: check_layouts(pool, env["gpus"], results),
        "memory": lambda: check_memory(results),
        "mfu steps": lambda: check_steps(results, found),
        "dtlab / plain": lambda: check_dtlab_vs_plain(pool, results, found),
    }
    try:
        for name, check in checks.items():
            try:
                check()
            except Exception as error:  # noqa: BLE001 - report every check, whatever fails
                results["failed"][name] = repr(error)
    finally:
        pool.close()
    results["elapsed_s"] = time.perf_counter() - started
    Path(args.out).write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    return report(results, args.out)


if __name__ == "__main__":
    sys.exit(main())
