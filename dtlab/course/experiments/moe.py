"""Lesson 12: the all-to-all on real ranks beside torch's, and the routers at step 0.

* :func:`all_to_all_versus_torch` (on ranks): dtlab's pairwise exchange and
  ``dist.all_to_all_single`` on the same pieces, even and uneven, with bytes
  and steps counted.
* :func:`routing_at_start` (in this process): what the untrained routers drop
  at step 0 for several capacity factors.
* :func:`expert_parallel_bytes` (on ranks): every all-to-all of one EP training
  step, traced (:mod:`dtlab.comm.tracer`): the dispatch and combine volume
  k·b·s·h·(N-1)/N measured.

The lesson's answer key and its exercise (the top-k dispatch, graded on
ranks) are in :mod:`dtlab.course.exercises.lesson12`.
"""

from __future__ import annotations

from dataclasses import asdict

import torch
import torch.distributed as dist

from dtlab.comm.all_to_all import all_to_all_schedule, all_to_all_single
from dtlab.comm.collectives import CommMeter, group_size_and_rank


def all_to_all_versus_torch(ctx, nbytes: int = 1 << 20) -> dict:
    """One even all-to-all of an ``nbytes`` float32 tensor, metered and traced, beside torch's;
    then an uneven one (rank r sends r + j + 1 rows to rank j)."""
    n, rank = group_size_and_rank(None)
    x = (torch.arange(nbytes // 4) % 7 + rank).float().to(ctx.device)  # (nbytes / 4,)
    ours, theirs = torch.empty_like(x), torch.empty_like(x)
    meter, trace = CommMeter(), []
    all_to_all_single(ours, x, meter=meter, trace=trace)
    dist.all_to_all_single(theirs, x)
    send = [rank + j + 1 for j in range(n)]
    recv = [i + rank + 1 for i in range(n)]
    rows = torch.full((sum(send), 2), float(rank), device=ctx.device)  # (rows, 2)
    uneven, uneven_torch = (torch.empty(sum(recv), 2, device=ctx.device) for _ in range(2))
    all_to_all_single(uneven, rows, recv, send)
    dist.all_to_all_single(uneven_torch, rows, recv, send)
    expected = [asdict(e) for e in all_to_all_schedule(n) if e.rank == rank]
    return {
        "rank": rank,
        "nbytes": x.numel() * x.element_size(),
        "bytes_sent": meter.bytes_sent["all_to_all"],
        "steps": len(trace),
        "trace_is_schedule": [{k: t[k] for k in expected[0]} for t in trace] == expected,
        "equal_to_torch": torch.equal(ours, theirs),
        "uneven_equal_to_torch": torch.equal(uneven, uneven_torch),
    }


def routing_at_start(config, capacity_factors) -> dict:
    """In this process: what the untrained model's routers do with step 0's batch, per capacity factor.

    ``config`` is a :class:`dtlab.config.TrainConfig` with ``experts``; for each
    factor (``None``: no limit), the assignments routed and dropped over all
    MoE layers. No training, no ranks: routing is deterministic for a seed.
    """
    import dataclasses

    from dtlab.data import global_batch
    from dtlab.model import build_model
    from dtlab.parallel.moe import take_expert_stats

    out = {}
    for factor in capacity_factors:
        cfg = dataclasses.replace(config.model_config(), capacity_factor=factor)
        model = build_model(cfg, seed=config.seed)
        x, _ = global_batch(0, batch_size=config.batch_size, seq_len=cfg.seq_len, seed=config.seed)
        with torch.enable_grad():
            model(x)
        layers = take_expert_stats(model)
        out[factor] = {
            "routed": sum(sum(layer["routed"]) for layer in layers),
            "dropped": sum(layer["dropped"] for layer in layers),
        }
    return out


def expert_parallel_bytes(ctx, *, batch: int = 4, experts: int = 4, top_k: int = 2) -> dict:
    """On each rank: one forward and backward of the small GPT with ``experts`` experts under EP over the
    world, ``batch`` sequences per rank, no capacity limit (nothing dropped), every call traced.

    Returns each all-to-all's kind and bytes in the order issued (the tracer's ``bytes``: the tensor
    fed in; ``wire_bytes``: the (N-1)/N of it that leaves the rank), and the shape that predicts them.
    """
    import dataclasses

    from dtlab.comm.tracer import CommTracer, tracing
    from dtlab.config import MODEL_PRESETS
    from dtlab.data import global_batch
    from dtlab.model import build_model
    from dtlab.parallel.moe import apply_expert_parallel

    n, rank = group_size_and_rank(None)
    cfg = dataclasses.replace(MODEL_PRESETS["small"], n_experts=experts, top_k=top_k, capacity_factor=None)
    model = apply_expert_parallel(build_model(cfg, seed=0))
    x, y = global_batch(0, batch_size=batch * n, seq_len=cfg.seq_len, seed=0)  # (n b, T) each
    mine = slice(rank * batch, (rank + 1) * batch)  # this rank's b sequences
    tracer = CommTracer()
    with tracing(tracer):
        model(x[mine], y[mine]).backward()
    calls = [
        {"bytes": c.bytes, "wire_bytes": c.wire_bytes, "tokens": c.bytes != experts * 8}  # counts: E int64
        for c in tracer.calls
        if c.kind == "all_to_all"
    ]
    return {
        "rank": rank,
        "calls": calls,
        "shape": {"k": top_k, "b": batch, "s": cfg.seq_len, "h": cfg.d_model, "N": n, "layers": cfg.n_layer},
    }
