"""ZeRO stages 1 (P_os) and 2 (P_os+g): each rank updates, and keeps the optimizer state of, 1/N of the parameters.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC 2020, Sec. 5.1-5.2. The parameters move into one flat
buffer (:mod:`dtlab.parallel.zero.flat`); rank r's optimizer sees only its shard of it.
One step on rank r (:class:`ZeroOptimizer`)::

    backward           every rank, on its slice of the batch: gradients g (Ψ,), locally accumulated
    reduce-scatter     g / N summed over ranks: rank r receives its averaged shard g_r (S,)
                       stage 1 keeps the whole (L,) gradient buffer, stage 2 only g_r
    optimizer step     p_r <- Adam(p_r, g_r): 1/N of the work, state of size S
    all-gather         every rank's updated p_r -> the whole parameters again

Communication per rank per step (:mod:`dtlab.planner.communication` counts a ring):
a reduce-scatter (Ψ) and an all-gather (Ψ), 2Ψ, exactly what plain DP's
all-reduce sends, at both stages (the paper's Sec. 7.2.1). Stage 1 only needs
its own averaged shard too, so it reduce-scatters as well; what stage 2 adds
is freeing the rest of the gradient buffer. (PyTorch's
``ZeroRedundancyOptimizer`` beside DDP all-reduces the whole gradient
instead, 2Ψ, and then all-gathers the parameters: 3Ψ. Stage 1 beside a dtlab
DP wrapper does the same: the wrapper's all-reduce has averaged the
gradients, so it skips its reduce-scatter, ``averaged_by_dp``.)

In the training loop (:mod:`dtlab.parallel.dp_optimizer`) ``finish_gradient_sync()``
does the reduce-scatter, so that the fp16 loss scaler can check the averaged
shard before the update; called alone, ``step()`` does it first.

:class:`ZeroOptimizer` is a whole ``torch.optim.Optimizer`` (groups, the
step, memory by category) over a flat buffer; its state for checkpoints
(``state_dict`` and the training state, resharded on load) is
:mod:`dtlab.parallel.zero.stage12_state`, and stage 2's buckets are
:mod:`dtlab.parallel.zero.stage2_buckets`.

Stage 2 with buckets (``bucket_mb``, DeepSpeed's ``overlap_comm``) reduce-scatters
during backward, window by window: :mod:`dtlab.parallel.zero.stage2_buckets`. Stage 1 keeps
the whole gradient anyway (that is what P_os is), so it keeps the one
reduce-scatter after backward and takes no bucket.
"""

from __future__ import annotations

from contextlib import contextmanager
from itertools import accumulate

import torch
import torch.nn as nn

from dtlab.comm import calls as comm
from dtlab.comm.collectives import ALL_GATHER, REDUCE_SCATTER, CommMeter, group_size_and_rank
from dtlab.i18n import ConfigError, DtlabError
from dtlab.measure.memory import note_moment, tensor_bytes
from dtlab.numerics.master_weights import MasterWeights
from dtlab.parallel.dp_optimizer import DPOptimizer, GradPiece
from dtlab.parallel.zero.flat import FlatLayout, named_groups
from dtlab.parallel.zero.hybrid import Replicas
from dtlab.parallel.zero.offload import OffloadOptimizer, check_master_weights
from dtlab.parallel.zero.stage2_buckets import Stage2Buckets, windows
from dtlab.parallel.zero.stage12_memory import Stage12Memory
from dtlab.parallel.zero.stage12_state import Stage12State
from dtlab.state.training_state import shard_ranges


class ZeroOptimizer(Stage2Buckets, Stage12State, Stage12Memory, torch.optim.Optimizer, DPOptimizer):
    """ZeRO stage 1 (P_os) or 2 (P_os+g): any torch optimizer, run by each rank on 1/N of the parameters.

    ``ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=2, group=g, lr=1e-3)``, or with
    parameter groups as any torch optimizer takes them::

        ZeroOptimizer([{"params": decay, "weight_decay": 0.1},
                       {"params": no_decay, "weight_decay": 0.0, "lr": 3e-4}],
                      torch.optim.AdamW, stage=2, group=g, lr=1e-3)

    It is a ``torch.optim.Optimizer``: ``param_groups`` (one per group given,
    in order; an lr scheduler writes ``group["lr"]`` there), ``step()``,
    ``zero_grad()``, ``state``, ``state_dict()`` / ``load_state_dict()``. The
    parameters are moved into one flat buffer, group after group (they
    become views of it; the model is unchanged otherwise). This rank's (S,)
    shard of that buffer is cut at the groups' borders into one 1-D piece per
    group (possibly empty), and these pieces are what the wrapped optimizer
    updates and what ``param_groups[i]["params"]`` holds: its state is 1/N of
    the whole, and an element-wise optimizer (SGD, Adam, AdamW) computes
    exactly what it would on the whole parameters. ``offload=True`` keeps
    that state, and runs the update, on the host
    (:class:`dtlab.parallel.zero.offload.OffloadOptimizer`; ``param_groups`` then
    holds the pieces' fp32 host masters, which it steps). Items may be
    ``(name, parameter)`` pairs (``model.named_parameters()``): the names
    label the training state (:meth:`training_state`; without them,
    positions do). ``meter`` (a :class:`dtlab.comm.meter.CommMeter`, made
    if not given) counts the collectives. Do not wrap the model in data
    parallelism as well: :meth:`step` averages the gradients itself.

    ``bucket_mb``, or ``bucket_cap_mb`` as DDP and the DP wrappers name it (stage 2 only; ``dtlab train``
    passes ``--bucket-mb``):
    reduce-scatter the gradient in windows of that many MiB during backward,
    as DeepSpeed's ``overlap_comm`` does (the module docstring draws the
    layout); this rank's shard is then one range per window, so each group
    holds one piece per window, and every backward of a step but the last
    must run inside :meth:`no_sync`. None (the default): the whole flat
    gradient is reduce-scattered once, after backward, as stage 1 does.
    ``replicate_group`` (hybrid sharding, :mod:`dtlab.parallel.zero.hybrid`): ``group`` is then
    the shard group, and each averaged shard is all-reduced once over the replicas.
    """

    def __init__(
        self,
        params,
        optimizer_class=torch.optim.AdamW,
        *,
        stage: int = 1,
        group=None,
        offload: bool = False,
        meter: CommMeter | None = None,
        bucket_mb: float | None = None,
        bucket_cap_mb: float | None = None,
        replicate_group=None,
        master_weights: bool = False,
        **optimizer_kwargs,
    ):
        bucket_mb = bucket_cap_mb if bucket_cap_mb is not None else bucket_mb  # DDP's name, as the DP wrappers'
        if stage not in (1, 2):
            raise ConfigError(
                f"stage={stage!r}: ZeroOptimizer is stage 1 or 2 (stage 3 is ZeroStage3)",
                f"stage={stage!r}：ZeroOptimizer 只实现第 1、2 阶段（第 3 阶段见 ZeroStage3）",
            )
        if bucket_mb is not None and (stage != 2 or not bucket_mb > 0):
            raise ConfigError(
                f"bucket_mb={bucket_mb!r} with stage={stage}: buckets are stage 2's, of a size > 0 MiB "
                f"(allowed: bucket_mb > 0 with stage 2, or None: the whole flat gradient after backward)",
                f"bucket_mb={bucket_mb!r} 与 stage={stage} 不能同时使用：桶只用于第 2 阶段，且大小须 > 0 MiB"
                f"（允许：第 2 阶段时 bucket_mb > 0，或 None：反向传播后一次归约散射整个扁平梯度）",
            )
        check_master_weights(master_weights, offload)
        self.stage, self.group, self.offload, self.master_weights = stage, group, offload, master_weights
        self.world_size, self.rank = group_size_and_rank(group)
        self.replicas = Replicas.of(replicate_group)
        self.mean_over = self.world_size * self.replicas.size  # every data-parallel rank
        self.meter = meter if meter is not None else CommMeter()
        self.bucket_mb = bucket_mb
        self._optimizer_class, self._optimizer_kwargs = optimizer_class, optimizer_kwargs
        self._build(params)
        # Stage 1 beside a DP wrapper over a group this size (dtlab.parallel.data_parallel marks the
        # parameters it averages): the gradients arrive averaged, and only the all-gather is left.
        self.averaged_by_dp = (
            stage == 1
            and self.world_size > 1
            and self.replicas.size == 1
            and all(getattr(p, "dtlab_averaged_over", None) == self.world_size for p in self.params)
        )
        self._flat_grad: torch.Tensor | None = None  # stage 1 keeps the whole averaged gradient
        self._shard_grad: torch.Tensor | None = None  # (S,): this rank's averaged gradient
        self._reduced = False
        self._sync = True
        if bucket_mb is not None:
            self._start_buckets()

    def _build(self, params) -> None:
        """The flat buffer of ``params`` (parameters or groups), this rank's pieces of it, and the wrapped
        optimizer over them (its state empty)."""
        options, self.names, self.params, counts = named_groups(params)
        if len({p.dtype for p in self.params}) != 1:
            raise ConfigError(
                "ZeroOptimizer needs every trainable parameter in one dtype",
                "ZeroOptimizer 要求所有可训练参数的数据类型相同",
            )
        self.layout = FlatLayout(tuple(p.shape for p in self.params), self.world_size)
        first = self.params[0]
        self.flat = self.layout.flatten(
            [p.detach() for p in self.params], dtype=first.dtype, device=first.device
        )  # (L,) 1D
        for p, view in zip(self.params, self.layout.views(self.flat)):
            p.data = view  # the model now reads and writes the flat buffer
        self._counts = counts
        piece_group = self._cut_shard(counts)
        groups = [
            {**o, "params": [piece for piece, pg in zip(self.pieces, piece_group) if pg == g]}
            for g, o in enumerate(options)
        ]
        optimizer_class, optimizer_kwargs = self._optimizer_class, self._optimizer_kwargs
        if self.offload:
            self.optimizer = OffloadOptimizer(groups, optimizer_class, **optimizer_kwargs)
        elif self.master_weights:  # the shard's fp32 masters and their state: K = 12 bytes per element, 1/N each
            self.optimizer = MasterWeights(groups, optimizer_class, **optimizer_kwargs)
        else:
            self.optimizer = optimizer_class(groups, **optimizer_kwargs)
        # torch.optim.Optimizer's own bookkeeping, over the wrapped optimizer's very groups and state,
        # so that writing param_groups[i]["lr"] here is writing it there.
        self._adopting = True
        torch.optim.Optimizer.__init__(self, self.optimizer.param_groups, self.optimizer.defaults)
        self._adopting = False
        self._share_wrapped()

    def _cut_shard(self, counts: list[int]) -> list[int]:
        """Set this rank's ``windows``, ``slices``, ``offsets``, ``shard``, ``pieces`` and ``_cuts`` of the flat
        buffer; return each piece's group (its index). ``counts``: how many parameters each group has, in order."""
        # The windows of the flat buffer that are sharded one by one: one, the whole buffer, unless
        # stage 2 has buckets. Rank r owns chunk r of each: self.slices, in the buffer's order; they
        # lie end to end in its (S,) shard gradient, window k's at self.offsets[k].
        self.windows = windows(self.layout, self.flat.element_size(), self.bucket_mb)
        self.slices = [
            slice(
                w.start + self.rank * (w.stop - w.start) // self.world_size,
                w.start + (self.rank + 1) * (w.stop - w.start) // self.world_size,
            )
            for w in self.windows
        ]
        self.offsets = [0, *accumulate(s.stop - s.start for s in self.slices)][:-1]
        # This rank's (S,) 1D flat shard, a view of the buffer when it is one range (no buckets):
        # its .grad is the averaged gradient.
        mine = self.layout.shard(self.rank)
        self.shard = nn.Parameter(self.flat[mine]) if len(self.windows) == 1 else None
        # Each of this rank's ranges cut at the groups' borders (the last group's range takes the
        # padding): one (s,) view of the buffer per range and group, so updating the pieces updates
        # the model's parameters in place. self._cuts: where each piece's gradient is in the shard's.
        borders = [sum(self.layout.numels[:n]) for n in accumulate(counts)][:-1]
        self.pieces, self._cuts, self._ranges, piece_group = [], [], [], []
        for own, offset in zip(self.slices, self.offsets):
            cuts = [own.start, *(min(max(b, own.start), own.stop) for b in borders), own.stop]
            for g, (a, b) in enumerate(zip(cuts, cuts[1:])):
                self.pieces.append(nn.Parameter(self.flat.detach()[a:b]))  # (s,) 1D
                self._cuts.append(slice(offset + a - own.start, offset + b - own.start))
                self._ranges.append(slice(a, b))  # the piece's place in the flat buffer
                piece_group.append(g)
        return piece_group

    @contextmanager
    def no_sync(self):
        """Gradient accumulation: backward passes in here only add into ``.grad``, locally.

        Stage 2 with buckets sends during the first backward outside it; other
        stages communicate only in :meth:`finish_gradient_sync`, so for them
        this changes nothing.
        """
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    @property
    def param_groups(self) -> list[dict]:
        """The groups, in the order given: each holds this rank's piece of it and its options (``lr``, ...)."""
        return self._param_groups

    @param_groups.setter
    def param_groups(self, groups: list[dict]) -> None:  # torch.optim.Optimizer assigns it
        self._param_groups = groups

    def _share_wrapped(self) -> None:
        """Point ``param_groups`` and ``state`` at the wrapped optimizer's (again after a load replaced them)."""
        self.param_groups, self.state = self.optimizer.param_groups, self.optimizer.state

    def add_param_group(self, param_group: dict) -> None:
        if getattr(self, "_adopting", False):  # torch.optim.Optimizer.__init__ taking the wrapped optimizer's groups
            return torch.optim.Optimizer.add_param_group(self, param_group)
        self.add_group_after_construction(param_group)  # Stage12State: the state moves with the new layout

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """Average the accumulated gradients over the ranks; this rank keeps its shard's average.

        :meth:`step` calls it if it has not been called since the last step.
        Call it once, after the last backward of a step: every backward adds
        into the parameters' ``.grad`` locally, and only this communicates.
        """
        if self._reduced:
            raise DtlabError(
                "the gradients were already reduced this step: call step() next",
                "本步的梯度已经归约过了：接下来请调用 step()",
            )
        if self.bucket_mb is not None:
            self._finish_buckets()  # stage 2's buckets: most were sent during backward
            self.replicas.all_reduce(self._shard_grad, self.meter)  # HSDP: the (S,) shard over the copies
            self._use_shard_grad(self._shard_grad)
            return
        flat_grad = self.layout.flatten(
            [p.grad for p in self.params], dtype=self.flat.dtype, device=self.flat.device
        )  # (L,) 1D
        note_moment("flat_grad", tensor_bytes(flat_grad))  # beside the whole gradients: memory's peak at one moment
        for p in self.params:
            p.grad = None  # now in flat_grad: free the per-parameter copies
        mine = self.layout.shard(self.rank)
        if self.averaged_by_dp:
            # Beside a DP wrapper (as torch's ZeroRedundancyOptimizer beside DDP): its all-reduce
            # averaged every gradient already, so this rank's shard of them is ready as it is.
            self._flat_grad = flat_grad
            self.shard.grad = flat_grad[mine]
            self._use_shard_grad(self.shard.grad)
            return
        # mean = sum of (g / N). Dividing first (as DDP does): gloo has no AVG, and
        # a sum of N quotients stays in one gradient's range, which fp16 needs.
        flat_grad.div_(self.mean_over)
        if self.stage == 1:
            # P_os keeps the whole gradient buffer (that is what stage 2 saves), but only this
            # rank's shard of it needs averaging: a reduce-scatter, Ψ on the wire, not an
            # all-reduce's 2Ψ. With the all-gather of the parameters: 2Ψ, the same as plain DP.
            if self.world_size > 1:
                reduced = torch.empty(
                    self.layout.shard_numel, dtype=flat_grad.dtype, device=flat_grad.device
                )  # (S,) 1D
                self.meter.record_call(REDUCE_SCATTER, flat_grad)
                comm.reduce_scatter_single(reduced, flat_grad, group=self.group)  # (L,) -> (S,)
                flat_grad[mine] = reduced
            self._flat_grad = flat_grad  # P_os: every rank holds a whole (L,) gradient buffer
            self.shard.grad = flat_grad[mine]  # (S,) view: the averaged part this rank's optimizer uses
        else:
            shard_grad = torch.empty(self.layout.shard_numel, dtype=flat_grad.dtype, device=flat_grad.device)  # (S,) 1D
            if self.world_size > 1:
                self.meter.record_call(REDUCE_SCATTER, flat_grad)
                comm.reduce_scatter_single(shard_grad, flat_grad, group=self.group)  # (L,) -> (S,)
            else:
                shard_grad.copy_(flat_grad)
            self.shard.grad = shard_grad  # P_os+g: flat_grad is freed on return, 1/N stays
        self.replicas.all_reduce(self.shard.grad, self.meter)  # HSDP: the (S,) shard over the copies
        self._use_shard_grad(self.shard.grad)

    def _use_shard_grad(self, shard_grad: torch.Tensor) -> None:
        """``shard_grad`` (S,) is this step's averaged shard gradient: the pieces' ``.grad`` are views of it."""
        self._shard_grad = shard_grad
        if self.shard is not None:
            self.shard.grad = shard_grad
        for piece, cut in zip(self.pieces, self._cuts):
            piece.grad = shard_grad[cut]  # (s,) views: what the wrapped optimizer reads
        self._reduced = True

    def finish_gradient_sync(self) -> None:
        """The protocol's name for :meth:`reduce_gradients` (once per step; a second call does nothing)."""
        if not self._reduced:
            self.reduce_gradients()

    @torch.no_grad()
    def step(self, closure=None):
        """Reduce the gradients (if not done yet), update this rank's shard, all-gather the parameters.

        ``closure`` (torch.optim's: re-evaluates the model, returns the loss) is called first.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._reduced:
            self.reduce_gradients()
        self.optimizer.step()  # only the shard: 1/N of the update, 1/N of the state
        self._gather_parameters()
        self._reduced = False
        return loss

    def _gather_parameters(self) -> None:
        """Every rank's updated shard into everyone's flat buffer: the whole parameters again."""
        if self.world_size > 1:
            for w, own in zip(self.windows, self.slices):
                window = self.flat[w]
                self.meter.record_call(ALL_GATHER, window)
                # Every rank's chunk of the window lands in its place in everyone's buffer; this
                # rank's own is already there (in place, as NCCL and gloo both allow).
                comm.all_gather_single(window, self.flat[own], group=self.group)

    def gradients(self) -> list[GradPiece]:
        """This rank's averaged (S,) shard gradient, cut per parameter: disjoint shards, each counted (HSDP:
        by the first copy)."""
        if self._shard_grad is None:
            return []
        if self.master_weights:  # the fp32 gradients the masters step with (the loss scaler unscales these)
            self.optimizer.take_gradients()
            return [
                GradPiece(name, grad[offset : offset + stop - start], self.replicas.rank == 0)
                for piece, at in zip(self.pieces, self._ranges)
                if (grad := self.optimizer.master_gradient(piece)) is not None
                for name, start, stop, offset in shard_ranges(self.names, self.layout.numels, at)
            ]
        return [
            GradPiece(name, self._shard_grad[at + offset : at + offset + stop - start], self.replicas.rank == 0)
            for own, at in zip(self.slices, self.offsets)
            for name, start, stop, offset in shard_ranges(self.names, self.layout.numels, own)
        ]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Free every gradient (they are always freed; ``set_to_none`` is there for torch.optim's signature)."""
        for p in [*self.params, *([self.shard] if self.shard is not None else [])]:
            p.grad = None
        self.optimizer.zero_grad(set_to_none=True)
        self._flat_grad = self._shard_grad = None
        self._reduced = False
        if self.bucket_mb is not None:
            for i in list(self._in_flight):  # a step abandoned in backward: let its buckets land
                self._wait(i)
            self._reset_buckets()
