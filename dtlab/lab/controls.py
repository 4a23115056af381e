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
from dtlab.lab.fit import row
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


CANDIDATES = {
    "dp": tuple(range(1, 9)),
    "tp": (1, 2, 4, 8),
    "pp": (1, 2, 4, 8),
    "micro_batches": tuple(range(1, 17)),
    "grad_accum": tuple(range(1, 9)),
    "batch_size": tuple(range(1, 65)),
    "experts": (0, 2, 4, 8),
    "top_k": (1, 2, 3, 4),
    "ep": (1, 2, 4, 8),
    "cp": (1, 2, 4, 8),
    "seq_len": (64, 128, 256, 512, 1024),
}
"""The values each layout slider can take (its range is a teaching choice); it offers those of them that
the rest of the panel allows (:func:`allowed_values`)."""


def allowed_values(config: TrainConfig, name: str, *, max_ranks: int, candidates=None) -> list:
    """The values of ``candidates`` (default ``CANDIDATES[name]``) that make a valid run with every other
    field as in ``config``.

    TrainConfig's own validation decides (one home for the rules): a DP degree that divides the global
    batch, a TP degree that divides the heads, a PP degree that divides the layers, no more ranks than the
    pool has... The current value is always kept, so the slider still shows what the panel holds.
    """
    current = getattr(config, name)
    allowed = []
    for value in CANDIDATES[name] if candidates is None else candidates:
        try:
            dataclasses.replace(config, **{name: value}).validate(max_world_size=max_ranks)
        except (DtlabError, ValueError, TypeError):
            if value != current:
                continue
        allowed.append(value)
    if current not in allowed:  # a value off the candidates (seq_len None: the model's own) stays shown
        allowed = [*allowed, current]
        if candidates is None:
            allowed.sort(key=lambda v: (v is None, v or 0))
    return allowed


def field_widget(name: str, value, *, max_ranks: int = 8) -> widgets.Widget:
    """The widget that sets TrainConfig's field ``name``, starting at ``value``.

    A layout field (``CANDIDATES``) gets a slider of the values it may take
    (narrowed by :meth:`ControlPanel.narrow` to those the panel allows); a few
    others a slider with a lesson's range; any other field a widget from its
    type: a ``Literal`` a dropdown of its choices, a ``bool`` a checkbox, a
    number or a string a text box.
    """
    if name in CANDIDATES:
        if name == "seq_len" and value is None:
            value = 64  # unset (None) is the model's own length; the slider starts at the small GPT's 64
        options = list(CANDIDATES[name]) if value in CANDIDATES[name] else sorted([*CANDIDATES[name], value])
        if name == "dp":
            options = [v for v in options if v <= max(max_ranks, value)]
        return widgets.SelectionSlider(options=options, value=value)
    sliders = {
        "steps": lambda: widgets.IntSlider(value=value, min=1, max=1000),
        "lr": lambda: widgets.FloatLogSlider(value=value, base=10, min=-5, max=-1, readout_format=".1e"),
        "model": lambda: widgets.Dropdown(options=list(MODEL_PRESETS), value=value),
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
        rows = [row(self.controls[i : i + 3]) for i in range(0, len(self.controls), 3)]  # wrap when narrow
        self.widget = widgets.VBox(
            [
                *rows,
                row([self.auto, self.run_button, self.stop_button]),
                self.status,
                self.prediction,
                self.dashboard.widget,
            ]
        )
        self._references: set = set()
        self.reference = reference
        self.current = None
        self._asked = 0  # requests made (valid or refused): a run's status shows only while it is the newest
        self._narrowing = False
        self._choices: dict[str, list] = {}  # each dropdown's every choice, before narrowing
        self.narrow()
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

    def narrow(self) -> None:
        """Offer on each layout slider and dropdown only the values the other controls allow
        (``allowed_values``); a checkbox whose other value is refused is disabled."""
        if self._narrowing:
            return
        self._narrowing = True  # options changed here are not a learner's move
        try:
            config = self.config()
            for name, control in self.fields.items():
                if isinstance(control, widgets.Checkbox):  # disabled where the other value is refused
                    allowed = allowed_values(config, name, max_ranks=self.pool.max_size, candidates=(False, True))
                    control.disabled = len(allowed) < 2
                    continue
                if name in CANDIDATES:
                    options = allowed_values(config, name, max_ranks=self.pool.max_size)
                elif isinstance(control, widgets.Dropdown):  # a choice (model, schedule...) narrows too
                    every = self._choices.setdefault(name, list(control.options))
                    options = allowed_values(config, name, max_ranks=self.pool.max_size, candidates=every)
                    options = [o for o in every if o in options]  # in the dropdown's own order
                else:
                    continue
                if list(control.options) != options:
                    value = control.value
                    control.options = options
                    control.value = value
        finally:
            self._narrowing = False

    def _on_change(self) -> None:
        if self._narrowing:
            return
        self.narrow()
        if self.auto.value:
            self.submit()

    def submit(self) -> None:
        """Validate the sliders' configuration and queue it (replacing any pending one).

        A refused configuration stops the run that is going (the controls no
        longer describe it) and its error stays in the status line until a
        valid run replaces it: a run queued before the refusal never reports.
        """
        self._asked += 1
        try:
            config = self.config().validate(max_world_size=self.pool.max_size)
        except DtlabError as error:
            self.stop()
            self.show_error(error)
            return
        self._predict(config)
        self.stop()  # graceful: the ranks finish their step and stay warm
        self.submit_request((self._asked, config))

    def stop(self) -> None:
        if self.current is not None and not self.current.finished:
            self.current.stop()

    def handle(self, request) -> None:
        """Run a request's config on the pool, drawn live (on the view's worker: one run at a time, the newest).

        ``request``: ``(number, config)`` as :meth:`submit` queues it, or a validated config alone.
        """
        import dtlab.train

        asked, config = request if isinstance(request, tuple) else (self._asked, request)
        if asked != self._asked:
            return  # the controls moved on (a newer run is queued, or a refusal is shown)
        self.set_status("status.running", dp=config.dp, world=config.world_size)
        self._draw_reference(config)
        run = dtlab.train.start(config, pool=self.pool)
        self.current = run  # set before the check below: a move from now on stops it in submit()
        if asked != self._asked:
            run.stop()  # the controls moved while it started: it ends at its next step, not its last
        self.dashboard.watch(run)
        summary = run.summary or {}
        if asked != self._asked:
            return  # stopped for a newer request: its status, or its refusal, stays
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
