"""Data parallelism made visible: time per rank for each DP version, gradient accumulation,
and a straggler, each driven by real runs of :func:`dtlab.train` on the warm pool.

* :class:`TimeFigure` (:func:`time_figure`): compute / communication / idle
  seconds per rank, for several runs side by side (read from the step
  records' ``ranks``).
* :class:`AccumulationView`: a slider for gradient-accumulation steps K. Each
  value trains the same global batch with K micro-steps and draws its loss
  curve over the K = 1 one, with the all-reduce calls per step.
* :class:`StragglerView`: sliders for which rank is slowed and by how many
  seconds; draws every rank's time and the straggler events the run reported.

Timings change from run to run; counts, losses and flagged ranks do not.
"""

from __future__ import annotations

import dataclasses
import statistics

import ipywidgets as widgets
import plotly.graph_objects as go

import dtlab
from dtlab.config import TrainConfig
from dtlab.i18n import register, t
from dtlab.lab import labels as _labels  # noqa: F401  (time.compute, time.comm, time.idle)
from dtlab.lab.fit import FigureWidget, fitted, responsive, row
from dtlab.lab.view import FigureLabels, View

register(
    {
        "dp.time.title": (
            "Time per rank, mean of the steps after the first",
            "每个 rank 的时间（第一步之后各步的平均）",
        ),
        "dp.time.x": ("DP version / rank", "数据并行版本 / rank"),
        "dp.accum.ctl": ("grad. accumulation K", "梯度累积步数 K"),
        "dp.accum.title": ("Loss with gradient accumulation (same global batch)", "梯度累积下的损失（全局批大小相同）"),
        "dp.accum.reference": ("K = 1", "K = 1"),
        "dp.accum.run": ("K = {k}", "K = {k}"),
        "dp.accum.summary": (
            "K = {k}: {micro} sequences per micro-step on each rank, all-reduce calls per "
            "optimizer step: {calls}; largest relative loss difference from K = 1: {gap:.1e}",
            "K = {k}：每个 rank 每个微步 {micro} 条序列，每个优化器步的全归约调用次数：{calls}；"
            "与 K = 1 的最大相对损失差：{gap:.1e}",
        ),
        "dp.strag.rank": ("slow rank", "慢节点 rank"),
        "dp.strag.seconds": ("extra seconds", "额外秒数"),
        "dp.strag.title": (
            "Time per rank with rank {rank} slowed by {seconds:g} s (last step)",
            "rank {rank} 慢 {seconds:g} 秒时每个 rank 的时间（最后一步）",
        ),
        "dp.strag.summary": (
            "step time {step:.3f} s; ranks flagged as stragglers in every step: {flagged}",
            "单步时间 {step:.3f} 秒；每一步都被标记为慢节点的 rank：{flagged}",
        ),
        "dp.running": ("running…", "正在运行……"),
    }
)

TIME_CATEGORIES = (
    ("compute_s", "time.compute", "#4C78A8"),
    ("comm_s", "time.comm", "#F58518"),
    ("idle_s", "time.idle", "#BAB0AC"),
)


def mean_times(records: list[dict]) -> list[dict]:
    """Per rank, the mean compute/comm/idle seconds over the steps after the first (the first warms up)."""
    steps = records[1:] or records
    n = len(steps[0]["ranks"])
    return [
        {key: statistics.fmean(rec["ranks"][r][key] for rec in steps) for key, _, _ in TIME_CATEGORIES}
        for r in range(n)
    ]


def flagged_every_step(records: list[dict]) -> list[int]:
    """Ranks reported with a ``straggler`` event in every step."""
    per_step = [{e["rank"] for e in rec["events"] if e["kind"] == "straggler"} for rec in records]
    return sorted(set.intersection(*per_step)) if per_step else []


class TimeFigure(View):
    """Stacked compute / communication / idle bars per rank, one group of bars per run.

    ``title_key`` and its ``{placeholders}`` (``title``) name the figure; the
    default title's x axis reads "DP version / rank", any other "rank".
    """

    def __init__(self, runs: dict[str, list[dict]], *, title_key: str = "dp.time.title", **title):
        self.figure = responsive(
            FigureWidget(
                layout=go.Layout(
                    height=340,
                    barmode="stack",
                    margin=dict(l=60, r=10, t=50, b=60),
                    legend=dict(orientation="h", y=-0.3),
                )
            )
        )
        self.widget = fitted(self.figure)  # the figure in a box that fits its output area
        for _, _, color in TIME_CATEGORIES:
            self.figure.add_bar(x=[], y=[], marker_color=color)
        self.title = title
        x_key = "dp.time.x" if title_key == "dp.time.title" else "axis.rank"
        self.figures = {
            "figure": FigureLabels(title_key, x_key, "axis.seconds", tuple(key for _, key, _ in TIME_CATEGORIES))
        }
        self.fill(runs)
        self.start()

    def label_args(self) -> dict:
        return self.title

    def fill(self, runs: dict[str, list[dict]], **title) -> None:
        """Draw ``runs`` (label -> records); ``title`` replaces the title's placeholders."""
        fill_time_bars(self.figure, runs)
        if title:
            self.title = title
            self.relabel()


def time_figure(runs: dict[str, list[dict]], *, title_key: str = "dp.time.title", **title) -> TimeFigure:
    """A :class:`TimeFigure` of ``runs`` (a cell ending in it shows the figure)."""
    return TimeFigure(runs, title_key=title_key, **title)


def fill_time_bars(fig: go.FigureWidget, runs: dict[str, list[dict]]) -> None:
    """Put each run's mean seconds per rank into ``fig``'s three stacked traces."""
    groups, ranks, per_key = [], [], {key: [] for key, _, _ in TIME_CATEGORIES}
    for label, records in runs.items():
        for r, times in enumerate(mean_times(records)):
            groups.append(label)
            ranks.append(str(r))
            for key in per_key:
                per_key[key].append(times[key])
    x = [groups, ranks] if any(groups) else ranks
    with fig.batch_update():
        for trace, (key, _, _) in zip(fig.data, TIME_CATEGORIES):
            trace.x, trace.y = x, per_key[key]


class AccumulationView(View):
    """A K slider; each value runs ``base`` with ``grad_accum=K`` and draws it over K = 1."""

    labels = {"slider": "dp.accum.ctl"}
    figures = {
        "figure": FigureLabels("dp.accum.title", "axis.step", "axis.loss", ("dp.accum.reference", "dp.accum.run"))
    }
    changes = {"slider": "show_selected"}

    def __init__(self, base: TrainConfig, choices=(1, 2, 4)):
        self.base = base
        self.runs: dict[int, object] = {}
        self.k: int | None = None
        self.slider = widgets.SelectionSlider(options=list(choices), value=choices[0])
        self.figure = responsive(
            FigureWidget(
                layout=go.Layout(height=320, margin=dict(l=60, r=10, t=50, b=40), legend=dict(orientation="h", y=-0.2))
            )
        )
        self.figure.add_scatter(x=[], y=[], mode="lines", line=dict(dash="dash", color="black"))
        self.figure.add_scatter(x=[], y=[], mode="markers", marker=dict(size=7))
        self.summary = widgets.HTML()
        self.widget = widgets.VBox([row([self.slider]), fitted(self.figure), self.summary])
        self.start()

    def run(self, k: int):
        """Train with ``grad_accum=k`` (once per k; later calls reuse the result)."""
        if k not in self.runs:
            self.runs[k] = dtlab.train(dataclasses.replace(self.base, grad_accum=k)).wait()
        return self.runs[k]

    def show_selected(self):
        return self.show(self.slider.value)

    def show(self, k: int):
        self.summary.value = t("dp.running")
        reference, run = self.run(1), self.run(k)
        self.k = k
        with self.figure.batch_update():
            ref = reference.losses()
            self.figure.data[0].x, self.figure.data[0].y = list(range(len(ref))), ref
            self.figure.data[1].x, self.figure.data[1].y = list(range(len(run.losses()))), run.losses()
        self.relabel()
        return run

    def label_args(self) -> dict:
        return {"k": self.slider.value if self.k is None else self.k}

    def refresh(self, lang: str) -> None:
        if self.k is None:
            return
        k = self.k
        run, ref = self.runs[k], self.runs[1].losses()
        gap = max(abs(a - b) / b for a, b in zip(run.losses(), ref))
        calls = sorted({rec["ranks"][0]["comm"].get("all_reduce", {}).get("count", 0) for rec in run.records})
        micro = self.base.batch_size // self.base.dp // k
        self.summary.value = t("dp.accum.summary", lang, k=k, micro=micro, calls=calls, gap=gap)


class StragglerView(View):
    """Sliders for the slow rank and its extra seconds; each change runs ``base`` with that straggler."""

    labels = {"rank": "dp.strag.rank", "seconds": "dp.strag.seconds"}
    changes = {"rank": "show_selected", "seconds": "show_selected"}

    def __init__(self, base: TrainConfig, *, seconds=(0.0, 0.1, 0.2, 0.3, 0.5)):
        self.base = base
        self.rank = widgets.SelectionSlider(options=list(range(base.dp)), value=base.dp - 1)
        self.seconds = widgets.SelectionSlider(options=list(seconds), value=seconds[-2])
        self.chart = TimeFigure({}, title_key="dp.strag.title", rank=self.rank.value, seconds=self.seconds.value)
        self.summary = widgets.HTML()
        self.widget = widgets.VBox([row([self.rank, self.seconds]), self.chart.widget, self.summary])
        self.last = None
        self.start()

    def show_selected(self):
        return self.show(self.rank.value, self.seconds.value)

    def show(self, rank: int, seconds: float):
        """Run ``base`` with ``straggler=(rank, seconds)`` and draw every rank's last step."""
        self.summary.value = t("dp.running")
        straggler = (rank, seconds) if seconds > 0 else None
        run = dtlab.train(dataclasses.replace(self.base, straggler=straggler)).wait()
        self.last = (rank, seconds, run)
        self.chart.fill({"": run.records[-1:]}, rank=rank, seconds=seconds)
        self.relabel()
        return run

    def refresh(self, lang: str) -> None:
        if self.last is not None:
            _, _, run = self.last
            self.summary.value = t(
                "dp.strag.summary", lang, step=run.records[-1]["step_time_s"], flagged=flagged_every_step(run.records)
            )
