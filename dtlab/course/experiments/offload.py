"""Lesson 05: what an offloaded optimizer moves between device and host, on real ranks.

The trainer's step records carry ``host_mem`` (what each rank keeps on the
host) but not the bytes copied, so :func:`offload_step` builds the offloaded
optimizer directly (Ren et al. 2021, ZeRO-Offload) and reads
:attr:`dtlab.parallel.zero.offload.OffloadOptimizer.transfer_bytes` after one step:
gradients device -> host (``d2h``), updated parameters host -> device
(``h2d``). Everything returned is an integer except ``seconds``, which is a
timing and changes from run to run.
"""

from __future__ import annotations

import torch

from dtlab.comm.collectives import group_size_and_rank
from dtlab.config import MODEL_PRESETS, TrainConfig
from dtlab.data import global_batch, shard
from dtlab.i18n import ConfigError
from dtlab.model import build_model
from dtlab.parallel.zero import OffloadOptimizer, apply_zero
from dtlab.reference import adamw_options


def offload_step(ctx, model: str = "small", zero: int = 0, batch_size: int = 8, seed: int = 0) -> dict:
    """One training step with the optimizer offloaded; what moved, and what each memory pool holds.

    ``zero=0`` wraps the whole model's optimizer in an :class:`OffloadOptimizer`
    (one rank only: nothing averages gradients across ranks); ``zero=1, 2, 3``
    offloads the shard ZeRO gives this rank (``apply_zero(..., offload=True)``).
    Returns ``transfer_bytes`` ``{"d2h", "h2d"}``, ``seconds`` of each copy,
    ``device`` and ``host`` bytes ``{"params", "grads", "optimizer"}``, and ``loss``.
    """
    cfg = MODEL_PRESETS[model]
    world, rank = group_size_and_rank(None)
    net = build_model(cfg, seed=seed).to(ctx.device)
    kwargs = adamw_options(TrainConfig(lr=1e-3, weight_decay=0.0))  # dtlab's AdamW
    if zero == 0:
        if world != 1:
            raise ConfigError(
                "offload_step with zero=0 runs on one rank (use zero=1, 2 or 3 for more)",
                "zero=0 的 offload_step 只能在一个 rank 上运行（多个 rank 请用 zero=1、2 或 3）",
            )
        optimizer = offloaded = OffloadOptimizer(net.parameters(), torch.optim.AdamW, **kwargs)
    else:
        net, optimizer = apply_zero(net, stage=zero, offload=True, **kwargs)
        offloaded = optimizer.optimizer  # the OffloadOptimizer over this rank's shard
    x, y = global_batch(0, batch_size=batch_size, seq_len=cfg.seq_len, seed=seed)
    x = shard(x, index=rank, count=world).to(ctx.device)  # (B / N, T)
    y = shard(y, index=rank, count=world).to(ctx.device)
    loss = net(x, y)
    loss.backward()
    optimizer.step()
    return {
        "rank": rank,
        "world_size": world,
        "loss": loss.item(),
        "transfer_bytes": dict(offloaded.transfer_bytes),
        "seconds": {k: v["seconds"] for k, v in offloaded.transfers.items()},
        "device": {k: optimizer.memory_bytes()[k] for k in ("params", "grads", "optimizer")},
        "host": optimizer.host_memory_bytes(),
    }


def host_adam_seconds(numel: int = 1 << 22, repeats: int = 3) -> dict:
    """In this process: the fastest of ``repeats`` torch AdamW steps on ``numel`` fp32 values on the CPU.

    What the host's step costs per parameter on this machine (a timing), to set beside the
    memory-bound best case the lesson computes (28 bytes per parameter).
    """
    import time

    param = torch.nn.Parameter(torch.zeros(numel))
    param.grad = torch.full((numel,), 1e-3)
    optimizer = torch.optim.AdamW([param], lr=1e-3, foreach=False)
    best = float("inf")
    for _ in range(repeats + 1):  # the first step also allocates the state
        started = time.perf_counter()
        optimizer.step()
        best = min(best, time.perf_counter() - started)
    return {"numel": numel, "seconds": best}
