"""The layout race's entries and results, as plain data: which layouts race, and what they measured.

:func:`race_layouts` picks the search's fastest layouts (by default the first
of each (dp, tp, pp) shape), :func:`layout_label` names one and
:func:`train_config` makes its ``dtlab train`` job; :class:`RaceRow` and
:class:`RaceResult` hold a race's predicted and measured step times, ranks
and Kendall's tau. The widget that runs and draws a race is
:class:`dtlab.lab.layout_race.LayoutRace`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from dtlab.config import TrainConfig


def layout_label(plan) -> str:
    """``dp=2 pp=2 m=4 1f1b zero=1``: the values that differ from a single rank's run."""
    parts = [f"{axis}={getattr(plan, axis)}" for axis in ("dp", "tp", "pp") if getattr(plan, axis) > 1]
    if plan.pp > 1:
        parts.append(
            f"m={plan.micro_batches} {plan.schedule}"
            + (f" v={plan.virtual_stages}" if plan.schedule == "interleaved" else "")
        )
    elif plan.micro_batches > 1:
        parts.append(f"m={plan.micro_batches}")
    parts += (
        [f"zero={plan.zero}"] * (plan.zero > 0)
        + ["recompute"] * (plan.recompute == "full")
        + ["sp"] * plan.sequence_parallel
    )
    return " ".join(parts) or "1 rank"


def train_config(plan, *, model: str, batch_size: int, steps: int) -> TrainConfig:
    """The ``dtlab train`` job of a plan of the local search (recompute is train's switch)."""
    return TrainConfig(
        model=model,
        batch_size=batch_size,
        steps=steps,
        seed=0,
        dp=plan.dp,
        tp=plan.tp,
        pp=plan.pp,
        micro_batches=plan.micro_batches,
        schedule=plan.schedule,
        virtual_stages=plan.virtual_stages,
        zero=plan.zero,
        precision=plan.precision,
        recompute=plan.recompute == "full",
        sp=plan.sequence_parallel,
    )


def race_layouts(found, top: int, *, one_per_shape: bool = True, runs=lambda plan: True) -> list:
    """The search's ranked plans, fastest first, that ``runs(plan)`` accepts, at most ``top`` of them;
    with ``one_per_shape``, only the first (fastest) of each (dp, tp, pp)."""
    chosen, shapes = [], set()
    for plan in found.ranked:
        shape = (plan.dp, plan.tp, plan.pp)
        if (one_per_shape and shape in shapes) or not runs(plan):
            continue
        chosen.append(plan)
        shapes.add(shape)
        if len(chosen) == top:
            break
    return chosen


@dataclass(frozen=True)
class RaceRow:
    """One layout of the race: the planner's plan and rank, and what its runs measured."""

    label: str
    config: TrainConfig
    plan: object
    """The search's :class:`~dtlab.planner.Plan` (a prediction)."""
    predicted_rank: int
    step_times: list[float]
    """Measured seconds of every step after the warm-up, every pass."""
    runs: list[list[dict]]
    """Each pass's step records (the warm-up steps included)."""
    measured_rank: int

    @property
    def predicted_s(self) -> float:
        return self.plan.step_time_s

    @property
    def measured_s(self) -> float:
        return statistics.median(self.step_times)


@dataclass(frozen=True)
class RaceResult:
    """What :meth:`LayoutRace.run` returns: the rows in the planner's order and Kendall's tau."""

    rows: list[RaceRow]
    kendall_tau: float
    profile: str
    ranks: int

    @property
    def fastest(self) -> int:
        """The planner's rank (1 = its fastest) of the layout that measured fastest."""
        return min(self.rows, key=lambda r: r.measured_s).predicted_rank

    def to_dict(self) -> dict:
        return {
            "ranks": self.ranks,
            "profile": self.profile,
            "kendall_tau": self.kendall_tau,
            "fastest": self.fastest,
            "rows": [
                {
                    "layout": r.label,
                    "predicted_rank": r.predicted_rank,
                    "measured_rank": r.measured_rank,
                    "predicted_s": r.predicted_s,
                    "measured_s": r.measured_s,
                }
                for r in self.rows
            ],
        }


def _ranks(values: list[float]) -> list[int]:
    """1 for the smallest value, 2 for the next, ... (ties in list order)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0] * len(values)
    for position, i in enumerate(order, 1):
        ranks[i] = position
    return ranks
