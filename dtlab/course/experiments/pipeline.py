"""Lesson 08: pipeline parallelism on real ranks (the world is one pipeline group).

Every rank builds the small GPT with the same seed, keeps its stage
(:func:`dtlab.parallel.pipeline.partition_gpt`) and runs one step of a GPipe
(Huang et al. 2018) or 1F1B (Narayanan et al. 2021) schedule with
:class:`dtlab.parallel.pipeline.PipelineRuntime`. The functions return plain numbers
and lists; the notebook prints the deterministic ones (layers, actions,
bytes, booleans) and only draws the timings.
"""

from __future__ import annotations

import copy

from dtlab.comm.collectives import group_size_and_rank
from dtlab.config import MODEL_PRESETS
from dtlab.data import global_batch
from dtlab.model import build_model
from dtlab.parallel.pipeline import PipelineRuntime, partition_gpt


def pipeline_step(
    ctx,
    schedule: str = "1f1b",
    micro_batches: int = 4,
    batch_size: int = 8,
    model: str = "small",
    seed: int = 0,
    repeats: int = 2,
    virtual_stages: int = 1,
) -> dict:
    """One pipelined forward and backward of one batch, compared with the whole model in one process.

    ``virtual_stages`` > 1 with ``schedule="interleaved"``: this rank keeps that many chunks
    (``blocks`` then lists all of theirs, chunk after chunk).

    The step runs ``repeats`` times (gradients cleared in between, no optimizer
    update, so each repeat computes the same thing); the first warms up the
    ranks, the last is the one reported. Its end is a broadcast of the loss,
    so the ranks start the reported step nearly together and their timelines
    can be drawn on one time axis.
    """
    cfg = MODEL_PRESETS[model]
    stages, stage_index = group_size_and_rank(None)
    full = build_model(cfg, seed=seed)
    dense = copy.deepcopy(full)  # the single-process reference
    stage = partition_gpt(full, stage=stage_index, stages=stages, virtual_stages=virtual_stages)
    x, y = global_batch(0, batch_size=batch_size, seq_len=cfg.seq_len, seed=seed)  # (B, T) each
    runtime = PipelineRuntime(
        stage,
        d_model=cfg.d_model,
        group=None,
        schedule=schedule,
        micro_batches=micro_batches,
        virtual_stages=virtual_stages,
    )
    for _ in range(repeats):
        stage.zero_grad(set_to_none=True)
        result = runtime.step(x, y)

    dense_loss = dense(x, y)
    dense_loss.backward()
    grad_diff, _ = stage_versus_dense(full, stage, dense)
    return {
        "stage": stage_index,
        "blocks": list(stage.layers),
        "embeddings": stage.is_first,
        "head": stage.is_last,
        "actions": [str(a) for a in runtime.actions],
        "loss": result.loss,
        "dense_loss": dense_loss.item(),
        "grad_diff": grad_diff,
        "in_flight_peak": result.in_flight_peak,
        "activation_peak": result.activation_peak,
        "bubble_fraction": result.bubble_fraction,  # measured: a timing
        "timeline": result.timeline,  # measured: timings
    }


def stage_versus_dense(full, stage, dense) -> tuple[float, int]:
    """How far this stage's gradients are from the single-process ones, and how many it has.

    ``stage`` was cut from ``full`` (:func:`dtlab.parallel.pipeline.partition_gpt`), so
    its modules *are* modules of ``full`` and each of its parameters has a
    name there; ``dense`` is the whole model after one backward on the whole
    batch. Returns the largest absolute difference between a stage gradient
    and the dense gradient of the same name, and the number compared. Lesson
    06 prints it; tests/test_pipeline_runtime.py asserts it.
    """
    mine = {id(p) for p in stage.parameters()}
    dense_grads = {name: p.grad for name, p in dense.named_parameters()}
    diffs = [(p.grad - dense_grads[name]).abs().max().item() for name, p in full.named_parameters() if id(p) in mine]
    return max(diffs, default=0.0), len(diffs)


def schedule_activation_peaks(cfg, kind: str, counts, *, micro_batch_size: int = 1, seed: int = 0) -> list[dict]:
    """For each micro-batch count m in ``counts``: one ``kind`` step of this rank's stage,
    its peak activation bytes and the most micro-batches it held at once.

    The micro-batch size stays fixed (``micro_batch_size`` sequences), so the
    batch grows with m. Returns ``[{"m", "bytes", "in_flight"}, ...]``.
    """
    stages, stage_index = group_size_and_rank(None)
    rows = []
    for m in counts:
        x, y = global_batch(0, batch_size=m * micro_batch_size, seq_len=cfg.seq_len, seed=seed)
        stage = partition_gpt(build_model(cfg, seed=seed), stage=stage_index, stages=stages)
        runtime = PipelineRuntime(stage, d_model=cfg.d_model, group=None, schedule=kind, micro_batches=m)
        step = runtime.step(x, y)
        rows.append({"m": m, "bytes": step.activation_peak, "in_flight": step.in_flight_peak})
    return rows


def activation_peaks(ctx, counts=(4, 8, 16), micro_batch_size: int = 1, model: str = "small", seed: int = 0) -> dict:
    """Peak activation bytes this stage held, per schedule, for each micro-batch count.

    GPipe keeps every micro-batch's activations until its backward phase,
    1F1B at most p - stage of them (:func:`schedule_activation_peaks`).
    """
    cfg = MODEL_PRESETS[model]
    _, stage_index = group_size_and_rank(None)
    peaks = {
        kind: schedule_activation_peaks(cfg, kind, counts, micro_batch_size=micro_batch_size, seed=seed)
        for kind in ("gpipe", "1f1b")
    }
    return {"stage": stage_index, **peaks}
