"""Offloading in pictures: the device pool beside the host pool, and what the PCIe copy costs.

:class:`MemoryPools` draws, for one rank of each run, what the device holds
(``mem``: parameters, gradients, optimizer state, activations) and, in a
separate figure on the same scale, what the host holds (``host_mem``, present
when the run offloads). The two are different memories and are never added.

:class:`OffloadCost` is planner-style arithmetic, no processes (Ren et al.
2021, ZeRO-Offload): with the optimizer on the host, each step sends the
gradients down and the updated parameters up over PCIe, in exchange for the
optimizer state (and master weights) no longer on the device; the host then
runs the optimizer step. Copies and host step are free when they hide behind
the step's compute (the host's step with the paper's delayed parameter
update); :func:`offload_cost` says from how many tokens per GPU per step that
happens, and the view draws the three and judges by both. Every number is a
prediction.
"""

from __future__ import annotations

import math

import ipywidgets as widgets
import plotly.graph_objects as go

from dtlab.i18n import get_language, register, t
from dtlab.lab.checks import human_bytes
from dtlab.lab.dashboard import CATEGORY_LABELS, COLORS, MEMORY_CATEGORIES
from dtlab.lab.fit import FigureWidget, fitted, fitting_grid, responsive
from dtlab.lab.view import FigureLabels, View
from dtlab.planner import (
    ACHIEVABLE_FRACTION,
    BYTES_PER_VALUE,
    GPUS,
    LINKS,
    Link,
    model_flops_per_token,
    model_states_bytes,
)

HOST_CATEGORIES = ("params", "grads", "optimizer")  # the host's: the fp32 masters, their gradients, Adam's state

register(
    {
        "offload.device.title": ("Device memory, rank 0", "设备内存（显存），rank 0"),
        "offload.host.title": ("Host (CPU) memory, rank 0", "主机（CPU）内存，rank 0"),
        "offload.axis.bytes": ("bytes", "字节"),
        "offload.cost.title": (
            "One step: PCIe copy and host step vs compute (prediction)",
            "一步之内：PCIe 拷贝与主机更新 vs 计算（预测）",
        ),
        "offload.cost.axis": ("seconds per step", "每步秒数"),
        "offload.cost.copy": ("PCIe copy (gradients down + parameters up)", "PCIe 拷贝（梯度下行 + 参数上行）"),
        "offload.cost.host": (
            "host's optimizer step (CPU, at the memory bound)",
            "主机上的优化器更新（CPU，内存带宽上限）",
        ),
        "offload.cost.compute": ("compute (forward + backward)", "计算（前向 + 反向）"),
        "offload.ctl.params": ("parameters Ψ", "参数量 Ψ"),
        "offload.ctl.gpu": ("GPU", "GPU 型号"),
        "offload.ctl.precision": ("precision", "精度"),
        "offload.ctl.tokens": ("tokens per GPU per step", "每张 GPU 每步的 token 数"),
        "offload.ctl.dp": ("DP degree", "数据并行度 (DP)"),
        "offload.ctl.bandwidth": ("PCIe GB/s (one direction)", "PCIe 带宽 GB/s（单向）"),
        "offload.cost.hides": (
            "copies and host step hide behind compute (with the delayed update)",
            "拷贝和主机更新都能被计算掩盖（借助延迟更新）",
        ),
        "offload.cost.waits": (
            "the GPU waits {wait:.3f} s per step for PCIe and the CPU",
            "GPU 每步要等待 PCIe 和 CPU {wait:.3f} 秒",
        ),
        "offload.cost.summary": (
            "frees {freed} of device memory per GPU; moves {moved} each way per step: "
            "copy {copy:.3f} s, host step {host:.3f} s, compute {compute:.3f} s — {verdict}. "
            "Break-even: {breakeven:,} tokens per GPU per step for the copies alone, "
            "{breakeven_step:,} with the host's step (prediction)",
            "每张 GPU 腾出 {freed} 显存；每步每个方向搬运 {moved}："
            "拷贝 {copy:.3f} 秒，主机更新 {host:.3f} 秒，计算 {compute:.3f} 秒——{verdict}。"
            "盈亏平衡点：只算拷贝时每张 GPU 每步 {breakeven:,} 个 token，"
            "加上主机更新时 {breakeven_step:,} 个（预测值）",
        ),
    }
)

PARAM_CHOICES = [
    ("125M", 125_000_000),
    ("1.3B", 1_300_000_000),
    ("7.5B", 7_500_000_000),
    ("13B", 13_000_000_000),
    ("70B", 70_000_000_000),
    ("175B", 175_000_000_000),
]
POWERS_OF_TWO = [1, 2, 4, 8, 16, 32, 64]


HOST_ADAM_BYTES = 28
"""Host memory traffic of one Adam update per parameter: fp32 master, gradient, momentum and
variance read (16 bytes), master, momentum and variance written (12). A CPU update is
memory-bound at best; this is that best case."""
HOST_BPS = 100e9
"""A server's host memory bandwidth, bytes/s (two sockets of DDR5 give a few hundred GB/s peak)."""


def offload_cost(
    params: int,
    *,
    tokens: int,
    precision: str = "bf16",
    gpu: str = "H100",
    dp: int = 1,
    link: Link | None = None,
    host_Bps: float = HOST_BPS,
) -> dict:
    """What offloading the optimizer frees and costs per GPU per step (a prediction).

    ZeRO-Offload (Ren et al. 2021): the device sends its gradients down and
    receives the updated parameters, each in the training precision, for
    the Ψ / N_d values this rank owns; the device no longer holds the
    optimizer state (KΨ / N_d with K = 12 in mixed precision: fp32 master,
    momentum and variance; 8 in fp32). The two copies run one after the
    other (gradients before the host's step, parameters after it). Compute
    is 6Ψ FLOPs per token (forward and backward matmuls) at the planner's
    achievable share of the GPU's peak. ``breakeven_tokens``: the fewest
    tokens per GPU per step whose compute lasts as long as the copy.

    The host's optimizer step is a cost of its own, and the paper shows it
    dominates: ``host_step_s`` is the best case, :data:`HOST_ADAM_BYTES` per
    parameter at ``host_Bps``. With the paper's delayed parameter update it
    overlaps the next step's compute too, so ``breakeven_with_step_tokens``
    asks compute to cover copy plus host step; without it, the step waits.
    """
    link = link or LINKS["pcie"]
    shard = -(-params // dp)
    each_way = BYTES_PER_VALUE[precision] * shard
    copy_s = 2 * link.time(each_way)
    flops_per_s = GPUS[gpu].peak_flops[precision] * ACHIEVABLE_FRACTION
    per_token_s = model_flops_per_token(params) / flops_per_s
    host_step_s = HOST_ADAM_BYTES * shard / host_Bps
    return {
        "bytes_each_way": each_way,
        "copy_s": copy_s,
        "compute_s": tokens * per_token_s,
        "freed_bytes": model_states_bytes(params, dp=dp, zero=1, precision=precision)["optimizer"],
        "breakeven_tokens": math.ceil(copy_s / per_token_s),
        "host_step_s": host_step_s,
        "breakeven_with_step_tokens": math.ceil((copy_s + host_step_s) / per_token_s),
    }


class MemoryPools(View):
    """Two figures on one scale: what the device holds and what the host holds, for rank 0 of each run."""

    figures = {
        "device": FigureLabels(
            "offload.device.title", y="offload.axis.bytes", traces=tuple(CATEGORY_LABELS[c] for c in MEMORY_CATEGORIES)
        ),
        "host": FigureLabels(
            "offload.host.title",
            y="offload.axis.bytes",
            traces=tuple(CATEGORY_LABELS[c] for c in HOST_CATEGORIES),
        ),
    }

    def __init__(self, runs: dict | None = None):
        self.device = responsive(
            FigureWidget(
                layout=go.Layout(
                    height=320,
                    barmode="stack",
                    margin=dict(l=70, r=10, t=40, b=40),
                    legend=dict(orientation="h", y=-0.25),
                )
            )
        )
        self.host = responsive(
            FigureWidget(
                layout=go.Layout(
                    height=320,
                    barmode="stack",
                    margin=dict(l=70, r=10, t=40, b=40),
                    legend=dict(orientation="h", y=-0.25),
                )
            )
        )
        for fig, cats in ((self.device, MEMORY_CATEGORIES), (self.host, HOST_CATEGORIES)):
            for cat in cats:
                fig.add_bar(x=[], y=[], marker_color=COLORS[cat])
        self.widget = fitting_grid([self.device, self.host])
        self.runs: dict = {}
        for label, run in (runs or {}).items():
            self.add(label, run)
        self.start()

    @staticmethod
    def pools(record: dict, rank: int = 0) -> tuple[dict, dict]:
        """(device bytes, host bytes) of ``rank`` in a step record; host is zeros without offloading."""
        r = record["ranks"][rank]
        device = {cat: r["mem"].get(cat, 0) for cat in MEMORY_CATEGORIES}
        host = {cat: r.get("host_mem", {}).get(cat, 0) for cat in HOST_CATEGORIES}
        return device, host

    def add(self, label: str, run) -> None:
        """Add a finished (or running) run's last record as one more bar in each figure."""
        self.runs[label] = run
        self._draw()

    def _draw(self) -> None:
        labels = [label for label, run in self.runs.items() if run.records]
        pools = [self.pools(self.runs[label].records[-1]) for label in labels]
        top = max([sum(d.values()) for d, _ in pools] + [sum(h.values()) for _, h in pools] + [1])
        with self.device.batch_update(), self.host.batch_update():
            for trace, cat in zip(self.device.data, MEMORY_CATEGORIES):
                trace.x, trace.y = labels, [d[cat] for d, _ in pools]
            for trace, cat in zip(self.host.data, HOST_CATEGORIES):
                trace.x, trace.y = labels, [h[cat] for _, h in pools]
            for fig in (self.device, self.host):
                fig.layout.yaxis.range = [0, 1.05 * top]  # one scale: the pools compare by eye


class OffloadCost(View):
    """Sliders over :func:`offload_cost`: one step's copy, host step and compute, and the two break-evens."""

    labels = {
        "params": "offload.ctl.params",
        "gpu": "offload.ctl.gpu",
        "precision": "offload.ctl.precision",
        "tokens": "offload.ctl.tokens",
        "dp": "offload.ctl.dp",
        "bandwidth": "offload.ctl.bandwidth",
    }
    figures = {"figure": FigureLabels("offload.cost.title", y="offload.cost.axis")}
    changes = dict.fromkeys(labels, "update")

    def __init__(
        self,
        *,
        params: int = 7_500_000_000,
        gpu: str = "H100",
        precision: str = "bf16",
        tokens: int = 4096,
        dp: int = 1,
    ):
        self.params = widgets.SelectionSlider(options=PARAM_CHOICES, value=params)
        self.gpu = widgets.Dropdown(options=list(GPUS), value=gpu)
        self.precision = widgets.ToggleButtons(options=["bf16", "fp32"], value=precision)
        self.tokens = widgets.SelectionSlider(options=[2**k for k in range(7, 17)], value=tokens)
        self.dp = widgets.SelectionSlider(options=POWERS_OF_TWO, value=dp)
        self.bandwidth = widgets.SelectionSlider(
            options=[16, 32, 64, 128], value=round(LINKS["pcie"].bandwidth_Bps / 1e9)
        )
        self.figure = responsive(FigureWidget(layout=go.Layout(height=260, margin=dict(l=60, r=10, t=40, b=40))))
        self.figure.add_bar(x=["", "", ""], y=[0, 0, 0], marker_color=["#F58518", "#E45756", "#4C78A8"])
        self.summary = widgets.HTML()
        self.controls = [self.params, self.gpu, self.precision, self.tokens, self.dp, self.bandwidth]
        self.widget = widgets.VBox(
            [
                widgets.HBox([self.params, self.gpu, self.precision]),
                widgets.HBox([self.tokens, self.dp, self.bandwidth]),
                fitted(self.figure),
                self.summary,
            ]
        )
        self.result: dict | None = None
        self.start()

    def link(self) -> Link:
        preset = LINKS["pcie"]
        return Link(name="pcie", latency_s=preset.latency_s, bandwidth_Bps=self.bandwidth.value * 1e9)

    def update(self, lang: str | None = None) -> None:
        r = self.result = offload_cost(
            self.params.value,
            tokens=self.tokens.value,
            precision=self.precision.value,
            gpu=self.gpu.value,
            dp=self.dp.value,
            link=self.link(),
        )
        lang = lang or get_language()
        with self.figure.batch_update():
            bar = self.figure.data[0]
            bar.x = [t("offload.cost.copy", lang), t("offload.cost.host", lang), t("offload.cost.compute", lang)]
            bar.y = [r["copy_s"], r["host_step_s"], r["compute_s"]]
        wait = r["copy_s"] + r["host_step_s"] - r["compute_s"]  # breakeven_with_step_tokens' rule
        verdict = t("offload.cost.hides", lang) if wait <= 0 else t("offload.cost.waits", lang, wait=wait)
        self.summary.value = t(
            "offload.cost.summary",
            lang,
            freed=human_bytes(r["freed_bytes"]),
            moved=human_bytes(r["bytes_each_way"]),
            copy=r["copy_s"],
            host=r["host_step_s"],
            compute=r["compute_s"],
            verdict=verdict,
            breakeven=r["breakeven_tokens"],
            breakeven_step=r["breakeven_with_step_tokens"],
        )

    def refresh(self, lang: str) -> None:
        self.update(lang)
