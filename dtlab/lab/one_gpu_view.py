"""Lesson 13's two figures: what each step of the steps table gained, and the attention's memory against T.

* :class:`StepGainsFigure`: one bar per step (sdpa, fused AdamW, compile, a
  larger batch), its tokens/s over the row before it, for the GPU table (its
  device and date in the legend) beside this machine's.
* :class:`AttentionMemoryFigure`: the small GPT's activation bytes against the
  sequence length, eager attention beside sdpa, on log-log axes, where T²
  is a line twice as steep as T.

Both draw numbers they are given (:mod:`dtlab.course.experiments.one_gpu`,
:mod:`dtlab.course.experiments.attention_memory`); titles, axes and legends
follow :func:`dtlab.set_language`.
"""

from __future__ import annotations

import plotly.graph_objects as go

from dtlab.i18n import register
from dtlab.lab.fit import FigureWidget, fitted, responsive
from dtlab.lab.view import FigureLabels, View

register(
    {
        "onegpu.gains.title": ("What each step gained over the row before it", "每一步相对上一行的提升"),
        "onegpu.gains.x": ("step", "步骤"),
        "onegpu.gains.y": ("tokens/s, x the row before", "tokens/s，相对上一行的倍数"),
        "onegpu.gains.gpu": ("{gpu}, {date} (~100M GPT)", "{gpu}，{date}（约 1 亿参数 GPT）"),
        "onegpu.gains.here": ("this machine: {here}", "本机：{here}"),
        "onegpu.mem.title": (
            "Activations of the small GPT against sequence length (batch {batch})",
            "小 GPT 的激活值随序列长度的变化（批大小 {batch}）",
        ),
        "onegpu.mem.x": ("sequence length T (tokens)", "序列长度 T（token）"),
        "onegpu.mem.y": ("activation bytes (MiB)", "激活值（MiB）"),
        "onegpu.mem.eager": ("eager: the T x T scores kept", "eager：保存 T x T 分数"),
        "onegpu.mem.sdpa": ("sdpa: no T x T tensor kept", "sdpa：不保存 T x T 张量"),
    }
)

GAIN_STEPS = ("sdpa", "fused", "compile", "batch")


class StepGainsFigure(View):
    """Bars of :func:`dtlab.course.experiments.one_gpu.gains` for the GPU table and this machine's."""

    figures = {
        "figure": FigureLabels(
            "onegpu.gains.title", "onegpu.gains.x", "onegpu.gains.y", ("onegpu.gains.gpu", "onegpu.gains.here")
        )
    }

    def __init__(self, gpu: dict[str, float], here: dict[str, float], *, gpu_name: str, date: str, here_name: str):
        self.names = {"gpu": gpu_name, "date": date, "here": here_name}
        self.figure = responsive(
            FigureWidget(layout=go.Layout(height=340, barmode="group", margin=dict(l=60, r=10, t=50, b=60)))
        )
        self.widget = fitted(self.figure)  # the figure in a box that fits its output area
        for gains, color in ((gpu, "#4C78A8"), (here, "#BAB0AC")):
            self.figure.add_bar(
                x=list(GAIN_STEPS),
                y=[gains.get(step) for step in GAIN_STEPS],
                marker_color=color,
                text=[f"x{gains[step]:.2f}" if step in gains else "" for step in GAIN_STEPS],
            )
        self.figure.add_hline(y=1.0, line_dash="dot", line_color="#888888")
        self.start()

    def label_args(self) -> dict:
        return self.names


class AttentionMemoryFigure(View):
    """Activation MiB against T, one line per attention kernel (``{kernel: {T: bytes}}``), log-log."""

    figures = {
        "figure": FigureLabels(
            "onegpu.mem.title", "onegpu.mem.x", "onegpu.mem.y", ("onegpu.mem.eager", "onegpu.mem.sdpa")
        )
    }

    def __init__(self, by_kernel: dict[str, dict[int, int]], *, batch: int):
        self.batch = batch
        self.figure = responsive(
            FigureWidget(
                layout=go.Layout(
                    height=340,
                    margin=dict(l=60, r=10, t=50, b=60),
                    xaxis=dict(type="log", dtick=0.30103),
                    yaxis=dict(type="log"),
                )
            )
        )
        self.widget = fitted(self.figure)  # the figure in a box that fits its output area
        for kernel, color in (("eager", "#E45756"), ("sdpa", "#4C78A8")):
            points = by_kernel[kernel]
            self.figure.add_scatter(
                x=list(points), y=[b / 2**20 for b in points.values()], mode="lines+markers", line_color=color
            )
        self.start()

    def label_args(self) -> dict:
        return {"batch": self.batch}
