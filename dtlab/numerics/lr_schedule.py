"""Learning-rate warmup and decay (Goyal et al., 2017, "Accurate, Large Minibatch SGD", Sec. 2.2).

At the start Adam's moment estimates are noisy; a full learning rate from
step 0 can throw the weights somewhere they never recover from. Linear warmup
ramps the rate from lr/W up to lr over W steps; cosine decay then lowers it
towards ``min_ratio * lr``, which it reaches at step ``total_steps``, one past the last.

A DeepSpeed config's scheduler (``WarmupLR``, ``WarmupDecayLR``,
``WarmupCosineLR``) replaces that schedule when a run reads one
(:class:`DeepSpeedSchedule`, ``TrainConfig.lr_schedule``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def lr_at(
    step: int,
    *,
    lr: float,
    warmup: int,
    total_steps: int,
    min_ratio: float = 0.1,
    schedule: "DeepSpeedSchedule | None" = None,
) -> float:
    """The learning rate for optimizer step ``step`` (0-based); ``schedule``, if given, decides instead."""
    if schedule is not None:
        return schedule.lr(step, lr)
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    decay_steps = max(1, total_steps - warmup)
    progress = min(1.0, (step - warmup) / decay_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr * (min_ratio + (1.0 - min_ratio) * cosine)


# --------------------------------------------------------------------------- DeepSpeed's schedules

DEEPSPEED_SCHEDULES = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "constant")
"""What a ds_config's ``scheduler.type`` may name here; ``"constant"``: the file names no scheduler."""


@dataclass(frozen=True)
class DeepSpeedSchedule:
    """One of DeepSpeed's learning-rate schedulers, as a ds_config's ``scheduler`` section describes it.

    The formulas are those of ``deepspeed/runtime/lr_schedules.py`` (DeepSpeed
    0.16, Feb. 2025; documented at deepspeed.readthedocs.io, "Learning Rate
    Schedulers"), with W = max(2, ``warmup_num_steps``), T =
    ``total_num_steps`` and i the scheduler's ``last_batch_iteration``::

        warmup fraction  g(i) = ln(i + 1) / ln(W)      warmup_type "log" (the default)
                         g(i) = i / W                  warmup_type "linear"
        WarmupLR         lr = min + (max - min) g(i)  for i < W, then max
        WarmupDecayLR    as WarmupLR for i < W, then min + (max - min) max(0, (T - i) / max(1, T - W))
        WarmupCosineLR   lr = base x r:  r = m + (1 - m) g(i) for i < W (m = warmup_min_ratio),
                         then r = max(0, c + (1 - c) (1 + cos(pi p)) / 2),
                         p = min(1, (i - W + 1) / max(1, T - W))
                         (c = cos_min_ratio; base = optimizer.params.lr)

    min, max are ``warmup_min_lr``, ``warmup_max_lr`` (when the file gives no
    max: the typed ``--lr``, else 0.001, DeepSpeed 0.16.5's default). The cosine's denominator
    max(1, T - W) is DeepSpeed's guard (PR deepspeedai/DeepSpeed#8142, so T = W
    divides by 1); the clamp p <= 1 is dtlab's: a step past ``total_num_steps``
    stays at the floor c instead of following the cosine back up, as
    DeepSpeed 0.16.5's formula (no clamp) would. Which i a step uses:
    DeepSpeed's engine steps the scheduler *after* each optimizer step, and
    the scheduler sets the rate once when it is made (i = -1: ``min`` for
    WarmupLR and WarmupDecayLR, 0 for WarmupCosineLR), so dtlab's step s
    trains at i = s - 1. (DeepSpeed also does not step the scheduler after a
    step the fp16 scaler skipped; dtlab's schedule counts every step.)
    ``"constant"`` is a file without a scheduler: DeepSpeed keeps the
    optimizer's rate throughout.
    """

    kind: str
    warmup_min_lr: float = 0.0
    warmup_max_lr: float = 0.001
    warmup_num_steps: int = 1000
    warmup_type: str = "log"
    total_num_steps: int | None = None
    warmup_min_ratio: float = 0.0
    cos_min_ratio: float = 0.0001

    def lr(self, step: int, base_lr: float) -> float:
        """The rate of dtlab's optimizer step ``step`` (0-based); ``base_lr``: ``optimizer.params.lr``."""
        if self.kind == "constant":
            return base_lr
        i, w = step - 1, max(2, self.warmup_num_steps)
        if i < 0:
            return 0.0 if self.kind == "WarmupCosineLR" else self.warmup_min_lr
        g = math.log(i + 1) / math.log(w) if self.warmup_type == "log" else i / w
        if self.kind == "WarmupCosineLR":
            if i < w:
                return base_lr * (self.warmup_min_ratio + (1.0 - self.warmup_min_ratio) * g)
            progress = min(1.0, (i - w + 1) / max(1, self.total_num_steps - w))  # past T: stays at the floor
            cosine = (1 + math.cos(math.pi * progress)) / 2
            return base_lr * max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * cosine)
        if i >= w:
            g = (
                1.0
                if self.kind == "WarmupLR"
                else max(0.0, (self.total_num_steps - i) / max(1.0, self.total_num_steps - w))
            )
        return self.warmup_min_lr + (self.warmup_max_lr - self.warmup_min_lr) * g
