"""ZeRO stage 3 (P_os+g+p, the idea PyTorch's FSDP implements): the parameters are sharded too.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC 2020, Sec. 5.3 and 7.2.2. Between uses every rank keeps
only a 1/N flat shard of each layer's parameters (and of their gradients and
optimizer state, as in stages 1 and 2, see ``dtlab/zero.py``). A layer's
whole parameters exist only while that layer computes::

    forward   layer i:  all-gather its shards -> compute -> free the gathered parameters
    backward  layer i:  all-gather them again -> compute gradients -> reduce-scatter the
                        gradients (each rank keeps the averaged shard of its own) -> free

so a rank holds 16Ψ/N bytes of model states plus one or two gathered
layers at a time. The price: parameters cross the network twice (forward and
backward) and gradients once, 3Ψ per step against plain DP's all-reduce of
2Ψ: 1.5x (Sec. 7.2.2). ``ZeroStage3.meter`` counts every collective, so a
test checks that figure.

The unit gathered at once is one submodule of the model: each child of the
wrapped module, and each element of a child that is a ``ModuleList`` (for the
small GPT: ``tok_emb``, ``pos_emb``, each of ``blocks``, ``ln_f``, ``head``),
as ``fully_shard`` is applied per block in FSDP2. Parameters of the root
itself, or shared (tied) between units, form a root unit gathered for the
whole forward. Frozen parameters and buffers are left as they are, whole.

How it is wired, with autograd's own hooks:

* a forward pre-hook on each unit calls :class:`_GatherParams`, an autograd
  function whose forward is the all-gather and whose backward is its
  derivative, a reduce-scatter; the gathered parameters become plain tensor
  attributes of the modules for the duration of the call;
* a forward hook frees them. Autograd would normally keep the weights it
  needs for backward alive; a ``saved_tensors_hooks`` pair stores, for any
  saved tensor inside a gathered buffer, only its address in that buffer,
  and looks it up again in backward;
* a gradient hook on the unit's outputs all-gathers the unit again just
  before its backward starts (``register_multi_grad_hook``).

The optimizer is any torch optimizer over ``wrapped.parameters()``: the
shards. Its step needs no communication; the next forward gathers the
updated shards. ``compute_dtype=torch.bfloat16`` gathers, computes and
reduce-scatters in bf16 while the shards (the fp32 masters) and the update
stay fp32.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn

from dtlab.collectives import ALL_GATHER, REDUCE_SCATTER, CommMeter, group_size_and_rank
from dtlab.memory import model_state_bytes, tensor_bytes
from dtlab.offload import OffloadOptimizer
from dtlab.zero import FlatLayout


def unit_modules(module: nn.Module) -> list[nn.Module]:
    """The submodules gathered one at a time: each child, and each element of a ModuleList/Dict child.

    Containers are never called (their elements are), so hooks on them would never fire.
    """
    units = []
    for child in module.children():
        units.extend(child.children() if isinstance(child, (nn.ModuleList, nn.ModuleDict)) else [child])
    return units


def _assign_units(module: nn.Module) -> list[tuple[nn.Module, str, list]]:
    """``(module to hook, unit name, [(parameter, places)])`` per unit.

    ``places`` are where the parameter is used: ``(module, attribute, qualified name)``.

    A trainable parameter used by one unit belongs to it; one of the root's
    own, or tied between units, belongs to a root unit, gathered for the
    whole forward (it comes first).
    """
    modules = unit_modules(module)
    unit_of = {id(m): i for i, unit in enumerate(modules) for m in unit.modules()}
    found: dict[int, tuple] = {}                  # id(parameter) -> (parameter, places, units using it)
    for prefix, m in module.named_modules(remove_duplicate=False):
        for attr, p in m.named_parameters(recurse=False, remove_duplicate=False):
            if p.requires_grad:
                entry = found.setdefault(id(p), (p, [], set()))
                entry[1].append((m, attr, f"{prefix}.{attr}" if prefix else attr))
                entry[2].add(unit_of.get(id(m)))   # None: the root's own
    groups: dict = {}
    for p, places, units in found.values():
        groups.setdefault(units.pop() if len(units) == 1 else None, []).append((p, places))
    names = {id(m): name for name, m in module.named_modules(remove_duplicate=False)}
    order = sorted(groups, key=lambda i: -1 if i is None else i)    # the root unit first
    return [(module, "root", groups[i]) if i is None else (modules[i], names[id(modules[i])], groups[i])
            for i in order]


class _Address(NamedTuple):
    """A tensor saved for backward that lives in a gathered buffer, kept as where it is, not what."""

    unit: "_Unit"
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


class _GatherParams(torch.autograd.Function):
    """Forward: all-gather the unit's shards. Backward: the derivative of that, a reduce-scatter.

    Gathering concatenates every rank's shard, so the gradient of rank r's
    shard is the sum, over every rank's gradient of the whole, of the slice
    that came from r: exactly what a reduce-scatter computes.
    """

    @staticmethod
    def forward(ctx, shard: torch.Tensor, unit: "_Unit") -> torch.Tensor:   # (S,) -> (L,)
        ctx.unit = unit
        return unit.gather().detach()   # an alias: the unit's own reference carries no autograd history

    @staticmethod
    def backward(ctx, grad_full: torch.Tensor):                              # (L,) -> (S,)
        grad_shard = ctx.unit.reduce_scatter(grad_full)
        ctx.unit.free()                 # this unit's backward is complete: back to 1/N
        return grad_shard, None


class _Unit:
    """Parameters gathered and freed together, kept as this rank's (S,) flat shard in between."""

    def __init__(self, name: str, params: list, owner: "ZeroStage3"):
        """``params``: ``(parameter, [(module, attribute, qualified name), ...])`` per parameter."""
        self.name, self.owner = name, owner
        self.places = [places for _, places in params]
        self.layout = FlatLayout(tuple(p.shape for p, _ in params), owner.world_size)
        first = params[0][0]
        flat = self.layout.flatten([p.detach() for p, _ in params], dtype=first.dtype,
                                   device=first.device)                           # (L,) 1D
        self.shard = nn.Parameter(flat[self.layout.shard(owner.rank)].clone())    # (S,) 1D flat shard
        self.dtype = owner.compute_dtype or first.dtype
        for places in self.places:
            for module, attr, _ in places:
                delattr(module, attr)          # no longer a registered parameter: the shard is
        # Between uses each parameter attribute is a placeholder on the meta device:
        # the right shape (so printing the model works), and no data.
        self.placeholders = [torch.empty(p.shape, dtype=p.dtype, device="meta") for p, _ in params]
        self.full: torch.Tensor | None = None   # (L,) in the compute dtype, only while gathered
        self._set(self.placeholders)

    def _set(self, tensors) -> None:
        for places, tensor in zip(self.places, tensors):
            for module, attr, _ in places:
                setattr(module, attr, tensor)

    # -- the two collectives
    def gather(self) -> torch.Tensor:
        """All-gather this unit's whole parameters into a new (L,) buffer (once again, if held)."""
        self.free()
        owner = self.owner
        full = torch.empty(self.layout.padded_numel, dtype=self.dtype, device=self.shard.device)
        mine = self.shard.detach().to(self.dtype)                 # (S,), a copy only if the dtype changes
        if owner.world_size == 1:
            full.copy_(mine)
        else:
            owner.meter.record_call(ALL_GATHER, full)
            dist.all_gather_single(full, mine, group=owner.group)  # N x (S,) -> (L,)
        self.full = full
        owner._hold(self, +1)
        return full

    def reduce_scatter(self, grad_full: torch.Tensor) -> torch.Tensor:
        """(L,) gradient of the whole unit on this rank -> (S,) average over ranks of this rank's shard."""
        owner = self.owner
        grad = grad_full.div(owner.world_size)   # mean = sum of (g / N): gloo has no AVG
        if owner.world_size > 1:
            shard_grad = torch.empty(self.layout.shard_numel, dtype=grad.dtype, device=grad.device)
            owner.meter.record_call(REDUCE_SCATTER, grad)
            dist.reduce_scatter_single(shard_grad, grad.contiguous(), group=owner.group)   # (L,) -> (S,)
            grad = shard_grad
        return grad.to(self.shard.dtype)         # the fp32 master's gradient

    def free(self) -> None:
        if self.full is not None:
            self.owner._hold(self, -1)
            self.full = None

    # -- the hooks
    def before_forward(self, module, args) -> None:
        full = _GatherParams.apply(self.shard, self)              # (L,) in the compute dtype
        self._set(self.layout.views(full))                        # each in its shape, while the call lasts

    def after_forward(self, module, args, output) -> None:
        self._set(self.placeholders)
        self.free()                     # autograd kept only addresses in it (ZeroStage3._saved_tensor_hooks)
        needing_grad = [t for t in _tensors(output) if t.requires_grad]
        if needing_grad:
            torch.autograd.graph.register_multi_grad_hook(needing_grad, self.before_backward, mode="any")

    def before_backward(self, grad) -> None:
        """Called when the gradient of the unit's output exists, just before the unit's own backward."""
        if self.full is None:
            self.gather()


def _tensors(output) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _tensors(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _tensors(item)]
    return []


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
        self._gathered: dict[int, _Unit] = {}      # storage address of a gathered buffer -> its unit
        self._held_bytes = self._peak_bytes = 0
        self._names = list(module.state_dict())    # full_state_dict() returns this order
        self.units: list[_Unit] = []
        for unit_module, name, params in _assign_units(module):
            unit = _Unit(name, params, self)
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
        with torch.autograd.graph.saved_tensors_hooks(*self._saved_tensor_hooks(outer)):
            return self.module(*args, **kwargs)

    def _saved_tensor_hooks(self, outer):
        """What autograd keeps for backward: a gathered parameter only as its address in its unit's buffer."""
        outer_pack, outer_unpack = outer or (lambda t: t.detach(), lambda saved: saved)

        def pack(tensor: torch.Tensor):
            unit = self._gathered.get(tensor.untyped_storage().data_ptr())
            if unit is None:
                return outer_pack(tensor)     # an activation: saved as it would be without us
            return _Address(unit, tensor.size(), tensor.stride(), tensor.storage_offset())

        def unpack(saved) -> torch.Tensor:
            if not isinstance(saved, _Address):
                return outer_unpack(saved)
            full = saved.unit.full if saved.unit.full is not None else saved.unit.gather()
            return full.as_strided(saved.size, saved.stride, saved.offset)

        return pack, unpack

    def _hold(self, unit: _Unit, sign: int) -> None:
        """Bookkeeping of the gathered buffers alive now, for the pack hook and for memory_bytes()."""
        if sign > 0:
            self._gathered[unit.full.untyped_storage().data_ptr()] = unit
        else:
            del self._gathered[unit.full.untyped_storage().data_ptr()]
        self._held_bytes += sign * tensor_bytes(unit.full)
        self._peak_bytes = max(self._peak_bytes, self._held_bytes)

    # -- memory
    def memory_bytes(self, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
        """``{"params", "grads", "optimizer", "gathered_peak"}`` in bytes on this rank's device.

        ``params`` is what is held between layers: the shards (plus frozen
        parameters); ``gathered_peak`` the most bytes of gathered whole
        parameters held at once since :meth:`reset_peak`; ``optimizer`` the
        state of ``optimizer`` if given.
        """
        return {**model_state_bytes(self.parameters(), optimizer), "gathered_peak": self._peak_bytes}

    def reset_peak(self) -> None:
        self._peak_bytes = self._held_bytes

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
                dist.all_gather_single(full, unit.shard.detach(), group=self.group)   # (L,)
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


class Stage3Optimizer:
    """The optimizer of a :class:`ZeroStage3` model: any torch optimizer over its shards.

    ``step()`` communicates nothing: the next forward gathers the updated
    shards. ``offload=True`` runs it on the host (:class:`dtlab.offload.OffloadOptimizer`).
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

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Free the shards' gradients and start a new step's count of the gathered peak."""
        self.optimizer.zero_grad(set_to_none=True)
        self.model.reset_peak()

    def state_dict(self) -> dict:
        return {"world_size": self.model.world_size, "rank": self.model.rank,
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])

    def memory_bytes(self) -> dict[str, int]:
        """As :meth:`ZeroStage3.memory_bytes`, with this optimizer's state (0 on the device if offloaded)."""
        return self.model.memory_bytes(None if self.offload else self.optimizer)

    def host_memory_bytes(self) -> dict[str, int]:
        if self.offload:
            return self.optimizer.host_memory_bytes()
        return {"params": 0, "grads": 0, "optimizer": 0}
