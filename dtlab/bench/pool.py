"""Cold versus warm start of the local rank pool: time to the first record of a 4-rank run.

There is no PyTorch built-in that keeps ranks warm between runs, so the
comparison is with how a cold start works (``torch.multiprocessing.spawn``
or torchrun both start fresh processes and import torch in each): the first
run of a pool whose ranks are spawned. Beside it, the first run of a new pool
forked from dtlab's fork server (which has imported torch once: how a pool
comes back after a failure ended its ranks). ``ratio`` = warm / cold (time:
lower is better).
"""

from __future__ import annotations

import statistics
import time

from dtlab.config import TrainConfig
from dtlab.config.command_progress import current
from dtlab.launch import RankPool


def _time_to_first_record(pool: RankPool, config: TrainConfig) -> float:
    import dtlab.train

    t0 = time.monotonic()
    run = dtlab.train.start(config, pool=pool)
    for _ in run:
        first = time.monotonic() - t0
        break
    run.wait()
    return first


def run(args) -> dict:
    world = getattr(args, "world_size", 4)
    config = TrainConfig(dp=world, steps=3, model="tiny", batch_size=8)
    colds, restarts, warms = [], [], []
    repeats = max(1, args.repeats)
    progress = current()
    progress.more(2 * repeats)
    for r in range(repeats):
        for times, method in ((colds, "spawn"), (restarts, None)):
            what = (
                ("a cold start (spawned ranks)", "冷启动（spawn 的 rank）")
                if method
                else ("a new pool from the fork server, then a warm run", "从 fork server 新建进程池，再预热运行")
            )
            progress.stage(f"{what[0]}, repeat {r + 1} of {repeats}", f"{what[1]}，第 {r + 1} 次，共 {repeats} 次")
            pool = RankPool(max_size=world, start_method=method)
            try:
                times.append(_time_to_first_record(pool, config))
                if method is None:
                    warms.append(_time_to_first_record(pool, config))
            finally:
                pool.close()
    cold, restart, warm = (statistics.median(t) for t in (colds, restarts, warms))
    print(f"time to the first record of a {world}-rank run (median of {len(colds)})")
    print(f"{world}-rank 运行收到第一条记录所需时间（{len(colds)} 次的中位数）")
    print(f"  cold, spawned ranks / 冷启动（spawn）:        {cold:8.3f} s   (every run: {_each(colds)})")
    print(f"  new pool, fork server / 新进程池（fork server）: {restart:8.3f} s   (every run: {_each(restarts)})")
    print(f"  warm pool / 预热后:                          {warm:8.3f} s   (every run: {_each(warms)})")
    print(f"  warm is {cold / warm:.0f}x sooner than cold / 预热后比冷启动快 {cold / warm:.0f} 倍")
    return {
        "bench": "pool",
        "world_size": world,
        "cold_s": cold,
        "forkserver_s": restart,
        "warm_s": warm,
        "speedup": cold / warm,
        "ratio": warm / cold,
    }


def _each(times: list[float]) -> str:
    return ", ".join(f"{t:.3f}" for t in times)
