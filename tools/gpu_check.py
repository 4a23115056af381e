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
   loop (:func:`dtlab.course.experiments.one_gpu.plain_loop`, which lesson 13 runs
   too; dtlab's model class, nothing else of dtlab), bf16
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
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dtlab.config import ModelConfig, TrainConfig  # noqa: E402
from dtlab.config.command_progress import Progress  # noqa: E402
from dtlab.course.experiments.one_gpu import (  # noqa: E402, F401 - the steps table and its units live in the package
    BATCHES,
    GPT_100M,
    PEAK_BF16_TFLOPS,
    STEPS,
    TIMED,
    WARMUP,
    device_name,
    model_flops_per_step,
    peak_flops,
    plain_loop,
    speed,
    steps_table,
    table,
)

DEFAULT_OUT = REPO / "notebooks" / "gpu_check.json"
SHAPE_FIELDS = ("vocab_size", "seq_len", "n_layer", "n_head", "d_model")
DEVICE = "cuda:0"  # where the checks in this process run (the ranks pick their own)
MEMORY_PRESET = "medium"  # the accountant check's model, in fp32
LAYOUT_STEPS = 5
MFU_TARGET, RATIO_TARGET = 0.45, 0.98


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


STAGES = (
    ("NCCL and every layout the GPUs allow", "NCCL 与 GPU 数允许的每种布局"),
    ("the memory accountant against the CUDA allocator", "内存统计与 CUDA 分配器对照"),
    (
        "the MFU steps table (eager, sdpa, fused AdamW, compile, batch; ~1 min)",
        "MFU 逐步表（eager、sdpa、融合 AdamW、compile、批大小；约 1 分钟）",
    ),
    ("dtlab's training loop beside the plain loop", "dtlab 训练循环与纯 PyTorch 循环对比"),
)
"""What each check measures, said on stderr as it begins (stage k of 4, the seconds so far)."""


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
    checks = {  # name: (what it measures, in English and Chinese, for the progress on stderr; the check)
        "layouts": (STAGES[0], lambda: check_layouts(pool, env["gpus"], results)),
        "memory": (STAGES[1], lambda: check_memory(results)),
        "mfu steps": (STAGES[2], lambda: check_steps(results, found)),
        "dtlab / plain": (STAGES[3], lambda: check_dtlab_vs_plain(pool, results, found)),
    }
    try:
        with Progress("make gpu-check", total=len(checks)) as progress:
            for name, (stage, check) in checks.items():
                progress.stage(*stage)
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
