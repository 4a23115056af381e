"""One training step, rank by rank, along time: what the tracer measured.

Each rank is a row. Its step window is cut into what the rank did
(:func:`dtlab.comm.tracer.span_segments`):

* **compute** — its compute regions, waits taken out;
* **blocked communication** — waiting in a collective or a receive (hover: which one);
* **idle** — the rest (loading the batch, assembling the record);
* **overlapped communication** — a thin bar above: communication in flight while
  the rank computed (data parallelism's buckets during backward), the time
  overlapping saves.

Time is milliseconds since the earliest rank began the step. The figure
follows a run live (:meth:`StepTimeline.watch`, :meth:`StepTimeline.follow`):
with the slider at the newest step it redraws as steps arrive; move it back
to look at an earlier one. The same data opens in Perfetto as a trace file
(``dtlab train --trace FILE``, :mod:`dtlab.measure.chrome_trace`).
"""

from __future__ import annotations

import threading

import ipywidgets as widgets
import plotly.graph_objects as go

from dtlab.comm.tracer import span_segments
from dtlab.i18n import register, t
from dtlab.lab.fit import FigureWidget, fitted, responsive, row, set_title
from dtlab.lab.view import FigureLabels, View

register(
    {
        "tl.title": ("Step {step}, rank by rank (measured by the tracer)", "第 {step} 步，逐个 rank（由追踪器实测）"),
        "tl.title.empty": ("Step timeline (waiting for a step)", "单步时间线（等待第一步）"),
        "tl.axis": ("milliseconds since the step began", "自本步开始的毫秒数"),
        "tl.compute": ("compute", "计算"),
        "tl.blocked": ("blocked in communication", "阻塞于通信"),
        "tl.idle": ("idle", "空闲"),
        "tl.overlap": ("communication overlapped with compute", "与计算重叠的通信"),
        "tl.step": ("step", "步"),
        "tl.summary": (
            "rank {rank}: compute {compute:.1f} ms, blocked {comm:.1f} ms, overlapped {overlap:.1f} ms, "
            "idle {idle:.1f} ms; most waited on: {top}",
            "rank {rank}：计算 {compute:.1f} 毫秒，阻塞 {comm:.1f} 毫秒，重叠 {overlap:.1f} 毫秒，"
            "空闲 {idle:.1f} 毫秒；等待最久的通信：{top}",
        ),
        "tl.none": ("none", "无"),
    }
)

CATEGORIES = (
    ("compute", "tl.compute", "#4C78A8"),
    ("blocked", "tl.blocked", "#E45756"),
    ("idle", "tl.idle", "#D8D8D8"),
    ("overlap", "tl.overlap", "#F58518"),
)


def step_bars(record: dict) -> dict[str, dict]:
    """Per category, the bars of one step record: ``{"y": rows, "base": starts, "x": lengths, "text": hovers}``.

    Times in milliseconds since the earliest rank's window began. Blocked time
    is drawn per call (the hover names it); the other categories per segment.
    """
    ranks = sorted(record["ranks"], key=lambda r: r["rank"])
    origin = min(r["spans"]["window"][0] for r in ranks)
    bars = {key: {"y": [], "base": [], "x": [], "text": []} for key, _, _ in CATEGORIES}

    def add(key: str, row: str, a: float, b: float, text: str = "") -> None:
        bars[key]["y"].append(row)
        bars[key]["base"].append((a - origin) * 1e3)
        bars[key]["x"].append((b - a) * 1e3)
        bars[key]["text"].append(text)

    for rank in ranks:
        row, cut = f"rank {rank['rank']}", span_segments(rank["spans"])
        for key in ("compute", "idle", "overlap"):
            for a, b in cut[key]:
                add(key, row, a, b)
        for call in rank["spans"]["comm"]:
            if call["end"] > call["wait"]:
                add("blocked", row, call["wait"], call["end"], f"{call['kind']} ({call['group']}, {call['bytes']} B)")
    return bars


def _top_kind(rank: dict, lang: str) -> str:
    comm = {k: v for k, v in rank.get("comm", {}).items() if v.get("seconds", 0) > 0}
    if not comm:
        return t("tl.none", lang)
    kind = max(comm, key=lambda k: comm[k]["seconds"])
    return f"{kind} x{comm[kind]['count']} ({comm[kind]['seconds'] * 1e3:.1f} ms)"


class StepTimeline(View):
    """A step of a run, per rank, as spans; a slider picks the step (at its end: the newest, live).

    ``StepTimeline(run.records)`` shows the steps of a finished run;
    ``StepTimeline().watch(dtlab.train(config))`` draws a run as it streams
    (``follow`` does it in a background thread).
    """

    labels = {"slider": "tl.step"}
    changes = {"slider": "draw_selected"}

    def __init__(self, records=(), *, step: int | None = None, width: int = 760):
        self.records: list[dict] = []
        self.step: int | None = None
        self.figure = responsive(
            FigureWidget(
                layout=go.Layout(
                    height=200,
                    barmode="overlay",
                    margin=dict(l=70, r=10, t=50, b=40),
                    legend=dict(orientation="h", y=-0.25),
                    yaxis=dict(autorange="reversed"),
                )
            )
        )
        for key, _, color in CATEGORIES:
            thin = key == "overlap"
            self.figure.add_bar(
                x=[],
                y=[],
                base=[],
                orientation="h",
                marker_color=color,
                width=0.18 if thin else 0.55,
                offset=-0.5 if thin else -0.275,
                hoverinfo="text+x" if key == "blocked" else "x",
            )
        self.figures = {"figure": FigureLabels(None, "tl.axis", None, tuple(k for _, k, _ in CATEGORIES))}
        self.slider = widgets.IntSlider(min=0, max=0, value=0, continuous_update=False)
        self.summary = widgets.HTML()
        self._lock = threading.Lock()
        self.widget = widgets.VBox([row([self.slider]), fitted(self.figure), self.summary])
        self.start()
        for record in records:
            self.push(record)
        if step is not None:
            self.show(step)

    # -- data
    def push(self, record: dict) -> None:
        """Add a step record; if the slider was at the newest step, follow to this one."""
        if record.get("summary") or not all("spans" in r for r in record["ranks"]):
            return
        with self._lock:
            following = not self.records or self.slider.value == len(self.records) - 1
            self.records.append(record)
            self.slider.max = len(self.records) - 1
        if following:
            self.slider.value = len(self.records) - 1  # draws it (the slider's change handler)
            if len(self.records) == 1:
                self.draw(record)

    def watch(self, run):
        """Draw ``run``'s steps as they arrive until it ends; returns the run."""
        for record in run:
            self.push(record)
        return run

    def follow(self, run) -> threading.Thread:
        """Like :meth:`watch`, in a background thread, so the notebook stays free."""
        thread = threading.Thread(target=self.watch, args=(run,), daemon=True, name="dtlab-timeline")
        thread.start()
        return thread

    def show(self, step: int) -> None:
        """Draw the record of step ``step`` (the step number, as the records count them)."""
        index = next(i for i, r in enumerate(self.records) if r["step"] == step)
        self.slider.value = index
        self.draw(self.records[index])

    def draw_selected(self) -> None:
        if self.records:
            self.draw(self.records[self.slider.value])

    # -- drawing
    def draw(self, record: dict) -> None:
        bars = step_bars(record)
        rows = len(record["ranks"])
        height = 150 + 40 * rows
        if self.figure.layout.height != height:
            # plotly.js pins the width at its value of the moment when a height is set (autosize off, lesson
            # 09's timeline stayed 700 px wide in a 592 px cell); a width of null in the same relayout lets it
            # follow its cell again. Plotly's Python side sends no change for a width already None: sent here.
            self.figure.layout.height = height
            self.figure._send_relayout_msg({"height": height, "width": None})
        with self.figure.batch_update():
            for trace, (key, _, _) in zip(self.figure.data, CATEGORIES):
                trace.y, trace.base, trace.x = bars[key]["y"], bars[key]["base"], bars[key]["x"]
                trace.hovertext = bars[key]["text"]
        self.step, self._record = record["step"], record
        self.relabel()

    def label_args(self) -> dict:
        return {"step": self.step}

    def refresh(self, lang: str) -> None:
        set_title(self.figure, t("tl.title" if self.step is not None else "tl.title.empty", lang, step=self.step))
        if self.step is None:
            return
        lines = [
            t(
                "tl.summary",
                lang,
                rank=r["rank"],
                compute=r["compute_s"] * 1e3,
                comm=r["comm_s"] * 1e3,
                overlap=r["overlap_s"] * 1e3,
                idle=r["idle_s"] * 1e3,
                top=_top_kind(r, lang),
            )
            for r in sorted(self._record["ranks"], key=lambda r: r["rank"])
        ]
        self.summary.value = "<br>".join(lines)
