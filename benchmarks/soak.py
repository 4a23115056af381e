"""`python benchmarks/soak.py [--runs 1000] [--json]`: a thousand short runs on one warm pool.

A course kernel moves sliders hundreds of times; each move stops the run in
flight and starts another on the same warm ranks. This does that: short
training runs on a cycle of layouts, every other one stopped after its first
step (a slider moved), all on one pool in this one process. It prints what
the caller and each worker hold (descriptors, threads, resident memory)
after the first pass over the layouts and after the last run. Flat is the
goal: a run must give back every socket, thread, pipe and store it took.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import dtlab
from dtlab.config import TrainConfig
from dtlab.launch import RankPool
from dtlab.launch.resources import usage

LAYOUTS = (
    dict(dp=2),
    dict(dp=4, zero=1),
    dict(tp=2),
    dict(pp=2, micro_batches=2),
    dict(dp=2, pp=2, micro_batches=2, precision="fp16"),
    dict(dp=2, tp=2, zero=2),
)
"""The slider positions a learner moves through, one run each, over and over."""


def snapshot(pool: RankPool) -> dict[str, dict]:
    """What the caller and each worker hold now."""
    readings = {"caller": usage(os.getpid())}
    readings.update({f"rank {i}": usage(pid) for i, pid in enumerate(pool.pids)})
    return readings


def soak(runs: int, *, steps: int = 3) -> dict:
    """``runs`` short runs on one pool; every odd one stopped after its first record."""
    pool = RankPool(max_size=4)
    started, start = time.perf_counter(), None
    try:
        for i in range(runs):
            config = TrainConfig(model="tiny", steps=steps, batch_size=4, **LAYOUTS[i % len(LAYOUTS)])
            run = dtlab.train(config, pool=pool)
            for _ in run:
                if i % 2:
                    run.stop()  # a slider moved: end at the next step, keep the pool warm
            if i + 1 == len(LAYOUTS):
                start = snapshot(pool)
        end = snapshot(pool)
    finally:
        pool.close()
    return {"runs": runs, "seconds_per_run": (time.perf_counter() - started) / runs, "start": start, "end": end}


def _table(result: dict) -> str:
    lines = [f"{'process':<8} {'fds':>11} {'threads':>11} {'RSS MiB':>15}"]
    for name, first in (result["start"] or {}).items():
        last = result["end"].get(name) or {}
        cells = [f"{first[k]:>5} -> {last.get(k, '?'):<5}" for k in ("fds", "threads")]
        lines.append(f"{name:<8} {cells[0]:>11} {cells[1]:>11} {first['rss_mib']:>7} -> {last.get('rss_mib', '?'):<7}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.runs < len(LAYOUTS):
        parser.error(f"--runs must be at least {len(LAYOUTS)} (one pass over the layouts)")
    result = soak(args.runs)
    print(
        f"soak: {result['runs']} runs, {result['seconds_per_run']:.2f} s per run; "
        f"start = after the first {len(LAYOUTS)} runs (one per layout), end = after the last"
    )
    print(_table(result))
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
