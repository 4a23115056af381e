"""The pipeline schedule as a picture: a row per stage (rank), a box per action, along time.

It draws the same data :mod:`dtlab.parallel.pipeline.schedule` returns: ``simulate``'s
ideal timeline (every forward takes one slot, communication is free), and
the timeline :class:`dtlab.parallel.pipeline.PipelineRuntime` measured on real ranks.
A box is labelled like PyTorch's pipelining actions, ``1F0`` = stage 1,
forward, micro-batch 0, and coloured by forward or backward; the white gaps
are the *bubble*: (p - 1)/(m + p - 1) of the time for GPipe (Huang et al.
2018) and for 1F1B (Narayanan et al. 2021), which only changes how many
micro-batches each stage must hold at once.

Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2) labels an action by its
*virtual* stage, chunk x p + rank: with p = 2, ``2F0`` is rank 0's chunk 1.
The picture keeps one row per rank (virtual stage mod p) and shows the chunk
(virtual stage // p) in the box's shade, darker for later chunks, and in its
hover text.

:class:`PipelineView` has sliders for p, m, the schedule and (interleaved) the
chunks per rank v, and a **Step** button that replays the ideal schedule one time slot at a time.
:class:`TimelineComparison` puts a measured run beside its ideal schedule.
"""

from __future__ import annotations

import html
import re
from typing import NamedTuple

import ipywidgets as widgets
import plotly.graph_objects as go

from dtlab.i18n import ConfigError, get_language, register, t
from dtlab.lab.fit import FigureWidget, fitted, fitting_grid, responsive, set_title
from dtlab.lab.view import View
from dtlab.parallel.pipeline.schedule import (
    BACKWARD,
    FORWARD,
    ideal_bubble_fraction,
    max_in_flight,
    simulate,
)
from dtlab.parallel.pipeline.schedule import (
    schedule as make_schedule,
)

register(
    {
        "pipe.title.ideal": (
            "Pipeline parallelism, {schedule}: p={p}, m={m} (ideal, simulated)",
            "流水线并行，{schedule}：p={p}，m={m}（理想情况，模拟）",
        ),
        "pipe.title.measured": (
            "Pipeline parallelism, {schedule}: p={p}, m={m} (measured on this machine)",
            "流水线并行，{schedule}：p={p}，m={m}（本机实测）",
        ),
        "pipe.axis.slots": ("time (one forward = 1 slot)", "时间（一次前向 = 1 个时隙）"),
        "pipe.axis.ms": ("milliseconds since the step began", "自本步开始的毫秒数"),
        "pipe.stage": ("stage {s}", "阶段 {s}"),
        "pipe.rank_stages": ("rank {r}: stages {stages}", "rank {r}：阶段 {stages}"),
        "pipe.hover": ("{label}: {start} – {end}", "{label}：{start} – {end}"),
        "pipe.hover.chunk": (
            "{label} (rank {r}, chunk {c}, virtual stage {s}): {start} – {end}",
            "{label}（rank {r}，模型块 {c}，虚拟阶段 {s}）：{start} – {end}",
        ),
        "pipe.chunks": ("{kind}; darker = a later chunk", "{kind}；颜色越深 = 越靠后的模型块"),
        "pipe.forward": ("forward (F)", "前向 (F)"),
        "pipe.backward": ("backward (B)", "反向 (B)"),
        "pipe.ctl.stages": ("stages p", "阶段数 p"),
        "pipe.ctl.micro": ("micro-batches m", "微批次数 m"),
        "pipe.ctl.schedule": ("schedule", "调度方式"),
        "pipe.ctl.virtual": ("chunks per rank v", "每个 rank 的模型块数 v"),
        "pipe.bubble.interleaved": (
            "bubble (p−1)/(v·m+p−1) = {idle}/{total} = {pct:.1f}% of the time (simulated: {sim:.1f}%)",
            "气泡 (p−1)/(v·m+p−1) = {idle}/{total}，占全部时间的 {pct:.1f}%（模拟结果：{sim:.1f}%）",
        ),
        "pipe.bubble": (
            "bubble (p−1)/(m+p−1) = {idle}/{total} = {pct:.1f}% of the time (simulated: {sim:.1f}%)",
            "气泡 (p−1)/(m+p−1) = {idle}/{total}，占全部时间的 {pct:.1f}%（模拟结果：{sim:.1f}%）",
        ),
        "pipe.in_flight": (
            "micro-batches in flight per stage, at most: {peaks}",
            "每个阶段同时在途的微批次数，最多：{peaks}",
        ),
        "pipe.now": (
            "time {now} of {total}; in flight now, per stage: {held}",
            "时间 {now} / {total}；此刻每个阶段在途的微批次数：{held}",
        ),
    }
)

COLORS = {FORWARD: "#4C78A8", BACKWARD: "#F58518"}
SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B"}
STAGE_CHOICES = (1, 2, 4)
_ACTION = re.compile(r"^(\d+)([FB])(\d+)$")


class Box(NamedTuple):
    """One action of a timeline, where it is drawn."""

    rank: int  # its row: the rank that ran it, virtual stage mod p
    chunk: int  # the rank's model chunk, virtual stage // p (0 unless interleaved)
    kind: str  # FORWARD or BACKWARD
    label: str  # as the schedule names it, "2F0" = (virtual) stage 2, forward, micro-batch 0
    start: float
    end: float


def boxes(timeline) -> list[Box]:
    """A :class:`Box` for each action of a timeline.

    ``timeline`` is a list per rank (p of them), either ``simulate(...).timeline``
    (Timed objects) or the runtime's measured dicts ``{"action": "1F0", "start": s, "end": e}``.
    An action's (virtual) stage s is drawn on rank s mod p as chunk s // p: GPipe and 1F1B's
    stage s on row s, interleaved's on the rank that holds it.
    """
    p = len(timeline)
    out = []
    for rank, actions in enumerate(timeline):
        for a in actions:
            if isinstance(a, dict):
                label, start, end = a["action"], a["start"], a["end"]
            else:
                label, start, end = str(a.action), a.start, a.end
            match = _ACTION.match(label)
            stage, kind = (int(match[1]), match[2]) if match else (rank, FORWARD)
            out.append(Box(stage % p, stage // p, kind, label, start, end))
    return out


def shade(color: str, chunk: int, chunks: int) -> str:
    """``color`` for chunk 0, mixed towards black for later chunks (up to 45% for the last)."""
    if chunks <= 1 or chunk == 0:
        return color
    keep = 1 - 0.45 * chunk / (chunks - 1)
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(c * keep):02X}" for c in (r, g, b))


class TimelineFigure(View):
    """One plotly figure: a horizontal row per stage, a bar per action, forward and backward coloured."""

    def __init__(self, *, title_key: str, x_key: str, width: int = 620):
        self.title_key, self.x_key = title_key, x_key
        self.figure = responsive(
            FigureWidget(
                layout=go.Layout(
                    height=260,
                    barmode="overlay",
                    margin=dict(l=70, r=10, t=50, b=40),
                    legend=dict(orientation="h", y=-0.3),
                    bargap=0.25,
                    yaxis=dict(autorange="reversed", zeroline=False),
                    xaxis=dict(zeroline=False),
                )
            )
        )
        self.widget = fitted(self.figure)  # the figure in a box that fits its output area
        for kind in (FORWARD, BACKWARD):
            self.figure.add_bar(
                x=[],
                y=[],
                base=[],
                orientation="h",
                marker_color=COLORS[kind],
                textposition="inside",
                insidetextanchor="middle",
                textfont=dict(color="white"),
                hoverinfo="text",
            )
        self._timeline, self._stages, self._upto, self._scale = [], 1, None, 1.0
        self._title = {}
        self.start()

    def draw(self, timeline, *, stages: int, upto: float | None = None, scale: float = 1.0, **title) -> None:
        """Draw ``timeline`` (see :func:`boxes`); ``upto`` shows only what ran before that time,
        and marks it with a dotted line; times are multiplied by ``scale`` (seconds -> ms)."""
        self._timeline, self._stages, self._upto, self._scale = timeline, stages, upto, scale
        self._title = title
        self._redraw()

    def _redraw(self, lang: str | None = None) -> None:
        drawn = boxes(self._timeline)
        p = self._stages
        chunks = 1 + max((box.chunk for box in drawn), default=0)  # v when interleaved, else 1
        shown = {FORWARD: [], BACKWARD: []}
        for box in drawn:
            start, end = box.start * self._scale, box.end * self._scale
            if self._upto is not None:
                if start >= self._upto:
                    continue
                end = min(end, self._upto)  # the part that has run so far
            shown[box.kind].append((box, start, end))
        lang = lang or get_language()
        with self.figure.batch_update():
            for trace, kind in zip(self.figure.data, (FORWARD, BACKWARD)):
                rows = shown[kind]
                trace.y = [box.rank for box, _, _ in rows]
                trace.base = [start for _, start, _ in rows]
                trace.x = [end - start for _, start, end in rows]
                trace.text = [box.label for box, _, _ in rows]
                name = t("pipe.forward" if kind == FORWARD else "pipe.backward", lang)
                if chunks == 1:
                    trace.marker.color = COLORS[kind]
                    trace.hovertext = [
                        t("pipe.hover", lang, label=box.label, start=f"{start:.3g}", end=f"{end:.3g}")
                        for box, start, end in rows
                    ]
                    trace.name = name
                else:
                    trace.marker.color = [shade(COLORS[kind], box.chunk, chunks) for box, _, _ in rows]
                    trace.hovertext = [
                        t(
                            "pipe.hover.chunk",
                            lang,
                            label=box.label,
                            r=box.rank,
                            c=box.chunk,
                            s=box.chunk * p + box.rank,
                            start=f"{start:.3g}",
                            end=f"{end:.3g}",
                        )
                        for box, start, end in rows
                    ]
                    trace.name = t("pipe.chunks", lang, kind=name)
            set_title(self.figure, t(self.title_key, lang, **self._title) if self._title else "")  # wrapped
            self.figure.layout.xaxis.title = t(self.x_key, lang)
            self.figure.layout.yaxis.tickvals = list(range(p))
            self.figure.layout.yaxis.ticktext = (
                [t("pipe.stage", lang, s=s) for s in range(p)]
                if chunks == 1
                else [
                    t("pipe.rank_stages", lang, r=r, stages=", ".join(str(c * p + r) for c in range(chunks)))
                    for r in range(p)
                ]
            )
            self.figure.layout.yaxis.range = [p - 0.5, -0.5]
            self.figure.layout.shapes = (
                []
                if self._upto is None
                else [
                    dict(
                        type="line",
                        x0=self._upto,
                        x1=self._upto,
                        y0=-0.5,
                        y1=p - 0.5,
                        line=dict(color="black", dash="dot", width=1),
                    )
                ]
            )

    def refresh(self, lang: str) -> None:
        """Every text of this figure depends on what it draws: redraw it all."""
        self._redraw(lang)


def in_flight_at(timeline, now: float) -> list[int]:
    """Per stage (rank), the micro-batches whose forward has started by ``now`` and whose backward
    has not finished: the activations that stage holds at that moment (interleaved: the rank's
    (chunk, micro-batch) pairs, as :func:`max_in_flight` counts them)."""
    held = [0] * len(timeline)
    for box in boxes(timeline):
        if box.kind == FORWARD and box.start < now:
            held[box.rank] += 1
        elif box.kind == BACKWARD and box.end <= now:
            held[box.rank] -= 1
    return held


class PipelineView(View):
    """Sliders for p, m, the schedule and v; the ideal timeline, its bubble, and a Step button.

    ``step()`` and ``reset()`` are what the buttons call, so a notebook can
    replay the schedule from code too; ``in_flight_now()`` reads the state.
    """

    labels = {
        "stages": "pipe.ctl.stages",
        "micro_batches": "pipe.ctl.micro",
        "schedule": "pipe.ctl.schedule",
        "virtual_stages": "pipe.ctl.virtual",
        "step_button": "ctl.step",
        "reset_button": "ctl.reset",
    }
    clicks = {"step_button": "step", "reset_button": "reset"}
    changes = {"stages": "redraw", "micro_batches": "redraw", "schedule": "redraw", "virtual_stages": "redraw"}

    def __init__(
        self,
        *,
        stages: int = 4,
        micro_batches: int = 4,
        schedule: str = "gpipe",
        virtual_stages: int = 2,
        f_time: float = 1,
        b_time: float = 1,
    ):
        self.f_time, self.b_time = f_time, b_time
        self.stages = widgets.SelectionSlider(options=list(STAGE_CHOICES), value=stages)
        self.micro_batches = widgets.IntSlider(value=micro_batches, min=1, max=16)
        self.schedule = widgets.ToggleButtons(options=[(SCHEDULE_NAMES[k], k) for k in SCHEDULE_NAMES], value=schedule)
        # Interleaved 1F1B's v (Narayanan et al. 2021): used only by that schedule.
        self.virtual_stages = widgets.IntSlider(value=virtual_stages, min=2, max=4)
        self.problem: ConfigError | None = None
        self.step_button = widgets.Button(icon="step-forward", button_style="primary")
        self.reset_button = widgets.Button(icon="undo")
        self.summary = widgets.HTML()
        self.chart = TimelineFigure(title_key="pipe.title.ideal", x_key="pipe.axis.slots")
        self.widget = widgets.VBox(
            [
                widgets.HBox([self.stages, self.micro_batches, self.virtual_stages]),
                widgets.HBox([self.schedule, self.step_button, self.reset_button]),
                self.chart.widget,
                self.summary,
            ]
        )
        self.redraw()
        self.start()

    # -- state
    @property
    def v(self) -> int:
        """Chunks per rank: the slider's under the interleaved schedule, else 1."""
        return self.virtual_stages.value if self.schedule.value == "interleaved" else 1

    def redraw(self) -> None:
        """Simulate the chosen schedule and show all of it; a choice it cannot run is said, in the summary."""
        self.virtual_stages.disabled = self.schedule.value != "interleaved"
        try:
            self.actions = make_schedule(self.schedule.value, self.stages.value, self.micro_batches.value, self.v)
        except ConfigError as error:  # interleaving needs p >= 2 and m a multiple of p
            self.problem = error
            self._summarize()
            return
        self.problem = None
        self.simulation = simulate(self.actions, f_time=self.f_time, b_time=self.b_time)
        self.now = self.simulation.makespan
        self._draw()

    def step(self) -> None:
        """Advance one time slot (from an empty picture after a reset)."""
        self.now = min(self.now + self.f_time, self.simulation.makespan)
        self._draw()

    def reset(self) -> None:
        """Back to time 0: nothing has run yet."""
        self.now = 0
        self._draw()

    def in_flight_now(self) -> list[int]:
        return in_flight_at(self.simulation.timeline, self.now)

    # -- drawing
    def _draw(self) -> None:
        p, m = self.stages.value, self.micro_batches.value
        name = SCHEDULE_NAMES[self.schedule.value] + (f", v={self.v}" if self.v > 1 else "")
        self.chart.draw(self.simulation.timeline, stages=p, upto=self.now, schedule=name, p=p, m=m)
        self._summarize()

    def _summarize(self) -> None:
        if self.problem is not None:
            self.summary.value = html.escape(self.problem.message())
            return
        p, m, v = self.stages.value, self.micro_batches.value, self.v
        bubble = ideal_bubble_fraction(p, m, v)
        lines = [
            t(
                "pipe.bubble" if v == 1 else "pipe.bubble.interleaved",
                idle=p - 1,
                total=v * m + p - 1,
                pct=100 * float(bubble),
                sim=100 * self.simulation.bubble_fraction,
            ),
            t("pipe.in_flight", peaks=max_in_flight(self.actions)),
            t("pipe.now", now=f"{self.now:g}", total=f"{self.simulation.makespan:g}", held=self.in_flight_now()),
        ]
        self.summary.value = "<br>".join(lines)

    def refresh(self, lang: str) -> None:
        self._summarize()  # the chart relabels itself


class TimelineComparison(View):
    """A measured pipeline step beside the ideal schedule it ran.

    ``measured`` is a list per rank of the runtime's timeline dicts (seconds);
    it is drawn in milliseconds, a row per rank (interleaved: ``virtual_stages`` chunks each). The ideal side uses ``b_time = 2`` forwards
    per backward, the usual ratio, so the two pictures can be compared by eye.
    """

    def __init__(self, measured, *, schedule: str, micro_batches: int, b_time: float = 2, virtual_stages: int = 1):
        stages = len(measured)
        name = SCHEDULE_NAMES[schedule] + (f", v={virtual_stages}" if schedule == "interleaved" else "")
        sim = simulate(make_schedule(schedule, stages, micro_batches, virtual_stages), f_time=1, b_time=b_time)
        self.ideal = TimelineFigure(title_key="pipe.title.ideal", x_key="pipe.axis.slots", width=520)
        self.measured = TimelineFigure(title_key="pipe.title.measured", x_key="pipe.axis.ms", width=520)
        self.ideal.draw(sim.timeline, stages=stages, schedule=name, p=stages, m=micro_batches)
        self.measured.draw(measured, stages=stages, scale=1e3, schedule=name, p=stages, m=micro_batches)
        self.widget = fitting_grid([self.ideal.figure, self.measured.figure])  # each relabels itself
