"""Activation memory per GPU against sequence length, for each context-parallel degree, live.

Sliders for the model, TP, sequence parallelism, CP and the sequence length;
every change redraws at once from the planner's formula
(:func:`dtlab.planner.activation_bytes_per_layer`, Korthikanti et al. 2022):
one line per CP degree (the chosen one bold), a dot at the chosen sequence
length, and the GPU's memory as a dashed line. Whole model, one micro-batch of
one sequence, 16-bit activations, no pipeline: every layer's activations on
every GPU. The attention scores (the a x s x s term) are kept only with
recompute "none" and no CP: "selective" recomputes them (as FlashAttention
never stores them), and ring attention under CP never forms them.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go

from dtlab.i18n import register, t
from dtlab.lab.fit import FigureWidget, fitted, responsive, row
from dtlab.lab.view import FigureLabels, View
from dtlab.planner import activation_bytes_per_layer, get_gpu
from dtlab.planner.architectures import get_architecture

register(
    {
        "lc.ctl.model": ("model", "模型"),
        "lc.ctl.tp": ("TP", "张量并行 TP"),
        "lc.ctl.sp": ("sequence parallelism (SP)", "序列并行（SP）"),
        "lc.ctl.cp": ("CP", "上下文并行 CP"),
        "lc.ctl.seq": ("sequence length (tokens)", "序列长度（token）"),
        "lc.ctl.recompute": ("recompute", "重计算"),
        "lc.title": (
            "Activations per GPU, {model}, TP {tp}{sp} (planner)",
            "每张 GPU 的激活内存，{model}，TP {tp}{sp}（规划器）",
        ),
        "lc.sp": (" + SP", " + SP"),
        "lc.x": ("sequence length (tokens)", "序列长度（token）"),
        "lc.y": ("GB per GPU", "每张 GPU 的 GB"),
        "lc.cp_line": ("CP {cp}", "CP {cp}"),
        "lc.capacity": ("{gpu} memory", "{gpu} 显存"),
        "lc.chosen": ("your choice", "你的选择"),
        "lc.summary": (
            "{model}, TP {tp}{sp}, CP {cp}, {seq:,} tokens: {gb:.1f} GB of activations per GPU "
            "({layer:.0f} MB per layer); without CP: {gb1:.1f} GB. {fits}",
            "{model}，TP {tp}{sp}，CP {cp}，{seq:,} 个 token：每张 GPU 激活 {gb:.1f} GB"
            "（每层 {layer:.0f} MB）；不用 CP 时：{gb1:.1f} GB。{fits}",
        ),
        "lc.fits": (
            "Fits in the {capacity:.0f} GB of an {gpu} (before weights and optimizer state).",
            "能放进一张 {gpu} 的 {capacity:.0f} GB（尚未计入权重和优化器状态）。",
        ),
        "lc.nofit": ("Does NOT fit in the {capacity:.0f} GB of an {gpu}.", "放不进一张 {gpu} 的 {capacity:.0f} GB。"),
    }
)

MODELS = ("llama3-8b", "llama3-70b", "gpt3-175b")
SEQ_LENS = (4096, 8192, 16384, 32768, 65536, 131072)
CP_DEGREES = (1, 2, 4, 8, 16)
COLORS = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#B279A2")


def activations_per_gpu(model: str, *, seq_len: int, tp: int, sp: bool, cp: int, recompute: str = "selective") -> float:
    """Bytes of activations per GPU for the whole model, one sequence, no pipeline (the planner's formula)."""
    arch = get_architecture(model)
    per_layer = activation_bytes_per_layer(
        seq_len=seq_len,
        micro_batch=1,
        hidden=arch.hidden,
        heads=arch.heads,
        tp=tp,
        sequence_parallel=sp,
        cp=cp,
        recompute=recompute,
    )
    return per_layer * arch.layers


class LongContextMemoryView(View):
    """The sliders and the figure; ``redraw()`` is what every control's change calls."""

    labels = {
        "model": "lc.ctl.model",
        "tp": "lc.ctl.tp",
        "sp": "lc.ctl.sp",
        "cp": "lc.ctl.cp",
        "seq_len": "lc.ctl.seq",
        "recompute": "lc.ctl.recompute",
    }
    figures = {"figure": FigureLabels("lc.title", "lc.x", "lc.y")}
    changes = {
        "model": "redraw",
        "tp": "redraw",
        "sp": "redraw",
        "cp": "redraw",
        "seq_len": "redraw",
        "recompute": "redraw",
    }

    def __init__(
        self,
        *,
        model: str = "llama3-8b",
        tp: int = 8,
        sp: bool = True,
        cp: int = 1,
        seq_len: int = 131072,
        recompute: str = "selective",
        gpu: str = "H100",
    ):
        self.gpu = get_gpu(gpu)
        self.model = widgets.Dropdown(options=list(MODELS), value=model)
        self.tp = widgets.SelectionSlider(options=[1, 2, 4, 8], value=tp)
        self.sp = widgets.Checkbox(value=sp)
        self.cp = widgets.SelectionSlider(options=list(CP_DEGREES), value=cp)
        self.seq_len = widgets.SelectionSlider(options=list(SEQ_LENS), value=seq_len)
        self.recompute = widgets.ToggleButtons(options=["none", "selective"], value=recompute)
        self.figure = responsive(
            FigureWidget(
                layout=go.Layout(
                    height=360,
                    margin=dict(l=60, r=10, t=50, b=40),
                    legend=dict(orientation="h", y=-0.25),
                    xaxis=dict(type="log", tickvals=list(SEQ_LENS), ticktext=[f"{s // 1024}K" for s in SEQ_LENS]),
                    yaxis=dict(type="log"),
                )
            )
        )
        for _ in CP_DEGREES:
            self.figure.add_scatter(x=list(SEQ_LENS), y=[], mode="lines+markers")
        self.figure.add_scatter(x=[], y=[], mode="markers", marker=dict(size=14, color="black", symbol="circle-open"))
        self.figure.add_scatter(x=[SEQ_LENS[0], SEQ_LENS[-1]], y=[], mode="lines", line=dict(dash="dash", color="grey"))
        self.summary = widgets.HTML()
        self.widget = widgets.VBox(
            [
                row([self.model, self.tp, self.sp]),
                self.recompute,
                row([self.cp, self.seq_len]),
                fitted(self.figure),
                self.summary,
            ]
        )
        self.start()

    def label_args(self) -> dict:
        return {"model": self.model.value, "tp": self.tp.value, "sp": t("lc.sp") if self.sp.value else ""}

    def chosen_bytes(self, cp: int | None = None) -> float:
        return activations_per_gpu(
            self.model.value,
            seq_len=self.seq_len.value,
            tp=self.tp.value,
            sp=self.sp.value and self.tp.value > 1,
            cp=cp or self.cp.value,
            recompute=self.recompute.value,
        )

    def redraw(self) -> None:
        self.relabel()

    def refresh(self, lang: str) -> None:
        """Every line, the dot, the capacity and the summary follow the controls."""
        model, tp, sp = self.model.value, self.tp.value, self.sp.value and self.tp.value > 1
        gb = 1e9
        with self.figure.batch_update():
            for trace, cp, color in zip(self.figure.data, CP_DEGREES, COLORS):
                # x with y, always: a browser given y alone draws the curve at x = 0, 1, 2...
                trace.x, trace.y = (
                    list(SEQ_LENS),
                    [
                        activations_per_gpu(model, seq_len=s, tp=tp, sp=sp, cp=cp, recompute=self.recompute.value) / gb
                        for s in SEQ_LENS
                    ],
                )
                trace.name = t("lc.cp_line", lang, cp=cp)
                trace.line = dict(color=color, width=5 if cp == self.cp.value else 1.5)
            dot, capacity = self.figure.data[len(CP_DEGREES)], self.figure.data[len(CP_DEGREES) + 1]
            dot.x, dot.y = [self.seq_len.value], [self.chosen_bytes() / gb]
            dot.name = t("lc.chosen", lang)
            capacity.x, capacity.y = [SEQ_LENS[0], SEQ_LENS[-1]], [self.gpu.memory_bytes / gb] * 2
            capacity.name = t("lc.capacity", lang, gpu=self.gpu.name)
        total = self.chosen_bytes()
        fits = t(
            "lc.fits" if total <= self.gpu.memory_bytes else "lc.nofit",
            lang,
            capacity=self.gpu.memory_bytes / gb,
            gpu=self.gpu.name,
        )
        self.summary.value = t(
            "lc.summary",
            lang,
            **self.label_args(),
            cp=self.cp.value,
            seq=self.seq_len.value,
            gb=total / gb,
            layer=total / get_architecture(model).layers / 1e6,
            gb1=self.chosen_bytes(cp=1) / gb,
            fits=fits,
        )
