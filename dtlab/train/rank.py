"""One rank's share of the model: :func:`build_rank` composes the parallelisms into a :class:`RankState`.

Every layout runs through here before its first step (:func:`dtlab.train.loop.train_rank`
then runs the steps on what this returns). The order the parallelisms are
applied in matters; :func:`build_rank`'s docstring says why, step by step.
Step 7, data parallelism or ZeRO, is :func:`_data_parallel_or_zero`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dtlab.comm.tracer import CommTracer
from dtlab.config import TrainConfig
from dtlab.grid import AXES, Grid, build_groups
from dtlab.launch.worker import RankContext
from dtlab.measure.memory import ActivationMeter, LiveBytes
from dtlab.model import build_model, count_params
from dtlab.numerics.fp8 import apply_fp8
from dtlab.numerics.gradient_checkpointing import apply_recompute
from dtlab.numerics.master_weights import MasterWeights, to_16_bit
from dtlab.numerics.precision import MixedPrecision
from dtlab.parallel.context_parallel import apply_context_parallel
from dtlab.parallel.data_parallel import apply_data_parallel
from dtlab.parallel.dp_optimizer import DPOptimizer
from dtlab.parallel.moe.expert_parallel import ExpertParallelOptimizer, apply_expert_parallel, dense_parameters
from dtlab.parallel.pipeline import PipelineRuntime, partition_gpt
from dtlab.parallel.replicated import ReplicatedOptimizer
from dtlab.parallel.sequence_parallel import apply_sequence_parallel
from dtlab.parallel.tensor_parallel import apply_tensor_parallel
from dtlab.parallel.zero import apply_zero
from dtlab.reference import adamw, adamw_options, make_optimizer
from dtlab.train import checkpoints


@dataclass
class RankState:
    """Everything one rank trains with, after the parallelisms have been applied."""

    groups: object  # dtlab.grid.RankGroups: this rank's dp / tp / pp groups and coordinates
    model: torch.nn.Module  # this rank's stage, TP-split, wrapped for DP or ZeRO
    optimizer: DPOptimizer  # DP's, ZeRO's or offloaded: the loop drives them alike
    precision: MixedPrecision
    runtime: PipelineRuntime
    meter: ActivationMeter
    tracer: CommTracer  # every call through dtlab.comm.calls, timed; the step's figures
    ledger: LiveBytes  # the bytes that come and go within a step: memory's ``peak``
    n_params: int
    places: dict  # this rank's parameters' places in the whole model (checkpoints)
    tp_counted_elsewhere: frozenset  # names TP rank 0 counts in the gradient norm instead of this rank


def build_rank(ctx: RankContext, config: TrainConfig) -> RankState:
    """Compose the parallelisms for this rank; the order matters, and each step says why.

    1. Build the whole model from the seed (the same weights on every rank).
    2. Pipeline: keep only this rank's stage (its blocks, or interleaved chunks; embeddings or head).
    3. Tensor parallelism: split the stage's blocks over the TP group. After 2,
       because it only rewrites the blocks this rank still holds. With ``sp``,
       sequence parallelism splits the rest of each block along the sequence.
       Then context parallelism: attention becomes ring attention over the CP
       group and the position table looks up whole-sequence positions; before 4,
       so the new position table gets its cast hooks too.
    4. Mixed precision: cast-on-forward hooks on the (TP) layers; 16-bit parameters where 7's optimizer
       keeps the fp32 masters (dtlab/numerics/master_weights.py), else the fp32 ones stay. Under fp8
       the blocks' Linear layers (dense or TP, after 3) first get fp8 matmuls and no casts.
    5. Recompute: checkpoint each block; after 3 so the recomputed forward is the
       TP forward, with its all-reduces.
    6. Expert parallelism (with ``experts`` and ep > 1): keep this rank's E/N
       experts. After 3, which leaves a mixture of experts whole on every TP
       rank; before 7, so that DP knows which parameters are replicated.
       Then ``--compile`` (:func:`_apply_compile`: the stage at once, not per block),
       as torchtitan's apply_compile comes after apply_tp and apply_ac: once the blocks have their final modules
       (3; compiled earlier, the dense forward TP replaces would be compiled) and
       their casts (4, traced into the graph); recompute (5) is refused with it, its
       autograd.Function is not traceable (dtlab/config/checks.py). Before 7, whose
       gradient hooks and flat buffers act on the parameters, outside the blocks'
       forward, and stay eager.
    7. Data parallelism or ZeRO, last: they shard or average whatever parameters
       the steps above left, over the DP group (under EP: the dense parameters
       over the dp x ep ranks, groups.dp_cp, the experts over dp; dtlab/parallel/moe/expert_parallel.py).
       With ``dp_shard`` (hybrid sharding), ZeRO shards over groups.dp_shard and all-reduces each
       gradient shard over groups.dp_replicate (dtlab/parallel/zero/hybrid.py).
    """
    cfg = config.model_config(ctx.device)  # the attention kernel: the config's, or this device's default
    grid = Grid(dp=config.dp, tp=config.tp, pp=config.pp, ep=config.ep, cp=config.cp)
    groups = build_groups(grid, dp_shard=config.dp_shard)
    model = build_model(cfg, seed=config.seed).to(ctx.device)
    n_params = count_params(model)
    stage = partition_gpt(model, stage=groups.coords.pp, stages=config.pp, virtual_stages=config.virtual_stages)
    split = apply_sequence_parallel if config.sp else apply_tensor_parallel
    stage = split(stage, group=groups.tp)
    stage = apply_context_parallel(stage, group=groups.cp)
    stage, precision, zero3_dtype = _mixed_precision(stage, config)
    if config.recompute:
        apply_recompute(stage)
    if config.ep > 1:
        stage = apply_expert_parallel(stage, group=groups.ep)
    if config.compile:
        _apply_compile(stage)
    places = checkpoints.parameter_places(stage, config)  # before 7, which keeps these names
    stage, optimizer = _data_parallel_or_zero(stage, config, groups, zero3_dtype)
    meter, ledger = ActivationMeter(stage), LiveBytes()
    ledger.watch_gradients(stage.parameters())
    # Gradient accumulation inside a pipeline is more micro-batches: K x m of them.
    runtime = PipelineRuntime(
        stage,
        d_model=cfg.d_model,
        group=groups.pp,
        schedule=config.schedule,
        micro_batches=config.micro_batches * config.grad_accum,
        meter=meter,
        no_sync=optimizer.no_sync,
        activation_dtype=precision.dtype,
        virtual_stages=config.virtual_stages,
    )
    # A parameter every TP rank holds whole (LayerNorms, embeddings, row-parallel biases) has the
    # same gradient on each of them: only TP rank 0 counts it in the global norm.
    replicated = {name for name, place in places.items() if place.numel == math.prod(place.shape)}
    return RankState(
        groups=groups,
        model=stage,
        optimizer=optimizer,
        precision=precision,
        runtime=runtime,
        meter=meter,
        tracer=_tracer(ctx, groups),
        ledger=ledger,
        n_params=n_params,
        places=places,
        tp_counted_elsewhere=frozenset(replicated if groups.coords.tp else ()),
    )


def _mixed_precision(stage: torch.nn.Module, config: TrainConfig):
    """Step 4 of :func:`build_rank`: (the stage, its :class:`MixedPrecision`, ZeRO-3's compute dtype or None).

    Under fp8 the blocks' Linear layers get fp8 matmuls first (:mod:`dtlab.numerics.fp8`), so that
    the casts leave them to quantize their fp32 weights themselves; ZeRO-3 gathers and computes in
    bf16 itself, so it gets no casts (its fp8 layers quantize the gathered bf16 weights).
    """
    if config.masters == "optimizer":  # 16-bit parameters; the optimizer keeps the fp32 masters
        precision = MixedPrecision(config.precision, loss_scale=config.loss_scale)
        stage = precision.apply(stage)  # casts where a layer computes in fp32 (LayerNorm) or returns it (the head)
        return to_16_bit(stage, precision.dtype), precision, None  # ZeRO-3 then shards, gathers and reduces 16 bits
    precision = MixedPrecision(config.precision if config.zero < 3 else "fp32", loss_scale=config.loss_scale)
    if config.precision == "fp8":
        apply_fp8(stage, history=config.fp8_amax_history, layers=stage.layers)
    if config.zero == 3 and config.precision in ("bf16", "fp8"):
        return stage, precision, torch.bfloat16
    return precision.apply(stage), precision, None


def _data_parallel_or_zero(
    stage: torch.nn.Module, config: TrainConfig, groups, zero3_dtype
) -> tuple[torch.nn.Module, DPOptimizer]:
    """Step 7 of :func:`build_rank`: the stage averaged (DP) or sharded (ZeRO) over the DP group, and its optimizer."""
    master_weights = config.masters == "optimizer"
    if config.zero:
        return apply_zero(
            stage,
            stage=config.zero,
            group=groups.dp_cp if config.dp_shard is None else groups.dp_shard,
            replicate_group=groups.dp_replicate,
            offload=config.offload,
            compute_dtype=zero3_dtype,
            prefetch=config.zero3_prefetch if config.zero == 3 else None,
            shard_modules=config.zero3_shard if config.zero == 3 else None,
            bucket_mb=config.bucket_mb if config.zero == 2 else None,
            master_weights=master_weights,
            optimizer_class=adamw,
            **adamw_options(config),
        )
    replicated = dense_parameters(stage) if config.ep > 1 else None
    stage = apply_data_parallel(
        stage, mode=config.dp_mode, group=groups.dp_cp, params=replicated, bucket_mb=config.bucket_mb
    )
    if master_weights:
        optimizer = ReplicatedOptimizer(stage, MasterWeights(stage.parameters(), adamw, **adamw_options(config)))
    else:
        optimizer = ReplicatedOptimizer(stage, make_optimizer(stage.parameters(), config))
    if config.ep > 1:
        optimizer = ExpertParallelOptimizer(optimizer, stage, group=groups.dp, ep=config.ep)
    return stage, optimizer


def _apply_compile(stage: torch.nn.Module) -> None:
    """``--compile``: torch.compile the stage's forward once, in place.

    Once, for the whole stage, and not block by block: each block carries hooks of
    its own (mixed precision's casts), so a graph compiled for one block's forward
    fails its guards on the next and is compiled again, and past dynamo's limit on
    recompilations (8) the remaining blocks ran eagerly (measured on an H200: 6 of
    the ~100M GPT's 14 blocks). The module is not wrapped, so parameter names,
    checkpoints and hooks outside the forward are as they were. What dynamo cannot
    trace (a collective inside TP's f and g) runs eagerly between compiled pieces.
    The pool's processes outlive a run: what the last run compiled is dropped first,
    so that no stale graph, nor the limit on recompilations, decides what this one runs.
    """
    torch.compiler.reset()
    stage.forward = torch.compile(stage.forward)  # an instance attribute: the class's forward, compiled


def _tracer(ctx: RankContext, groups) -> CommTracer:
    """This rank's tracer, with its groups named by axis (the gradient-averaging one too)."""
    tracer = CommTracer(device=ctx.device)
    tracer.name_group(groups["dp_cp"], "dp_cp")
    for name in ("dp_shard", "dp_replicate"):  # hybrid sharding's (None without it)
        tracer.name_group(groups[name], name)
    for axis in AXES:  # an axis' name wins where dp_cp is that axis' group
        tracer.name_group(groups[axis], axis)
    return tracer
