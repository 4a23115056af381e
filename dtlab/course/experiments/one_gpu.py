"""Lesson 13 and ``make gpu-check``: one GPU made fast, one change a row, and the MFU of each row.

* :func:`plain_loop`: the training loop a PyTorch user writes for dtlab's GPT
  class, nothing else of dtlab in it: the attention kernel (``eager``, the
  explicit softmax(QK^T)V, or ``sdpa``), fused AdamW, ``torch.compile`` and
  bf16 autocast, each a switch. Its speed in the units of the table: ms a
  step, tokens/s, model TFLOP/s and MFU.
* :func:`steps_table`: the rows of :data:`STEPS`, each the last row that ran
  plus one change (eager -> sdpa -> fused AdamW -> compile -> a larger batch);
  :func:`gains` is what each row gained over the one before it.
* :func:`live_table`: that table measured on this machine, the ~100M GPT
  (:data:`GPT_100M`) on a CUDA GPU, the small GPT on the CPU.
* :func:`stored_report`: the table ``tools/gpu_check.py`` measured on a GPU and
  stored in ``notebooks/gpu_check.json``, with the device and the date.

MFU (Chowdhery et al. 2022, PaLM, App. B) is the model's FLOPs per second over
the device's peak: :func:`dtlab.planner.formulas.model_flops_per_token` per
token, 6N + 12 x layers x d_model x seq_len, times tokens per second.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

import torch

from dtlab.config import MODEL_PRESETS, ModelConfig
from dtlab.planner.formulas import model_flops_per_token

GPT_100M = ModelConfig(vocab_size=256, seq_len=1024, n_layer=14, n_head=12, d_model=768)
"""About 100M parameters: GPT-2 small's width and heads, 14 blocks, dtlab's byte vocabulary."""
PEAK_BF16_TFLOPS = {  # dense (no sparsity) bf16 tensor-core peak, vendor datasheets
    "H200": 989.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
}
WARMUP, TIMED = 3, 10  # steps: warm-up ones (compiling, first-use allocations), then timed ones
BATCHES = (8, 64, 32)  # the steps table's batch, then the larger one: the first that fits
STEPS = (  # (row, what it changes from the last row that ran)
    ("eager attention (dtlab's causal_attention)", {}),
    ("sdpa: F.scaled_dot_product_attention", {"attention": "sdpa"}),
    ("+ fused AdamW", {"fused": True}),
    ("+ torch.compile", {"compile": True}),
    ("+ larger batch", {"batch": BATCHES[1:]}),
)
STEP_KEYS = ("eager", "sdpa", "fused", "compile", "batch")
"""Each row of :data:`STEPS` in a word: what a learner names as the step that gains most."""
CPU_MODEL, CPU_BATCHES, CPU_WARMUP, CPU_TIMED = "small", (8, 32), 1, 3
""":func:`live_table` on a CPU: the small GPT, fp32, few steps, so that a lesson stays fast."""


def peak_flops(device_name: str) -> tuple[float | None, str]:
    """(peak bf16 FLOP/s, where the figure comes from) for a device name; None if unknown."""
    if os.environ.get("DTLAB_PEAK_TFLOPS"):
        return float(os.environ["DTLAB_PEAK_TFLOPS"]) * 1e12, "DTLAB_PEAK_TFLOPS"
    for key, tflops in PEAK_BF16_TFLOPS.items():  # the more specific names come first
        if key in device_name:
            return tflops * 1e12, f"{key} dense bf16 datasheet peak, {tflops:g} TFLOP/s"
    return None, f"unknown GPU {device_name!r}: set DTLAB_PEAK_TFLOPS"


def model_flops_per_step(cfg: ModelConfig, params: int, tokens: int) -> float:
    """6N per token (forward 2N, backward 4N) plus attention 12 x layers x d x T (PaLM, App. B)."""
    per_token = model_flops_per_token(params, layers=cfg.n_layer, hidden=cfg.d_model, seq_len=cfg.seq_len)
    return tokens * per_token


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

    ``attention``: the model's kernel (``"sdpa"``: ``F.scaled_dot_product_attention``,
    ``"eager"``: the explicit softmax(QK^T)V), fused AdamW, ``torch.compile`` of the
    whole model, bf16 autocast: each a switch, a row of the steps table. A step
    runs from reading the batch (the same batches as dtlab's) to the update done,
    the device synchronized: the median of ``steps`` after ``warmup``.
    """
    from dtlab.data import global_batch
    from dtlab.model import build_model, count_params

    model = build_model(dataclasses.replace(cfg, attention=attention), seed=0).to(device)
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


def steps_table(cfg: ModelConfig, device: str, batches=BATCHES, *, skip: dict | None = None, **loop) -> list[dict]:
    """Each row of :data:`STEPS` is the last row that ran plus one change; the larger batch is the first that runs.

    ``skip``: step key (:data:`STEP_KEYS`) -> why that row is not run here; the row keeps the reason
    (``"skipped"``) and the next row builds on the last one that ran.
    """
    settings = {"attention": "eager", "fused": False, "compile": False, "batch": batches[0]}
    rows = []
    for key, (name, change) in zip(STEP_KEYS, STEPS):
        tries = [dict(settings, batch=b) for b in batches[1:]] if "batch" in change else [dict(settings, **change)]
        if skip and key in skip:
            rows.append({"step": name, **tries[0], "skipped": skip[key]})
            continue
        for tried in tries:
            row = _row(name, tried, cfg, device, **loop)
            if "error" not in row or "out of memory" not in row["error"].lower():
                break
        rows.append(row)
        if "error" not in row:
            settings = tried
    return rows


def table(rows: list[dict]) -> str:
    """The steps table as Markdown: the figures, or the error of a row that failed."""
    lines = ["| step | batch | ms | tokens/s | TFLOP/s | MFU |", "|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row or "skipped" in row:
            why = f"failed: {row['error'][:80]}" if "error" in row else f"not run: {row['skipped'][:80]}"
            lines.append(f"| {row['step']} | {row['batch']} | {why} | | | |")
        else:
            mfu = "?" if row["mfu"] is None else f"{row['mfu']:.3f}"
            figures = f"{row['ms']:.1f} | {row['tokens_per_s']:,.0f} | {row['tflops']:.1f} | {mfu}"
            lines.append(f"| {row['step']} | {row['batch']} | {figures} |")
    return "\n".join(lines)


def gains(rows: list[dict]) -> dict[str, float]:
    """Step key -> its row's tokens/s over the last row before it that ran (rows that did not run are left out)."""
    out, last = {}, None
    for key, row in zip(STEP_KEYS, rows):
        if "tokens_per_s" not in row:
            continue
        if last is not None:
            out[key] = row["tokens_per_s"] / last
        last = row["tokens_per_s"]
    return out


def gains_most(rows: list[dict]) -> str:
    """The step key whose row gained most over the one before it."""
    found = gains(rows)
    return max(found, key=found.get)


def text_table(rows: list[dict]) -> str:
    """The steps table as text, headers in both languages, each row's gain over the last row that ran."""
    up = gains(rows)
    lines = [
        f"{'step / 步骤':<14} {'attention':>9} {'fused':>5} {'compile':>7} {'batch':>5} {'ms':>8} "
        f"{'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'gain / 提升':>11}"
    ]
    for key, row in zip(STEP_KEYS, rows):
        settings = f"{key:<14} {row['attention']:>9} {row['fused']!s:>5} {row['compile']!s:>7} {row['batch']:>5}"
        if "tokens_per_s" not in row:
            why = row.get("skipped") or row.get("error", "")
            lines.append(f"{settings}   not run / 未运行: {why[:70]}")
            continue
        mfu = "?" if row["mfu"] is None else f"{row['mfu']:.3f}"
        gain = f"x{up[key]:.2f}" if key in up else ""
        lines.append(
            f"{settings} {row['ms']:>8.1f} {row['tokens_per_s']:>10,.0f} {row['tflops']:>8.3g} {mfu:>6} {gain:>11}"
        )
    return "\n".join(lines)


def live_table(device: str | None = None, *, compile_on_cpu: bool = False) -> dict:
    """The steps table measured here: the ~100M GPT in bf16 on a CUDA GPU (about a minute on an H200, compiling
    included), else the small GPT in fp32 on the CPU with :data:`CPU_TIMED` steps (seconds), where
    ``torch.compile`` is not run unless ``compile_on_cpu`` (compiling takes tens of seconds on two cores).

    Returns ``{"device", "model", "rows"}``.
    """
    device = device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    if str(device).startswith("cuda"):
        rows = steps_table(GPT_100M, device)
        return {"device": device_name(device), "model": "~100M GPT, bf16", "rows": rows}
    skip = None if compile_on_cpu else {"compile": "compiling takes tens of seconds on a CPU / CPU 上编译要几十秒"}
    rows = steps_table(
        MODEL_PRESETS[CPU_MODEL], "cpu", CPU_BATCHES, skip=skip, bf16=False, steps=CPU_TIMED, warmup=CPU_WARMUP
    )
    return {"device": "cpu", "model": f"{CPU_MODEL} GPT, fp32", "rows": rows}


def stored_report(path: str | Path = "gpu_check.json") -> dict:
    """The steps table of a GPU report (``tools/gpu_check.py``'s JSON): ``{"device", "date", "torch", "cuda",
    "params", "peak_source", "rows"}``; ``date`` is the day it was measured (YYYY-MM-DD)."""
    report = json.loads(Path(path).read_text(encoding="utf-8"))
    env = report["environment"]
    steps = next(v for k, v in report["checked"].items() if k.startswith("MFU steps"))
    return {
        "device": env["device"],
        "date": env["date"][:10],
        "torch": env["torch"],
        "cuda": env["cuda"],
        "params": steps["params"],
        "peak_source": steps["peak_source"],
        "rows": steps["rows"],
    }
