"""ZeRO stage 3's units: the parameters gathered, used and freed together, and the hooks that do it.

The unit gathered at once is one submodule of the model: each child of the
wrapped module, and each element of a child that is a ``ModuleList`` (for the
small GPT: ``tok_emb``, ``pos_emb``, each of ``blocks``, ``ln_f``, ``head``),
as ``fully_shard`` is applied per block in FSDP2. Parameters of the root
itself, or shared (tied) between units, form a root unit gathered for the
whole forward. Frozen parameters and buffers are left as they are, whole.

How it is wired, with autograd's own hooks (:class:`dtlab.parallel.zero.stage3.ZeroStage3`
installs them):

* between uses each parameter is registered under its own name as this
  rank's *flat shard* of it: a 1-D ``nn.Parameter`` viewing the part of the
  unit's (S,) shard that falls inside that parameter (FSDP1's
  ``use_orig_params`` view; FSDP2 shards each parameter by rows instead). It
  may hold no elements on some ranks. An optimizer over
  ``module.parameters()`` updates these views, so the shard itself;
* a forward pre-hook on each unit calls :class:`_GatherParams`, an autograd
  function whose forward is the all-gather and whose backward is its
  derivative, a reduce-scatter cut into each parameter's piece (autograd
  adds it into each shard's ``.grad``, shaped as the shard); the gathered
  parameters take the shards' places in the modules for the call (as FSDP
  swaps its sharded and unsharded parameters);
* a forward hook frees them. Autograd would normally keep the weights it
  needs for backward alive; a ``saved_tensors_hooks`` pair
  (:func:`saved_tensor_hooks`) stores, for any saved tensor inside a gathered
  buffer, only its address in that buffer, and looks it up again in backward;
* a gradient hook on the unit's outputs all-gathers the unit again just
  before its backward starts (``register_multi_grad_hook``).

Prefetch (``ShardGroup.prefetch`` = p, FSDP2's default behaviour at p = 1):
each unit, once its own parameters are there and before it computes, issues
the all-gathers of the next p units asynchronously (``async_op=True``, the
work kept), so they travel while it computes; the next unit waits on its
work instead of issuing one. *Next* is, in forward, the order the previous
forward ran the units in (the first forward: the order they were registered
in, which is the call order for a model whose children are listed as they
run; a unit prefetched and then not run next is freed when the forward ends,
one all-gather spent for nothing); in backward, the reverse of the order this forward left them in, as
FSDP2 records the forward order and prefetches in reverse during backward.
So up to p + 1 units are gathered at once (besides a root unit, gathered
for the whole forward and the whole backward), each still one all-gather
per forward and one per backward; p = 0 gathers strictly one unit at a time,
each all-gather issued and waited at once. A unit's gradient is still
reduce-scattered blocking as its backward ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn as nn

from dtlab.comm import calls as comm
from dtlab.comm.collectives import ALL_GATHER, REDUCE_SCATTER, CommMeter
from dtlab.measure.memory import note, tensor_bytes
from dtlab.parallel.zero.flat import FlatLayout
from dtlab.parallel.zero.hybrid import Replicas


def unit_modules(module: nn.Module) -> list[nn.Module]:
    """The submodules gathered one at a time: each child, and each element of a ModuleList/Dict child.

    Containers are never called (their elements are), so hooks on them would never fire.
    """
    units = []
    for child in module.children():
        units.extend(child.children() if isinstance(child, (nn.ModuleList, nn.ModuleDict)) else [child])
    return units


def assign_units(module: nn.Module, shard=None) -> list[tuple[nn.Module, str, list]]:
    """``(module to hook, unit name, [(parameter, places)])`` per unit.

    ``places`` are where the parameter is used: ``(module, attribute, qualified name)``.

    A trainable parameter used by one unit belongs to it; one of the root's
    own, or tied between units, belongs to a root unit, gathered for the
    whole forward (it comes first). ``shard`` (a predicate on modules, the sharding policy of
    :mod:`dtlab.parallel.zero.policy`): a parameter is left out unless every module using it matches.
    """
    modules = unit_modules(module)
    unit_of = {id(m): i for i, unit in enumerate(modules) for m in unit.modules()}
    found: dict[int, tuple] = {}  # id(parameter) -> (parameter, places, units using it)
    for prefix, m in module.named_modules(remove_duplicate=False):
        for attr, p in m.named_parameters(recurse=False, remove_duplicate=False):
            if p.requires_grad:
                entry = found.setdefault(id(p), (p, [], set()))
                entry[1].append((m, attr, f"{prefix}.{attr}" if prefix else attr))
                entry[2].add(unit_of.get(id(m)))  # None: the root's own
    groups: dict = {}
    for p, places, units in found.values():
        if shard is not None and not all(shard(m) for m, _, _ in places):
            continue  # replicated by the policy
        groups.setdefault(units.pop() if len(units) == 1 else None, []).append((p, places))
    names = {id(m): name for name, m in module.named_modules(remove_duplicate=False)}
    order = sorted(groups, key=lambda i: -1 if i is None else i)  # the root unit first
    return [(module, "root", groups[i]) if i is None else (modules[i], names[id(modules[i])], groups[i]) for i in order]


@dataclass(eq=False)
class ShardGroup:
    """What the units of one wrapped model share: the group, the meter, and which buffers are gathered."""

    group: object
    world_size: int
    rank: int
    meter: CommMeter
    compute_dtype: torch.dtype | None = None
    gathered: dict = field(default_factory=dict)  # storage address of a gathered buffer -> its Unit
    held_bytes: int = 0
    peak_bytes: int = 0
    prefetch: int = 0
    """Units whose all-gather is issued ahead of their use (0: each gathered when it is needed)."""
    order: list = field(default_factory=list)
    """The units in the order the last forward ran them (before any: the order they were registered in)."""
    running: list = field(default_factory=list)  # this forward's units, in the order they run
    leaving: "_Leaving" = field(default_factory=lambda: _Leaving())
    replicas: Replicas = field(default_factory=Replicas)
    """Hybrid sharding: the copies of this shard group's units (one all-reduce of each gradient shard)."""

    def begin_forward(self) -> None:
        self.settle()
        self.running, self.leaving = [], _Leaving()

    def end_forward(self) -> None:
        """The forward is over: its order is the next forward's, and nothing it prefetched stays."""
        self.settle()
        self.order = self.running

    def prefetch_after(self, units: list, index: int, done) -> None:
        """Issue the all-gathers of ``units[index + 1 : index + 1 + prefetch]``, those not held yet and
        not in ``done`` (units that have run already, if the model runs them in another order)."""
        for unit in units[index + 1 : index + 1 + self.prefetch]:
            if unit not in done:
                unit.start_gather(async_op=True)

    def settle(self) -> None:
        """Free every gathered unit no hook is using: a prefetch the model did not use (a forward that
        ran its units in another order), so no buffer outlives the step or sees a stale shard."""
        for unit in list(self.gathered.values()):
            unit.free()

    def hold(self, unit: "Unit", sign: int) -> None:
        """Bookkeeping of the gathered buffers alive now, for the pack hook and for the peak."""
        if sign > 0:
            self.gathered[unit.full.untyped_storage().data_ptr()] = unit
        else:
            del self.gathered[unit.full.untyped_storage().data_ptr()]
        self.held_bytes += sign * tensor_bytes(unit.full)
        note("gathered", sign * tensor_bytes(unit.full))  # memory's peak at one moment
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    def reset_peak(self) -> None:
        self.peak_bytes = self.held_bytes


@dataclass(eq=False)
class _Leaving:
    """One forward's units that await a backward, in the order they left the forward (backward needs
    them in reverse), and those whose backward has begun."""

    units: list = field(default_factory=list)
    started: set = field(default_factory=set)


class _Address(NamedTuple):
    """A tensor saved for backward that lives in a gathered buffer, kept as where it is, not what."""

    unit: "Unit"
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


class _GatherParams(torch.autograd.Function):
    """Forward: all-gather the unit's shards. Backward: the derivative of that, a reduce-scatter.

    Gathering concatenates every rank's shard, so the gradient of rank r's
    shard is the sum, over every rank's gradient of the whole, of the slice
    that came from r: exactly what a reduce-scatter computes. That (S,)
    gradient is then cut into the pieces of the parameters' shards (views).
    """

    @staticmethod
    def forward(ctx, unit: "Unit", *shards: torch.Tensor) -> torch.Tensor:  # k x (s_i,) -> (L,)
        ctx.unit = unit
        return unit.gather().detach()  # an alias: the unit's own reference carries no autograd history

    @staticmethod
    def backward(ctx, grad_full: torch.Tensor):  # (L,) -> k x (s_i,)
        grad_shard = ctx.unit.reduce_scatter(grad_full)  # (S,)
        ctx.unit.free()  # this unit's backward is complete: back to 1/N
        sizes = [shard.numel() for shard in ctx.unit.shards]
        return (None, *grad_shard.split([*sizes, grad_shard.numel() - sum(sizes)])[:-1])


class Unit:
    """Parameters gathered and freed together, kept as this rank's (S,) flat shard in between."""

    def __init__(self, name: str, params: list, shared: ShardGroup):
        """``params``: ``(parameter, [(module, attribute, qualified name), ...])`` per parameter."""
        self.name, self.shared = name, shared
        self.places = [places for _, places in params]
        self.layout = FlatLayout(tuple(p.shape for p, _ in params), shared.world_size)
        first = params[0][0]
        flat = self.layout.flatten([p.detach() for p, _ in params], dtype=first.dtype, device=first.device)  # (L,) 1D
        mine = self.layout.shard(shared.rank)
        self.flat_shard = flat[mine].clone()  # (S,) 1D: this rank's part of the unit, padding included
        # Parameter i holds elements ranges[i] = [start, stop) of itself (flattened) here, as a 1D view
        # of flat_shard: the parameters are laid end to end, so these views tile the shard in order.
        self.ranges, self.shards, begin = [], [], 0
        for numel in self.layout.numels:
            lo = min(max(begin, mine.start), mine.stop)
            hi = min(max(begin + numel, lo), mine.stop)
            self.ranges.append((lo - begin, hi - begin) if hi > lo else (0, 0))
            self.shards.append(nn.Parameter(self.flat_shard[lo - mine.start : hi - mine.start]))  # (s_i,) 1D
            begin += numel
        self.dtype = shared.compute_dtype or first.dtype
        self.full: torch.Tensor | None = None  # (L,) in the compute dtype, only while gathered
        self._pending = None  # (work, input) of a prefetch not yet waited on
        self._set(self.shards)  # registered under the original names from now on

    def names(self) -> list[str]:
        """Each parameter's qualified name (a tied one: its first)."""
        return [places[0][2] for places in self.places]

    def _set(self, tensors) -> None:
        """Put ``tensors`` where the parameters are registered (``nn.Module.__setattr__`` accepts only
        ``nn.Parameter`` there, and the gathered ones are autograd results, so the dict is written)."""
        for places, tensor in zip(self.places, tensors):
            for module, attr, _ in places:
                module._parameters[attr] = tensor

    # -- the two collectives
    def start_gather(self, async_op: bool = False) -> None:
        """All-gather this unit's whole parameters into a new (L,) buffer, unless it is held already
        (gathered, or a prefetch in flight); ``async_op``: keep the work, :meth:`gather` waits on it."""
        if self.full is not None:
            return
        shared = self.shared
        full = torch.empty(self.layout.padded_numel, dtype=self.dtype, device=self.flat_shard.device)
        mine = self.flat_shard.to(self.dtype)  # (S,), a copy only if the dtype changes
        if shared.world_size == 1:
            full.copy_(mine)
        else:
            shared.meter.record_call(ALL_GATHER, full)
            work = comm.all_gather_single(full, mine, group=shared.group, async_op=async_op)  # N x (S,) -> (L,)
            self._pending = (work, mine) if async_op else None  # its input lives until the wait
        self.full = full
        shared.hold(self, +1)

    def gather(self) -> torch.Tensor:
        """This unit's whole parameters (L,): the prefetched ones once their all-gather is done, else gathered now."""
        self.start_gather()
        if self._pending is not None:
            work, self._pending = self._pending[0], None
            work.wait()
        return self.full

    def ready(self) -> torch.Tensor:
        """:meth:`gather`, called only if the unit is not held, or held by a prefetch not waited on yet."""
        return self.full if self.full is not None and self._pending is None else self.gather()

    def reduce_scatter(self, grad_full: torch.Tensor) -> torch.Tensor:
        """(L,) gradient of the whole unit on this rank -> (S,) average over ranks of this rank's shard."""
        shared = self.shared
        grad = grad_full.div(shared.world_size * shared.replicas.size)  # mean = sum of (g / N): gloo has no AVG
        if shared.world_size > 1:
            shard_grad = torch.empty(self.layout.shard_numel, dtype=grad.dtype, device=grad.device)
            shared.meter.record_call(REDUCE_SCATTER, grad)
            comm.reduce_scatter_single(shard_grad, grad.contiguous(), group=shared.group)  # (L,) -> (S,)
            grad = shard_grad
        shared.replicas.all_reduce(grad, shared.meter)  # HSDP: (S,) summed over the replicas
        return grad.to(self.flat_shard.dtype)  # the fp32 master's gradient

    def free(self) -> None:
        if self.full is not None:
            if self._pending is not None:  # a prefetch never used: let its all-gather finish first
                work, self._pending = self._pending[0], None
                work.wait()
            self.shared.hold(self, -1)
            self.full = None

    # -- the hooks
    def before_forward(self, module, args) -> None:
        shared = self.shared
        full = _GatherParams.apply(self, *self.shards)  # (L,) in the compute dtype
        shared.running.append(self)
        order = shared.order
        index = len(shared.running) - 1
        if not (index < len(order) and order[index] is self):  # another order than last time
            index = order.index(self) if self in order else len(order)
        shared.prefetch_after(order, index, shared.running)  # in flight while this unit computes
        self._set(self.layout.views(full))  # each in its shape, while the call lasts

    def after_forward(self, module, args, output) -> None:
        self._set(self.shards)
        self.free()  # autograd kept only addresses in it (saved_tensor_hooks)
        needing_grad = [t for t in _tensors(output) if t.requires_grad]
        if needing_grad:
            leaving = self.shared.leaving
            index = len(leaving.units)
            leaving.units.append(self)
            torch.autograd.graph.register_multi_grad_hook(
                needing_grad, lambda grad: self.before_backward(leaving, index), mode="any"
            )

    def before_backward(self, leaving: "_Leaving", index: int) -> None:
        """Called when the gradient of the unit's output exists, just before the unit's own backward.

        ``leaving``: the units of its forward in the order they left it, this one at ``index``;
        backward needs them in reverse, so the next are ``leaving.units[index - 1]``, ...
        """
        self.ready()
        leaving.started.add(self)
        backward = leaving.units[index::-1]  # this unit, then the ones backward needs next
        self.shared.prefetch_after(backward, 0, leaving.started)  # in flight while this unit's backward computes


def _tensors(output) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _tensors(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _tensors(item)]
    return []


def saved_tensor_hooks(shared: ShardGroup, outer):
    """What autograd keeps for backward: a gathered parameter only as its address in its unit's buffer.

    ``outer`` is the pack/unpack pair active around the model's call, or
    None: every tensor that is not a gathered parameter is handed to it.
    """
    outer_pack, outer_unpack = outer or (lambda t: t.detach(), lambda saved: saved)

    def pack(tensor: torch.Tensor):
        unit = shared.gathered.get(tensor.untyped_storage().data_ptr())
        if unit is None:
            return outer_pack(tensor)  # an activation: saved as it would be without us
        return _Address(unit, tensor.size(), tensor.stride(), tensor.storage_offset())

    def unpack(saved) -> torch.Tensor:
        if not isinstance(saved, _Address):
            return outer_unpack(saved)
        full = saved.unit.ready()  # held by now (waited if it was a prefetch), else gathered again
        return full.as_strided(saved.size, saved.stride, saved.offset)

    return pack, unpack
