"""The planner's ranking put to the test: run its fastest layouts on this machine, see if the order holds.

:class:`LayoutRace` asks the layout search (:func:`dtlab.planner.search.search`)
for every layout of N local ranks, priced with this machine's profile
(``dtlab calibrate``; ``dtlab plan --search --gpu local``), and takes the top
K that ``dtlab train`` runs. By default it takes the fastest layout of each
(dp, tp, pp) shape (:func:`race_layouts`): within one shape the search's next
layouts differ by little or not at all (1F1B and GPipe with one micro-batch
are the same run), and a race between near-copies ranks the noise. On **Run**
(or :meth:`LayoutRace.run`, which a test or a notebook cell calls without a
browser) it trains each layout for a few steps on the warm pool, every layout
once per pass (:func:`dtlab.train.compare.run_in_passes`), and draws the
planner's predicted step time beside the measured median, each layout's
predicted and measured rank, and Kendall's tau between the two orders.

Without a profile it says so in both languages and offers to calibrate here
(:func:`dtlab.planner.calibrate.calibrate`, quick: fewer sizes and repeats).
Predicted numbers are the planner's; measured ones come from the runs, and
change from run to run. The race's layouts and results, without the widget,
are :mod:`dtlab.lab.layout_race_results`'s.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import ipywidgets as widgets
import plotly.graph_objects as go

from dtlab.config import MODEL_PRESETS, TrainConfig
from dtlab.i18n import ConfigError, get_language, register, t
from dtlab.lab.fit import FigureWidget, fitted, responsive, row
from dtlab.lab.layout_race_results import RaceResult, RaceRow, _ranks, layout_label, race_layouts, train_config
from dtlab.lab.view import FigureLabels, View
from dtlab.launch import RankPool, default_pool
from dtlab.train.compare import kendall_tau, run_in_passes

register(
    {
        "race.title": (
            "Step time on this machine: the planner's prediction beside the measurement",
            "本机的单步时间：规划器的预测与实测并排",
        ),
        "race.x": ("layout (the planner's rank)", "布局（规划器的排名）"),
        "race.ms": ("ms per step", "每步毫秒"),
        "race.predicted": ("predicted (planner, this machine's profile)", "预测（规划器，本机配置文件）"),
        "race.measured": ("measured (median of {n} steps)", "实测（{n} 步的中位数）"),
        "race.run": ("Run these layouts", "运行这些布局"),
        "race.calibrate": ("Calibrate this machine (quick)", "校准本机（快速）"),
        "race.ready": (
            "the planner's top {k} layouts of {ranks} ranks here ({profile}): press Run to measure them",
            "规划器在本机 {ranks} 个 rank 上排名前 {k} 的布局（{profile}）：点“运行这些布局”来实测",
        ),
        "race.running": ("running {label}, pass {k} of {passes}…", "正在运行 {label}，第 {k} / {passes} 轮……"),
        "race.calibrating": (
            "measuring this machine (dtlab calibrate, quick)…",
            "正在测量本机（dtlab calibrate，快速）……",
        ),
        "race.done": ("done: {k} layouts, {passes} pass(es) each", "完成：{k} 个布局，每个 {passes} 轮"),
        "race.no_profile": (
            "no machine profile at {path}: run `dtlab calibrate` in a terminal (under a minute), or "
            "press Calibrate here (quick); the planner needs it to predict this machine",
            "{path} 处没有机器配置文件：请在终端运行 `dtlab calibrate`（一分钟内），或点“校准本机”"
            "（快速）；规划器要靠它来预测本机",
        ),
        "race.col.rank": ("planner's rank", "规划器排名"),
        "race.col.layout": ("layout", "布局"),
        "race.col.predicted": ("predicted ms (planner)", "预测毫秒（规划器）"),
        "race.col.measured": ("measured ms (median)", "实测毫秒（中位数）"),
        "race.col.measured_rank": ("measured rank", "实测排名"),
        "race.col.ratio": ("measured / predicted", "实测 / 预测"),
        "race.summary": (
            "Kendall tau between the planner's order and the measured one: {tau:.2f} (1: the same "
            "order, 0: unrelated, -1: reversed). Fastest when measured: the planner's #{fastest}.",
            "规划器的排序与实测排序之间的 Kendall tau：{tau:.2f}（1：顺序相同，0：无关，-1：相反）。"
            "实测最快的是规划器的第 {fastest} 名。",
        ),
    }
)


def _check_count(name: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(
            f"{name}={value!r} is not allowed; expected an integer from {low} to {high}",
            f"{name}={value!r} 不合法；应为 {low} 到 {high} 之间的整数",
        )


class LayoutRace(View):
    """Run the planner's top layouts of ``ranks`` local ranks and compare the measured order with its own.

    ``run()`` trains them and returns a :class:`RaceResult` (what the Run button calls);
    ``calibrate()`` measures this machine first when no profile exists. ``profile``: a profile
    file (default: where ``dtlab calibrate`` writes). ``steps`` measured steps after ``warmup``
    per run, ``passes`` runs of each layout.
    """

    labels = {"run_button": "race.run", "calibrate_button": "race.calibrate"}
    figures = {"figure": FigureLabels("race.title", "race.x", "race.ms", ("race.predicted", "race.measured"))}
    clicks = {"run_button": "submit_run", "calibrate_button": "submit_calibrate"}

    def __init__(
        self,
        *,
        model: str = "small",
        ranks: int = 4,
        top: int = 4,
        batch_size: int = 8,
        steps: int = 3,
        warmup: int = 1,
        passes: int = 2,
        profile: str | None = None,
        one_per_shape: bool = True,
        pool: RankPool | None = None,
    ):
        if model not in MODEL_PRESETS:
            raise ConfigError(
                f"model={model!r} is not allowed; expected one of {sorted(MODEL_PRESETS)}",
                f"model={model!r} 不合法；应为 {sorted(MODEL_PRESETS)} 之一",
            )
        self.pool = pool or default_pool()
        _check_count("ranks", ranks, 2, min(8, self.pool.max_size))
        _check_count("top", top, 2, 16)
        for name, value in (("steps", steps), ("passes", passes)):
            _check_count(name, value, 1, 100)
        _check_count("warmup", warmup, 0, 100)
        self.model, self.ranks, self.top, self.batch_size = model, ranks, top, batch_size
        self.steps, self.warmup, self.passes, self.one_per_shape = steps, warmup, passes, one_per_shape
        from dtlab.planner.profile import default_path

        self.profile_path = Path(profile) if profile is not None else default_path()
        self.run_button = widgets.Button(button_style="primary", icon="play")
        self.calibrate_button = widgets.Button(icon="tachometer")
        self.status, self.table = widgets.HTML(), widgets.HTML()
        self.figure = responsive(
            FigureWidget(
                layout=go.Layout(
                    height=340,
                    barmode="group",
                    margin=dict(l=60, r=10, t=50, b=60),
                    legend=dict(orientation="h", y=-0.3),
                )
            )
        )
        self.figure.add_bar(x=[], y=[], marker_color="#BAB0AC", marker_pattern_shape="/")
        self.figure.add_bar(x=[], y=[], marker_color="#4C78A8")
        self.widget = widgets.VBox(
            [row([self.run_button, self.calibrate_button]), self.status, fitted(self.figure), self.table]
        )
        self.result: RaceResult | None = None
        self.layouts: list = []
        self.missing: ConfigError | None = None
        self._find_layouts()
        self.start()

    # -- the planner's side
    def _find_layouts(self) -> None:
        """The search on this machine's profile, or the bilingual note that there is none."""
        from dtlab.planner.search import search

        self.result = None
        if not self.profile_path.is_file():
            path = str(self.profile_path)
            self.missing = ConfigError(t("race.no_profile", "en", path=path), t("race.no_profile", "zh", path=path))
            self.layouts = []
        else:
            self.missing = None
            found = search(self.model, gpus=self.ranks, gpu=str(self.profile_path), batch_size=self.batch_size)
            self.layouts = race_layouts(found, self.top, one_per_shape=self.one_per_shape, runs=self._runs)
        self.calibrate_button.layout.display = None if self.missing else "none"
        self.run_button.disabled = self.missing is not None
        if self.missing:
            self.set_status("race.no_profile", path=self.profile_path)
        else:
            self.set_status("race.ready", k=len(self.layouts), ranks=self.ranks, profile=self.profile_path)
        self._draw()

    def _runs(self, plan) -> bool:
        """``dtlab train`` accepts this plan's job on this pool."""
        try:
            self._config(plan).validate(max_world_size=self.pool.max_size)
        except ConfigError:
            return False
        return True

    def _config(self, plan) -> TrainConfig:
        return train_config(plan, model=self.model, batch_size=self.batch_size, steps=self.warmup + self.steps)

    # -- the measured side
    def run(self) -> RaceResult:
        """Train every chosen layout ``passes`` times; draw and return the predicted and measured figures."""
        if self.missing is not None:
            raise self.missing
        if not self.layouts:
            raise ConfigError(
                f"no layout of {self.ranks} ranks that dtlab train runs fits the search "
                f"(model {self.model}, batch {self.batch_size})",
                f"搜索没有找到 dtlab train 能运行的 {self.ranks} 个 rank 的布局"
                f"（模型 {self.model}，批大小 {self.batch_size}）",
            )
        configs = {layout_label(p): self._config(p) for p in self.layouts}
        measured = run_in_passes(
            configs,
            self.pool,
            warmup=self.warmup,
            passes=self.passes,
            on_run=lambda label, k: self.set_status("race.running", label=label, k=k + 1, passes=self.passes),
        )
        medians = [statistics.median(measured[label]["step_times"]) for label in configs]
        order = _ranks(medians)
        rows = [
            RaceRow(
                label=label,
                config=configs[label],
                plan=plan,
                predicted_rank=i,
                step_times=measured[label]["step_times"],
                runs=measured[label]["runs"],
                measured_rank=order[i - 1],
            )
            for i, (label, plan) in enumerate(zip(configs, self.layouts), 1)
        ]
        tau = kendall_tau([r.predicted_s for r in rows], [r.measured_s for r in rows])
        self.result = RaceResult(rows=rows, kendall_tau=tau, profile=str(self.profile_path), ranks=self.ranks)
        self.set_status("race.done", k=len(rows), passes=self.passes)
        self.relabel()
        return self.result

    def calibrate(self, *, quick: bool = True):
        """Measure this machine (:func:`dtlab.planner.calibrate.calibrate`) on the pool, save the profile where this
        race reads it, and search again; returns the profile."""
        from dtlab.planner.calibrate import calibrate
        from dtlab.planner.profile import save_profile

        self.set_status("race.calibrating")
        profile = calibrate(model=self.model, quick=quick, pool=self.pool)
        save_profile(profile, self.profile_path)
        self._find_layouts()
        return profile

    def submit_run(self) -> None:
        self.submit_request("run")

    def submit_calibrate(self) -> None:
        self.submit_request("calibrate")

    def handle(self, request: str) -> None:
        self.run() if request == "run" else self.calibrate()

    # -- drawing
    def label_args(self) -> dict:
        return {"n": self.passes * self.steps}

    def refresh(self, lang: str) -> None:
        self._draw(lang)

    def _draw(self, lang: str | None = None) -> None:
        lang = lang or get_language()
        rows = self.result.rows if self.result else None
        x = [f"#{i} {layout_label(p)}" for i, p in enumerate(self.layouts, 1)]
        with self.figure.batch_update():
            self.figure.data[0].x, self.figure.data[0].y = x, [p.step_time_s * 1e3 for p in self.layouts]
            self.figure.data[1].x = x if rows else []
            self.figure.data[1].y = [r.measured_s * 1e3 for r in rows] if rows else []
        heads = (
            "race.col.rank",
            "race.col.layout",
            "race.col.predicted",
            "race.col.measured",
            "race.col.measured_rank",
            "race.col.ratio",
        )
        cells = "".join(f"<th style='padding:2px 8px'>{t(h, lang)}</th>" for h in heads)
        lines = [f"<tr>{cells}</tr>"]
        for i, plan in enumerate(self.layouts):
            row = rows[i] if rows else None
            values = (
                i + 1,
                layout_label(plan),
                f"{plan.step_time_s * 1e3:.1f}",
                f"{row.measured_s * 1e3:.1f}" if row else "—",
                row.measured_rank if row else "—",
                f"{row.measured_s / plan.step_time_s:.2f}" if row else "—",
            )
            lines.append("<tr>" + "".join(f"<td style='padding:2px 8px'>{v}</td>" for v in values) + "</tr>")
        summary = (
            f"<p>{t('race.summary', lang, tau=self.result.kendall_tau, fastest=self.result.fastest)}</p>"
            if self.result
            else ""
        )
        self.table.value = f"<table>{''.join(lines)}</table>{summary}"
