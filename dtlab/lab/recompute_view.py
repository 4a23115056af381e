"""Activation recomputation, phase by phase: the bytes held for backward through one step.

:class:`RecomputeView` measures one forward and backward of the small GPT at
the depth its slider chooses, twice: keeping every activation, and with every
block recomputed (:func:`dtlab.numerics.gradient_checkpointing.apply_recompute`; Chen et al., 2016).
The measurements come from :func:`dtlab.course.experiments.checkpointing.activation_trace`
(the :class:`dtlab.measure.memory.ActivationMeter` read at each block boundary). The
**Step** button reveals one phase at a time: F0, F1, ... the forward through
the blocks, then the loss, then the backward from the last block to the first.
A line is what is held at that moment; a bar above it is the most held since
the previous phase (a recomputed block's intermediates live only there).
"""

from __future__ import annotations

import dataclasses

import ipywidgets as widgets
import plotly.graph_objects as go

from dtlab.config import MODEL_PRESETS
from dtlab.course.experiments.checkpointing import activation_trace
from dtlab.i18n import get_language, register, t
from dtlab.lab.checks import human_bytes
from dtlab.lab.fit import FigureWidget, fitted, responsive, row, set_title
from dtlab.lab.view import FigureLabels, View

register(
    {
        "recompute.title": (
            "Activations held for backward during one step ({layers} blocks)",
            "一步训练中为反向传播保存的激活值（{layers} 个 block）",
        ),
        "recompute.axis.phase": ("phase of the step (F = forward, B = backward)", "这一步的阶段（F = 前向，B = 反向）"),
        "recompute.axis.bytes": ("bytes", "字节"),
        "recompute.plain": ("keep everything: held", "全部保存：当前持有"),
        "recompute.plain_peak": ("keep everything: peak since previous phase", "全部保存：自上一阶段以来的峰值"),
        "recompute.recompute": ("recompute: held", "重计算：当前持有"),
        "recompute.recompute_peak": ("recompute: peak since previous phase", "重计算：自上一阶段以来的峰值"),
        "recompute.ctl.layers": ("blocks (depth)", "block 数（深度）"),
        "recompute.summary": (
            "{layers} blocks: peak {plain} keeping everything, {recompute} with recompute (saves {saved}, {pct:.0f}%)",
            "{layers} 个 block：全部保存时峰值 {plain}，重计算时 {recompute}（省下 {saved}，{pct:.0f}%）",
        ),
        "recompute.now": (
            "phase {phase} ({index} of {total}): held {plain} vs {recompute}",
            "阶段 {phase}（第 {index} / {total} 个）：当前持有 {plain} 对比 {recompute}",
        ),
    }
)

COLORS = {"plain": "#4C78A8", "recompute": "#F58518"}


class RecomputeView(View):
    """A depth slider, the two measured traces, and Step / Reset.

    ``step()``, ``reset()`` and ``measure()`` are what the controls call;
    ``traces`` holds the two measurements (``"plain"`` and ``"recompute"``).
    """

    labels = {"layers": "recompute.ctl.layers", "step_button": "ctl.step", "reset_button": "ctl.reset"}
    figures = {
        "figure": FigureLabels(
            "recompute.title",
            "recompute.axis.phase",
            "recompute.axis.bytes",
            ("recompute.plain_peak", "recompute.recompute_peak", "recompute.plain", "recompute.recompute"),
        )
    }
    clicks = {"step_button": "step", "reset_button": "reset"}
    changes = {"layers": "measure"}

    def __init__(self, *, layers: int = 4, model: str = "small", batch_size: int = 8, seed: int = 0):
        self.model, self.batch_size, self.seed = model, batch_size, seed
        self.layers = widgets.IntSlider(value=layers, min=1, max=8)
        self.step_button = widgets.Button(icon="step-forward", button_style="primary")
        self.reset_button = widgets.Button(icon="undo")
        self.summary = widgets.HTML()
        self.figure = responsive(
            FigureWidget(
                layout=go.Layout(
                    height=320,
                    margin=dict(l=70, r=10, t=50, b=40),
                    barmode="group",
                    legend=dict(orientation="h", y=-0.3),
                )
            )
        )
        for kind in ("plain", "recompute"):
            self.figure.add_bar(x=[], y=[], marker_color=COLORS[kind], opacity=0.35)
        for kind in ("plain", "recompute"):
            self.figure.add_scatter(x=[], y=[], mode="lines+markers", line=dict(color=COLORS[kind], width=3))
        self.widget = widgets.VBox(
            [row([self.layers, self.step_button, self.reset_button]), fitted(self.figure), self.summary]
        )
        self.measure()
        self.start()

    # -- state
    def measure(self) -> None:
        """Measure both ways at the slider's depth; show the whole step."""
        cfg = dataclasses.replace(MODEL_PRESETS[self.model], n_layer=self.layers.value)
        self.traces = {
            kind: activation_trace(cfg, recompute=kind == "recompute", batch_size=self.batch_size, seed=self.seed)
            for kind in ("plain", "recompute")
        }
        self.phases = [p["phase"] for p in self.traces["plain"]["phases"]]
        self.shown = len(self.phases)
        self._draw()

    def step(self) -> None:
        """Reveal the next phase (from an empty picture after a reset)."""
        self.shown = min(self.shown + 1, len(self.phases))
        self._draw()

    def reset(self) -> None:
        self.shown = 0
        self._draw()

    def held_now(self) -> dict[str, int]:
        """Bytes held at the last phase shown, per way (0 before the first)."""
        if self.shown == 0:
            return {kind: 0 for kind in self.traces}
        return {kind: trace["phases"][self.shown - 1]["held"] for kind, trace in self.traces.items()}

    # -- drawing
    def label_args(self) -> dict:
        return {"layers": self.layers.value}

    def _draw(self, lang: str | None = None) -> None:
        lang = lang or get_language()
        x = self.phases[: self.shown]
        with self.figure.batch_update():
            for i, kind in enumerate(("plain", "recompute")):
                phases = self.traces[kind]["phases"][: self.shown]
                self.figure.data[i].x, self.figure.data[i].y = x, [p["peak"] for p in phases]
                self.figure.data[2 + i].x, self.figure.data[2 + i].y = x, [p["held"] for p in phases]
            self.figure.layout.xaxis.categoryorder = "array"
            self.figure.layout.xaxis.categoryarray = self.phases
            self.figure.layout.xaxis.range = [-0.5, len(self.phases) - 0.5]
            self.figure.layout.yaxis.range = [0, 1.05 * self.traces["plain"]["peak"]]
            set_title(self.figure, t("recompute.title", lang, layers=self.layers.value))
        self._summarize(lang)

    def _summarize(self, lang: str | None = None) -> None:
        plain, rc = self.traces["plain"]["peak"], self.traces["recompute"]["peak"]
        lines = [
            t(
                "recompute.summary",
                lang,
                layers=self.layers.value,
                plain=human_bytes(plain),
                recompute=human_bytes(rc),
                saved=human_bytes(plain - rc),
                pct=100 * (plain - rc) / plain,
            )
        ]
        if 0 < self.shown:
            held = self.held_now()
            lines.append(
                t(
                    "recompute.now",
                    lang,
                    phase=self.phases[self.shown - 1],
                    index=self.shown,
                    total=len(self.phases),
                    plain=human_bytes(held["plain"]),
                    recompute=human_bytes(held["recompute"]),
                )
            )
        self.summary.value = "<br>".join(lines)

    def refresh(self, lang: str) -> None:
        self._summarize(lang)
