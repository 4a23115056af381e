"""A small control panel: sliders that start a real run on the warm pool.

Moving a slider while a run is going asks that run to stop at its next step
(:meth:`TrainingRun.stop`: the ranks agree on it collectively), then starts
the new configuration on the *same* processes, so a slider never pays process
start-up again. Bad values are reported in the panel in the current language
before anything starts.
"""

from __future__ import annotations

import dataclasses

import ipywidgets as widgets

from dtlab.config import MODEL_PRESETS, TrainConfig, field_types
from dtlab.i18n import DtlabError
from dtlab.lab import labels as _labels  # noqa: F401
from dtlab.lab.dashboard import Dashboard
from dtlab.lab.view import View
from dtlab.launch import RankPool, default_pool

# ``show=`` names a panel's widgets by TrainConfig field; these short names also work.
ALIASES = {"micro": "micro_batches", "accum": "grad_accum", "batch": "batch_size"}
LABEL_KEYS = {
    "dp": "ctl.dp",
    "tp": "pl.tp",
    "pp": "pl.pp",
    "micro_batches": "pl.m",
    "schedule": "ctl.schedule",
    "zero": "pl.zero",
    "grad_accum": "ctl.accum",
    "batch_size": "ctl.batch",
    "steps": "ctl.steps",
    "lr": "ctl.lr",
    "model": "ctl.model",
    "seed": "ctl.seed",
    "precision": "pl.precision",
    "recompute": "pl.recompute",
    "experts": "ctl.experts",
    "top_k": "ctl.top_k",
    "ep": "ctl.ep",
    "cp": "ctl.cp",
    "sp": "ctl.sp",
    "seq_len": "ctl.seq_len",
}


def field_widget(name: str, value, *, max_ranks: int = 8) -> widgets.Widget:
    """The widget that sets TrainConfig's field ``name``, starting at ``value``.

    A few fields get the slider a lesson wants (its range is a teaching choice);
    any other field gets one from its type: a ``Literal`` a dropdown of its
    choices, a ``bool`` a checkbox, a number or a string a text box.
    """
    sliders = {
        "dp": lambda: widgets.IntSlider(value=value, min=1, max=min(8, max_ranks)),
        "tp": lambda: widgets.SelectionSlider(options=[1, 2, 4, 8], value=value),
        "pp": lambda: widgets.SelectionSlider(options=[1, 2, 4, 8], value=value),
        "micro_batches": lambda: widgets.IntSlider(value=value, min=1, max=16),
        "grad_accum": lambda: widgets.IntSlider(value=value, min=1, max=8),
        "batch_size": lambda: widgets.IntSlider(value=value, min=1, max=64),
        "steps": lambda: widgets.IntSlider(value=value, min=1, max=1000),
        "lr": lambda: widgets.FloatLogSlider(value=value, base=10, min=-5, max=-1, readout_format=".1e"),
        "model": lambda: widgets.Dropdown(options=list(MODEL_PRESETS), value=value),
        "experts": lambda: widgets.SelectionSlider(options=[0, 2, 4, 8], value=value),
        "top_k": lambda: widgets.IntSlider(value=value, min=1, max=4),
        "ep": lambda: widgets.SelectionSlider(options=[1, 2, 4, 8], value=value),
        "cp": lambda: widgets.SelectionSlider(options=[1, 2, 4, 8], value=value),
        # unset (None) is the model's own length; the slider starts at the small GPT's 64
        "seq_len": lambda: widgets.SelectionSlider(options=[64, 128, 256, 512, 1024], value=value or 64),
    }
    if name in sliders:
        return sliders[name]()
    allowed = TrainConfig.choices(name)
    if allowed and all(isinstance(a, int) for a in allowed):  # the ZeRO stage
        return widgets.IntSlider(value=value, min=min(allowed), max=max(allowed))
    if allowed:
        return widgets.Dropdown(options=list(allowed), value=value)
    by_type = {bool: widgets.Checkbox, int: widgets.IntText, float: widgets.FloatText, str: widgets.Text}
    kind = field_types(TrainConfig)[name]
    if kind not in by_type:
        raise TypeError(f"TrainConfig.{name} ({kind}) has no control; set it in the base config")
    return by_type[kind](value=value)


class ControlPanel(View):
    """Sliders for one training job and a live :class:`Dashboard` beneath them.

    ``show`` names the TrainConfig fields the panel controls (or an alias in
    ``ALIASES``); the rest come from ``config``. ``panel.fields`` maps each
    shown field to its widget, also reachable as ``panel.dp``, ``panel.accum``...
    """

    labels = {"auto": "ctl.auto", "run_button": "ctl.run", "stop_button": "ctl.stop"}  # + shown fields'
    clicks = {"run_button": "submit", "stop_button": "stop"}

    def __init__(
        self,
        config: TrainConfig | None = None,
        *,
        pool: RankPool | None = None,
        dashboard: Dashboard | None = None,
        auto_run: bool = True,
        show: tuple[str, ...] = ("dp", "accum", "batch", "steps", "lr", "model", "seed"),
        reference: bool = False,
    ):
        base = config or TrainConfig(steps=40)
        self.base = base
        self.pool = pool or default_pool()
        self.dashboard = dashboard or Dashboard()
        names = [ALIASES.get(name, name) for name in show]
        self.fields = {name: field_widget(name, getattr(base, name), max_ranks=self.pool.max_size) for name in names}
        self.auto = widgets.Checkbox(value=auto_run)
        self.run_button = widgets.Button(button_style="primary", icon="play")
        self.stop_button = widgets.Button(icon="stop")
        self.status = widgets.HTML()
        self.prediction = widgets.HTML()
        self.controls = list(self.fields.values())
        rows = [widgets.HBox(self.controls[i : i + 3]) for i in range(0, len(self.controls), 3)]
        self.widget = widgets.VBox(
            [
                *rows,
                widgets.HBox([self.auto, self.run_button, self.stop_button]),
                self.status,
                self.prediction,
                self.dashboard.widget,
            ]
        )
        self._references: set = set()
        self.reference = reference
        self.current = None
        for name, control in self.fields.items():
            self.on_change(control, "_on_change")
            if name not in LABEL_KEYS:  # a field no label is written for shows its name
                control.description, control.style.description_width = name, "initial"
        self.labels = {**self.labels, **{name: LABEL_KEYS[name] for name in self.fields if name in LABEL_KEYS}}
        self.set_status("status.idle")
        self.start()

    def __getattr__(self, name: str):
        """``panel.dp``, ``panel.accum``: the widget of a shown field, by its name or alias."""
        fields = self.__dict__.get("fields", {})
        if ALIASES.get(name, name) in fields:
            return fields[ALIASES.get(name, name)]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def refresh(self, lang: str) -> None:
        self._predict(self.config())

    def config(self) -> TrainConfig:
        """The configuration the widgets describe now (validated when submitted)."""
        return dataclasses.replace(self.base, **{name: w.value for name, w in self.fields.items()})

    def _on_change(self) -> None:
        if self.auto.value:
            self.submit()

    def submit(self) -> None:
        """Validate the sliders' configuration and queue it (replacing any pending one)."""
        try:
            config = self.config().validate(max_world_size=self.pool.max_size)
        except DtlabError as error:
            self.show_error(error)
            return
        self._predict(config)
        if self.current is not None and not self.current.finished:
            self.current.stop()  # graceful: the ranks finish their step and stay warm
        self.submit_request(config)

    def stop(self) -> None:
        if self.current is not None and not self.current.finished:
            self.current.stop()

    def handle(self, config: TrainConfig) -> None:
        """Run ``config`` on the pool, drawn live (on the view's worker: one run at a time, the newest)."""
        import dtlab.train

        self.set_status("status.running", dp=config.dp, world=config.world_size)
        self._draw_reference(config)
        run = dtlab.train.start(config, pool=self.pool)
        self.current = run
        self.dashboard.watch(run)
        summary = run.summary or {}
        if summary.get("stopped_early"):
            self.set_status("status.stopped", steps=summary["steps"])
        else:
            self.set_status(
                "status.done",
                steps=summary.get("steps", 0),
                loss=summary.get("final_loss") if summary.get("final_loss") is not None else float("nan"),
                tps=summary.get("mean_tokens_per_s", 0.0),
            )

    def _draw_reference(self, config: TrainConfig) -> None:
        """The single-process loss for the same model, data and steps (computed once per setting)."""
        if not self.reference:
            return
        from dtlab.reference import reference_train

        key = (config.model, config.steps, config.batch_size, config.lr, config.seed, config.warmup)
        if key not in self._references:
            self._references.add(key)
            single = dataclasses.replace(config, dp=1, tp=1, pp=1, micro_batches=1, zero=0, grad_accum=1)
            self.dashboard.add_reference(reference_train(single)[0])

    def _predict(self, config: TrainConfig) -> None:
        """The planner's numbers for this layout, here and on 1,024 GPUs (labelled a prediction)."""
        from dtlab.lab.prediction import prediction_html

        try:
            self.prediction.value = prediction_html(config)
        except DtlabError as error:
            self.prediction.value = error.message()
