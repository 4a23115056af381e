"""Numerics: what keeps the numbers of a training step finite, and the trade of compute for memory.

* :mod:`dtlab.numerics.precision`: fp16/bf16 compute with fp32 master weights;
* :mod:`dtlab.numerics.loss_scaling`: keeping fp16 gradients out of the underflow zone;
* :mod:`dtlab.numerics.gradient_clipping`: clipping by the global norm over every shard;
* :mod:`dtlab.numerics.lr_schedule`: warmup and decay;
* :mod:`dtlab.numerics.loss_spikes`: a bad batch injected, the spike detected, recovered from;
* :mod:`dtlab.numerics.gradient_checkpointing`: activation checkpointing (recompute in backward).
"""
