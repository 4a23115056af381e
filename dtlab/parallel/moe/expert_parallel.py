"""Expert parallelism: E experts spread over N ranks, tokens moved to them by all-to-all.

GShard (Lepikhin et al. 2020, Sec. 3.2) and Switch Transformer (Fedus et al.
2021, Sec. 5) place different experts on different ranks: with E = 4 and
N = 2, rank 0 keeps experts 0-1 and rank 1 experts 2-3, and everything else in
the model is replicated. Each rank still reads its own slice of the batch, so
the expert-parallel ranks are also data-parallel for the rest of the model::

    rank 0: attention, router (replica) | experts 0 1      tokens of sequences 0-3
    rank 1: attention, router (replica) | experts 2 3      tokens of sequences 4-7
                  all-to-all: each token to the rank of its expert, and back

Gradients therefore need two reductions (DeepSpeed-MoE, Rajbhandari et al.
2022, Sec. 4.1, calls the second group the expert-data-parallel group):

* a replicated (dense) parameter saw only this rank's tokens: average it over
  every rank that holds a replica, the dp x ep ranks of its stage;
* an expert's parameter already saw the tokens of all N expert-parallel ranks,
  because the all-to-all's backward brought their gradients to it: it holds
  the *sum* of N ranks' contributions. Average it over the ranks that hold the
  same expert (the expert-data-parallel group, dp of them), then divide by N.

    apply_expert_parallel(model, group=ep_group)   # keep my E/N experts
    ... forward, backward ...
    reduce_expert_gradients(model, group=expert_dp_group, ep=N)

In the trainer, data parallelism over the dp x ep ranks averages every
parameter but the experts (``apply_data_parallel(..., params=dense_parameters(model))``)
and :class:`ExpertParallelOptimizer` adds the experts' reduction to the step.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from dtlab.comm import calls as comm
from dtlab.comm.collectives import CommMeter, group_size_and_rank
from dtlab.i18n import ConfigError
from dtlab.parallel.dp_optimizer import DPOptimizer, GradPiece
from dtlab.parallel.moe.layer import MoE


def moe_layers(model: nn.Module) -> list[MoE]:
    """Every MoE layer in ``model``, in module order."""
    return [m for m in model.modules() if isinstance(m, MoE)]


def apply_expert_parallel(model: nn.Module, *, group=None, meter: CommMeter | None = None) -> nn.Module:
    """Keep only this rank's E/N experts in every MoE layer of ``model``, in place.

    Group rank r of N keeps experts r*E/N .. (r+1)*E/N - 1, under the same
    global names (``experts.2`` stays ``experts.2``). ``meter`` counts the
    all-to-alls. With one rank every expert stays and nothing is sent.
    """
    n, rank = group_size_and_rank(group)
    for layer in moe_layers(model):
        if layer.n_experts % n:
            raise ConfigError(
                f"ep={n} does not divide the {layer.n_experts} experts (allowed: a divisor of {layer.n_experts})",
                f"ep={n} 不能整除 {layer.n_experts} 个专家（允许：{layer.n_experts} 的约数）",
            )
        per_rank = layer.n_experts // n
        for i in list(layer.local_experts):
            if not rank * per_rank <= i < (rank + 1) * per_rank:
                del layer.experts[str(i)]
        layer.group, layer.meter = group, meter
    return model


def expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The experts' parameters (reduced over the expert-data-parallel group), in module order."""
    return [p for layer in moe_layers(model) for p in layer.experts.parameters()]


def dense_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every other parameter (replicated on the dp x ep ranks; the routers are among them)."""
    experts = {id(p) for p in expert_parameters(model)}
    return [p for p in model.parameters() if id(p) not in experts]


def reduce_expert_gradients(model: nn.Module, *, group=None, ep: int = 1, meter: CommMeter | None = None) -> None:
    """Average the experts' gradients over ``group`` (the expert-data-parallel group), divided by ``ep``.

    An expert's gradient holds the sum over the ``ep`` ranks that sent it
    tokens of each rank's mean-loss gradient; the mean over the whole batch
    is that sum averaged over ``group`` and divided by ``ep``. A world of one
    with ``ep=1`` does nothing.
    """
    grads = [p.grad for p in expert_parameters(model) if p.grad is not None]
    if not grads:
        return
    size, _ = group_size_and_rank(group)
    flat = torch.cat([g.reshape(-1) for g in grads])  # (numel,) one message
    if size > 1:
        if meter is not None:
            meter.record_call("all_reduce", flat)
        comm.all_reduce(flat, group=group, kind="all_reduce.experts")
    flat /= size * ep
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


class ExpertParallelOptimizer(DPOptimizer):
    """A data-parallel optimizer (``inner``) whose gradient sync also reduces the experts' gradients.

    ``inner`` averages the dense parameters over the dp x ep ranks; after it,
    :meth:`finish_gradient_sync` runs :func:`reduce_expert_gradients` over
    ``group`` (the expert-data-parallel group). Every other method of the
    protocol is ``inner``'s (a method added to the protocol is forwarded here too).
    """

    def __init__(self, inner: DPOptimizer, model: nn.Module, *, group=None, ep: int, meter: CommMeter | None = None):
        self.inner, self.model, self.group, self.ep, self.meter = inner, model, group, ep, meter

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none)

    def no_sync(self):
        return self.inner.no_sync()

    def finish_gradient_sync(self) -> None:
        self.inner.finish_gradient_sync()
        reduce_expert_gradients(self.model, group=self.group, ep=self.ep, meter=self.meter)

    def gradients(self) -> list[GradPiece]:
        """``inner``'s, but an expert's gradient is the same only over ``group``: its first rank counts it."""
        experts = {id(p) for p in expert_parameters(self.model)}
        names = {name for name, p in self.model.module.named_parameters() if id(p) in experts}
        first = group_size_and_rank(self.group)[1] == 0
        return [piece._replace(counted=first) if piece.name in names else piece for piece in self.inner.gradients()]

    def step(self) -> None:
        self.inner.step()

    def memory_bytes(self) -> dict[str, int]:
        return self.inner.memory_bytes()

    def host_memory_bytes(self) -> dict[str, int]:
        return self.inner.host_memory_bytes()

    def training_state(self):
        return self.inner.training_state()

    def load_training_state(self, source) -> None:
        self.inner.load_training_state(source)

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)


def set_aux_grad_scale(model: nn.Module, scale: float) -> None:
    """Tell every MoE layer what the loss is multiplied by before backward (1/m x loss scale)."""
    for layer in moe_layers(model):
        layer.aux_grad_scale = scale


def take_expert_stats(model: nn.Module) -> list[dict]:
    """Per MoE layer on this rank, what its router did since the last call (see ``MoE.take_stats``)."""
    return [layer.take_stats() for layer in moe_layers(model)]
