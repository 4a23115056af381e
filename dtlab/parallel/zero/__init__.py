"""ZeRO: data parallelism without the redundant copies of the model states.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC 2020 (arXiv 1910.02054, 2019). Plain data parallelism
(:mod:`dtlab.parallel.data_parallel`) keeps on every one of N ranks the whole *model
states*: parameters, gradients and optimizer state. With fp32 training and
Adam (two state tensors per parameter) that is 4 + 4 + 8 = 16 bytes per
parameter on every rank, for Ψ parameters (the paper's Fig. 1 counts
(2 + 2 + K)Ψ with K = 12 for mixed precision). ZeRO partitions them instead,
one more each stage::

                          parameters   gradients   optimizer state   bytes per rank (fp32 Adam)
    stage 0 (plain DP)    Ψ            Ψ           Ψ                 16Ψ
    stage 1 P_os          Ψ            Ψ           Ψ / N             8Ψ + 8Ψ/N
    stage 2 P_os+g        Ψ            Ψ / N       Ψ / N             4Ψ + 12Ψ/N
    stage 3 P_os+g+p      Ψ / N        Ψ / N       Ψ / N             16Ψ / N

Communication per rank per step, counted as the paper does (an all-reduce
moves the tensor twice, a reduce-scatter or an all-gather once):

    stage 0   all-reduce the gradients                                      2Ψ
    stage 1   reduce-scatter the gradients (Ψ), all-gather the parameters (Ψ)   2Ψ
    stage 2   the same as stage 1, bucket by bucket during backward;
              only this rank's shard of the gradient is kept                 2Ψ
    stage 3   all-gather each unit in forward (Ψ) and in backward (Ψ),
              reduce-scatter its gradients (Ψ)                              3Ψ, 1.5x DP

(Sec. 7.2.1 and 7.2.2.) The package, one module per idea:

    flat.py      FlatLayout: tensors end to end in one buffer, padded into N equal shards
    stage12.py   ZeroOptimizer: stages 1 and 2, any torch optimizer over this rank's shard
    stage12_state.py   ZeroOptimizer's state_dict and training state (checkpoints), groups added later
    stage12_memory.py  what a ZeroOptimizer holds, by the memory accountant's categories
    stage2_buckets.py  stage 2's buckets, reduce-scattered during backward (DeepSpeed's overlap_comm)
    units.py     stage 3's units and the autograd hooks that gather, free and reduce-scatter them
    stage3.py    ZeroStage3 (the wrapped model) and Stage3Optimizer
    offload.py   OffloadOptimizer: the shard's optimizer state and update on the host (ZeRO-Offload)
    hybrid.py    hybrid sharding (HSDP): shard over K ranks, all-reduce each shard over the dp/K copies
    apply.py     apply_zero(model, stage=...): the trainer's one entry point

Every optimizer here is a :class:`dtlab.parallel.dp_optimizer.DPOptimizer`, the
protocol the training loop drives.

Used from Python as PyTorch's own ZeRO and FSDP are::

    # stages 1, 2: a torch.optim.Optimizer, like torch's ZeroRedundancyOptimizer
    optimizer = ZeroOptimizer([{"params": decay, "weight_decay": 0.1},
                               {"params": no_decay, "weight_decay": 0.0}],
                              torch.optim.AdamW, stage=2, group=dp_group, lr=3e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)   # writes param_groups[i]["lr"]
    torch.save(optimizer.state_dict(), f"opt.rank{rank}.pt")           # this rank's 1/N of the state

    # stage 3: like FSDP, the module keeps its parameters' names, each now this rank's shard
    wrapped = ZeroStage3(model, group=dp_group)      # broadcasts rank 0's weights first, as DDP does
    for name, p in wrapped.module.named_parameters(): ...   # "blocks.0.attn.qkv.weight": a 1-D shard
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=3e-4)      # groups allowed; steps the shards
    wrapped.full_state_dict()                        # whole tensors under the same names (collective)

A stage-3 shard is *flat*: the 1-D run of the parameter's elements (row-major)
that falls in this rank's 1/N of its unit's flat buffer, possibly empty,
and ``.grad`` after backward has the same shape and dtype
(:meth:`ZeroStage3.named_shards` gives each range). FSDP2 shards each
parameter by rows instead (a DTensor keeping the parameter's shape); flat
shards keep one all-gather per unit with no per-parameter padding, and any
element-wise optimizer steps them exactly, but a parameter's shape must be
taken from its name (e.g. to choose the weight-decay group), not from the
shard. Stage 2 takes a bucket size, ``bucket_mb`` (DeepSpeed's
``reduce_bucket_size`` with ``overlap_comm``): the flat buffer is then cut in
windows of that many MiB, each sharded N ways and reduce-scattered during
backward as soon as its gradients exist, so the whole gradient is never
alive at once (stage2_buckets.py's docstring draws the layout); without it, and at
stage 1 (which keeps the whole gradient anyway), the whole flat buffer is
reduce-scattered once after backward. Stage 3 has no bucket: it reduce-scatters
unit by unit. ``bucket_mb`` is in MiB, 2^20 bytes, as DDP's ``bucket_cap_mb``
(:mod:`dtlab.parallel.data_parallel`) is.
"""

from __future__ import annotations

from dtlab.parallel.zero.apply import apply_zero
from dtlab.parallel.zero.flat import FlatLayout, trainable_parameters
from dtlab.parallel.zero.offload import OffloadOptimizer
from dtlab.parallel.zero.stage3 import Stage3Optimizer, ZeroStage3
from dtlab.parallel.zero.stage12 import ZeroOptimizer
from dtlab.parallel.zero.units import unit_modules

__all__ = [
    "FlatLayout",
    "OffloadOptimizer",
    "Stage3Optimizer",
    "ZeroOptimizer",
    "ZeroStage3",
    "apply_zero",
    "trainable_parameters",
    "unit_modules",
]
