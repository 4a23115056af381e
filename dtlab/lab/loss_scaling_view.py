"""Dynamic loss scaling, one step at a time (Micikevicius et al., 2017, Sec. 3.2).

:class:`LossScalerStepper` drives a real :class:`dtlab.numerics.loss_scaling.LossScaler`
with a scripted list of gradients, one optimizer step per press of **Step**.
Each step does what a fp16 training step does to its gradients:

    scaled = gradient x S, stored in fp16     (what backward of S x loss produces)
    found_inf = scaler.unscale_and_check(...)  (divide by S in fp32; any inf or NaN?)
    scaler.update(found_inf)                   (overflow: skip, S <- S / 2;
                                                growth_interval clean steps: S <- 2 S)

:class:`LossScaleFigure` draws the scale per step, taken steps as dots and
skipped ones as crosses; it draws the stepper's history and the
``loss_scale`` / ``skipped`` fields of a real fp16 run's records alike.
"""

from __future__ import annotations

import math

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from dtlab.i18n import register, t
from dtlab.lab.fit import FigureWidget, fitted, responsive, row
from dtlab.lab.view import FigureLabels, View
from dtlab.numerics.loss_scaling import LossScaler

register(
    {
        "loss_scaling.title.script": (
            "Loss scaling, step by step (scripted gradients)",
            "损失缩放，一步一步来（脚本给定的梯度）",
        ),
        "loss_scaling.title.run": ("Loss scale of a real fp16 run", "一次真实 fp16 训练的损失缩放系数"),
        "loss_scaling.axis.step": ("step", "步"),
        "loss_scaling.axis.scale": ("loss scale S (log scale)", "损失缩放系数 S（对数坐标）"),
        "loss_scaling.taken": ("step taken", "正常更新"),
        "loss_scaling.skipped": ("skipped (overflow)", "跳过（上溢）"),
        "loss_scaling.start": (
            "Before step 0: S = {scale:g}. Press Step to feed the first gradient.",
            "第 0 步之前：S = {scale:g}。按“前进一步”送入第一个梯度。",
        ),
        "loss_scaling.row": (
            "step {step}, S = {scale:g}: the largest gradient, {grad:g}, is {stored} "
            "in fp16 once multiplied by S; {verdict}; next S = {next:g}",
            "第 {step} 步，S = {scale:g}：最大的梯度 {grad:g} 乘以 S 后在 fp16 中是 {stored}；"
            "{verdict}；下一步 S = {next:g}",
        ),
        "loss_scaling.ok": ("finite, the optimizer steps", "有限值，优化器正常更新"),
        "loss_scaling.overflow": ("overflow, the step is skipped and S halves", "上溢，跳过这一步，S 减半"),
        "loss_scaling.done": (
            "The script is over: {skipped} of {steps} steps skipped; S = {scale:g}.",
            "脚本结束：{steps} 步中跳过了 {skipped} 步；S = {scale:g}。",
        ),
    }
)


class LossScaleFigure(View):
    """The loss scale per step; a dot for a step taken, a cross for a skipped one."""

    def __init__(self, *, title_key: str = "loss_scaling.title.run", width: int = 620):
        self.figures = {
            "figure": FigureLabels(
                title_key,
                "loss_scaling.axis.step",
                "loss_scaling.axis.scale",
                ("loss_scaling.taken", "loss_scaling.skipped"),
            )
        }
        self.figure = responsive(
            FigureWidget(
                layout=go.Layout(
                    height=300,
                    margin=dict(l=70, r=10, t=50, b=40),
                    legend=dict(orientation="h", y=-0.25),
                    yaxis=dict(type="log"),
                    xaxis=dict(zeroline=False),
                )
            )
        )
        self.widget = fitted(self.figure)  # the figure in a box that fits its output area
        self.figure.add_scatter(
            x=[],
            y=[],
            mode="lines+markers",
            marker=dict(size=8, color="#4C78A8"),
            line=dict(shape="hv", color="#4C78A8"),
        )
        self.figure.add_scatter(x=[], y=[], mode="markers", marker=dict(size=12, symbol="x", color="#E45756"))
        self.start()

    def draw(self, steps, scales, skipped) -> None:
        """``steps``, the scale each step used, and whether it was skipped (three equal-length lists)."""
        with self.figure.batch_update():
            self.figure.data[0].x, self.figure.data[0].y = list(steps), list(scales)
            bad = [(s, v) for s, v, k in zip(steps, scales, skipped) if k]
            self.figure.data[1].x = [s for s, _ in bad]
            self.figure.data[1].y = [v for _, v in bad]
            powers = sorted({round(math.log2(v)) for v in scales if v > 0})
            if powers:  # one tick per power of two: 2^k
                ticks = range(powers[0] - 1, powers[-1] + 2)
                self.figure.layout.yaxis.tickvals = [2.0**k for k in ticks]
                self.figure.layout.yaxis.ticktext = [f"2^{k}" for k in ticks]

    def draw_records(self, records) -> None:
        """A training run's records (fp16: ``loss_scale`` is a number in each)."""
        rows = [r for r in records if r.get("loss_scale") is not None]
        self.draw([r["step"] for r in rows], [r["loss_scale"] for r in rows], [r["skipped"] for r in rows])


class LossScalerStepper(View):
    """A :class:`LossScaler` fed one scripted gradient per **Step**.

    ``gradients`` lists, per step, the gradient values (a number or a list of
    numbers, true scale, before any loss scaling). ``step()`` and ``reset()``
    are what the buttons call; ``rows`` holds what each step did.
    """

    labels = {"step_button": "ctl.step", "reset_button": "ctl.reset"}
    clicks = {"step_button": "step", "reset_button": "reset"}

    def __init__(self, gradients, *, init_scale: float = 2.0**16, growth_interval: int = 4):
        self.gradients = [torch.as_tensor(g, dtype=torch.float64).reshape(-1) for g in gradients]
        self.init_scale, self.growth_interval = init_scale, growth_interval
        self.step_button = widgets.Button(icon="step-forward", button_style="primary")
        self.reset_button = widgets.Button(icon="undo")
        self.summary = widgets.HTML()
        self.chart = LossScaleFigure(title_key="loss_scaling.title.script")
        self.chart.figure.layout.xaxis.range = [-0.5, len(self.gradients) - 0.5]
        self.widget = widgets.VBox([row([self.step_button, self.reset_button]), self.chart.widget, self.summary])
        self.reset()
        self.start()

    # -- state
    def reset(self) -> None:
        """A fresh scaler at ``init_scale``; nothing fed yet."""
        self.scaler = LossScaler(self.init_scale, growth_interval=self.growth_interval)
        self.rows: list[dict] = []
        self._draw()

    def step(self) -> dict | None:
        """Feed the next gradient through scale -> fp16 -> unscale and check -> update."""
        k = len(self.rows)
        if k >= len(self.gradients):
            return None
        true = self.gradients[k]
        scale = self.scaler.loss_scale
        stored = (true * scale).to(torch.float16)  # what backward leaves in fp16
        grads = stored.float()  # the fp32 gradient the scaler checks
        found_inf = self.scaler.unscale_and_check([grads])
        self.scaler.update(found_inf)
        largest = stored.float().abs().max().item()
        row = {
            "step": k,
            "largest": true.abs().max().item(),
            "scale": scale,
            "stored": largest,
            "skipped": found_inf,
            "next_scale": self.scaler.loss_scale,
        }
        self.rows.append(row)
        self._draw()
        return row

    @property
    def finished(self) -> bool:
        return len(self.rows) == len(self.gradients)

    # -- drawing
    def _draw(self) -> None:
        self.chart.draw(
            [r["step"] for r in self.rows], [r["scale"] for r in self.rows], [r["skipped"] for r in self.rows]
        )
        self._summarize()

    def _summarize(self) -> None:
        if not self.rows:
            self.summary.value = t("loss_scaling.start", scale=self.scaler.loss_scale)
            return
        lines = [self.row_text(r) for r in self.rows[-3:]]
        if self.finished:
            lines.append(
                "<b>"
                + t(
                    "loss_scaling.done",
                    skipped=sum(r["skipped"] for r in self.rows),
                    steps=len(self.rows),
                    scale=self.scaler.loss_scale,
                )
                + "</b>"
            )
        self.summary.value = "<br>".join(lines)

    @staticmethod
    def row_text(r: dict, lang: str | None = None) -> str:
        stored = "inf" if r["stored"] == float("inf") else f"{r['stored']:g}"
        verdict = t("loss_scaling.overflow" if r["skipped"] else "loss_scaling.ok", lang)
        return t(
            "loss_scaling.row",
            lang,
            step=r["step"],
            grad=r["largest"],
            scale=r["scale"],
            stored=stored,
            verdict=verdict,
            next=r["next_scale"],
        )

    def refresh(self, lang: str) -> None:
        self._summarize()
