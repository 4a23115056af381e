"""ZeRO in pictures: model states per rank, measured beside the paper's formula, and stage 3 step by step.

:class:`ZeroExplorer` has sliders for the ZeRO stage and the DP degree. Each
move starts a short real training job on the warm pool (the same
``dtlab.train`` the lessons use) and draws, per rank, the parameters,
gradients and optimizer state that rank measured, beside one more bar: what
the ZeRO paper's formula says for the same model (Rajbhandari et al. 2019,
Sec. 5 and Fig. 1; :func:`dtlab.planner.model_states_bytes`, fp32 here:
4 + 4 + 8 bytes per parameter, each sharded from its stage on).

:class:`Stage3Stepper` replays what ZeRO stage 3 did on one rank during one
forward and backward (:func:`dtlab.course.experiments.zero.stage3_trace`): a **Step**
button advances one event (an all-gather, a reduce-scatter or a free) and
the picture shows which unit's whole parameters exist at that moment.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go

from dtlab.config import MODEL_PRESETS, TrainConfig
from dtlab.i18n import get_language, register, t
from dtlab.lab.checks import human_bytes
from dtlab.lab.dashboard import CATEGORY_LABELS, COLORS
from dtlab.lab.fit import FigureWidget, fitted, responsive, row, set_title
from dtlab.lab.view import FigureLabels, View
from dtlab.launch import RankPool, default_pool
from dtlab.planner import model_states_bytes

register(
    {
        "zero.title": (
            "ZeRO stage {stage}, DP = {dp}: model states per rank (measured) and the formula",
            "ZeRO 阶段 {stage}，DP = {dp}：每个 rank 的模型状态（实测）与公式",
        ),
        "zero.axis.bytes": ("bytes", "字节"),
        "zero.rank": ("rank {r}", "第 {r} 号 rank"),
        "zero.formula": ("formula (ZeRO paper)", "公式（ZeRO 论文）"),
        "zero.ctl.stage": ("ZeRO stage", "ZeRO 阶段"),
        "zero.ctl.dp": ("DP degree", "数据并行度 (DP)"),
        "zero.ctl.run": ("Run", "运行"),
        "zero.status.idle": (
            "move a slider: a short real run starts on the warm pool",
            "拖动滑块：会在预热好的进程池上启动一次简短的真实运行",
        ),
        "zero.status.running": (
            "running ZeRO stage {stage} on {dp} rank(s)…",
            "正在 {dp} 个 rank 上运行 ZeRO 阶段 {stage}……",
        ),
        "zero.status.done": (
            "stage {stage}, DP = {dp}: measured {measured} per rank, formula {formula}, "
            "difference {diff} B (stage 3 rounds each unit up to N shards)",
            "阶段 {stage}，DP = {dp}：每个 rank 实测 {measured}，公式 {formula}，"
            "相差 {diff} 字节（阶段 3 把每个单元向上取整为 N 个分片）",
        ),
        # the stage 3 stepper
        "zero.step.title": (
            "ZeRO stage 3 on rank {rank} of {world}: {now}",
            "ZeRO 阶段 3，{world} 个 rank 中的 rank {rank}：{now}",
        ),
        "zero.step.start": ("before the forward pass", "前向传播之前"),
        "zero.step.event": (
            "event {k} of {n}: {phase}, {action} {unit}",
            "第 {k} / {n} 个事件：{phase}，{action} {unit}",
        ),
        "zero.step.forward": ("forward", "前向"),
        "zero.step.backward": ("backward", "反向"),
        "zero.step.gather": ("all-gather", "all-gather（全收集）"),
        "zero.step.free": ("free", "释放"),
        "zero.step.reduce_scatter": ("reduce-scatter the gradient of", "reduce-scatter（归约散射）梯度："),
        "zero.step.shard": ("shard held by this rank (1/N)", "本 rank 持有的分片（1/N）"),
        "zero.step.gathered": ("whole parameters, gathered now", "此刻已收集的完整参数"),
        "zero.step.summary": (
            "gathered now: {held} ({units}); most at once so far: {peak}; "
            "shards kept between layers: {shards}; all-gathers so far: {gathers}, "
            "reduce-scatters so far: {scatters}",
            "此刻已收集：{held}（{units}）；到目前为止同时最多：{peak}；"
            "层与层之间保留的分片：{shards}；已做 all-gather：{gathers} 次，"
            "已做 reduce-scatter：{scatters} 次",
        ),
        "zero.step.none": ("nothing", "无"),
        # ZeRO's Figure 1, measured
        "zero.fig1.title": (
            "ZeRO's Figure 1, measured: {precision}, DP = {dp}, one rank's model states",
            "实测的 ZeRO 图 1：{precision}，DP = {dp}，一个 rank 的模型状态",
        ),
        "zero.fig1.stage": ("ZeRO stage", "ZeRO 阶段"),
    }
)

STATE_CATEGORIES = ("params", "grads", "optimizer")


def _batch_for(dp: int) -> int:
    """A global batch every DP degree divides (model states do not depend on it)."""
    return 2 * dp


class ZeroExplorer(View):
    """Sliders for the ZeRO stage and DP degree; measured model states per rank beside the formula.

    ``measure(stage, dp)`` runs one job and redraws (what the sliders call,
    through a worker thread so the notebook stays free); it returns the
    per-rank states measured and the formula's, in bytes.
    """

    labels = {"stage": "zero.ctl.stage", "dp": "zero.ctl.dp", "run_button": "zero.ctl.run"}
    figures = {
        "figure": FigureLabels(
            "zero.title", y="zero.axis.bytes", traces=tuple(CATEGORY_LABELS[c] for c in STATE_CATEGORIES)
        )
    }
    clicks = {"run_button": "submit"}

    def __init__(
        self,
        *,
        stage: int = 2,
        dp: int = 4,
        model: str = "small",
        steps: int = 2,
        pool: RankPool | None = None,
        auto_run: bool = True,
    ):
        self.pool = pool or default_pool()
        self.model, self.steps = model, steps
        self.stage = widgets.IntSlider(value=stage, min=0, max=3)
        self.dp = widgets.IntSlider(value=dp, min=1, max=min(8, self.pool.max_size))
        self.run_button = widgets.Button(button_style="primary", icon="play")
        self.status = widgets.HTML()
        self.figure = responsive(
            FigureWidget(
                layout=go.Layout(
                    height=340,
                    barmode="stack",
                    margin=dict(l=70, r=10, t=50, b=40),
                    legend=dict(orientation="h", y=-0.2),
                )
            )
        )
        for cat in STATE_CATEGORIES:
            self.figure.add_bar(x=[], y=[], marker_color=COLORS[cat])
        self.widget = widgets.VBox([row([self.stage, self.dp, self.run_button]), fitted(self.figure), self.status])
        self.result: dict | None = None
        if auto_run:
            for control in (self.stage, self.dp):
                self.on_change(control, "submit")
        self.set_status("zero.status.idle")
        self.start()

    # -- running
    def submit(self) -> None:
        """Queue the sliders' configuration (a newer request replaces one not started yet)."""
        self.submit_request((self.stage.value, self.dp.value))

    def handle(self, request: tuple[int, int]) -> None:
        self.measure(*request)

    def measure(self, stage: int, dp: int) -> dict:
        """Run ``steps`` steps of ZeRO ``stage`` on ``dp`` ranks; draw and return what each rank held."""
        import dtlab.train

        config = TrainConfig(dp=dp, zero=stage, model=self.model, steps=self.steps, batch_size=_batch_for(dp), seed=0)
        self.set_status("zero.status.running", stage=stage, dp=dp)
        run = dtlab.train.start(config, pool=self.pool).wait()
        params = MODEL_PRESETS[self.model].param_count()
        measured = [{k: r["mem"][k] for k in STATE_CATEGORIES} for r in run.records[-1]["ranks"]]
        formula = model_states_bytes(params, dp=dp, zero=stage, precision="fp32")
        self.result = {"stage": stage, "dp": dp, "params": params, "measured": measured, "formula": formula}
        self._draw()
        most = max(sum(m.values()) for m in measured)
        self.set_status(
            "zero.status.done",
            stage=stage,
            dp=dp,
            measured=human_bytes(most),
            formula=human_bytes(sum(formula.values())),
            diff=most - sum(formula.values()),
        )
        return self.result

    # -- drawing
    def label_args(self) -> dict:
        shown = self.result or {"stage": self.stage.value, "dp": self.dp.value}
        return {"stage": shown["stage"], "dp": shown["dp"]}

    def _draw(self, lang: str | None = None) -> None:
        if self.result is None:
            return
        lang = lang or get_language()
        r = self.result
        x = [t("zero.rank", lang, r=i) for i in range(len(r["measured"]))] + [t("zero.formula", lang)]
        opacity = [1.0] * len(r["measured"]) + [0.45]
        with self.figure.batch_update():
            for trace, cat in zip(self.figure.data, STATE_CATEGORIES):
                trace.x = x
                trace.y = [m[cat] for m in r["measured"]] + [r["formula"][cat]]
                trace.marker.opacity = opacity
            set_title(self.figure, t("zero.title", lang, stage=r["stage"], dp=r["dp"]))  # wrapped

    def refresh(self, lang: str) -> None:
        self._draw(lang)  # the rank names on the x axis


FIGURE_1_CATEGORIES = ("params", "grads", "master", "optimizer")
"""The paper's model states as a run's record names them: 16-bit parameters and gradients, the fp32
master and Adam's moments (the last two the paper's K = 12)."""


class FigureOne(View):
    """ZeRO's Figure 1 from real runs: one stacked bar per stage of rank 0's model states, as measured.

    ``runs``: stage -> a finished run (``dtlab.train(...).wait()``) of the same model, precision and
    DP degree. A cell ending in it shows the figure.
    """

    def __init__(self, runs: dict):
        config = next(iter(runs.values())).config
        self.title = {"precision": config.precision, "dp": config.dp}
        self.held = {
            stage: {c: run.records[-1]["ranks"][0]["mem"].get(c, 0) for c in FIGURE_1_CATEGORIES}
            for stage, run in runs.items()
        }
        self.figure = responsive(
            FigureWidget(
                layout=go.Layout(
                    height=340,
                    barmode="stack",
                    margin=dict(l=70, r=10, t=50, b=60),
                    legend=dict(orientation="h", y=-0.3),
                )
            )
        )
        self.widget = fitted(self.figure)
        stages = [str(s) for s in self.held]
        for c in FIGURE_1_CATEGORIES:
            self.figure.add_bar(x=stages, y=[held[c] for held in self.held.values()], marker_color=COLORS[c])
        self.figures = {
            "figure": FigureLabels(
                "zero.fig1.title",
                "zero.fig1.stage",
                "zero.axis.bytes",
                tuple(CATEGORY_LABELS[c] for c in FIGURE_1_CATEGORIES),
            )
        }
        self.start()

    def label_args(self) -> dict:
        return self.title


class Stage3Stepper(View):
    """Step through one rank's ZeRO stage 3 forward and backward, one gather, reduce-scatter or free at a time.

    ``trace`` is what :func:`dtlab.course.experiments.zero.stage3_trace` returned for
    one rank. ``step()`` and ``reset()`` are what the buttons call;
    ``held_now()`` and ``peak_so_far()`` read the state.
    """

    labels = {"step_button": "ctl.step", "reset_button": "ctl.reset"}
    clicks = {"step_button": "step", "reset_button": "reset"}

    def __init__(self, trace: dict):
        self.trace = trace
        self.units = trace["units"]
        self.events = trace["events"]
        self.now = 0  # events shown so far (0: before the forward pass)
        self.step_button = widgets.Button(icon="step-forward", button_style="primary")
        self.reset_button = widgets.Button(icon="undo")
        self.summary = widgets.HTML()
        self.figure = responsive(
            FigureWidget(
                layout=go.Layout(
                    height=320,
                    barmode="overlay",
                    margin=dict(l=80, r=10, t=50, b=40),
                    legend=dict(orientation="h", y=-0.2),
                    yaxis=dict(autorange="reversed"),
                )
            )
        )
        self.figure.add_bar(y=[], x=[], orientation="h", marker_color="#F58518", opacity=0.55)
        self.figure.add_bar(y=[], x=[], orientation="h", marker_color="#4C78A8")
        self.widget = widgets.VBox([row([self.step_button, self.reset_button]), fitted(self.figure), self.summary])
        self.start()

    # -- state
    def step(self) -> None:
        """Show one more event (stays at the last one)."""
        self.now = min(self.now + 1, len(self.events))
        self._draw()

    def reset(self) -> None:
        """Back to before the forward pass: only the shards exist."""
        self.now = 0
        self._draw()

    def held_now(self) -> list[str]:
        """Units whose whole parameters exist after the events shown so far."""
        return list(self.events[self.now - 1]["held_units"]) if self.now else []

    def held_bytes_now(self) -> int:
        return self.events[self.now - 1]["held_bytes"] if self.now else 0

    def peak_so_far(self) -> int:
        return max([e["held_bytes"] for e in self.events[: self.now]], default=0)

    # -- drawing
    def _draw(self, lang: str | None = None) -> None:
        lang = lang or get_language()
        names = [u["name"] for u in self.units]
        held = set(self.held_now())
        bytes_per = self.trace["shard_bytes"] // max(1, sum(u["shard"] for u in self.units))
        with self.figure.batch_update():
            gathered, shards = self.figure.data
            gathered.y, gathered.x = names, [u["padded"] * bytes_per if u["name"] in held else 0 for u in self.units]
            shards.y, shards.x = names, [u["shard"] * bytes_per for u in self.units]
            gathered.name = t("zero.step.gathered", lang)
            shards.name = t("zero.step.shard", lang)
            self.figure.layout.xaxis.title = t("zero.axis.bytes", lang)
            set_title(
                self.figure,
                t(
                    "zero.step.title",
                    lang,
                    rank=self.trace["rank"],
                    world=self.trace["world_size"],
                    now=self._describe(lang),
                ),
            )
        shown = self.events[: self.now]
        self.summary.value = t(
            "zero.step.summary",
            lang,
            held=human_bytes(self.held_bytes_now()),
            units=", ".join(self.held_now()) or t("zero.step.none", lang),
            peak=human_bytes(self.peak_so_far()),
            shards=human_bytes(self.trace["shard_bytes"]),
            gathers=sum(e["action"] == "gather" for e in shown),
            scatters=sum(e["action"] == "reduce_scatter" for e in shown),
        )

    def _describe(self, lang: str) -> str:
        if not self.now:
            return t("zero.step.start", lang)
        e = self.events[self.now - 1]
        return t(
            "zero.step.event",
            lang,
            k=self.now,
            n=len(self.events),
            phase=t(f"zero.step.{e['phase']}", lang),
            action=t(f"zero.step.{e['action']}", lang),
            unit=e["unit"],
        )

    def refresh(self, lang: str) -> None:
        self._draw(lang)
