"""The caller side of training: start a run on the warm pool and follow its records.

:func:`start` validates the configuration before any process starts, then
asks the pool (``dtlab/launch/``) to run :func:`dtlab.train.loop.train_rank`
on ``dp x tp x pp`` ranks. The :class:`TrainingRun` it returns streams the
step records as rank 0 emits them and, when the summary arrives, completes it
with the planner's prediction (:func:`with_prediction`; the records themselves
are made on rank 0, ``dtlab/train/records.py``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Iterator

from dtlab.comm.ring_backend import check_backend
from dtlab.config import TrainConfig
from dtlab.launch.pool import RankPool, default_pool
from dtlab.launch.runs import Run
from dtlab.launch.worker import pick_backend
from dtlab.measure.chrome_trace import chrome_trace
from dtlab.train import checkpoints
from dtlab.train.loop import train_rank
from dtlab.train.records import strict


class TrainingRun:
    """A training job running on the pool. Iterate it for step records as they arrive.

    ``run.records`` keeps every step record received so far, ``run.summary``
    the final summary (with the planner's prediction beside the measurement);
    ``run.wait()`` blocks until the end; ``run.stop()`` ends it at the next
    step boundary; ``run.cancel()`` ends every rank.
    """

    def __init__(self, config: TrainConfig, run: Run):
        self.config, self._run = config, run
        self.records: list[dict] = []
        self.summary: dict | None = None

    def __iter__(self) -> Iterator[dict]:
        for record in self._run:
            if record.get("summary"):
                self.summary = with_prediction(record, self.config, self.records)
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

    def trace(self) -> dict:
        """The records received so far as a Chrome trace-event object (what ``trace=FILE`` writes)."""
        return chrome_trace(self.records)


def start(config: TrainConfig, *, pool: RankPool | None = None) -> TrainingRun:
    """Validate ``config`` and its ``resume`` checkpoint (before any process starts), then launch it on the warm pool."""
    pool = pool or default_pool()
    config.validate(max_world_size=pool.max_size)
    check_backend(config.collectives, pick_backend(config.world_size))  # the ring is gloo's only
    if config.resume:  # missing, damaged, another model or data, nothing left: refused here
        checkpoints.check_before_start(config)
    if config.trace:  # rank 0 writes it: name the file as the caller means it
        config = dataclasses.replace(config, trace=os.path.abspath(config.trace))
    run = pool.run(train_rank, config.world_size, config, timeout=config.timeout_s)
    return TrainingRun(config, run)


def with_prediction(summary: dict, config: TrainConfig, records: list[dict]) -> dict:
    """``summary`` with ``predicted``: the planner's numbers beside those of the step ``records``."""
    return strict({**summary, "predicted": prediction(config, records)})


def prediction(config: TrainConfig, records: list[dict]) -> dict | None:
    """The planner's numbers for this layout beside what the ranks measured (labelled: a prediction).

    Both sides count memory in the accountant's categories (params, grads,
    optimizer, copies, activations, buffers, logits, peak). Model states and
    copies are exact counts on both sides and should agree; activations (a
    formula), hence peak, and step time are estimates (step time for the planner's H100, not this
    machine; with a profile from ``dtlab calibrate``, ``local`` holds this machine's, see
    :func:`local_prediction`). Measured memory is the last step's largest per rank; measured
    step time the median over the steps after the first (:func:`_median_after_warmup`), as in ``local``.
    None for a run without steps,
    or for a layout the planner does not model yet.
    """
    from dtlab.i18n import ConfigError
    from dtlab.planner import plan_for_config

    if not records:
        return None
    try:
        predicted = plan_for_config(config)
    except ConfigError:  # a layout the planner does not model yet (cp, ep, experts): no prediction
        return None
    ranks = records[-1]["ranks"]
    measured = {k: max(r["mem"][k] for r in ranks) for k in predicted.memory if k in ranks[0]["mem"]}
    if "master" in ranks[0]["mem"]:  # the planner counts the paper's K: the fp32 master with Adam's moments
        measured["optimizer"] = max(r["mem"]["optimizer"] + r["mem"]["master"] for r in ranks)
    measured_step = _median_after_warmup(records, lambda r: r["step_time_s"])
    beside = {
        "label": "prediction (dtlab.planner), beside the measurement",
        "memory": predicted.memory,
        "measured_memory": measured,
        "activations_ratio": measured["activations"] / max(1, predicted.memory["activations"]),
        "step_time_s": predicted.step_time_s,
        "gpu": predicted.gpu,
        "measured_step_time_s": measured_step,
        "step_time_ratio": measured_step / predicted.step_time_s,
    }
    local = local_prediction(config, records)
    return beside if local is None else {**beside, "local": local}


def local_prediction(config: TrainConfig, records: list[dict]) -> dict | None:
    """This machine's predicted step (``dtlab plan --gpu local``) beside the measured one; None without a
    profile from ``dtlab calibrate`` (or one this dtlab cannot read, or a layout it does not model).

    Measured figures are medians over the steps after the first (which pays for warming up): the step
    time, and the largest ``compute_s`` and ``comm_s`` over the ranks of each step.
    """
    from dtlab.i18n import ConfigError
    from dtlab.planner import plan_for_config
    from dtlab.planner.profile import default_path

    path = default_path()
    if not records or not path.is_file():
        return None
    try:
        predicted = plan_for_config(config, gpu="local")
    except ConfigError:
        return None
    measured_step = _median_after_warmup(records, lambda r: r["step_time_s"])
    comm = sum(predicted.comm_time_s.values())
    return {
        "label": "prediction for this machine (dtlab calibrate's profile), beside the measurement",
        "profile": str(path),
        "step_time_s": predicted.step_time_s,
        "compute_s": predicted.compute_time_s,
        "comm_s": comm,
        "comm_by_axis": predicted.comm_time_s,
        "measured_step_time_s": measured_step,
        "measured_compute_s": _median_after_warmup(records, lambda r: max(x["compute_s"] for x in r["ranks"])),
        "measured_comm_s": _median_after_warmup(records, lambda r: max(x["comm_s"] for x in r["ranks"])),
        "step_time_ratio": measured_step / predicted.step_time_s,
    }


def _median_after_warmup(records: list[dict], value) -> float:
    """The middle of ``value(record)`` over the steps after the first, which pays for warming up (the upper
    middle of an even count: a figure some step measured); over all steps when there is only one."""
    values = sorted(value(r) for r in records[1:] or records)
    return values[len(values) // 2]
