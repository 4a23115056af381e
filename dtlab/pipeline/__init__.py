"""Pipeline parallelism: the schedule as data, the model cut into stages, and the runtime.

* :mod:`dtlab.pipeline.schedule`: GPipe and 1F1B as plain actions per rank
  (``1F0``), their ideal timeline and bubble; no process group.
* :mod:`dtlab.pipeline.partition`: the small GPT cut into stages.
* :mod:`dtlab.pipeline.runtime`: executes one rank's actions with send/recv.
"""
from dtlab.pipeline.partition import GPTStage, partition_gpt, stage_layers
from dtlab.pipeline.runtime import PipelineRuntime, PipelineStepResult
from dtlab.pipeline.schedule import (
    Action, check_deadlock_free, format_grid, gpipe, ideal_bubble_fraction, max_in_flight,
    one_f_one_b, schedule, simulate,
)

__all__ = ["Action", "GPTStage", "PipelineRuntime", "PipelineStepResult", "check_deadlock_free",
           "format_grid", "gpipe", "ideal_bubble_fraction", "max_in_flight", "one_f_one_b",
           "partition_gpt", "schedule", "simulate", "stage_layers"]
