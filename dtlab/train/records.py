"""What a training run reports: one record per step, then a summary (the contract in DESIGN.md).

Rank 0 assembles both from what every rank measured (:func:`step_record`,
:func:`run_summary`) and streams them to the caller as they are made. The
caller, when the summary arrives, sets the planner's prediction beside the
measurement (``dtlab/train/run.py``, :func:`with_prediction`): the prediction
is arithmetic about the whole layout, so it belongs with the caller, not
inside a rank's loop.

Records are strict JSON: a number that is not finite (a NaN loss, an
infinite threshold) is reported as ``None`` (JSON's ``null``), never as
``NaN`` or ``Infinity``, which ``json.dumps`` would write and strict parsers
refuse (:func:`strict`).
"""

from __future__ import annotations

import math

from dtlab.comm.stragglers import detect_stragglers
from dtlab.config import TrainConfig
from dtlab.parallel.moe.records import expert_summary


def step_record(
    step: int,
    ranks: list[dict],
    tokens_per_step: int,
    *,
    lr: float,
    loss: float,
    events: list[dict],
    skipped: bool,
    loss_scale: float | None,
    grad_norm: float | None = None,
    clipped: bool | None = None,
) -> dict:
    """Assemble the contract's step line from every rank's measurements (``ranks``, in rank order).

    The step lasted as long as its slowest rank; ranks much slower than the
    rest are flagged as stragglers among the step's events. With clipping on
    (``clipped`` not None) the line has ``grad_norm``, the global gradient
    norm before clipping (null if not finite: an fp16 overflow), and ``clipped``.
    """
    step_time = max(r.pop("wall_s") for r in ranks)
    events = events + [{"kind": "straggler", "rank": rank} for rank in detect_stragglers(ranks)]
    experts = expert_summary(ranks)
    clipping = {} if clipped is None else {"grad_norm": grad_norm, "clipped": clipped}
    return strict(
        {
            "step": step,
            "loss": loss,
            "lr": lr,
            "tokens_per_s": tokens_per_step / step_time,
            "step_time_s": step_time,
            "loss_scale": loss_scale,
            "skipped": skipped,
            "ranks": ranks,
            "events": events,
            **clipping,
            **({"experts": experts} if experts else {}),
        }
    )


def run_summary(
    config: TrainConfig,
    *,
    world_size: int,
    backend: str,
    params: int,
    first_step: int,
    steps: int,
    wall_s: float,
    emitted: tuple[list[float], list[float]] | None,
) -> dict:
    """The last record of a run. ``emitted`` is rank 0's (losses, tokens per second) of each step it
    emitted; other ranks pass None and return the summary without them.
    """
    summary = {
        "summary": True,
        "steps": steps,
        "first_step": first_step,
        "stopped_early": first_step + steps < config.steps,
        "params": params,
        "world_size": world_size,
        "dp": config.dp,
        "cp": config.cp,
        "tp": config.tp,
        "pp": config.pp,
        "sp": config.sp,
        "ep": config.ep,
        "backend": backend,
        "wall_s": wall_s,
    }
    if emitted is not None:
        losses, tokens_per_s = emitted
        summary.update(
            final_loss=losses[-1] if losses else None,
            losses=losses,
            mean_tokens_per_s=sum(tokens_per_s) / max(1, len(tokens_per_s)),
        )
    return strict(summary)


def strict(value):
    """``value`` with every float that is not finite replaced by None, in nested dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(item) for item in value]
    return value
