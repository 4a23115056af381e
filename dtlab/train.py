"""The one training loop: every layout of the small GPT runs through here.

Three ways in, one loop:

* ``dtlab.train(config)`` from a notebook: validates, then runs
  :func:`train_rank` on the warm local pool and returns a :class:`TrainingRun`
  whose records stream as each step finishes;
* ``dtlab train --dp 4 ...`` on the command line (``dtlab/cli.py``);
* ``torchrun --nproc-per-node 4 -m dtlab.train --dp 4 ...`` on a cluster: each
  process torchrun starts joins torchrun's group and runs the same loop.

Per step, rank 0 gathers every rank's timings and memory and emits one record
(the fields of the public contract in DESIGN.md).
"""
from __future__ import annotations

import sys
import time
import types
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist

from dtlab.checkpoint import load_checkpoint, restore_rng_state, save_checkpoint
from dtlab.collectives import CommMeter
from dtlab.config import TrainConfig
from dtlab.data import global_batch, shard
from dtlab.data_parallel import ReplicatedOptimizer, apply_data_parallel
from dtlab.dp_optimizer import MODEL_STATES, DPOptimizer
from dtlab.gradient_checkpointing import apply_recompute
from dtlab.grid import Grid, build_groups
from dtlab.launch import RankContext, RankPool, Run, default_pool
from dtlab.loss_spikes import SpikeGuard, corrupt_batch, global_loss
from dtlab.lr_schedule import lr_at
from dtlab.memory import ActivationMeter, StepTimer
from dtlab.model import build_model, count_params
from dtlab.moe.expert_parallel import (ExpertParallelOptimizer, apply_expert_parallel, dense_parameters,
                                       set_aux_grad_scale, take_expert_stats)
from dtlab.moe.records import expert_summary
from dtlab.pipeline import PipelineRuntime, partition_gpt
from dtlab.precision import MixedPrecision
from dtlab.reference import adamw_options, make_optimizer
from dtlab.stragglers import detect_stragglers, inject_straggler
from dtlab.tensor_parallel import apply_tensor_parallel
from dtlab.zero import apply_zero


@dataclass
class RankState:
    """Everything one rank trains with, after the parallelisms have been applied."""

    groups: object          # dtlab.grid.RankGroups: this rank's dp / tp / pp groups and coordinates
    model: torch.nn.Module  # this rank's stage, TP-split, wrapped for DP or ZeRO
    optimizer: DPOptimizer  # DP's, ZeRO's or offloaded: the loop drives them alike
    precision: MixedPrecision
    runtime: PipelineRuntime
    meter: ActivationMeter
    comm: CommMeter
    n_params: int


def build_rank(ctx: RankContext, config: TrainConfig) -> RankState:
    """Compose the parallelisms for this rank; the order matters, and each step says why.

    1. Build the whole model from the seed (the same weights on every rank).
    2. Pipeline: keep only this rank's stage (its blocks, plus embeddings or head).
    3. Tensor parallelism: split the stage's blocks over the TP group. After 2,
       because it only rewrites the blocks this rank still holds.
    4. Mixed precision: cast-on-forward hooks on the (TP) layers, fp32 masters stay.
    5. Recompute: checkpoint each block; after 3 so the recomputed forward is the
       TP forward, with its all-reduces.
    6. Expert parallelism (with ``experts`` and ep > 1): keep this rank's E/N
       experts. After 3, which leaves a mixture of experts whole on every TP
       rank; before 7, so that DP knows which parameters are replicated.
    7. Data parallelism or ZeRO, last: they shard or average whatever parameters
       the steps above left, over the DP group (under EP: the dense parameters
       over the dp x ep ranks, groups.dp_cp, the experts over dp; dtlab/moe/expert_parallel.py).
    """
    cfg = config.model_config()
    groups = build_groups(Grid(dp=config.dp, tp=config.tp, pp=config.pp, ep=config.ep))
    comm = CommMeter()
    model = build_model(cfg, seed=config.seed).to(ctx.device)
    n_params = count_params(model)
    stage = partition_gpt(model, stage=groups.coords.pp, stages=config.pp)
    stage = apply_tensor_parallel(stage, group=groups.tp, meter=comm)
    zero3_dtype = None
    precision = MixedPrecision(config.precision if config.zero < 3 else "fp32",
                               loss_scale=config.loss_scale)
    if config.zero == 3 and config.precision == "bf16":
        zero3_dtype = torch.bfloat16  # ZeRO-3 gathers and computes in bf16 itself
    else:
        stage = precision.apply(stage)
    if config.recompute:
        apply_recompute(stage)
    if config.ep > 1:
        stage = apply_expert_parallel(stage, group=groups.ep, meter=comm)
    if config.zero == 0:
        replicated = dense_parameters(stage) if config.ep > 1 else None
        stage = apply_data_parallel(stage, mode=config.dp_mode, group=groups.dp_cp, meter=comm,
                                    params=replicated)
        optimizer = ReplicatedOptimizer(stage, make_optimizer(stage.parameters(), config))
        if config.ep > 1:
            optimizer = ExpertParallelOptimizer(optimizer, stage, group=groups.dp, ep=config.ep, meter=comm)
    else:
        stage, optimizer = apply_zero(stage, stage=config.zero, group=groups.dp, offload=config.offload,
                                      compute_dtype=zero3_dtype, meter=comm, **adamw_options(config))
    meter = ActivationMeter(stage)
    # Gradient accumulation inside a pipeline is more micro-batches: K x m of them.
    runtime = PipelineRuntime(stage, d_model=cfg.d_model, group=groups.pp, schedule=config.schedule,
                              micro_batches=config.micro_batches * config.grad_accum, meter=meter,
                              no_sync=optimizer.no_sync)
    return RankState(groups=groups, model=stage, optimizer=optimizer, precision=precision,
                     runtime=runtime, meter=meter, comm=comm, n_params=n_params)


def _model_states(state: RankState) -> dict[str, int]:
    held = state.optimizer.memory_bytes()
    return {k: held[k] for k in MODEL_STATES}


def _layout(config: TrainConfig) -> dict:
    layout = {"dp": config.dp, "tp": config.tp, "pp": config.pp, "zero": config.zero}
    return layout if not config.experts else {**layout, "ep": config.ep, "experts": config.experts}


def train_rank(ctx: RankContext, config: TrainConfig) -> dict:
    """Run ``config`` on this rank; rank 0 emits one record per step and a summary."""
    cfg = config.model_config()
    state = build_rank(ctx, config)
    coords = state.groups.coords
    data_rank = coords.dp * config.ep + coords.ep          # which slice of the batch this rank reads
    # Instrumentation travels over gloo even when training uses NCCL, so that
    # gathering the records never syncs or occupies the GPU streams.
    metrics_group = dist.new_group(backend="gloo") if ctx.backend != "gloo" else None
    guard = SpikeGuard(config.spike_policy)
    first_step = 0
    if config.resume:
        saved = load_checkpoint(config.resume, expected_layout=_layout(config), group=metrics_group)
        _load_states(state, saved)
        restore_rng_state(saved["rng"])
        first_step = saved["data_position"]
    tokens_per_step = config.batch_size * cfg.seq_len
    started = time.perf_counter()
    losses, tokens_per_s, step_times, last_ranks, step = [], [], [], [], first_step - 1

    for step in range(first_step, config.steps):
        timer = StepTimer(ctx.device)
        lr = lr_at(step, lr=config.lr, warmup=config.warmup, total_steps=config.steps)
        for group in state.optimizer.param_groups:
            group["lr"] = lr
        x, y = global_batch(step, batch_size=config.batch_size, seq_len=cfg.seq_len, seed=config.seed)
        events = []
        if step == config.spike:   # a corrupted batch, the same on every rank
            x, y = corrupt_batch(x, y, seed=config.seed + step)
        x = shard(x, index=data_rank, count=config.data_ranks).to(ctx.device)   # (B / (dp ep), T)
        y = shard(y, index=data_rank, count=config.data_ranks).to(ctx.device)
        state.optimizer.zero_grad(set_to_none=True)
        state.comm.reset()
        if ctx.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats(ctx.device)
        with timer.compute():
            inject_straggler(ctx.rank, config.straggler)   # a slow rank reaches the all-reduce late
        # Forward and backward of every micro-batch (one stage of it, when pp > 1):
        # its compute, and its waiting for neighbour stages, go to the two timers.
        if config.experts:   # the balancing loss's gradient, scaled as the loss's is: S / m
            set_aux_grad_scale(state.model, (state.precision.loss_scale or 1.0)
                               / (config.micro_batches * config.grad_accum))
        pipe = state.runtime.step(x, y, loss_scale=state.precision.loss_scale or 1.0)
        timer.compute_s += pipe.compute_s
        timer.comm_s += pipe.wait_s
        with timer.comm():   # DP: wait for what backward started; ZeRO-1/2: reduce-scatter
            state.optimizer.finish_gradient_sync()
        loss = global_loss(pipe.loss, group=metrics_group)
        events += guard.check(step, loss, model=_unwrap(state.model), optimizer=state.optimizer,
                              scaler=state.precision.scaler)
        spiked = any(e["kind"] == "spike" for e in events)   # the guard already recovered: no update
        skipped, loss_scale = spiked, state.precision.loss_scale
        if not spiked:
            with timer.compute():
                skipped, loss_scale = state.precision.step(state.optimizer)
            if skipped:
                events.append({"kind": "overflow", "rank": None, "loss_scale": loss_scale})
        mine = {"rank": ctx.rank, "dp": coords.dp, "tp": coords.tp, "pp": coords.pp, **timer.finish(),
                "loss": pipe.loss, "mem": {**_model_states(state), "activations": pipe.activation_peak},
                "bubble_fraction": pipe.bubble_fraction, "timeline": pipe.timeline,
                "comm": state.comm.as_dict(), "stop": ctx.stop_requested()}
        if config.offload:
            mine["host_mem"] = state.optimizer.host_memory_bytes()
        if config.experts:
            mine.update(ep=coords.ep, experts=take_expert_stats(state.model))
        if ctx.device.startswith("cuda"):
            mine["mem"]["cuda_peak_allocated"] = torch.cuda.max_memory_allocated(ctx.device)
        ranks = [None] * ctx.world_size
        dist.all_gather_object(ranks, mine, group=metrics_group)
        stop = any(r.pop("stop") for r in ranks)  # every rank sees the same list: they agree
        if ctx.rank == 0:
            record = _step_record(step, lr, loss, ranks, tokens_per_step, events=events,
                                  skipped=skipped, loss_scale=loss_scale if config.precision == "fp16" else None)
            losses.append(record["loss"])
            tokens_per_s.append(record["tokens_per_s"])
            step_times.append(record["step_time_s"])
            last_ranks = record["ranks"]
            ctx.emit(record)
        if config.save and ((step + 1) % config.save_every == 0 or step + 1 == config.steps):
            _save(state, config, step, metrics_group)
        if stop:
            break

    summary = {"summary": True, "steps": len(losses) if ctx.rank == 0 else step + 1 - first_step,
               "first_step": first_step, "stopped_early": step + 1 < config.steps,
               "params": state.n_params, "world_size": ctx.world_size, "dp": config.dp,
               "tp": config.tp, "pp": config.pp, "ep": config.ep, "backend": ctx.backend,
               "wall_s": time.perf_counter() - started}
    if ctx.rank == 0:
        summary.update(final_loss=losses[-1] if losses else None, losses=losses,
                       mean_tokens_per_s=sum(tokens_per_s) / max(1, len(tokens_per_s)))
        summary["predicted"] = _prediction(config, last_ranks, step_times)
        ctx.emit(summary)
    return summary


def _prediction(config: TrainConfig, ranks: list[dict], step_times: list[float]) -> dict | None:
    """The planner's numbers for this layout beside what the ranks measured (labelled: a prediction).

    Model states are exact counts on both sides and should agree; activations
    and step time are estimates (step time for the planner's H100, not this machine).
    """
    from dtlab.planner import plan_for_config

    if not ranks:
        return None
    predicted = plan_for_config(config)
    measured = {k: max(r["mem"][k] for r in ranks) for k in ("params", "grads", "optimizer", "activations")}
    measured_step = sorted(step_times)[len(step_times) // 2]
    return {"label": "prediction (dtlab.planner), beside the measurement",
            "memory": predicted.memory, "measured_memory": measured,
            "activations_ratio": measured["activations"] / max(1, predicted.memory["activations"]),
            "step_time_s": predicted.step_time_s, "gpu": predicted.gpu,
            "measured_step_time_s": measured_step,
            "step_time_ratio": measured_step / predicted.step_time_s}


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def _save(state: RankState, config: TrainConfig, step: int, group) -> None:
    save_checkpoint(config.save, step=step + 1, layout=_layout(config),
                    model_state=_unwrap(state.model).state_dict(),
                    optimizer_state=state.optimizer.state_dict(),
                    scaler_state=state.precision.state_dict(), data_position=step + 1, group=group)


def _load_states(state: RankState, saved: dict) -> None:
    _unwrap(state.model).load_state_dict(saved["model"])
    state.optimizer.load_state_dict(saved["optimizer"])
    if saved.get("scaler") is not None:
        state.precision.load_state_dict(saved["scaler"])


def _step_record(step: int, lr: float, loss: float, ranks: list[dict], tokens_per_step: int, *,
                 events: list[dict], skipped: bool, loss_scale) -> dict:
    """Assemble the contract's step line from every rank's measurements."""
    step_time = max(r.pop("wall_s") for r in ranks)
    events = events + [{"kind": "straggler", "rank": rank} for rank in detect_stragglers(ranks)]
    experts = expert_summary(ranks)
    return {"step": step, "loss": loss, "lr": lr, "tokens_per_s": tokens_per_step / step_time,
            "step_time_s": step_time, "loss_scale": loss_scale, "skipped": skipped,
            "ranks": ranks, "events": events, **({"experts": experts} if experts else {})}


class TrainingRun:
    """A training job running on the pool. Iterate it for step records as they arrive.

    ``run.records`` keeps every step record received so far, ``run.summary``
    the final summary; ``run.wait()`` blocks until the end; ``run.cancel()``
    ends every rank.
    """

    def __init__(self, config: TrainConfig, run: Run):
        self.config, self._run = config, run
        self.records: list[dict] = []
        self.summary: dict | None = None

    def __iter__(self) -> Iterator[dict]:
        for record in self._run:
            if record.get("summary"):
                self.summary = record
            else:
                self.records.append(record)
                yield record

    def wait(self) -> "TrainingRun":
        for _ in self:
            pass
        return self

    def stop(self) -> None:
        """Finish at the next step boundary, keeping the pool warm."""
        self._run.stop()

    def cancel(self) -> None:
        """End every rank now (the pool restarts cold next time)."""
        self._run.cancel()

    @property
    def finished(self) -> bool:
        return self._run.finished

    @property
    def first_record_s(self) -> float | None:
        return self._run.first_record_s

    def losses(self) -> list[float]:
        return [r["loss"] for r in self.records]


def start(config: TrainConfig, *, pool: RankPool | None = None) -> TrainingRun:
    """Validate ``config`` (before any process starts) and launch it on the warm pool."""
    pool = pool or default_pool()
    config.validate(max_world_size=pool.max_size)
    run = pool.run(train_rank, config.world_size, config, timeout=config.timeout_s)
    return TrainingRun(config, run)


class _CallableModule(types.ModuleType):
    """Lets ``dtlab.train(config)`` be a call while ``python -m dtlab.train`` stays a module."""

    def __call__(self, config: TrainConfig, *, pool: RankPool | None = None) -> TrainingRun:
        return start(config, pool=pool)


sys.modules[__name__].__class__ = _CallableModule


def main(argv: list[str] | None = None) -> int:
    """``python -m dtlab.train`` / ``torchrun ... -m dtlab.train``: same flags as ``dtlab train``."""
    from dtlab.cli import main as cli_main

    return cli_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
