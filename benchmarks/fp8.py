"""`python benchmarks/fp8.py [--model small] [--steps 200] [--lr LR] [--json]`: fp8 training against bf16, same seed.

Issue 39's goal at full size: after 200 steps of the small GPT, `--precision fp8` ends within 3% of bf16's
loss with the same seed, at dp 1 and at dp 2 x tp 2. Checked at dtlab's default learning rate (`dtlab train`'s
`--lr`) for both scalings at both layouts: current scaling (`--fp8-amax-history 0`) and delayed scaling
(history 4, at dp 2 x tp 2 with sequence parallelism on, to cover that path too); `tests/test_fp8.py` checks
the same on the tiny GPT to keep CI's time. Each run's loss is the mean of its last ten steps (one batch's
noise averaged out). Prints each run's loss, its ratio to bf16's and the gap, and each run's steady tokens/s
(the fp8 matmuls run through torch._scaled_mm, on the CPU here); exits 1 when an fp8 run misses the goal.

One more run is a control, not judged: fp32, whose only difference from bf16 is rounding. Its gap is how far
*any* change of rounding moves this run's loss at this learning rate. At `--lr 3e-3` without warmup the small
GPT's loss jumps between steps 10 and 30 and where it lands is chaotic: over seeds 0-4 fp32 alone ends up to
4.5% from bf16, and bf16's own loss moved 2.2% when its master weights moved into the optimizer, so a 3% goal
there measures the jump, not fp8 (benchmarks/HISTORY.md).
"""

from __future__ import annotations

import argparse
import json
import sys

import dtlab
from dtlab.config import TrainConfig
from dtlab.launch import RankPool

GOAL = 0.03
REFERENCE = "bf16, dp 1"
CONTROL = "fp32, dp 1 (control)"


def runs(common: dict) -> dict[str, TrainConfig]:
    """The reference, the control and the fp8 runs the goal is checked on, by name."""
    tp = dict(dp=2, tp=2)
    return {
        REFERENCE: TrainConfig(precision="bf16", **common),
        CONTROL: TrainConfig(precision="fp32", **common),
        "fp8 current, dp 1": TrainConfig(precision="fp8", **common),
        "fp8 delayed (4), dp 1": TrainConfig(precision="fp8", fp8_amax_history=4, **common),
        "fp8 current, dp 2 x tp 2": TrainConfig(precision="fp8", **tp, **common),
        "fp8 delayed (4), dp 2 x tp 2 + sp": TrainConfig(precision="fp8", fp8_amax_history=4, sp=True, **tp, **common),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", help="model preset / 模型预设")
    parser.add_argument("--steps", type=int, default=200, help="steps of each run / 每次运行的步数")
    parser.add_argument(
        "--lr", type=float, default=TrainConfig().lr, help="peak learning rate (dtlab train's default) / 峰值学习率"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object / 输出一个 JSON 对象")
    args = parser.parse_args(argv)
    common = dict(model=args.model, steps=args.steps, lr=args.lr, batch_size=8, seed=0)
    out = {}
    pool = RankPool(max_size=4)
    try:
        for name, config in runs(common).items():
            print(f"{name} ... / 运行中 ……", file=sys.stderr)
            run = dtlab.train(config, pool=pool).wait()
            losses = run.losses()
            speeds = [r["tokens_per_s"] for r in run.records[1:] if r.get("tokens_per_s")]
            out[name] = {
                "loss": sum(losses[-10:]) / len(losses[-10:]),  # fewer than ten with --steps < 10
                "tokens_per_s": sorted(speeds)[len(speeds) // 2] if speeds else None,
            }
    finally:
        pool.close()
    reference = out[REFERENCE]["loss"]
    for r in out.values():
        r["ratio"] = r["loss"] / reference
        r["gap"] = abs(r["ratio"] - 1)
    ok = all(r["gap"] < GOAL for name, r in out.items() if name.startswith("fp8"))
    if args.json:
        print(
            json.dumps({"model": args.model, "steps": args.steps, "lr": args.lr, "runs": out, "goal": GOAL, "ok": ok})
        )
        return 0 if ok else 1
    print(f"{args.model}, {args.steps} steps, lr {args.lr:g}, seed 0; loss = mean of the last 10 steps")
    for name, r in out.items():
        speed = f"{r['tokens_per_s']:8.0f} tokens/s" if r["tokens_per_s"] else ""
        print(f"{name:36s} loss {r['loss']:.4f}  x bf16 {r['ratio']:.4f}  gap / 差距 {r['gap'] * 100:5.2f}%  {speed}")
    print(
        "control: fp32 differs from bf16 only in rounding, not judged / 对照：fp32 与 bf16 只在舍入上不同，不计入目标"
    )
    print(f"every fp8 run within {GOAL:.0%} of bf16 / 所有 fp8 运行都在 bf16 的 {GOAL:.0%} 以内: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
