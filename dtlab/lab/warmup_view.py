"""Learning-rate warmup: the schedule step by step, and real runs with and without it.

:class:`WarmupView` draws :func:`dtlab.numerics.lr_schedule.lr_at` for the chosen peak
learning rate, with the chosen warmup and with none, and a **Step** button that
walks along the schedule one optimizer step at a time. Its **Run** button
trains the small GPT twice at that peak, without warmup and with it (Goyal et
al., 2017, Sec. 2.2: ramp the rate up linearly over the first steps), and
draws both loss curves live on a :class:`dtlab.lab.Dashboard`.
"""

from __future__ import annotations

import dataclasses

import ipywidgets as widgets
import plotly.graph_objects as go

from dtlab.config import TrainConfig
from dtlab.i18n import register, t
from dtlab.lab.fit import FigureWidget, fitted, responsive
from dtlab.lab.view import FigureLabels, View
from dtlab.numerics.lr_schedule import lr_at

register(
    {
        "warmup.title": (
            "Learning rate per step: linear warmup, then cosine decay",
            "每一步的学习率：先线性预热，再余弦衰减",
        ),
        "warmup.axis.step": ("optimizer step", "优化器步"),
        "warmup.axis.lr": ("learning rate", "学习率"),
        "warmup.trace.with": ("warmup {warmup} steps", "预热 {warmup} 步"),
        "warmup.trace.without": ("no warmup", "无预热"),
        "warmup.trace.now": ("this step", "当前这一步"),
        "warmup.ctl.lr": ("peak learning rate", "峰值学习率"),
        "warmup.ctl.warmup": ("warmup steps W", "预热步数 W"),
        "warmup.ctl.run": ("Train both", "两种都训练一次"),
        "warmup.now.warming": (
            "step {step}: lr = peak x ({step} + 1) / W = {lr:.3g} x {num}/{W} = {value:.4g} (no warmup: {plain:.4g})",
            "第 {step} 步：lr = 峰值 x ({step} + 1) / W = {lr:.3g} x {num}/{W} = {value:.4g}（无预热：{plain:.4g}）",
        ),
        "warmup.now.decay": (
            "step {step}: warmup is over, cosine decay: lr = {value:.4g} (no warmup: {plain:.4g})",
            "第 {step} 步：预热已结束，余弦衰减：lr = {value:.4g}（无预热：{plain:.4g}）",
        ),
        "warmup.run.label": ("lr {lr:.2g}, warmup {warmup}", "lr {lr:.2g}，预热 {warmup}"),
        "warmup.running": (
            "training: lr {lr:.2g}, without warmup, then with {warmup} warmup steps…",
            "正在训练：lr {lr:.2g}，先不预热，再预热 {warmup} 步……",
        ),
        "warmup.done": (
            "final loss without warmup {without:.3f}, with warmup {with_:.3f}",
            "最终损失：无预热 {without:.3f}，有预热 {with_:.3f}",
        ),
    }
)


class WarmupView(View):
    """Sliders for the peak learning rate and the warmup; the schedule, a Step button, and Run.

    ``step()``, ``reset()`` and ``compare()`` are what the buttons call, so a
    notebook can drive it from code; ``now`` is the step shown and
    ``lr_now()`` its learning rate.
    """

    labels = {
        "lr": "warmup.ctl.lr",
        "warmup": "warmup.ctl.warmup",
        "step_button": "ctl.step",
        "reset_button": "ctl.reset",
        "run_button": "warmup.ctl.run",
    }
    figures = {
        "figure": FigureLabels(
            "warmup.title",
            "warmup.axis.step",
            "warmup.axis.lr",
            ("warmup.trace.with", "warmup.trace.without", "warmup.trace.now"),
        )
    }
    clicks = {"step_button": "step", "reset_button": "reset", "run_button": "compare_in_background"}
    changes = {"lr": "_draw", "warmup": "_draw"}

    def __init__(self, config: TrainConfig | None = None, *, dashboard=None):
        self.base = config or TrainConfig(lr=0.3, warmup=10, steps=40)
        self.dashboard = dashboard
        self.lr = widgets.FloatLogSlider(value=self.base.lr, base=10, min=-4, max=0, readout_format=".1e")
        self.warmup = widgets.IntSlider(value=max(self.base.warmup, 1), min=1, max=self.base.steps)
        self.step_button = widgets.Button(icon="step-forward", button_style="primary")
        self.reset_button = widgets.Button(icon="undo")
        self.run_button = widgets.Button(icon="play")
        self.summary = widgets.HTML()
        self.status = widgets.HTML()
        self.figure = responsive(
            FigureWidget(
                layout=go.Layout(height=300, margin=dict(l=70, r=10, t=50, b=40), legend=dict(orientation="h", y=-0.25))
            )
        )
        self.figure.add_scatter(x=[], y=[], mode="lines+markers", marker=dict(size=4), line=dict(color="#4C78A8"))
        self.figure.add_scatter(x=[], y=[], mode="lines", line=dict(color="#BAB0AC", dash="dash"))
        self.figure.add_scatter(x=[], y=[], mode="markers", marker=dict(size=12, color="#E45756"))
        self.widget = widgets.VBox(
            [
                widgets.HBox([self.lr, self.warmup]),
                widgets.HBox([self.step_button, self.reset_button, self.run_button]),
                fitted(self.figure),
                self.summary,
                self.status,
            ]
        )
        self.now = 0
        self.start()
        self._draw()

    # -- the schedule
    def schedule(self, warmup: int | None = None) -> list[float]:
        """``lr_at`` for every step of the run, with ``warmup`` (default: the slider's)."""
        w = self.warmup.value if warmup is None else warmup
        return [lr_at(s, lr=self.lr.value, warmup=w, total_steps=self.base.steps) for s in range(self.base.steps)]

    def lr_now(self) -> float:
        self.now = min(self.now, self.base.steps - 1)  # ``base`` may have been replaced by a shorter run
        return self.schedule()[self.now]

    def step(self) -> None:
        """Show the next optimizer step's learning rate."""
        self.now = min(self.now + 1, self.base.steps - 1)
        self._draw()

    def reset(self) -> None:
        self.now = 0
        self._draw()

    # -- real runs
    def configs(self) -> tuple[TrainConfig, TrainConfig]:
        """The two runs **Run** trains: the slider's peak without warmup, and with it."""
        without = dataclasses.replace(self.base, lr=self.lr.value, warmup=0)
        return without, dataclasses.replace(without, warmup=self.warmup.value)

    def compare(self):
        """Train both configurations one after the other, drawn live; returns the two runs."""
        import dtlab.train
        from dtlab.lab.dashboard import Dashboard

        if self.dashboard is None:
            self.dashboard = Dashboard()
            self.widget.children = (*self.widget.children, self.dashboard.widget)
        runs = []
        for config in self.configs():
            label = t("warmup.run.label", lr=config.lr, warmup=config.warmup)
            runs.append(self.dashboard.watch(dtlab.train(config), label=label))
        return tuple(runs)

    def compare_in_background(self) -> None:
        """What **Run** does: :meth:`compare` on the view's worker thread, reported in the status line."""
        self.submit_request("compare")

    def handle(self, request) -> None:
        without, with_ = self.configs()
        self.set_status("warmup.running", lr=without.lr, warmup=with_.warmup)
        a, b = self.compare()
        self.set_status("warmup.done", without=a.losses()[-1], with_=b.losses()[-1])

    # -- drawing
    def label_args(self) -> dict:
        return {"warmup": self.warmup.value}

    def _draw(self) -> None:
        steps = list(range(self.base.steps))
        with_, without = self.schedule(), self.schedule(0)
        with self.figure.batch_update():
            self.figure.data[0].x, self.figure.data[0].y = steps, with_
            self.figure.data[1].x, self.figure.data[1].y = steps, without
            self.figure.data[2].x, self.figure.data[2].y = [self.now], [with_[self.now]]
        self.relabel()  # the first trace's name carries the warmup

    def _summarize(self, lang: str | None = None) -> None:
        s, w = self.now, self.warmup.value
        if s < w:
            self.summary.value = t(
                "warmup.now.warming",
                lang,
                step=s,
                lr=self.lr.value,
                num=s + 1,
                W=w,
                value=self.lr_now(),
                plain=self.schedule(0)[s],
            )
        else:
            self.summary.value = t("warmup.now.decay", lang, step=s, value=self.lr_now(), plain=self.schedule(0)[s])

    def refresh(self, lang: str) -> None:
        self._summarize(lang)
