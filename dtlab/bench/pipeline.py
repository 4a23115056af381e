"""Measured pipeline bubble beside the formula, for PP 4 with 4 and 16 micro-batches.

GPipe's bubble is (p - 1) / (m + p - 1) of the step (Huang et al., 2018).
The measurement is each rank's idle share of its step (from the pipeline
runtime's timeline), averaged over ranks and steps. On a CPU with fewer cores
than ranks the stages also wait for a core, so expect the measurement above
the formula; on one GPU per stage it comes close. There is no PyTorch
built-in to put beside it here in the same run, so ``ratio`` is measured
over the formula at m = 16 (lower is better, 1.0 is ideal).
"""
from __future__ import annotations

import statistics

from dtlab.config import TrainConfig
from dtlab.launch import RankPool


def run(args) -> dict:
    import dtlab.train

    pool = RankPool(max_size=4)
    rows = []
    try:
        for schedule in ("gpipe", "1f1b"):
            for m in (4, 16):
                config = TrainConfig(pp=4, micro_batches=m, schedule=schedule, model="medium",
                                     batch_size=16, steps=2 + max(1, args.repeats))
                run = dtlab.train.start(config, pool=pool).wait()
                measured = statistics.mean(r["bubble_fraction"] for record in run.records[2:]
                                           for r in record["ranks"])
                rows.append({"schedule": schedule, "m": m, "formula": 3 / (m + 3), "measured": measured})
    finally:
        pool.close()
    print("pipeline bubble, PP = 4 (medium GPT, 16 sequences per step)")
    print("流水线气泡，PP = 4（medium GPT，每步 16 条序列）")
    print(f"{'schedule':>9} {'m':>3} {'formula (p-1)/(m+p-1)':>22} {'measured':>9}")
    for row in rows:
        print(f"{row['schedule']:>9} {row['m']:>3} {row['formula']:>22.3f} {row['measured']:>9.3f}")
    headline = next(r for r in rows if r["schedule"] == "1f1b" and r["m"] == 16)
    return {"bench": "pipeline", "rows": rows, "ratio": headline["measured"] / headline["formula"]}
