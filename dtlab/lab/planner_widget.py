"""Sliders over the planner: does a layout fit, how long is a step, what MFU?

A prediction from formulas (dtlab.planner), drawn as memory per GPU against
the GPU's capacity. Invalid layouts show the planner's bilingual error.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go

from dtlab.config.layout import PRECISIONS, RECOMPUTE
from dtlab.i18n import DtlabError, t
from dtlab.lab import labels as _labels  # noqa: F401
from dtlab.lab.dashboard import CATEGORY_LABELS, COLORS, MEMORY_CATEGORIES
from dtlab.lab.fit import FigureWidget, fitted, responsive
from dtlab.lab.view import FigureLabels, View
from dtlab.planner import ARCHITECTURES, GPUS, Layout, plan

# The planner predicts neither buffers nor workspace, and counts the fp32 master in the optimizer (the paper's K).
PLANNED = tuple(c for c in MEMORY_CATEGORIES if c not in ("buffers", "workspace", "master"))

POWERS_OF_TWO = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


class PlannerExplorer(View):
    """Pick a model, a GPU and a 3D layout; see the predicted memory, step time, MFU and bubble."""

    labels = {
        "model": "ctl.model",
        "gpu": "pl.gpu",
        "dp": "pl.dp",
        "tp": "pl.tp",
        "pp": "pl.pp",
        "micro_batches": "pl.m",
        "zero": "pl.zero",
        "precision": "pl.precision",
        "recompute": "pl.recompute",
        "batch_size": "ctl.batch",
    }
    figures = {
        "figure": FigureLabels("pl.title", y="pl.gb", traces=(*(CATEGORY_LABELS[c] for c in PLANNED), "pl.capacity"))
    }
    changes = dict.fromkeys(labels, "update")

    def __init__(
        self,
        *,
        model: str = "gpt3-175b",
        gpu: str = "H100",
        dp: int = 8,
        tp: int = 8,
        pp: int = 16,
        micro_batches: int = 96,
        zero: int = 1,
        precision: str = "bf16",
        recompute: str = "selective",
        batch_size: int = 1536,
        states: str = "dtlab",
    ):
        """The sliders start at the given layout; ``states`` counts model states as ``dtlab.plan`` does
        (``"dtlab"``: dtlab's trainer; ``"paper"``: the ZeRO paper's 16Ψ)."""
        self.states = states
        self.model = widgets.Dropdown(options=list(ARCHITECTURES), value=model)
        self.gpu = widgets.Dropdown(options=list(GPUS), value=gpu)
        self.dp = widgets.SelectionSlider(options=POWERS_OF_TWO, value=dp)
        self.tp = widgets.SelectionSlider(options=POWERS_OF_TWO[:5], value=tp)
        self.pp = widgets.SelectionSlider(options=POWERS_OF_TWO[:8], value=pp)
        self.micro_batches = widgets.IntSlider(value=micro_batches, min=1, max=256)
        self.zero = widgets.IntSlider(value=zero, min=0, max=3)
        self.precision = widgets.Dropdown(options=list(PRECISIONS), value=precision)
        self.recompute = widgets.Dropdown(options=list(RECOMPUTE), value=recompute)
        self.batch_size = widgets.IntText(value=batch_size)
        self.figure = responsive(
            FigureWidget(layout=go.Layout(height=320, barmode="stack", margin=dict(l=60, r=10, t=40, b=40)))
        )
        for cat in PLANNED:
            self.figure.add_bar(x=[""], y=[0], marker_color=COLORS[cat])
        self.figure.add_scatter(
            x=[""], y=[0], mode="markers", marker=dict(symbol="line-ew-open", size=60, color="black")
        )
        self.summary = widgets.HTML()
        self.controls = [
            self.model,
            self.gpu,
            self.dp,
            self.tp,
            self.pp,
            self.micro_batches,
            self.zero,
            self.precision,
            self.recompute,
            self.batch_size,
        ]
        self.widget = widgets.VBox(
            [
                widgets.HBox([self.model, self.gpu, self.precision, self.recompute]),
                widgets.HBox([self.dp, self.tp, self.pp]),
                widgets.HBox([self.micro_batches, self.zero, self.batch_size]),
                fitted(self.figure),
                self.summary,
            ]
        )
        self.result = None
        self.start()

    def refresh(self, lang: str) -> None:
        self.update()

    def update(self) -> None:
        try:
            layout = Layout(
                dp=self.dp.value,
                tp=self.tp.value,
                pp=self.pp.value,
                micro_batches=self.micro_batches.value,
                zero=self.zero.value,
                precision=self.precision.value,
                recompute=self.recompute.value,
            )
            self.result = plan(
                self.model.value, layout, gpu=self.gpu.value, batch_size=self.batch_size.value, states=self.states
            )
        except DtlabError as error:  # no bars left of the last layout that planned: they are not this one's
            self.result = None
            with self.figure.batch_update():
                for trace in self.figure.data:
                    trace.x, trace.y = [], []
            self.summary.value = f"<b style='color:#b00'>{error.message()}</b>"
            return
        r = self.result
        label = f"{r.gpus} x {r.gpu}"
        with self.figure.batch_update():
            for trace, cat in zip(self.figure.data, PLANNED):
                trace.x, trace.y = [label], [r.memory[cat] / 1e9]
            self.figure.data[-1].x, self.figure.data[-1].y = [label], [r.gpu_memory / 1e9]
        self.summary.value = t(
            "pl.summary",
            gpus=r.gpus,
            total=r.memory["total"] / 1e9,
            capacity=r.gpu_memory / 1e9,
            fits=t("pl.fits") if r.fits else t("pl.nofit"),
            step=r.step_time_s,
            mfu=100 * r.mfu,
            bubble=100 * r.bubble_fraction,
        )
