"""The configuration plane: what a training job is, checked before any rank starts.

* :mod:`dtlab.config.train_config`: ``TrainConfig``, the one list of training options (a frozen
  dataclass with a docstring under every field) and its ``validate()``;
* :mod:`dtlab.config.model_config`: ``ModelConfig`` and the presets ``--model`` names;
* :mod:`dtlab.config.layout`: ``Layout``, how a step is spread over GPUs (shared with the planner);
* :mod:`dtlab.config.checks`: the refusals ``validate()`` runs (what splits, what combines);
* :mod:`dtlab.config.limits`, :mod:`~dtlab.config.rank_limit`, :mod:`~dtlab.config.torch_support`,
  :mod:`~dtlab.config.output_paths`: how large a number, how many ranks, which torch, where a run writes;
* :mod:`dtlab.config.flags`, :mod:`~dtlab.config.help_zh`, :mod:`~dtlab.config.field_docs`,
  :mod:`~dtlab.config.command_line`: ``dtlab train``'s flags and help, derived from the fields, and
  how every command reads its arguments and reports a mistake in both languages;
* :mod:`dtlab.config.command_progress`: how a long command says on stderr what it is doing and how far along;
* :mod:`dtlab.config.machine`: the machine a measurement was taken on (CPU, cores, torch, date);
* :mod:`dtlab.config.deepspeed`, :mod:`~dtlab.config.deepspeed_json`: a DeepSpeed ``ds_config.json`` read
  (its keys flattened and typed) into a ``TrainConfig``.

``from dtlab.config import TrainConfig, ModelConfig, MODEL_PRESETS`` is the public path.
"""

from dtlab.config.checks import check_pipeline_schedule, check_zero3_precision, check_zero3_with_pipeline
from dtlab.config.layout import PRECISIONS, ZERO_STAGES, Layout
from dtlab.config.model_config import MODEL_PRESETS, ModelConfig
from dtlab.config.train_config import DP_MODES, SCHEDULES, Collectives, TrainConfig, field_types

__all__ = [
    "DP_MODES",
    "MODEL_PRESETS",
    "PRECISIONS",
    "SCHEDULES",
    "ZERO_STAGES",
    "Collectives",
    "Layout",
    "ModelConfig",
    "TrainConfig",
    "check_pipeline_schedule",
    "check_zero3_precision",
    "check_zero3_with_pipeline",
    "field_types",
]
