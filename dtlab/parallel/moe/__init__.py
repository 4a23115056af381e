"""Mixture of experts and expert parallelism.

* :mod:`dtlab.parallel.moe.router`: top-k softmax gating, capacity and dropped tokens, the balancing loss;
* :mod:`dtlab.parallel.moe.layer`: the MoE layer (route, dispatch, compute, combine);
* :mod:`dtlab.parallel.moe.expert_parallel`: E/N experts per rank, the two gradient reductions;
* :mod:`dtlab.parallel.moe.options`: which settings combine (torch-free: the config checks them).

The all-to-all that moves the tokens is :mod:`dtlab.comm.all_to_all`. The torch
modules are imported on first use (module ``__getattr__``), so that
``dtlab.config`` can import :mod:`dtlab.parallel.moe.options` without torch.
"""

import importlib

_LAZY = {
    "MoE": "layer",
    "sort_by_expert": "layer",
    "Routing": "router",
    "TopKRouter": "router",
    "capacity": "router",
    "check_experts": "options",
    **dict.fromkeys(
        (
            "ExpertParallelOptimizer",
            "apply_expert_parallel",
            "dense_parameters",
            "expert_parameters",
            "moe_layers",
            "reduce_expert_gradients",
            "set_aux_grad_scale",
            "take_expert_stats",
        ),
        "expert_parallel",
    ),
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"dtlab.parallel.moe.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'dtlab.parallel.moe' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = sorted(_LAZY)
