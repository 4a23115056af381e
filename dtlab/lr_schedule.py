"""Learning-rate warmup and decay (Goyal et al., 2017, "Accurate, Large Minibatch SGD", Sec. 2.2).

At the start Adam's moment estimates are noisy; a full learning rate from
step 0 can throw the weights somewhere they never recover from. Linear warmup
ramps the rate from lr/W up to lr over W steps; cosine decay then lowers it
to ``min_ratio * lr`` by the last step.
"""
from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, warmup: int, total_steps: int, min_ratio: float = 0.1) -> float:
    """The learning rate for optimizer step ``step`` (0-based)."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    decay_steps = max(1, total_steps - warmup)
    progress = min(1.0, (step - warmup) / decay_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr * (min_ratio + (1.0 - min_ratio) * cosine)
