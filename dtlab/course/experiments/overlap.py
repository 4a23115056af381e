"""Lesson 02: when does overlapped DP really overlap? Buckets started while backward still computes.

:class:`dtlab.parallel.data_parallel.OverlappedDP` starts a bucket's all-reduce the
moment its last gradient exists. Backward makes the last layers' gradients
first, so a bucket that fills early is sent while earlier layers are still
being differentiated: that is the overlap. The bucket holding the first
layers' gradients fills last, when backward has nothing left to compute. So
with one bucket (the small GPT's 0.9 MiB of gradients under DDP's 25 MB cap)
nothing overlaps, and with k buckets k - 1 of them start early.
:func:`buckets_started_early` counts it (deterministic) and times it with the
communication tracer (a timing: overlap seconds, which vary run to run).
"""

from __future__ import annotations

from dtlab.comm.collectives import group_size_and_rank
from dtlab.comm.tracer import CommTracer, tracing
from dtlab.config import MODEL_PRESETS
from dtlab.data import global_batch
from dtlab.model import build_model
from dtlab.parallel.data_parallel import OverlappedDP


def buckets_started_early(ctx, bucket_cap_mb: float, steps: int = 3) -> dict:
    """On each rank: one OverlappedDP step of the small GPT; buckets, and how many were sent early.

    A bucket is *early* if its all-reduce started while some parameter's
    gradient was still to come: a hook registered after DP's (so it runs
    after DP's hook for the same parameter) counts the buckets in flight
    (``Bucket.work``) each time a gradient arrives but is not the last.
    """
    size, rank = group_size_and_rank(None)
    cfg = MODEL_PRESETS["small"]
    model = build_model(cfg, seed=0)
    dp = OverlappedDP(model, bucket_cap_mb=bucket_cap_mb)
    params = [p for p in model.parameters() if p.requires_grad]
    seen = {"arrived": 0, "early": 0}

    def arrived(_param) -> None:
        seen["arrived"] += 1
        if seen["arrived"] < len(params):  # backward still has gradients to make
            seen["early"] = sum(b.work is not None for b in dp.buckets)

    for p in params:
        p.register_post_accumulate_grad_hook(arrived)
    tracer, overlap = CommTracer(ctx.device), []
    per_rank = 8 // size
    for step in range(steps):
        x, y = global_batch(step, batch_size=8, seq_len=cfg.seq_len, seed=0)
        seen.update(arrived=0, early=0)
        with tracing(tracer):
            with tracer.compute():
                dp(x[rank * per_rank : (rank + 1) * per_rank], y[rank * per_rank : (rank + 1) * per_rank]).backward()
            dp.finish_gradient_sync()
            overlap.append(tracer.end_step()["overlap_s"])
        model.zero_grad(set_to_none=True)
    return {"rank": rank, "buckets": len(dp.buckets), "started_early": seen["early"], "overlap_s": min(overlap)}
