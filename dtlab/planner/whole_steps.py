"""Whole training steps beside the planner: calibrate's last measurement, and the check that a profile
still describes the machine.

:func:`measure_steps` is the step's own cost ``dtlab calibrate`` keeps: real
``dtlab train`` steps with data parallelism over 1, 2 and 4 ranks, one sequence
per rank, less what the profile already prices of them, so that the profile
predicts those three runs as measured at the time it was taken.

That makes the same three runs a quick check of a profile later
(:func:`speed_against`): run them again for a few steps, and measured over
predicted is 1.0 while the machine is as fast as when it was calibrated. A
shared or virtual machine is not always: this 2-core VM has run 30% slower
within seconds of a calibration, and every prediction then misses the same
way. ``dtlab bench planner`` checks before and after its layouts.
"""

from __future__ import annotations

import dataclasses
import statistics

WORLD_SIZES = (1, 2, 4)
STEP_WARMUP, STEP_PASSES, STEP_TIMED = 2, 3, 10  # untimed steps, turns, timed steps per turn
CHECK_SIZES = (1, 4)  # speed_against: the fewest and the most ranks


def step_config(model: str, world: int, steps: int):
    """The run calibrate times at ``world`` ranks: DP over every rank, one sequence each."""
    from dtlab.config import TrainConfig

    return TrainConfig(model=model, dp=world, batch_size=world, steps=steps)


def predicted_step_s(profile, config) -> float:
    """``profile``'s prediction of one step of :func:`step_config`'s run."""
    from dtlab.planner.architectures import from_model_config
    from dtlab.planner.local import local_step

    return local_step(
        profile,
        from_model_config(config.model_config()),
        config.layout,
        micro_batch_size=1,
        bubble=0.0,
        bucket_mb=config.bucket_mb,
    ).step_s


def timed_steps(config, pool) -> list[float]:
    """The step times of one run of ``config`` on ``pool``, its first STEP_WARMUP steps left out."""
    import dtlab.train

    run = dtlab.train.start(config, pool=pool).wait()
    return [r["step_time_s"] for r in run.records[STEP_WARMUP:]]


def measure_steps(profile, pool, *, quick: bool = False):
    """``profile`` with each world size's ``step_s``: real training steps beyond what the profile prices.

    For 1, 2 and 4 ranks, the median step time of :func:`step_config`'s run less the planner's
    prediction of it from the profile so far (compute, AdamW, every collective) is the trainer's own
    cost per step. The world sizes take turns, STEP_PASSES times of STEP_TIMED steps (once, of 3, if
    ``quick``).
    """
    compute = dict(profile.compute)
    configs = {n: step_config(profile.model, n, STEP_WARMUP + (3 if quick else STEP_TIMED)) for n in WORLD_SIZES}
    steps: dict[int, list[float]] = {n: [] for n in WORLD_SIZES}
    for _ in range(1 if quick else STEP_PASSES):
        for n, config in configs.items():
            steps[n] += timed_steps(config, pool)
    for n, config in configs.items():
        residual = statistics.median(steps[n]) - predicted_step_s(profile, config)
        compute[n] = dataclasses.replace(compute[n], step_s=max(0.0, residual))
    return dataclasses.replace(profile, compute=compute)


def speed_against(profile, pool) -> dict[int, float]:
    """For 1 and 4 ranks, measured over predicted step time of calibrate's run, now, on ``pool``
    (STEP_TIMED steps each): about 1.0 while this machine runs as fast as when ``profile`` was taken,
    1.3 when it runs 30% slower."""
    speed = {}
    for n in CHECK_SIZES:
        config = step_config(profile.model, n, STEP_WARMUP + STEP_TIMED)
        speed[n] = statistics.median(timed_steps(config, pool)) / predicted_step_s(profile, config)
    return speed
