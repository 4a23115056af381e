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
from contextlib import nullcontext
from typing import Iterator

import torch
import torch.distributed as dist

from dtlab.config import TrainConfig
from dtlab.data import global_batch, micro_batches, shard
from dtlab.data_parallel import apply_data_parallel
from dtlab.faults import detect_stragglers, inject_straggler
from dtlab.launch import RankContext, RankPool, Run, default_pool
from dtlab.lr_schedule import lr_at
from dtlab.memory import ActivationMeter, StepTimer, model_state_bytes
from dtlab.model import build_model, count_params
from dtlab.reference import make_optimizer


def train_rank(ctx: RankContext, config: TrainConfig) -> dict:
    """Run ``config`` on this rank; rank 0 emits one record per step and a summary."""
    cfg = config.model_config()
    dp_rank, dp = ctx.rank, config.dp  # only data parallelism in this version: the world is the DP group
    # Same seed on every rank gives the same initial weights; the DP wrapper
    # broadcasts rank 0's, which makes that a guarantee rather than a coincidence.
    model = build_model(cfg, seed=config.seed).to(ctx.device)
    model = apply_data_parallel(model, mode=config.dp_mode, group=None)  # the world is the DP group
    optimizer = make_optimizer(model.parameters(), config)
    meter = ActivationMeter(model)
    # Instrumentation travels over gloo even when training uses NCCL, so that
    # gathering the records never syncs or occupies the GPU streams.
    metrics_group = dist.new_group(backend="gloo") if ctx.backend != "gloo" else None
    n_params = count_params(model)
    tokens_per_step = config.batch_size * cfg.seq_len
    started = time.perf_counter()
    losses, tokens_per_s = [], []

    for step in range(config.steps):
        timer = StepTimer(ctx.device)
        lr = lr_at(step, lr=config.lr, warmup=config.warmup, total_steps=config.steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = global_batch(step, batch_size=config.batch_size, seq_len=cfg.seq_len, seed=config.seed)
        x = shard(x, index=dp_rank, count=dp).to(ctx.device)   # (B / dp, T)
        y = shard(y, index=dp_rank, count=dp).to(ctx.device)
        optimizer.zero_grad(set_to_none=True)
        meter.reset_peak()
        if ctx.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats(ctx.device)
        loss_sum = 0.0
        with timer.compute(), meter.track():
            # A straggler is slow to compute, so its gradients reach the all-reduce late.
            inject_straggler(ctx.rank, config.straggler)
            for i, (mx, my) in enumerate(micro_batches(x, y, config.grad_accum)):  # (B / dp / K, T) each
                # Only the last micro-step communicates; the others accumulate locally.
                last = i == config.grad_accum - 1
                with nullcontext() if last else model.no_sync():
                    loss = model(mx, my) / config.grad_accum
                    loss.backward()   # OverlappedDP starts bucket all-reduces from in here
                loss_sum += loss.item()
        with timer.comm():
            model.finish_gradient_sync()   # waits for the rest: comm_s is the time not hidden
        with timer.compute():
            optimizer.step()
        mine = {"rank": ctx.rank, "dp": dp_rank, "tp": 0, "pp": 0, **timer.finish(), "loss": loss_sum,
                "mem": {**model_state_bytes(model.parameters(), optimizer), "activations": meter.peak}}
        if ctx.device.startswith("cuda"):
            mine["mem"]["cuda_peak_allocated"] = torch.cuda.max_memory_allocated(ctx.device)
        mine["stop"] = ctx.stop_requested()
        ranks = [None] * ctx.world_size
        dist.all_gather_object(ranks, mine, group=metrics_group)
        stop = any(r.pop("stop") for r in ranks)  # every rank sees the same list: they agree
        if ctx.rank == 0:
            record = _step_record(step, lr, ranks, config, tokens_per_step)
            losses.append(record["loss"])
            tokens_per_s.append(record["tokens_per_s"])
            ctx.emit(record)
        if stop:
            break

    summary = {"summary": True, "steps": step + 1, "stopped_early": step + 1 < config.steps, "params": n_params,
               "world_size": ctx.world_size, "dp": config.dp, "tp": config.tp, "pp": config.pp,
               "backend": ctx.backend, "wall_s": time.perf_counter() - started}
    if ctx.rank == 0:
        summary.update(final_loss=losses[-1], losses=losses,
                       mean_tokens_per_s=sum(tokens_per_s) / len(tokens_per_s))
        ctx.emit(summary)
    return summary


def _step_record(step: int, lr: float, ranks: list[dict], config: TrainConfig,
                 tokens_per_step: int) -> dict:
    """Assemble the contract's step line from every rank's measurements."""
    step_time = max(r.pop("wall_s") for r in ranks)
    loss = sum(r["loss"] for r in ranks) / len(ranks)  # mean over DP ranks = mean over the global batch
    events = [{"kind": "straggler", "rank": rank} for rank in detect_stragglers(ranks)]
    return {"step": step, "loss": loss, "lr": lr, "tokens_per_s": tokens_per_step / step_time,
            "step_time_s": step_time, "loss_scale": None, "skipped": False,
            "ranks": ranks, "events": events}


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
