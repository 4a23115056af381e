"""ZeRO: data parallelism without the redundant copies (stages 1 and 2 here, 3 in ``zero_stage3.py``).

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC 2020 (arXiv 1910.02054, 2019). Plain data parallelism
keeps on every one of N ranks the whole *model states*: parameters,
gradients and optimizer state. With fp32 training and Adam (two state
tensors per parameter) that is 4 + 4 + 8 = 16 bytes per parameter on every
rank, for Ψ parameters (the paper's Fig. 1 counts (2 + 2 + K)Ψ with K = 12
for mixed precision). ZeRO partitions them instead, one more each stage::

                          parameters   gradients   optimizer state   bytes per rank (fp32 Adam)
    stage 0 (plain DP)    Ψ            Ψ           Ψ                 16Ψ
    stage 1 P_os          Ψ            Ψ           Ψ / N             8Ψ + 8Ψ/N
    stage 2 P_os+g        Ψ            Ψ / N       Ψ / N             4Ψ + 12Ψ/N
    stage 3 P_os+g+p      Ψ / N        Ψ / N       Ψ / N             16Ψ / N

One step of stage 1 or 2 on rank r (:class:`ZeroOptimizer`)::

    backward           every rank, on its slice of the batch: gradients g (Ψ,)
    stage 1            all-reduce g (the average), then keep using only g[shard r]
    stage 2            reduce-scatter g: rank r receives only its averaged shard g_r (S,)
    optimizer step     p_r <- Adam(p_r, g_r): 1/N of the work, state of size S
    all-gather         every rank's updated p_r -> the whole parameters again

Communication per rank per step, counted for a ring (:mod:`dtlab.interconnect`):
stage 1 all-reduces the whole gradient (2Ψ) as PyTorch's
``ZeroRedundancyOptimizer`` beside DDP does, then all-gathers parameters (Ψ):
3Ψ. Stage 2 notes that a rank only needs its own shard of the gradient, so a
reduce-scatter (Ψ) is enough: Ψ + Ψ = 2Ψ, exactly what plain DP's all-reduce
sends (the paper's Sec. 7.2.1). Stage 3 gathers parameters twice (forward
and backward) and reduce-scatters gradients once: 3Ψ, 1.5x DP (Sec. 7.2.2).

The flat buffer. All trainable parameters are laid end to end in one 1-D
buffer, padded with zeros to a multiple of N so that every rank owns an equal,
contiguous shard (the collectives need equal pieces)::

    Ψ = 10, N = 4: L = ceil(10 / 4) x 4 = 12 elements, shards of S = 3

    flat (L,)   [ a  a  a  a  a  a  b  b  b  b  0  0 ]    a: (2, 3)   b: (4,)   0: padding
    owner       [ rank 0 | rank 1 | rank 2 | rank 3  ]

The padding is at most N - 1 elements, all in the last shard(s). It stays
zero: its gradient is zero, and an optimizer step on a zero parameter with
zero gradient and zero state changes nothing (Adam: 0 / (0 + eps) = 0).

Typical use (the trainer's)::

    model, optimizer = apply_zero(model, stage=2, group=dp_group, lr=1e-3)
    for x, y in micro_batches:                  # gradient accumulation needs nothing special
        (model(x, y) / K).backward()
    optimizer.step()                            # communicates, updates its shard, gathers
    optimizer.zero_grad()
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch
import torch.distributed as dist
import torch.nn as nn

from dtlab.collectives import ALL_GATHER, REDUCE_SCATTER, CommMeter, global_rank, group_size_and_rank
from dtlab.i18n import ConfigError, DtlabError
from dtlab.memory import model_state_bytes, tensor_bytes
from dtlab.offload import OffloadOptimizer


# --------------------------------------------------------------------------- the flat buffer

@dataclass(frozen=True)
class FlatLayout:
    """Where each tensor lives in a flat buffer padded to a multiple of N, and who owns which slice."""

    shapes: tuple[torch.Size, ...]
    world_size: int

    @property
    def numels(self) -> tuple[int, ...]:
        return tuple(prod(shape) for shape in self.shapes)

    @property
    def numel(self) -> int:
        """Ψ: the elements of the tensors themselves."""
        return sum(self.numels)

    @property
    def shard_numel(self) -> int:
        """S = ceil(Ψ / N): what each rank owns."""
        return -(-self.numel // self.world_size)

    @property
    def padded_numel(self) -> int:
        """L = S x N >= Ψ: the buffer's length."""
        return self.shard_numel * self.world_size

    def shard(self, rank: int) -> slice:
        """Rank ``rank``'s contiguous slice of the buffer."""
        return slice(rank * self.shard_numel, (rank + 1) * self.shard_numel)

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """One view of ``flat`` (L,) per tensor, in its shape (split is differentiable: stage 3 uses that)."""
        pieces = flat.split([*self.numels, self.padded_numel - self.numel])   # the last is padding
        return [piece.view(shape) for piece, shape in zip(pieces, self.shapes)]

    def flatten(self, tensors, *, dtype: torch.dtype, device) -> torch.Tensor:
        """The tensors end to end in a new (L,) buffer; ``None`` (no gradient) and padding are zeros."""
        flat = torch.zeros(self.padded_numel, dtype=dtype, device=device)    # (L,)
        for view, tensor in zip(self.views(flat), tensors):
            if tensor is not None:
                view.copy_(tensor)
        return flat


def trainable_parameters(params) -> list[nn.Parameter]:
    """Each parameter once (a tied one is one Parameter), leaving out frozen ones."""
    params = list(params)
    if any(isinstance(p, dict) for p in params):
        raise ConfigError("ZeRO here takes a plain list of parameters, not parameter groups",
                          "这里的 ZeRO 只接受参数列表，不接受参数组（param groups）")
    return [p for p in {id(p): p for p in params}.values() if p.requires_grad]


def broadcast_from_rank0(module: nn.Module, *, group=None) -> None:
    """Every rank starts from rank 0's parameters and buffers.

    The same seed makes them equal; this makes it certain, as DDP does.
    """
    world_size, _ = group_size_and_rank(group)
    if world_size == 1:
        return
    for tensor in [*module.parameters(), *module.buffers()]:
        dist.broadcast(tensor.detach(), src=global_rank(group, 0), group=group)


# --------------------------------------------------------------------------- stages 1 and 2

class ZeroOptimizer:
    """ZeRO stage 1 (P_os) or 2 (P_os+g): any torch optimizer, run by each rank on 1/N of the parameters.

    ``ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=2, group=g, lr=1e-3)``.
    The parameters are moved into one flat buffer (they become views of it;
    the model is unchanged otherwise) and the wrapped optimizer sees only this
    rank's shard of it, a single 1-D parameter: its state is 1/N of the
    whole. ``offload=True`` keeps that state, and runs the update, on the host
    (:class:`dtlab.offload.OffloadOptimizer`). ``meter`` (a
    :class:`dtlab.collectives.CommMeter`, made if not given) counts the
    collectives. Do not wrap the model in data parallelism as well:
    :meth:`step` averages the gradients itself.
    """

    def __init__(self, params, optimizer_class=torch.optim.AdamW, *, stage: int = 1, group=None,
                 offload: bool = False, meter: CommMeter | None = None, **optimizer_kwargs):
        if stage not in (1, 2):
            raise ConfigError(f"stage={stage!r}: ZeroOptimizer is stage 1 or 2 (stage 3 is ZeroStage3)",
                              f"stage={stage!r}：ZeroOptimizer 只实现第 1、2 阶段（第 3 阶段见 ZeroStage3）")
        self.stage, self.group, self.offload = stage, group, offload
        self.world_size, self.rank = group_size_and_rank(group)
        self.meter = meter if meter is not None else CommMeter()
        self.params = trainable_parameters(params)
        if not self.params:
            raise ConfigError("ZeroOptimizer got no trainable parameters",
                              "ZeroOptimizer 没有收到任何可训练参数")
        if len({p.dtype for p in self.params}) != 1:
            raise ConfigError("ZeroOptimizer needs every trainable parameter in one dtype",
                              "ZeroOptimizer 要求所有可训练参数的数据类型相同")
        self.layout = FlatLayout(tuple(p.shape for p in self.params), self.world_size)
        first = self.params[0]
        self.flat = self.layout.flatten([p.detach() for p in self.params],
                                        dtype=first.dtype, device=first.device)     # (L,) 1D
        for p, view in zip(self.params, self.layout.views(self.flat)):
            p.data = view               # the model now reads and writes the flat buffer
        # The one parameter the wrapped optimizer sees: this rank's (S,) 1D flat shard, a view of
        # the buffer, so updating it updates the model's parameters in place.
        self.shard = nn.Parameter(self.flat[self.layout.shard(self.rank)])
        if offload:                     # the shard's master copy, state and update on the host
            self.optimizer = OffloadOptimizer([self.shard], optimizer_class, **optimizer_kwargs)
        else:
            self.optimizer = optimizer_class([self.shard], **optimizer_kwargs)
        self._flat_grad: torch.Tensor | None = None   # stage 1 keeps the whole averaged gradient
        self._reduced = False

    @property
    def param_groups(self) -> list[dict]:
        """The wrapped optimizer's groups (set ``lr`` here, as with any torch optimizer)."""
        return self.optimizer.param_groups

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """Average the accumulated gradients over the ranks: stage 1 whole, stage 2 only this rank's shard.

        :meth:`step` calls it if it has not been called since the last step.
        Call it once, after the last backward of a step: every backward adds
        into the parameters' ``.grad`` locally, and only this communicates.
        """
        if self._reduced:
            raise DtlabError("the gradients were already reduced this step: call step() next",
                             "本步的梯度已经归约过了：接下来请调用 step()")
        flat_grad = self.layout.flatten([p.grad for p in self.params], dtype=self.flat.dtype,
                                        device=self.flat.device)                  # (L,) 1D
        for p in self.params:
            p.grad = None               # now in flat_grad: free the per-parameter copies
        # mean = sum of (g / N). Dividing first (as DDP does): gloo has no AVG, and
        # a sum of N quotients stays in one gradient's range, which fp16 needs.
        flat_grad.div_(self.world_size)
        mine = self.layout.shard(self.rank)
        if self.stage == 1:
            # P_os keeps the whole gradient buffer (that is what stage 2 saves), but only this
            # rank's shard of it needs averaging: a reduce-scatter, Ψ on the wire, not an
            # all-reduce's 2Ψ. With the all-gather of the parameters: 2Ψ, the same as plain DP.
            if self.world_size > 1:
                reduced = torch.empty(self.layout.shard_numel, dtype=flat_grad.dtype,
                                      device=flat_grad.device)                    # (S,) 1D
                self.meter.record_call(REDUCE_SCATTER, flat_grad)
                dist.reduce_scatter_single(reduced, flat_grad, group=self.group)  # (L,) -> (S,)
                flat_grad[mine] = reduced
            self._flat_grad = flat_grad         # P_os: every rank holds a whole (L,) gradient buffer
            self.shard.grad = flat_grad[mine]   # (S,) view: the averaged part this rank's optimizer uses
        else:
            shard_grad = torch.empty(self.layout.shard_numel, dtype=flat_grad.dtype,
                                     device=flat_grad.device)                     # (S,) 1D
            if self.world_size > 1:
                self.meter.record_call(REDUCE_SCATTER, flat_grad)
                dist.reduce_scatter_single(shard_grad, flat_grad, group=self.group)   # (L,) -> (S,)
            else:
                shard_grad.copy_(flat_grad)
            self.shard.grad = shard_grad        # P_os+g: flat_grad is freed on return, 1/N stays
        self._reduced = True

    @torch.no_grad()
    def step(self) -> None:
        """Reduce the gradients (if not done yet), update this rank's shard, all-gather the parameters."""
        if not self._reduced:
            self.reduce_gradients()
        self.optimizer.step()            # only the shard: 1/N of the update, 1/N of the state
        if self.world_size > 1:
            self.meter.record_call(ALL_GATHER, self.flat)
            # Every rank's (S,) shard lands in its place in everyone's (L,) buffer; this rank's
            # own shard is already there (in place, as NCCL and gloo both allow).
            dist.all_gather_single(self.flat, self.shard.detach(), group=self.group)
        self._reduced = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Free every gradient (they are always freed; ``set_to_none`` is there for torch.optim's signature)."""
        for p in self.params:
            p.grad = None
        self.optimizer.zero_grad(set_to_none=True)
        self._flat_grad = None
        self._reduced = False

    # -- checkpoints: each rank saves and loads its own shard of the state
    def state_dict(self) -> dict:
        return {"stage": self.stage, "world_size": self.world_size, "rank": self.rank,
                "shard_numel": self.layout.shard_numel, "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        mine = (self.stage, self.world_size, self.rank, self.layout.shard_numel)
        theirs = (state["stage"], state["world_size"], state["rank"], state["shard_numel"])
        if mine != theirs:
            raise ConfigError(
                f"this optimizer state is rank {theirs[2]}'s of {theirs[1]} at stage {theirs[0]} "
                f"(shard of {theirs[3]}); this is rank {mine[2]} of {mine[1]} at stage {mine[0]} "
                f"(shard of {mine[3]})",
                f"这份优化器状态属于第 {theirs[0]} 阶段、{theirs[1]} 个 rank 中的 rank {theirs[2]}"
                f"（分片 {theirs[3]}）；当前是第 {mine[0]} 阶段、{mine[1]} 个 rank 中的 rank {mine[2]}"
                f"（分片 {mine[3]}）")
        self.optimizer.load_state_dict(state["optimizer"])

    # -- what this rank holds
    def memory_bytes(self) -> dict[str, int]:
        """Bytes of model states on this rank's device: ``{"params", "grads", "optimizer"}``.

        Read it after :meth:`step` (before :meth:`zero_grad`): stage 1 then
        holds the whole flat gradient (L), stage 2 only its shard (S).
        Padding counts: it is allocated. Offloaded optimizer state is on the
        host (:meth:`host_memory_bytes`), not here.
        """
        grads = sum(tensor_bytes(p.grad) for p in self.params)   # accumulated, not reduced yet
        # At stage 1 the shard's gradient is a view into the flat one: count the flat one once.
        grads += tensor_bytes(self._flat_grad) if self.stage == 1 else tensor_bytes(self.shard.grad)
        optimizer = 0 if self.offload else model_state_bytes([], self.optimizer)["optimizer"]
        return {"params": tensor_bytes(self.flat), "grads": grads, "optimizer": optimizer}

    def host_memory_bytes(self) -> dict[str, int]:
        """Bytes held on the host for this rank: the offloaded master shard, its gradient and state."""
        if self.offload:
            return self.optimizer.host_memory_bytes()
        return {"params": 0, "grads": 0, "optimizer": 0}


# --------------------------------------------------------------------------- one entry point

def apply_zero(model: nn.Module, *, stage: int, group=None, optimizer_class=torch.optim.AdamW,
               offload: bool = False, compute_dtype: torch.dtype | None = None,
               meter: CommMeter | None = None, **optimizer_kwargs):
    """Shard ``model``'s training states over ``group`` with ZeRO ``stage`` (1, 2 or 3).

    Returns ``(model, optimizer)``: a model with the same forward and an
    optimizer whose ``step()`` does the stage's communication, so a training
    loop only calls ``loss.backward(); optimizer.step(); optimizer.zero_grad()``.
    Stages 1 and 2 return ``model`` itself (its parameters moved into the flat
    buffer; no data-parallel wrapper: ZeRO averages the gradients itself);
    stage 3 returns a :class:`dtlab.zero_stage3.ZeroStage3` wrapping it
    (``compute_dtype`` is stage 3's option). Rank 0's weights are broadcast
    first. Move the model to its device before: the parameters become views
    of (or shards cut from) buffers made here. Both optimizers have
    ``memory_bytes()``, ``host_memory_bytes()``, ``meter`` (a
    :class:`dtlab.collectives.CommMeter`) and ``param_groups``.
    """
    if stage not in (1, 2, 3):
        raise ConfigError(f"ZeRO stage={stage!r} is not allowed; expected 1, 2 or 3 "
                          "(stage 0 is plain data parallelism: dtlab/data_parallel.py)",
                          f"ZeRO stage={stage!r} 不合法；应为 1、2 或 3"
                          "（第 0 阶段就是普通数据并行：dtlab/data_parallel.py）")
    if compute_dtype is not None and stage != 3:
        raise ConfigError(f"compute_dtype={compute_dtype} is an option of stage 3 only (got stage {stage})",
                          f"compute_dtype={compute_dtype} 只用于第 3 阶段（当前为第 {stage} 阶段）")
    broadcast_from_rank0(model, group=group)
    if stage < 3:
        return model, ZeroOptimizer(model.parameters(), optimizer_class, stage=stage, group=group,
                                    offload=offload, meter=meter, **optimizer_kwargs)
    from dtlab.zero_stage3 import Stage3Optimizer, ZeroStage3   # stage 3 builds on FlatLayout above

    wrapped = ZeroStage3(model, group=group, compute_dtype=compute_dtype, meter=meter)
    return wrapped, Stage3Optimizer(wrapped, optimizer_class, offload=offload, **optimizer_kwargs)
