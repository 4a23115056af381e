"""ZeRO stage 3 (P_os+g+p, the idea PyTorch's FSDP implements): the parameters are sharded too.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC 2020, Sec. 5.3 and 7.2.2. Between uses every rank keeps
only a 1/N flat shard of each layer's parameters (and of their gradients and
optimizer state, as in stages 1 and 2, :mod:`dtlab.parallel.zero.stage12`). A layer's
whole parameters exist only while that layer computes::

    forward   layer i:  all-gather its shards -> compute -> free the gathered parameters
    backward  layer i:  all-gather them again -> compute gradients -> reduce-scatter the
                        gradients (each rank keeps the averaged shard of its own) -> free

so a rank holds 16Ψ/N bytes of model states plus one gathered layer at a
time, or, with ``prefetch=p`` (default 1, as FSDP2 does), p + 1: while
layer i computes, the all-gathers of the next p layers (in backward: the
previous ones) are already in flight, so the communication hides behind
compute (the tracer's ``overlap_s``) for p more layers of memory. The price: parameters cross the network twice (forward and
backward) and gradients once, 3Ψ per step against plain DP's all-reduce of
2Ψ: 1.5x (Sec. 7.2.2). ``ZeroStage3.meter`` counts every collective, so a
test checks that figure.

What is gathered at once (a *unit*: one block, say) and the autograd hooks
that gather, free and reduce-scatter it are in :mod:`dtlab.parallel.zero.units`;
:class:`ZeroStage3` cuts a model into units and installs the hooks.

After wrapping, ``wrapped.module.named_parameters()`` yields the original
names, each holding this rank's flat 1-D shard of that parameter (see
:mod:`dtlab.parallel.zero.units`; :meth:`ZeroStage3.named_shards` says which range of
the whole each holds), and after backward each has a ``.grad`` of the same
shape and dtype: the averaged gradient of those elements. So the optimizer
is any torch optimizer over ``wrapped.parameters()``, parameter groups
included (:class:`Stage3Optimizer` wraps one for the training loop). Its step
needs no communication; the next forward gathers the updated shards.
Element-wise optimizers (SGD, Adam, AdamW) give the same update as on the
whole parameter; one that reads a parameter's shape (Adafactor's factored
moments, Shampoo) does not work on flat shards (FSDP2's DTensor row shards
keep the shape for it).
``compute_dtype=torch.bfloat16`` gathers, computes and reduce-scatters in
bf16 while the shards (the fp32 masters) and the update stay fp32.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from dtlab.comm import calls as comm
from dtlab.comm.collectives import CommMeter, group_size_and_rank
from dtlab.i18n import ConfigError, DtlabError
from dtlab.measure.memory import model_state_bytes, tensor_bytes
from dtlab.numerics.master_weights import MasterWeights
from dtlab.parallel.data_parallel import broadcast_from_rank0
from dtlab.parallel.dp_optimizer import DPOptimizer, GradPiece, WrappingOptimizer, no_bytes
from dtlab.parallel.zero.hybrid import Replicas
from dtlab.parallel.zero.offload import OffloadOptimizer, check_master_weights, set_state_of, state_of
from dtlab.parallel.zero.policy import Replicated, shard_predicate
from dtlab.parallel.zero.units import ShardGroup, Unit, assign_units, saved_tensor_hooks
from dtlab.state.training_state import PARAM, Piece, StateSource, load_whole, split_state, whole_pieces


class ZeroStage3(nn.Module):
    """Wrap ``module`` so that each rank holds 1/N of its parameters, gradients and optimizer state.

    ``wrapped = ZeroStage3(model, group=g)``; ``torch.optim.AdamW(wrapped.parameters())``
    updates the shards, which are ``model``'s own parameters from now on (same
    names, 1-D shards). Rank 0's weights and buffers are broadcast first, as
    the data-parallel wrappers do, so every rank starts from the same model.
    ``prefetch``: units whose all-gather is issued ahead, while the unit before
    them computes (:mod:`dtlab.parallel.zero.units`); 0 gathers each one when it is needed.
    ``replicate_group`` (hybrid sharding, :mod:`dtlab.parallel.zero.hybrid`): ``group`` shards, and
    each unit's gradient shard is all-reduced over this group of copies.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        group=None,
        compute_dtype: torch.dtype | None = None,
        meter: CommMeter | None = None,
        prefetch: int = 1,
        replicate_group=None,
        shard_modules=None,
    ):
        super().__init__()
        check_prefetch(prefetch)
        broadcast_from_rank0(module, group=group)
        if replicate_group is not None:  # HSDP: then every copy has global rank 0's
            broadcast_from_rank0(module, group=replicate_group)
        self.module, self.group, self.compute_dtype = module, group, compute_dtype
        self.world_size, self.rank = group_size_and_rank(group)
        self.meter = meter if meter is not None else CommMeter()
        self.shared = ShardGroup(
            group,
            self.world_size,
            self.rank,
            self.meter,
            compute_dtype,
            prefetch=prefetch,
            replicas=Replicas.of(replicate_group),
        )
        self._names = list(module.state_dict())  # full_state_dict() returns this order
        self.units: list[Unit] = []
        for unit_module, name, params in assign_units(module, shard_predicate(shard_modules)):
            unit = Unit(name, params, self.shared)
            # Gathered before any hook already on the module runs (mixed precision's casts must see the
            # whole parameters, not the shards); released after them.
            unit_module.register_forward_pre_hook(unit.before_forward, prepend=True)
            unit_module.register_forward_hook(unit.after_forward)
            self.units.append(unit)
        self.shared.order = list(self.units)  # the first forward's guess: the order registered
        sharded = {id(p) for unit in self.units for p in unit.shards}
        self.replicated = Replicated(  # what the policy keeps whole (nothing by default)
            module,
            [p for _, p in self.named_replicated(sharded)],
            group=group,
            replicate_group=replicate_group,
            meter=self.meter,
            compute_dtype=compute_dtype,
        )

    def named_replicated(self, sharded: set | None = None) -> list[tuple[str, nn.Parameter]]:
        """``(name, parameter)`` per trainable parameter the sharding policy keeps whole on every rank."""
        if sharded is None:
            sharded = {id(p) for unit in self.units for p in unit.shards}
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad and id(p) not in sharded]

    @property
    def prefetch(self) -> int:
        """Units whose all-gather is issued ahead, while the unit before them computes (0: none)."""
        return self.shared.prefetch

    def named_shards(self) -> list[tuple[str, nn.Parameter, int, int]]:
        """``(name, shard, start, stop)`` per sharded parameter: ``shard`` (1-D, maybe empty) holds
        elements ``[start, stop)`` of the whole parameter, flattened row-major (a tied one: first name)."""
        return [
            (name, shard, *bounds)
            for unit in self.units
            for name, shard, bounds in zip(unit.names(), unit.shards, unit.ranges)
        ]

    def forward(self, *args, **kwargs):
        if self.compute_dtype is not None:  # floating-point inputs follow the parameters' dtype
            args = tuple(_cast(a, self.compute_dtype) for a in args)
            kwargs = {k: _cast(v, self.compute_dtype) for k, v in kwargs.items()}
        # Only the innermost pair of saved-tensor hooks applies, so the pair active around
        # this call, if any (dtlab's activation meter, say), is handed every tensor that
        # is not a gathered parameter. (torch has no public way to ask for that pair.)
        outer = torch._C._autograd._top_saved_tensors_default_hooks(False)
        self.shared.begin_forward()
        with torch.autograd.graph.saved_tensors_hooks(*saved_tensor_hooks(self.shared, outer)):
            output = self.module(*args, **kwargs)
        self.shared.end_forward()
        return output

    # -- memory
    def memory_bytes(self, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
        """``{"params", "grads", "optimizer", "gathered_peak"}`` in bytes on this rank's device.

        ``params`` is what is held between layers: each unit's (S,) shard,
        padding included, plus frozen parameters; ``grads`` the storage the
        shards' gradients live in (autograd may keep them as views of the
        unit's reduce-scattered (S,) gradient); ``gathered_peak`` the most
        bytes of gathered whole parameters held at once since
        :meth:`reset_peak` (a prefetched unit counts from its issue: up to
        ``prefetch`` + 1 units, plus a root unit); ``optimizer`` the state of ``optimizer`` if given.
        """
        whole = model_state_bytes(p for p in self.parameters() if not p.requires_grad or id(p) in self._whole_ids)
        grads = [shard.grad for unit in self.units for shard in unit.shards if shard.grad is not None]
        storages = {g.untyped_storage().data_ptr(): g.untyped_storage().nbytes() for g in grads if g.numel()}
        return {
            "params": sum(tensor_bytes(unit.flat_shard) for unit in self.units) + whole["params"],
            "grads": sum(storages.values()) + whole["grads"],
            "optimizer": model_state_bytes([], optimizer)["optimizer"],
            "gathered_peak": self.shared.peak_bytes,
            "buffers": self.shared.peak_bytes + self.replicated.buffer_bytes,
        }  # the gathered units (and the replicated parameters' buckets) are its buffers

    @property
    def _whole_ids(self) -> set[int]:
        return {id(p) for p in self.replicated.params}

    def reset_peak(self) -> None:
        self.shared.reset_peak()

    # -- whole parameters, for checkpoints and comparisons (collectives: call on every rank)
    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The wrapped module's state dict with whole parameters under their original names."""
        whole = {}
        for unit in self.units:
            full = torch.empty(unit.layout.padded_numel, dtype=unit.flat_shard.dtype, device=unit.flat_shard.device)
            if self.world_size == 1:
                full.copy_(unit.flat_shard)
            else:
                comm.all_gather_single(full, unit.flat_shard, group=self.group, kind="all_gather.checkpoint")  # (L,)
            for places, view in zip(unit.places, unit.layout.views(full)):
                whole.update({name: view.clone() for _, _, name in places})
        rest = self.module.state_dict()  # frozen parameters and buffers (and the shards)
        return {name: whole[name] if name in whole else rest[name] for name in self._names}

    @torch.no_grad()
    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Each rank takes its shard of every parameter from a whole state dict (no communication)."""
        for unit in self.units:
            tensors = [state[name] for name in unit.names()]
            flat = unit.layout.flatten(tensors, dtype=unit.flat_shard.dtype, device=unit.flat_shard.device)
            unit.flat_shard.copy_(flat[unit.layout.shard(self.rank)])  # the shards are views of it
        sharded = {name for unit in self.units for places in unit.places for _, _, name in places}
        for name, tensor in self.module.state_dict().items():  # frozen parameters and buffers
            if name not in sharded:
                tensor.copy_(state[name])


def check_prefetch(prefetch) -> None:
    """Refuse a prefetch that is not a count of units (an int from 0)."""
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ConfigError(
            f"prefetch={prefetch!r} is not allowed; expected an integer >= 0 "
            "(units gathered ahead: 0 gathers each unit only when it is needed)",
            f"prefetch={prefetch!r} 不合法；应为 >= 0 的整数（提前收集的单元数：0 表示每个单元到需要时才收集）",
        )


def _cast(value, dtype: torch.dtype):
    return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value


class Stage3Optimizer(WrappingOptimizer, DPOptimizer):
    """The optimizer of a :class:`ZeroStage3` model: any torch optimizer over its shards.

    ``step()`` communicates nothing: the next forward gathers the updated
    shards; nor does :meth:`finish_gradient_sync`: backward reduce-scattered
    each unit's gradient already. ``offload=True`` runs it on the host
    (:class:`dtlab.parallel.zero.offload.OffloadOptimizer`). ``params`` (default: every
    trainable shard) may be parameter groups over ``model.parameters()``, as
    torch.optim takes them (per-group ``lr``, ``weight_decay``).
    """

    def __init__(
        self,
        model: ZeroStage3,
        optimizer_class=torch.optim.AdamW,
        *,
        offload: bool = False,
        master_weights: bool = False,
        params=None,
        **optimizer_kwargs,
    ):
        check_master_weights(master_weights, offload)
        self.model, self.offload, self.meter = model, offload, model.meter
        self.master_weights = master_weights
        if params is None:
            params = [p for p in model.parameters() if p.requires_grad]
        if offload:
            optimizer = OffloadOptimizer(params, optimizer_class, **optimizer_kwargs)
        elif master_weights:  # fp32 masters of the 16-bit shards: K = 12 bytes per element this rank holds
            optimizer = MasterWeights(params, optimizer_class, **optimizer_kwargs)
        else:
            optimizer = optimizer_class(params, **optimizer_kwargs)
        self._adopt(optimizer)  # a torch.optim.Optimizer too: LambdaLR(this, ...) writes the wrapped one's lr

    def step(self) -> None:
        self.optimizer.step()

    def _grad(self, p: torch.Tensor) -> torch.Tensor | None:
        """The gradient the step uses for ``p``: its own, or its fp32 master's."""
        return self.optimizer.master_gradient(p) if self.master_weights else p.grad

    def gradients(self) -> list[GradPiece]:
        """Each parameter's shard gradient (reduce-scattered in backward): disjoint ranges, all counted."""
        first_copy = self.model.shared.replicas.rank == 0  # HSDP: the first copy counts
        if self.master_weights:
            self.optimizer.take_gradients()  # fp32: the loss scaler unscales these, clipping scales them
        whole = [  # kept whole by the sharding policy: the same on every rank, its first rank counts them
            GradPiece(name, grad, first_copy and self.model.rank == 0)
            for name, p in self.model.named_replicated()
            if (grad := self._grad(p)) is not None
        ]
        return [
            GradPiece(name, grad, first_copy)
            for name, shard, start, stop in self.model.named_shards()
            if (grad := self._grad(shard)) is not None and stop > start
        ] + whole

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Free the shards' gradients and start a new step's count of the gathered peak."""
        self.optimizer.zero_grad(set_to_none=True)
        self.model.reset_peak()

    # -- the training state: this rank's shard of every parameter, weights and optimizer state alike
    def training_state(self) -> list[Piece]:
        """Each parameter's shard (the range of it this rank holds) with its optimizer state (original names)."""
        pieces = []
        for name, shard, start, stop in self.model.named_shards():
            if stop > start:
                tensors, scalars = split_state(state_of(self.optimizer, shard), shard.numel())
                weights = self._weights(shard).detach().to("cpu", copy=True)
                pieces.append(Piece(name, start, stop, {PARAM: weights, **tensors}, scalars))
        replicated = [(name, self._weights(p)) for name, p in self.model.named_replicated()]
        return pieces + whole_pieces(replicated, lambda p: self.optimizer.state.get(p, {}))

    def _weights(self, p: torch.Tensor) -> torch.Tensor:
        """``p``'s authoritative weights: itself, or its fp32 master."""
        return self.optimizer.master_of(p) if self.master_weights else p

    @torch.no_grad()
    def load_training_state(self, source: StateSource) -> None:
        """Each parameter's shard of the weights, then its optimizer state (no communication)."""
        for name, shard, start, stop in self.model.named_shards():
            keys = source.keys(name)
            if stop > start:
                if PARAM not in keys:
                    raise DtlabError(
                        f"the saved state holds no weights for {name} (ZeRO-3)",
                        f"保存的状态中没有 {name} 的权重（ZeRO-3）",
                    )
                weights = source.read(name, PARAM, start, stop)
                shard.copy_(weights)
            else:
                weights = torch.empty(0)
            state_dtype = torch.float32 if self.master_weights else shard.dtype  # the masters' state is fp32
            state = {
                k: (source.read(name, k, start, stop) if stop > start else torch.empty(0)).to(shard.device, state_dtype)
                for k in sorted(keys - {PARAM})
            }
            scalars = {k: v.clone() for k, v in source.scalars(name).items()}
            set_state_of(self.optimizer, shard, {**state, **scalars} if state else {}, weights)
        if self.master_weights:  # the replicated parameters' masters take the exact weights, then their state
            replicated = [(name, self.optimizer.master_of(p)) for name, p in self.model.named_replicated()]
            load_whole(replicated, source, lambda master, state: set_state_of(self.optimizer.optimizer, master, state))
            for _, p in self.model.named_replicated():
                p.copy_(self.optimizer.master_of(p))
            return
        load_whole(self.model.named_replicated(), source, lambda p, state: set_state_of(self.optimizer, p, state))

    def state_dict(self) -> dict:
        return {"world_size": self.model.world_size, "rank": self.model.rank, "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self._share_wrapped()  # torch's load replaces the groups

    def memory_bytes(self) -> dict[str, int]:
        """As :meth:`ZeroStage3.memory_bytes`, with this optimizer's state (0 on the device if offloaded)."""
        held = self.model.memory_bytes(None if self.offload else self.optimizer)
        if self.master_weights:
            held["master"] = self.optimizer.master_bytes()  # the fp32 masters of this rank's shards
        return held

    def host_memory_bytes(self) -> dict[str, int]:
        return self.optimizer.host_memory_bytes() if self.offload else no_bytes()
