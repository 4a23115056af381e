"""Measured pipeline bubble beside the formula, for PP 4 with 4 and 16 micro-batches, both schedules.

GPipe's bubble is (p - 1) / (m + p - 1) of the step (Huang et al., 2018), and
1F1B's is the same (Narayanan et al., 2021). A stage idles while it waits for
its neighbour; the formula assumes every stage has a processor of its own.

How idle time is measured here. Four ranks on a machine with fewer cores
(two, on the course's laptop) also wait for a *core*, and the operating
system hides a pipeline's idle stages behind the busy ones: wall-clock idle is
then not the pipeline's bubble. So the bench measures two things on the same
steps, and prints both:

* ``wall``: each rank's share of its step spent outside any action's compute
  (the pipeline runtime's ``bubble_fraction``), averaged over ranks and steps.
  It mixes the pipeline's waits with the cores' sharing.
* ``measured``: each action's compute as the CPU time its rank's thread spent
  on it (``time.thread_time``: time waiting for a core is not counted), its
  median over the measured steps, laid out as the schedule's dependencies
  allow, one core per stage and messages taking no time
  (:func:`dtlab.parallel.pipeline.schedule.simulate` with these durations): idle /
  (ranks x step). Uneven stages (the first embeds, the last computes the
  loss) and uneven actions show in it; the transfers do not, nor the
  step-to-step jitter of sharing cores (the median).

On one GPU per stage both come close to the formula. There is no PyTorch
built-in to put beside it in the same run, so ``ratio`` is ``measured`` over
the formula at m = 16 with 1F1B (1.0 is ideal).
"""

from __future__ import annotations

import statistics

from dtlab.config import TrainConfig
from dtlab.config.command_progress import current
from dtlab.launch import RankPool
from dtlab.parallel.pipeline.schedule import schedule as make_schedule
from dtlab.parallel.pipeline.schedule import simulate

STAGES = 4
MICRO_BATCHES = (4, 16)


def measured_bubble(records: list[dict], kind: str, stages: int, micro_batches: int) -> float:
    """The steps' bubble from their actions' CPU times (each action's median over ``records``), laid out
    by the schedule's dependencies."""
    actions = make_schedule(kind, stages, micro_batches)
    durations = {}
    for stage, mine in enumerate(actions):
        steps = [next(r["timeline"] for r in record["ranks"] if r["pp"] == stage) for record in records]
        for done in steps:
            if [d["action"] for d in done] != [str(a) for a in mine]:
                raise RuntimeError(f"stage {stage} ran {[d['action'] for d in done]}, not the {kind} schedule")
        durations.update({a: statistics.median(done[j]["cpu"] for done in steps) for j, a in enumerate(mine)})
    return simulate(actions, durations=durations).bubble_fraction


def run(args) -> dict:
    import dtlab.train

    progress = current()
    progress.more(2 * len(MICRO_BATCHES))
    pool = RankPool(max_size=STAGES)
    rows = []
    try:
        for kind in ("gpipe", "1f1b"):
            for m in MICRO_BATCHES:
                progress.stage(
                    f"{kind}, {m} micro-batches on {STAGES} stages", f"{kind}，{STAGES} 个阶段，{m} 个微批次"
                )
                config = TrainConfig(
                    pp=STAGES,
                    micro_batches=m,
                    schedule=kind,
                    model="medium",
                    batch_size=16,
                    steps=2 + max(3, args.repeats),
                )
                records = dtlab.train.start(config, pool=pool).wait().records[2:]
                wall = statistics.mean(r["bubble_fraction"] for record in records for r in record["ranks"])
                measured = measured_bubble(records, kind, STAGES, m)
                rows.append(
                    {
                        "schedule": kind,
                        "m": m,
                        "formula": (STAGES - 1) / (m + STAGES - 1),
                        "measured": measured,
                        "wall": wall,
                    }
                )
    finally:
        pool.close()
    print(f"pipeline bubble, PP = {STAGES} (medium GPT, 16 sequences per step)")
    print(f"流水线气泡，PP = {STAGES}（medium GPT，每步 16 条序列）")
    print(f"{'schedule':>9} {'m':>3} {'formula (p-1)/(m+p-1)':>22} {'measured':>9} {'wall':>6}")
    for row in rows:
        print(f"{row['schedule']:>9} {row['m']:>3} {row['formula']:>22.3f} {row['measured']:>9.3f} {row['wall']:>6.3f}")
    print(
        "measured: each action's CPU time (not its wait for a core; median over the steps), laid out by the\n"
        "  schedule's dependencies, one core per stage; wall: idle share of each rank's wall-clock step\n"
        "  (includes sharing the cores)"
    )
    print(
        "measured：每个动作的 CPU 时间（不含等待 CPU 核的时间；各步的中位数），按调度的依赖关系排布，每个阶段\n"
        "  独占一个核；wall：各 rank 墙钟时间中的空闲比例（包含共享 CPU 核的影响）",
        flush=True,
    )
    headline = next(r for r in rows if r["schedule"] == "1f1b" and r["m"] == MICRO_BATCHES[-1])
    return {
        "bench": "pipeline",
        "rows": rows,
        "ratio": headline["measured"] / headline["formula"],
        "idle": "thread CPU time per action (median over steps), laid out by the schedule's dependencies",
    }
