"""Lesson 00: who am I, how many are we, and one all-reduce."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def hello(ctx) -> dict:
    """Each rank reports its rank, the world size and the backend it joined with."""
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "backend": dist.get_backend()}


def all_reduce_rank_plus_one(ctx) -> float:
    """Every rank contributes ``rank + 1``; after all-reduce(SUM) every rank holds the total.

    With 4 ranks: 1 + 2 + 3 + 4 = 10, on every rank.
    """
    x = torch.tensor([ctx.rank + 1.0], device=ctx.device)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x.item()


def emit_ticks(ctx, n: int, pause_s: float = 0.0) -> int:
    """Emit ``n`` small records (used to show streaming and to time the pool)."""
    for i in range(n):
        if pause_s:
            time.sleep(pause_s)
        ctx.emit({"rank": ctx.rank, "tick": i})
    return n
