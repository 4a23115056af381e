"""Mixture of experts and expert parallelism.

* :mod:`dtlab.moe.router`: top-k softmax gating, capacity and dropped tokens, the balancing loss;
* :mod:`dtlab.moe.layer`: the MoE layer (route, dispatch, compute, combine);
* :mod:`dtlab.moe.expert_parallel`: E/N experts per rank, the two gradient reductions.

The all-to-all that moves the tokens is :mod:`dtlab.all_to_all`.
"""
from dtlab.moe.expert_parallel import (
    apply_expert_parallel, dense_parameters, expert_parameters, moe_layers, reduce_expert_gradients,
    set_aux_grad_scale, take_expert_stats,
)
from dtlab.moe.layer import MoE
from dtlab.moe.router import Routing, TopKRouter, capacity

__all__ = ["MoE", "Routing", "TopKRouter", "apply_expert_parallel", "capacity", "dense_parameters",
           "expert_parameters", "moe_layers", "reduce_expert_gradients", "set_aux_grad_scale",
           "take_expert_stats"]
