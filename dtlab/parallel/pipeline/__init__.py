"""Pipeline parallelism: the schedule as data, the model cut into stages, and the runtime.

* :mod:`dtlab.parallel.pipeline.schedule`: GPipe, 1F1B and interleaved 1F1B as plain
  actions per rank (``1F0``), their ideal timeline, and the closed forms the planner uses
  (layers per stage, bubble, micro-batches in flight); no process group, no torch.
* :mod:`dtlab.parallel.pipeline.partition`: the small GPT cut into stages (interleaved: v chunks per rank).
* :mod:`dtlab.parallel.pipeline.runtime`: executes one rank's actions with send/recv
  (GPipe and 1F1B: one stage per rank; interleaved 1F1B: its v chunks).

The schedule's names are imported here at once (pure Python). The stage and
the runtime need torch, so they are imported on first use (module
``__getattr__``): ``import dtlab.parallel.pipeline.schedule`` and the planner stay
torch-free.
"""

import importlib

from dtlab.parallel.pipeline.schedule import (
    Action,
    bubble_over_ideal,
    check_deadlock_free,
    format_grid,
    gpipe,
    ideal_bubble_fraction,
    interleaved,
    max_in_flight,
    one_f_one_b,
    peak_in_flight,
    schedule,
    simulate,
    stage_layers,
)

_LAZY = {
    "GPTStage": "partition",
    "partition_gpt": "partition",
    "PipelineRuntime": "runtime",
    "PipelineStepResult": "runtime",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"dtlab.parallel.pipeline.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'dtlab.parallel.pipeline' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Action",
    "GPTStage",
    "PipelineRuntime",
    "PipelineStepResult",
    "bubble_over_ideal",
    "check_deadlock_free",
    "format_grid",
    "gpipe",
    "ideal_bubble_fraction",
    "interleaved",
    "max_in_flight",
    "one_f_one_b",
    "partition_gpt",
    "peak_in_flight",
    "schedule",
    "simulate",
    "stage_layers",
]
