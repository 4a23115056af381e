"""One entry point to ZeRO: :func:`apply_zero` shards a model's training states with stage 1, 2 or 3.

Typical use (the trainer's, :func:`dtlab.train.build_rank`)::

    model, optimizer = apply_zero(model, stage=2, group=dp_group, lr=1e-3)
    for x, y in micro_batches:                  # gradient accumulation needs nothing special
        (model(x, y) / K).backward()
    optimizer.step()                            # communicates, updates its shard, gathers
    optimizer.zero_grad()

The optimizer returned is a :class:`dtlab.parallel.dp_optimizer.DPOptimizer`, as the
trainer's plain data parallelism is, so the training loop drives every stage
the same way.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from dtlab.comm.collectives import CommMeter
from dtlab.i18n import ConfigError
from dtlab.parallel.data_parallel import broadcast_from_rank0
from dtlab.parallel.zero.stage3 import Stage3Optimizer, ZeroStage3
from dtlab.parallel.zero.stage12 import ZeroOptimizer


def apply_zero(
    model: nn.Module,
    *,
    stage: int,
    group=None,
    optimizer_class=torch.optim.AdamW,
    offload: bool = False,
    compute_dtype: torch.dtype | None = None,
    meter: CommMeter | None = None,
    prefetch: int | None = None,
    bucket_mb: float | None = None,
    replicate_group=None,
    shard_modules=None,
    master_weights: bool = False,
    **optimizer_kwargs,
):
    """Shard ``model``'s training states over ``group`` with ZeRO ``stage`` (1, 2 or 3).

    Returns ``(model, optimizer)``: a model with the same forward and an
    optimizer whose ``step()`` does the stage's communication, so a training
    loop only calls ``loss.backward(); optimizer.step(); optimizer.zero_grad()``.
    Stages 1 and 2 return ``model`` itself (its parameters moved into the flat
    buffer; no data-parallel wrapper: ZeRO averages the gradients itself);
    stage 3 returns a :class:`dtlab.parallel.zero.stage3.ZeroStage3` wrapping it
    (``compute_dtype`` and ``prefetch``, the units gathered ahead, default 1, are
    stage 3's options), whose ``module`` keeps its
    parameters' names, each now this rank's 1-D shard. Rank 0's weights are
    broadcast first. Move the model to its device before: the parameters become views
    of (or shards cut from) buffers made here. Both optimizers are
    :class:`dtlab.parallel.dp_optimizer.DPOptimizer` and have a ``meter`` (a
    :class:`dtlab.comm.meter.CommMeter`). ``bucket_mb`` (stage 2 only): reduce-scatter
    the gradient in buckets of that many MiB during backward, as DeepSpeed's
    ``overlap_comm`` does (:class:`dtlab.parallel.zero.stage12.ZeroOptimizer`); None: the
    whole flat gradient after backward. ``replicate_group`` (hybrid sharding, HSDP: ``group`` is
    then the shard group of K ranks; :mod:`dtlab.parallel.zero.hybrid`): each gradient shard is
    all-reduced once over these copies. ``shard_modules`` (stage 3): the sharding policy
    (:mod:`dtlab.parallel.zero.policy`; None shards every parameter). ``master_weights``: the
    model's parameters are 16-bit and the optimizer keeps fp32 masters of this rank's shard
    (:mod:`dtlab.numerics.master_weights`; ZeRO's Figure 1).
    """
    _check_options(stage, compute_dtype=compute_dtype, bucket_mb=bucket_mb, prefetch=prefetch)
    if stage < 3:
        broadcast_from_rank0(model, group=group)  # (ZeroStage3 does it itself)
        if replicate_group is not None:  # HSDP: then global rank 0's everywhere
            broadcast_from_rank0(model, group=replicate_group)
        return model, ZeroOptimizer(
            model.named_parameters(),
            optimizer_class,
            stage=stage,
            group=group,
            offload=offload,
            meter=meter,
            bucket_mb=bucket_mb,
            replicate_group=replicate_group,
            master_weights=master_weights,
            **optimizer_kwargs,
        )
    wrapped = ZeroStage3(
        model,
        group=group,
        compute_dtype=compute_dtype,
        meter=meter,
        prefetch=1 if prefetch is None else prefetch,
        replicate_group=replicate_group,
        shard_modules=shard_modules,
    )
    return wrapped, Stage3Optimizer(
        wrapped, optimizer_class, offload=offload, master_weights=master_weights, **optimizer_kwargs
    )


def _check_options(stage: int, *, compute_dtype, bucket_mb, prefetch) -> None:
    """Refuse a stage other than 1-3, and an option of another stage than ``stage``."""
    if stage not in (1, 2, 3):
        raise ConfigError(
            f"ZeRO stage={stage!r} is not allowed; expected 1, 2 or 3 "
            "(stage 0 is plain data parallelism: dtlab/parallel/data_parallel.py)",
            f"ZeRO stage={stage!r} 不合法；应为 1、2 或 3"
            "（第 0 阶段就是普通数据并行：dtlab/parallel/data_parallel.py）",
        )
    if compute_dtype is not None and stage != 3:
        raise ConfigError(
            f"compute_dtype={compute_dtype} is an option of stage 3 only (got stage {stage})",
            f"compute_dtype={compute_dtype} 只用于第 3 阶段（当前为第 {stage} 阶段）",
        )
    if bucket_mb is not None and stage == 3:
        raise ConfigError(
            f"bucket_mb={bucket_mb!r} with stage 3: stage 3 reduce-scatters unit by unit "
            f"(allowed: bucket_mb with stage 2, None otherwise)",
            f"bucket_mb={bucket_mb!r} 不能用于第 3 阶段：第 3 阶段逐单元归约散射"
            f"（允许：第 2 阶段时给 bucket_mb，其他阶段为 None）",
        )
    if prefetch is not None and stage != 3:
        raise ConfigError(
            f"prefetch={prefetch!r} is an option of stage 3 only (got stage {stage}): "
            "stages 1 and 2 gather no parameters before use",
            f"prefetch={prefetch!r} 只用于第 3 阶段（当前为第 {stage} 阶段）：第 1、2 阶段在使用参数前不收集参数",
        )
