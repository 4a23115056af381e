"""The parallelisms: each a way of splitting one training step over ranks, each in a module of its own.

* :mod:`dtlab.parallel.data_parallel` (with :mod:`~dtlab.parallel.buckets` and the optimizer protocol
  :mod:`~dtlab.parallel.dp_optimizer`): data parallelism, torch DDP's job;
* :mod:`dtlab.parallel.zero`: ZeRO stages 1-3 and offloading (FSDP's job at stage 3);
* :mod:`dtlab.parallel.tensor_parallel` and :mod:`~dtlab.parallel.sequence_parallel`: Megatron's split
  of each layer's matrices, and of what that leaves whole along the sequence;
* :mod:`dtlab.parallel.context_parallel` with :mod:`~dtlab.parallel.ring_attention`: the sequence
  split across ranks, attention exact over the ring;
* :mod:`dtlab.parallel.pipeline`: the model cut into stages, schedules as data;
* :mod:`dtlab.parallel.moe`: mixture of experts and expert parallelism.

The classes a PyTorch user reaches for are importable from here, each loaded on first use::

    from dtlab.parallel import OverlappedDP, ZeroOptimizer, ZeroStage3, ColumnParallelLinear
"""

import importlib

_PUBLIC = {
    "PerParameterDP": "data_parallel",
    "BucketedDP": "data_parallel",
    "OverlappedDP": "data_parallel",
    "ReplicatedOptimizer": "replicated",
    "DPOptimizer": "dp_optimizer",
    "ZeroOptimizer": "zero",
    "ZeroStage3": "zero",
    "Stage3Optimizer": "zero",
    "OffloadOptimizer": "zero",
    "apply_zero": "zero",
    "ColumnParallelLinear": "tensor_parallel",
    "RowParallelLinear": "tensor_parallel",
    "ParallelSelfAttention": "tensor_parallel",
    "ParallelMLP": "tensor_parallel",
    "SequenceParallelColumnLinear": "sequence_parallel",
    "SequenceParallelRowLinear": "sequence_parallel",
    "SequenceParallelLayerNorm": "sequence_parallel",
    "RingAttention": "ring_attention",
    "PipelineRuntime": "pipeline",
}


def __getattr__(name):
    # Loaded on first use, so that ``import dtlab.parallel.pipeline.schedule`` (pure data) stays light.
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"dtlab.parallel.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module 'dtlab.parallel' has no attribute {name!r}")


__all__ = sorted(_PUBLIC)
