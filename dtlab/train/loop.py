"""The rank side of training: build this rank's share of the model, then run the steps.

Every layout of the small GPT runs through here, whichever way it was
started (``dtlab.train(config)`` in a notebook, ``dtlab train`` on the command
line, ``torchrun -m dtlab.train`` on a cluster; see ``dtlab/train/__init__.py``).

:func:`build_rank` (``dtlab/train/rank.py``) is the one place where the
parallelisms are composed, in an order it explains. :func:`train_rank` runs the steps; each step is
:func:`_train_step` (learning rate, this rank's slice of the batch, forward
and backward, the spike guard, the update) followed by rank 0 gathering every
rank's measurements into one record (``dtlab/train/records.py``) and
streaming it to the caller.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from dtlab.comm import calls as comm
from dtlab.comm.ring_backend import collectives
from dtlab.comm.stragglers import inject_straggler
from dtlab.comm.tracer import tracing
from dtlab.config import TrainConfig
from dtlab.data import global_batch, shard
from dtlab.launch.worker import RankContext
from dtlab.measure.chrome_trace import TraceWriter
from dtlab.measure.memory import counting, module_buffer_bytes, workspace_bytes
from dtlab.numerics.fp8 import take_fp8_stats
from dtlab.numerics.gradient_clipping import clip_to, global_grad_norm
from dtlab.numerics.loss_spikes import SpikeGuard, corrupt_batch, global_loss
from dtlab.numerics.lr_schedule import lr_at
from dtlab.parallel.context_parallel import shard_sequence
from dtlab.parallel.dp_optimizer import MODEL_STATES
from dtlab.parallel.moe.expert_parallel import set_aux_grad_scale, take_expert_stats
from dtlab.train import checkpoints
from dtlab.train.rank import RankState, build_rank
from dtlab.train.records import run_summary, step_record


def _memory(state: RankState, pipe, device: str) -> dict[str, int]:
    """This rank's memory by category (:mod:`dtlab.measure.memory`), each at its peak in the step.

    ``buffers`` adds what the optimizer protocol reports (DP's buckets,
    ZeRO's whole gradients or gathered units), the pipeline's send and receive
    buffers and the model's registered buffers; ``logits`` the loss's input,
    alive for a moment (the last stage's). ``peak`` is the highest total
    at one moment: params and optimizer state, plus the ledger's highest.
    ``workspace``: what the device's allocator holds at the step's end beyond
    params, optimizer state and the ledger's total then (0 on the CPU).
    """
    held = state.optimizer.memory_bytes()
    state.ledger.set("grads", held["grads"])  # the step's end is a moment too
    mem = {k: held[k] for k in MODEL_STATES}
    master = held.get("master", 0)  # --master-weights optimizer: the fp32 masters, beside the 16-bit params
    if "master" in held:
        mem["master"] = master
    mem.update(
        activations=pipe.activation_peak,
        copies=state.meter.copies_peak,
        buffers=held.get("buffers", 0) + state.runtime.buffer_peak + module_buffer_bytes(state.model),
        logits=state.ledger.moments.get("logits", 0),
    )
    mem["peak"] = held["params"] + master + held["optimizer"] + state.ledger.high
    mem["workspace"] = workspace_bytes(device, held["params"] + master + held["optimizer"] + state.ledger.total)
    return mem


def _start_ledger(config: TrainConfig, state: RankState) -> None:
    """What lives at the step's start besides params and optimizer: kept buffers, leftover gradients."""
    held = state.optimizer.memory_bytes()
    kept = held.get("buffers", 0) if config.zero == 0 else 0  # DP's buckets stay; ZeRO's come and go
    state.ledger.start(
        {
            "grads": held["grads"],
            "buffers": kept + module_buffer_bytes(state.model),
            "activations": state.meter.current,
            "copies": state.meter.copies,
        }
    )


def train_rank(ctx: RankContext, config: TrainConfig) -> dict:
    """Run ``config`` on this rank; rank 0 emits one record per step and a summary.

    Every call through :mod:`dtlab.comm.calls` from the first step on is traced
    (:mod:`dtlab.comm.tracer`); a step's window runs from the previous record to
    this one, so what happens between two records (gathering them, saving a
    checkpoint) is booked to the next step. With ``config.trace``, rank 0
    writes every step's spans to that file as a Chrome trace (:mod:`dtlab.measure.chrome_trace`).
    """
    with collectives(config.collectives, ctx.backend):  # torch's, or dtlab's ring (gloo only)
        return _train(ctx, config)


def _train(ctx: RankContext, config: TrainConfig) -> dict:
    state = build_rank(ctx, config)
    # Instrumentation travels over gloo even when training uses NCCL, so that
    # gathering the records never syncs or occupies the GPU streams.
    metrics_group = dist.new_group(backend="gloo") if ctx.backend != "gloo" else None
    state.tracer.name_group(metrics_group, "world")
    guard = SpikeGuard(config.spike_policy)
    first_step = _resume(state, config, guard, metrics_group) if config.resume else 0
    tokens_per_step = config.batch_size * config.model_config().seq_len
    writer = TraceWriter(config.trace) if config.trace and ctx.rank == 0 else None
    started = time.perf_counter()
    losses, tokens_per_s, step = [], [], first_step - 1
    comm.barrier(group=metrics_group)  # the ranks start their clocks together
    with tracing(state.tracer):
        state.tracer.start()
        for step in range(first_step, config.steps):
            mine, facts = _train_step(ctx, config, state, guard, step, metrics_group)
            ranks = [None] * ctx.world_size
            comm.all_gather_object(ranks, mine, group=metrics_group, kind="all_gather_object.records")
            stop = any(r.pop("stop") for r in ranks)  # every rank sees the same list: they agree
            if ctx.rank == 0:
                record = step_record(step, ranks, tokens_per_step, **facts)
                losses.append(record["loss"])
                tokens_per_s.append(record["tokens_per_s"])
                ctx.emit(record)
                if writer is not None:
                    writer.add(record)
            if config.save and ((step + 1) % config.save_every == 0 or step + 1 == config.steps):
                _save(state, config, guard, step + 1, metrics_group)
            if stop:
                break
    if writer is not None:
        writer.close()

    summary = run_summary(
        config,
        world_size=ctx.world_size,
        backend=ctx.backend,
        params=state.n_params,
        first_step=first_step,
        steps=step + 1 - first_step,
        wall_s=time.perf_counter() - started,
        emitted=(losses, tokens_per_s) if ctx.rank == 0 else None,
    )
    if ctx.rank == 0:
        ctx.emit(summary)
    return summary


def _train_step(
    ctx: RankContext, config: TrainConfig, state: RankState, guard: SpikeGuard, step: int, metrics_group
) -> tuple[dict, dict]:
    """One optimizer step on this rank: (what this rank measured, the step's facts for rank 0's record).

    The training work is one compute region of the tracer: what the rank spends
    blocked in communication inside it (TP's f and g in forward and backward,
    ZeRO-3's gathers, a pipeline's receives, DP's wait for its buckets) is
    taken out of compute time and booked as communication.
    """
    lr = lr_at(step, lr=config.lr, warmup=config.warmup, total_steps=config.steps, schedule=config.lr_schedule)
    for group in state.optimizer.param_groups:
        group["lr"] = lr
    x, y = _batch(ctx, config, state, step)
    state.optimizer.zero_grad(set_to_none=True)
    if ctx.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(ctx.device)
    _start_ledger(config, state)
    with state.tracer.compute(), counting(state.ledger):
        inject_straggler(ctx.rank, config.straggler)  # a slow rank reaches the all-reduce late
        if config.experts:  # the balancing loss's gradient, scaled as the loss's is: S / m
            set_aux_grad_scale(
                state.model, (state.precision.loss_scale or 1.0) / (config.micro_batches * config.grad_accum)
            )
        # Forward and backward of every micro-batch (one stage of it, when pp > 1).
        pipe = state.runtime.step(x, y, loss_scale=state.precision.loss_scale or 1.0)
        state.optimizer.finish_gradient_sync()  # DP, ZeRO-2: wait for what backward started; ZeRO-1: reduce-scatter
        state.ledger.set("grads", state.optimizer.memory_bytes()["grads"])  # ZeRO freed the whole ones
        loss = global_loss(pipe.loss, group=metrics_group)
        clip = _GradientClip(config, state, ctx.device) if config.clip_grad is not None else None
        events, skipped, loss_scale = _update(state, guard, step, loss, clip)
    facts = {
        "lr": lr,
        "loss": loss,
        "events": events,
        "skipped": skipped,
        "loss_scale": loss_scale if config.precision == "fp16" else None,
    }
    if clip is not None:
        facts.update(grad_norm=clip.norm, clipped=clip.clipped)
    return _measurements(ctx, config, state, pipe), facts


def _batch(ctx: RankContext, config: TrainConfig, state: RankState, step: int):
    """This rank's slice of step ``step``'s global batch, on its device: inputs and targets."""
    x, y = global_batch(step, batch_size=config.batch_size, seq_len=config.model_config().seq_len, seed=config.seed)
    if step == config.spike:  # a corrupted batch, the same on every rank
        x, y = corrupt_batch(x, y, seed=config.seed + step)
    coords = state.groups.coords
    data_rank = coords.dp * config.ep + coords.ep  # which slice of the batch this rank reads
    x = shard(x, index=data_rank, count=config.data_ranks).to(ctx.device)  # (B / (dp ep), T)
    y = shard(y, index=data_rank, count=config.data_ranks).to(ctx.device)
    cp = state.groups.cp  # CP: this rank's tokens of each sequence
    return shard_sequence(x, group=cp), shard_sequence(y, group=cp)  # (B / (dp ep), T / cp)


class _GradientClip:
    """``--clip-grad``: the step's global gradient norm, taken when made; :meth:`__call__` clips to it.

    The norm (:func:`dtlab.numerics.gradient_clipping.global_grad_norm`, one all-reduce
    over every rank) is taken right after the gradients are averaged, before
    the spike guard and the loss scaler decide, so it is reported for every
    step, a skipped one too; the gradients are clipped only when the update
    is taken (the loss scaler calls this after unscaling).
    """

    def __init__(self, config: TrainConfig, state: RankState, device: str):
        self.pieces, self.max_norm, self.clipped = state.optimizer.gradients(), config.clip_grad, False
        self.norm = global_grad_norm(
            self.pieces,
            uncounted=state.tp_counted_elsewhere,
            loss_scale=state.precision.loss_scale or 1.0,
            device=device,
        )

    def __call__(self) -> None:
        self.clipped = clip_to(self.pieces, self.max_norm, self.norm)


def _update(
    state: RankState, guard: SpikeGuard, step: int, loss: float, clip=None
) -> tuple[list[dict], bool, float | None]:
    """The spike guard looks at the loss; then the optimizer steps, unless the guard or the loss scaler skips it.

    Under fp16 a loss that is inf or NaN overflowed in the forward pass: that
    is the loss scaler's ``overflow`` (its gradients are not finite either, so
    the scaler skips the update and backs off), not a spike for the guard.
    Returns the step's events, whether the update was skipped, and the loss scale.
    """
    overflowed = state.precision.scaler is not None and not math.isfinite(loss)  # the same on every rank
    # The snapshot is the optimizer's training state: the weights too, wherever the layout keeps them.
    events = (
        []
        if overflowed
        else guard.check(
            step, loss, model=None, optimizer=checkpoints.OptimizerState(state.optimizer), scaler=state.precision.scaler
        )
    )
    spiked = any(e["kind"] == "spike" for e in events)  # the guard already recovered: no update
    skipped, loss_scale = spiked, state.precision.loss_scale
    if not spiked:
        skipped, loss_scale = state.precision.step(state.optimizer, before_step=clip)
        if skipped or overflowed:
            events.append({"kind": "overflow", "rank": None, "loss_scale": loss_scale})
    return events, skipped, loss_scale


def _measurements(ctx: RankContext, config: TrainConfig, state: RankState, pipe) -> dict:
    """This rank's line of the step record: coordinates, times, memory, communication, and its stop vote.

    The tracer closes the step's window here: ``compute_s``, ``comm_s``,
    ``overlap_s``, ``idle_s``, ``comm`` per kind and the ``spans`` behind them.
    """
    coords = state.groups.coords
    mine = {
        "rank": ctx.rank,
        "dp": coords.dp,
        "cp": coords.cp,
        "tp": coords.tp,
        "pp": coords.pp,
        **state.tracer.end_step(),
        "loss": pipe.loss,
        "mem": _memory(state, pipe, ctx.device),
        "bubble_fraction": pipe.bubble_fraction,
        "timeline": pipe.timeline,
        "stop": ctx.stop_requested(),
    }
    if config.offload:
        mine["host_mem"] = state.optimizer.host_memory_bytes()
    if config.experts:
        mine.update(ep=coords.ep, experts=take_expert_stats(state.model))
    if config.precision == "fp8":
        mine["fp8"] = take_fp8_stats(state.model)  # per layer: amax, scale, saturated, flushed
    if ctx.device.startswith("cuda"):
        mine["mem"]["cuda_peak_allocated"] = torch.cuda.max_memory_allocated(ctx.device)
    return mine


def _save(state: RankState, config: TrainConfig, guard: SpikeGuard, step: int, group) -> None:
    checkpoints.save(
        config.save,
        step,
        optimizer=state.optimizer,
        places=state.places,
        precision=state.precision,
        guard=guard,
        config=config,
        group=group,
    )


def _resume(state: RankState, config: TrainConfig, guard: SpikeGuard, group) -> int:
    """Load the checkpoint in ``config.resume`` (of any layout) into this rank; returns the step to continue from."""
    return checkpoints.resume(
        config.resume,
        optimizer=state.optimizer,
        places=state.places,
        precision=state.precision,
        guard=guard,
        config=config,
        group=group,
    )
