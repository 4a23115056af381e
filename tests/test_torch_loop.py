"""A training loop written for torch's DDP, ZeroRedundancyOptimizer and FSDP runs on dtlab's classes (issue 36,
item 6): only the constructors change; the loop (AdamW, a LambdaLR schedule, ``backward()``, ``step()``, no
``finish_gradient_sync()``) and its losses stay the same. Every DP wrapper has averaged the gradients by the
time ``backward()`` returns, and dtlab's ZeRO-1 optimizer steps beside one as torch's does beside DDP."""

from __future__ import annotations

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from dtlab.parallel.data_parallel import BucketedDP, OverlappedDP, PerParameterDP
from dtlab.parallel.replicated import ReplicatedOptimizer
from dtlab.parallel.zero import Stage3Optimizer, ZeroOptimizer, ZeroStage3
from tests.clean_exit import _batch, _Net
from tests.harness import run_ranks


def _loop(model, optimizer, rank: int) -> list[float]:
    """The loop as torch's documentation writes it; nothing dtlab-specific."""
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    x, y = _batch(rank)
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    return losses


def _net():
    torch.manual_seed(0)
    return _Net()


def _all_loops(ctx) -> dict[str, list[float]]:
    rank = ctx.rank
    adamw = dict(lr=1e-2)
    ddp = DistributedDataParallel(_net())
    overlapped = OverlappedDP(_net(), bucket_cap_mb=1e-3)
    zero3 = ZeroStage3(_net())
    runs = {
        "ddp": (ddp, torch.optim.AdamW(ddp.parameters(), **adamw)),
        "dtlab OverlappedDP": (overlapped, torch.optim.AdamW(overlapped.parameters(), **adamw)),
        "dtlab ReplicatedOptimizer": (
            (m := OverlappedDP(_net(), bucket_cap_mb=1e-3)),
            ReplicatedOptimizer(m, torch.optim.AdamW(m.parameters(), **adamw)),
        ),
        "dtlab BucketedDP": ((b := BucketedDP(_net(), bucket_cap_mb=1e-3)), torch.optim.AdamW(b.parameters(), **adamw)),
        "dtlab PerParameterDP": ((p := PerParameterDP(_net())), torch.optim.AdamW(p.parameters(), **adamw)),
        "torch ZeroRedundancyOptimizer": (
            (d := DistributedDataParallel(_net())),
            ZeroRedundancyOptimizer(d.parameters(), optimizer_class=torch.optim.AdamW, **adamw),
        ),
        "dtlab ZeroOptimizer": ((n := _net()), ZeroOptimizer(n.parameters(), torch.optim.AdamW, stage=2, **adamw)),
        "dtlab ZeroOptimizer stage 1 beside OverlappedDP": (  # as ZeroRedundancyOptimizer beside DDP
            (o := OverlappedDP(_net(), bucket_cap_mb=1e-3)),
            ZeroOptimizer(o.parameters(), torch.optim.AdamW, stage=1, **adamw),
        ),
        "dtlab ZeroStage3 + AdamW": (zero3, torch.optim.AdamW(zero3.parameters(), **adamw)),
        "dtlab Stage3Optimizer": ((s := ZeroStage3(_net())), Stage3Optimizer(s, torch.optim.AdamW, **adamw)),
    }
    losses = {name: _loop(model, optimizer, rank) for name, (model, optimizer) in runs.items()}
    # Beside a DP wrapper, ZeRO-1 takes the averaged gradients as they are: only its all-gather
    # communicates, as torch's ZeroRedundancyOptimizer beside DDP only broadcasts.
    beside = runs["dtlab ZeroOptimizer stage 1 beside OverlappedDP"][1].meter.calls
    alone = runs["dtlab ZeroOptimizer"][1].meter.calls
    return {**losses, "calls beside DP": dict(beside), "calls alone": dict(alone)}


def test_a_torch_loop_runs_unchanged_on_dtlab():
    for rank_losses in run_ranks(_all_loops, 2):
        assert "reduce_scatter" not in rank_losses.pop("calls beside DP")
        assert rank_losses.pop("calls alone")["reduce_scatter"] > 0
        reference = rank_losses["ddp"]
        for name, losses in rank_losses.items():
            assert torch.allclose(torch.tensor(losses), torch.tensor(reference), atol=1e-5), (name, losses, reference)
