"""``make gpu-check``: what dtlab does on real GPUs, checked on one machine in under 10 minutes.

    python tools/gpu_check.py [--out notebooks/gpu_check.json]

1. **NCCL and layouts**: the small GPT trained for a few steps on every
   (dp, tp, pp) layout the GPU count allows (one rank per GPU, NCCL), each
   compared with the one-GPU loss.
2. **Memory accountant vs the allocator**: dtlab's bytes of parameters,
   gradients, optimizer state and saved activations (dtlab/measure/memory.py) against
   what ``torch.cuda.memory_allocated`` saw each category add, and the step's
   ``max_memory_allocated``.
3. **bf16 step time and MFU** of a GPT of about 100M parameters on one GPU,
   with the peak FLOP/s it assumes stated (dense bf16 tensor-core peak from
   the vendor's datasheet; set ``DTLAB_PEAK_TFLOPS`` for a GPU not listed).

Results go to a JSON file beside the lessons, so a lesson can show real GPU
figures. Everything the script could not check (no GPU at all; with one GPU,
every layout of two or more ranks, since NCCL cannot put two ranks on one
device) is listed with the reason, on screen and in the file. Without a CUDA
GPU it checks nothing, says so in both languages, writes nothing and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

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
LAYOUT_STEPS = 5


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


def environment() -> dict:
    cuda = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": cuda,
        "gpus": torch.cuda.device_count() if cuda else 0,
        "names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
    }


def check_layouts(gpus: int, results: dict) -> None:
    """Train each layout on one NCCL pool; compare its losses with the one-GPU run's."""
    import dtlab
    from dtlab.launch import RankPool

    reference, pool = None, RankPool(max_size=gpus)
    try:
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
                "backend": "nccl",
                "tokens_per_s": statistics.median(r["tokens_per_s"] for r in run.records[1:]),
            }
    finally:
        pool.close()
    if gpus == 1:
        results["not_checked"]["layouts of 2 or more ranks"] = (
            "one GPU: NCCL cannot put two ranks on the same device / 只有一张 GPU：NCCL 不能把两个 rank "
            "放在同一个设备上"
        )


def check_memory(results: dict) -> None:
    """Each category of dtlab's accountant beside what the CUDA allocator saw it add (fp32, medium)."""
    from dtlab.config import MODEL_PRESETS
    from dtlab.measure.memory import ActivationMeter, model_state_bytes
    from dtlab.model import build_model

    dev, cfg = "cuda:0", MODEL_PRESETS["medium"]
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated
    base = allocated(dev)
    model = build_model(cfg, seed=0).to(dev)
    measured = {"params": allocated(dev) - base}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len), device=dev)  # (B, T)
    meter = ActivationMeter(exclude=model)
    before = allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    with meter.track():
        loss = model(x, x)
        measured["activations"] = allocated(dev) - before  # what forward left alive for backward
        loss.backward()
    del loss
    measured["grads"] = allocated(dev) - before
    before_step = allocated(dev)
    optimizer.step()
    measured["optimizer"] = allocated(dev) - before_step
    counted = {**model_state_bytes(model.parameters(), optimizer), "activations": meter.peak}
    results["checked"]["memory accountant vs torch.cuda.memory_allocated"] = {
        "ok": all(abs(measured[k] / counted[k] - 1) < 0.1 for k in counted),
        "counted_bytes": counted,
        "allocator_bytes": measured,
        "max_memory_allocated": torch.cuda.max_memory_allocated(dev),
        "note": "allocator figures round up to 512-byte blocks; activations include the loss",
    }


def check_mfu(results: dict) -> None:
    """bf16 autocast step (forward, backward, AdamW) of the ~100M GPT; step time and MFU."""
    from dtlab.model import build_model, count_params

    dev, batch = "cuda:0", 8
    model = build_model(GPT_100M, seed=0).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, GPT_100M.vocab_size, (batch, GPT_100M.seq_len), device=dev)  # (B, T)
    times = []
    for step in range(13):  # 3 warm-up steps, 10 timed
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= 3:
            times.append(time.perf_counter() - start)
    params, step_s = count_params(model), statistics.median(times)
    flops = model_flops_per_step(GPT_100M, params, batch * GPT_100M.seq_len)
    peak, source = peak_flops(torch.cuda.get_device_name(0))
    results["checked"]["bf16 step of a ~100M GPT on one GPU"] = {
        "ok": True,
        "params": params,
        "batch": batch,
        "seq_len": GPT_100M.seq_len,
        "step_time_s": step_s,
        "model_flops_per_step": flops,
        "achieved_tflops": flops / step_s / 1e12,
        "peak_flops_assumed": peak,
        "peak_source": source,
        "mfu": flops / step_s / peak if peak else None,
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
        "bf16 step time and MFU of a ~100M GPT / 约 1 亿参数 GPT 的 bf16 步时与 MFU",
    ):
        print(f"  not checked / 未检查: {item}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/gpu_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="where the JSON results go")
    args = parser.parse_args(argv)
    env = environment()
    if not env["cuda_available"]:
        return refuse(env)
    results = {"environment": env, "checked": {}, "not_checked": {}, "failed": {}}
    checks = {
        "layouts": lambda: check_layouts(env["gpus"], results),
        "memory": lambda: check_memory(results),
        "mfu": lambda: check_mfu(results),
    }
    for name, check in checks.items():
        try:
            check()
        except Exception as error:  # noqa: BLE001 - report every check, whatever fails
            results["failed"][name] = repr(error)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    for name, value in results["checked"].items():
        print(("✓" if value["ok"] else "✗"), name, json.dumps(value))
    for name, why in {**results["not_checked"], **results["failed"]}.items():
        print("- not checked / 未检查:", name, "—", why)
    print(f"gpu-check: results written to / 结果已写入 {args.out}")
    ok = not results["failed"] and all(v["ok"] for v in results["checked"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
