"""ZeRO stage 3 (P_os+g+p, the idea PyTorch's FSDP implements): the parameters are sharded too.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC 2020, Sec. 5.3 and 7.2.2. Between uses every rank keeps
only a 1/N flat shard of each layer's parameters (and of their gradients and
optimizer state, as in stages 1 and 2, :mod:`dtlab.zero.stage12`). A layer's
whole parameters exist only while that layer computes::

    forward   layer i:  all-gather its shards -> compute -> free the gathered parameters
    backward  layer i:  all-gather them again -> compute gradients -> reduce-scatter the
                        gradients (each rank keeps the averaged shard of its own) -> free

so a rank holds 16Ψ/N bytes of model states plus one or two gathered
layers at a time. The price: parameters cross the network twice (forward and
backward) and gradients once, 3Ψ per step against plain DP's all-reduce of
2Ψ: 1.5x (Sec. 7.2.2). ``ZeroStage3.meter`` counts every collective, so a
test checks that figure.

What is gathered at once (a *unit*: one block, say) and the autograd hooks
that gather, free and reduce-scatter it are in :mod:`dtlab.zero.units`;
:class:`ZeroStage3` cuts a model into units and installs the hooks.

The optimizer is any torch optimizer over ``wrapped.parameters()``: the
shards (:class:`Stage3Optimizer` wraps one for the training loop). Its step
needs no communication; the next forward gathers the updated shards.
``compute_dtype=torch.bfloat16`` gathers, computes and reduce-scatters in
bf16 while the shards (the fp32 masters) and the update stay fp32.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from dtlab import comm
from dtlab.collectives import CommMeter, group_size_and_rank
from dtlab.dp_optimizer import DPOptimizer, GradPiece, no_bytes
from dtlab.i18n import DtlabError
from dtlab.memory import model_state_bytes
from dtlab.training_state import (PARAM, Piece, StateSource, flat_pieces, read_flat, read_flat_state, shard_ranges,
                                  split_state)
from dtlab.zero.offload import OffloadOptimizer, set_state_of, state_of
from dtlab.zero.units import ShardGroup, Unit, assign_units, saved_tensor_hooks


class ZeroStage3(nn.Module):
    """Wrap ``module`` so that each rank holds 1/N of its parameters, gradients and optimizer state.

    ``wrapped = ZeroStage3(model, group=g)``; ``torch.optim.AdamW(wrapped.parameters())``
    updates the shards. Every rank should start from the same weights
    (:func:`dtlab.zero.apply_zero` broadcasts rank 0's first).
    """

    def __init__(self, module: nn.Module, *, group=None, compute_dtype: torch.dtype | None = None,
                 meter: CommMeter | None = None):
        super().__init__()
        self.module, self.group, self.compute_dtype = module, group, compute_dtype
        self.world_size, self.rank = group_size_and_rank(group)
        self.meter = meter if meter is not None else CommMeter()
        self.shared = ShardGroup(group, self.world_size, self.rank, self.meter, compute_dtype)
        self._names = list(module.state_dict())    # full_state_dict() returns this order
        self.units: list[Unit] = []
        for unit_module, name, params in assign_units(module):
            unit = Unit(name, params, self.shared)
            unit_module.register_forward_pre_hook(unit.before_forward)
            unit_module.register_forward_hook(unit.after_forward)
            self.units.append(unit)
        self.shards = nn.ParameterDict({u.name.replace(".", "_"): u.shard for u in self.units})

    def forward(self, *args, **kwargs):
        if self.compute_dtype is not None:   # floating-point inputs follow the parameters' dtype
            args = tuple(_cast(a, self.compute_dtype) for a in args)
            kwargs = {k: _cast(v, self.compute_dtype) for k, v in kwargs.items()}
        # Only the innermost pair of saved-tensor hooks applies, so the pair active around
        # this call, if any (dtlab's activation meter, say), is handed every tensor that
        # is not a gathered parameter. (torch has no public way to ask for that pair.)
        outer = torch._C._autograd._top_saved_tensors_default_hooks(False)
        with torch.autograd.graph.saved_tensors_hooks(*saved_tensor_hooks(self.shared, outer)):
            return self.module(*args, **kwargs)

    # -- memory
    def memory_bytes(self, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
        """``{"params", "grads", "optimizer", "gathered_peak"}`` in bytes on this rank's device.

        ``params`` is what is held between layers: the shards (plus frozen
        parameters); ``gathered_peak`` the most bytes of gathered whole
        parameters held at once since :meth:`reset_peak`; ``optimizer`` the
        state of ``optimizer`` if given.
        """
        return {**model_state_bytes(self.parameters(), optimizer), "gathered_peak": self.shared.peak_bytes,
                "buffers": self.shared.peak_bytes}   # the gathered units are its buffers

    def reset_peak(self) -> None:
        self.shared.reset_peak()

    # -- whole parameters, for checkpoints and comparisons (collectives: call on every rank)
    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The wrapped module's state dict with whole parameters under their original names."""
        whole = {}
        for unit in self.units:
            full = torch.empty(unit.layout.padded_numel, dtype=unit.shard.dtype, device=unit.shard.device)
            if self.world_size == 1:
                full.copy_(unit.shard)
            else:
                comm.all_gather_single(full, unit.shard.detach(), group=self.group,
                                            kind="all_gather.checkpoint")   # (L,)
            for places, view in zip(unit.places, unit.layout.views(full)):
                whole.update({name: view.clone() for _, _, name in places})
        rest = self.module.state_dict()           # frozen parameters and buffers
        return {name: whole[name] if name in whole else rest[name] for name in self._names}

    @torch.no_grad()
    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Each rank takes its shard of every parameter from a whole state dict (no communication)."""
        for unit in self.units:
            tensors = [state[places[0][2]] for places in unit.places]
            flat = unit.layout.flatten(tensors, dtype=unit.shard.dtype, device=unit.shard.device)
            unit.shard.copy_(flat[unit.layout.shard(self.rank)])
        rest = self.module.state_dict()           # frozen parameters and buffers
        self.module.load_state_dict({name: state[name] for name in rest})


def _cast(value, dtype: torch.dtype):
    return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value


class Stage3Optimizer(DPOptimizer):
    """The optimizer of a :class:`ZeroStage3` model: any torch optimizer over its shards.

    ``step()`` communicates nothing: the next forward gathers the updated
    shards; nor does :meth:`finish_gradient_sync`: backward reduce-scattered
    each unit's gradient already. ``offload=True`` runs it on the host
    (:class:`dtlab.zero.offload.OffloadOptimizer`).
    """

    def __init__(self, model: ZeroStage3, optimizer_class=torch.optim.AdamW, *, offload: bool = False,
                 **optimizer_kwargs):
        self.model, self.offload, self.meter = model, offload, model.meter
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = (OffloadOptimizer(params, optimizer_class, **optimizer_kwargs) if offload
                          else optimizer_class(params, **optimizer_kwargs))

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def step(self) -> None:
        self.optimizer.step()

    def gradients(self) -> list[GradPiece]:
        """Each unit's (S,) shard gradient (reduce-scattered in backward), cut per parameter: all counted."""
        pieces = []
        for unit in self.model.units:
            if unit.shard.grad is not None:
                names, numels, shard = self._cut(unit)
                pieces += [GradPiece(name, unit.shard.grad[offset:offset + stop - start], True)
                           for name, start, stop, offset in shard_ranges(names, numels, shard)]
        return pieces

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Free the shards' gradients and start a new step's count of the gathered peak."""
        self.optimizer.zero_grad(set_to_none=True)
        self.model.reset_peak()

    # -- the training state: this rank's shard of every unit, weights and optimizer state alike
    def training_state(self) -> list[Piece]:
        """Each unit's (S,) shard of the weights with its optimizer state, cut per parameter (original names)."""
        pieces = []
        for unit in self.model.units:
            tensors, scalars = split_state(state_of(self.optimizer, unit.shard), unit.layout.shard_numel)
            pieces += flat_pieces(*self._cut(unit), {PARAM: unit.shard, **tensors}, scalars)
        return pieces

    @torch.no_grad()
    def load_training_state(self, source: StateSource) -> None:
        """Each unit's shard of the weights, then its optimizer state (no communication)."""
        for unit in self.model.units:
            if not read_flat(*self._cut(unit), source, PARAM, unit.shard.data):
                raise DtlabError(f"the saved state holds no weights for ZeRO-3 unit {unit.name}",
                                 f"保存的状态中没有 ZeRO-3 单元 {unit.name} 的权重")
            state = read_flat_state(*self._cut(unit), source, like=unit.shard.detach())
            set_state_of(self.optimizer, unit.shard, state)

    def _cut(self, unit) -> tuple:
        """How the unit's flat buffer is laid out: parameter names, their sizes, this rank's shard."""
        names = [places[0][2] for places in unit.places]       # a tied parameter: its first name
        return names, unit.layout.numels, unit.layout.shard(self.model.rank)

    def state_dict(self) -> dict:
        return {"world_size": self.model.world_size, "rank": self.model.rank,
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])

    def memory_bytes(self) -> dict[str, int]:
        """As :meth:`ZeroStage3.memory_bytes`, with this optimizer's state (0 on the device if offloaded)."""
        return self.model.memory_bytes(None if self.offload else self.optimizer)

    def host_memory_bytes(self) -> dict[str, int]:
        return self.optimizer.host_memory_bytes() if self.offload else no_bytes()
