"""Cold versus warm start of the local rank pool: time to the first record of a 4-rank run.

There is no PyTorch built-in that keeps ranks warm between runs, so the
comparison is with how a cold start works (``torch.multiprocessing.spawn``
or torchrun both start fresh processes and import torch in each): the cold
pool's first run. ``ratio`` = warm / cold (time: lower is better).
"""
from __future__ import annotations

import statistics
import time

from dtlab.config import TrainConfig
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
    colds, warms = [], []
    for _ in range(max(1, args.repeats)):
        pool = RankPool(max_size=world)
        try:
            colds.append(_time_to_first_record(pool, config))
            warms.append(_time_to_first_record(pool, config))
        finally:
            pool.close()
    cold, warm = statistics.median(colds), statistics.median(warms)
    print(f"time to the first record of a {world}-rank run (median of {len(colds)})")
    print(f"{world}-rank 运行收到第一条记录所需时间（{len(colds)} 次的中位数）")
    print(f"  cold pool / 冷启动: {cold:8.3f} s   (every run: {', '.join(f'{c:.2f}' for c in colds)})")
    print(f"  warm pool / 预热后: {warm:8.3f} s   (every run: {', '.join(f'{w:.3f}' for w in warms)})")
    print(f"  warm is {cold / warm:.0f}x sooner / 预热后快 {cold / warm:.0f} 倍")
    return {"bench": "pool", "world_size": world, "cold_s": cold, "warm_s": warm,
            "speedup": cold / warm, "ratio": warm / cold}
