"""The analytical planner: what a training layout needs and how fast it might run.

No processes and no torch: every number comes from a formula whose docstring
names its paper, so everything here is a *prediction*. One module per part:

* :mod:`dtlab.planner.hardware`: GPU and link presets (datasheet numbers);
* :mod:`dtlab.planner.architectures`: model shapes (GPT-2/3, Llama 3, dtlab's
  own) and the parameters each (pipeline stage, TP rank) holds;
* :mod:`dtlab.planner.formulas`: model-state memory (ZeRO), activation memory
  (Korthikanti et al.), FLOPs (Megatron-LM, PaLM);
* :mod:`dtlab.planner.communication`: ring collectives in the alpha-beta
  model, and what DP, TP and PP send per iteration;
* :mod:`dtlab.planner.memory_models` and :mod:`~dtlab.planner.plan_memory`: whose layout of the
  model states a plan counts (dtlab's runtime, DeepSpeed's estimators, Megatron-LM's bytes per
  parameter) and the plan's memory per GPU under it;
* :mod:`dtlab.planner.timing`: compute at the GPU's achievable share of peak, and communication;
* :mod:`dtlab.planner.work`: what a plan is computed from (the model's work per step);
* :mod:`dtlab.planner.predict`: :func:`plan` puts them together for a model
  and a :class:`~dtlab.config.layout.Layout`;
* :mod:`dtlab.planner.cli` and :mod:`~dtlab.planner.report`: the ``dtlab plan`` command and its text;
* :mod:`dtlab.planner.calibrate` and :mod:`~dtlab.planner.whole_steps`: ``dtlab calibrate``, measuring this
  machine for ``--gpu local``.

The pipeline's arithmetic (blocks per stage, bubble, micro-batches in flight)
is :mod:`dtlab.parallel.pipeline.schedule`'s, the same code the runtime schedules with.

``plan("gpt3-175b", Layout(dp=8, tp=8, pp=16, micro_batches=96, precision="bf16"),
batch_size=1536)``; ``plan_for_config(config)`` for a TrainConfig.
"""

from dtlab.config.layout import Layout
from dtlab.planner.architectures import ARCHITECTURES, Architecture, by_shape, params_per_rank
from dtlab.planner.formulas import (
    ACHIEVABLE_FRACTION,
    BYTES_PER_VALUE,
    activation_bytes_per_layer,
    dtlab_model_states_bytes,
    flops_per_iteration,
    model_flops_per_token,
    model_states_bytes,
)
from dtlab.planner.hardware import GPU, GPUS, LINKS, Link, get_gpu, get_link
from dtlab.planner.memory_models import MEMORY_MODELS, deepspeed_states, megatron_states
from dtlab.planner.predict import Plan, plan, plan_for_config

__all__ = [
    "ACHIEVABLE_FRACTION",
    "ARCHITECTURES",
    "Architecture",
    "BYTES_PER_VALUE",
    "GPU",
    "GPUS",
    "LINKS",
    "MEMORY_MODELS",
    "Layout",
    "Link",
    "Plan",
    "activation_bytes_per_layer",
    "by_shape",
    "deepspeed_states",
    "flops_per_iteration",
    "get_gpu",
    "get_link",
    "megatron_states",
    "model_flops_per_token",
    "model_states_bytes",
    "dtlab_model_states_bytes",
    "params_per_rank",
    "plan",
    "plan_for_config",
]
