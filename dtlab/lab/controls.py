"""A small control panel: sliders that start a real run on the warm pool.

Moving a slider while a run is going asks that run to stop at its next step
(:meth:`TrainingRun.stop`: the ranks agree on it collectively), then starts
the new configuration on the *same* processes, so a slider never pays process
start-up again. Bad values are reported in the panel in the current language
before anything starts.
"""
from __future__ import annotations

import dataclasses
import queue
import threading

import ipywidgets as widgets

from dtlab.config import MODEL_PRESETS, TrainConfig
from dtlab.i18n import DtlabError, get_language, on_language_change, t
from dtlab.lab import labels as _labels  # noqa: F401
from dtlab.lab.dashboard import Dashboard
from dtlab.launch import RankPool, default_pool
from dtlab.lab.view import View


class ControlPanel(View):
    """Sliders for one training job and a live :class:`Dashboard` beneath them."""

    def __init__(self, config: TrainConfig | None = None, *, pool: RankPool | None = None,
                 dashboard: Dashboard | None = None, auto_run: bool = True,
                 show: tuple[str, ...] = ("dp", "accum", "batch", "steps", "lr", "model", "seed"),
                 reference: bool = False):
        base = config or TrainConfig(steps=40)
        self.base = base
        self.pool = pool or default_pool()
        self.dashboard = dashboard or Dashboard()
        self.dp = widgets.IntSlider(value=base.dp, min=1, max=min(8, self.pool.max_size))
        self.accum = widgets.IntSlider(value=base.grad_accum, min=1, max=8)
        self.batch = widgets.IntSlider(value=base.batch_size, min=1, max=64)
        self.steps = widgets.IntSlider(value=base.steps, min=1, max=1000)
        self.lr = widgets.FloatLogSlider(value=base.lr, base=10, min=-5, max=-1, readout_format=".1e")
        self.model = widgets.Dropdown(options=list(MODEL_PRESETS), value=base.model)
        self.seed = widgets.IntText(value=base.seed)
        self.tp = widgets.SelectionSlider(options=[1, 2, 4, 8], value=base.tp)
        self.pp = widgets.SelectionSlider(options=[1, 2, 4, 8], value=base.pp)
        self.micro = widgets.IntSlider(value=base.micro_batches, min=1, max=16)
        self.schedule = widgets.Dropdown(options=["1f1b", "gpipe"], value=base.schedule)
        self.zero = widgets.IntSlider(value=base.zero, min=0, max=3)
        self.auto = widgets.Checkbox(value=auto_run)
        self.run_button = widgets.Button(button_style="primary", icon="play")
        self.stop_button = widgets.Button(icon="stop")
        self.status = widgets.HTML()
        self.prediction = widgets.HTML()
        by_name = {"dp": self.dp, "tp": self.tp, "pp": self.pp, "micro": self.micro,
                   "schedule": self.schedule, "zero": self.zero, "accum": self.accum,
                   "batch": self.batch, "steps": self.steps, "lr": self.lr, "model": self.model,
                   "seed": self.seed}
        self.controls = [by_name[name] for name in show]
        rows = [widgets.HBox(self.controls[i:i + 3]) for i in range(0, len(self.controls), 3)]
        self.widget = widgets.VBox([
            *rows, widgets.HBox([self.auto, self.run_button, self.stop_button]),
            self.status, self.prediction, self.dashboard.widget])
        self._references: set = set()
        self.reference = reference
        self.current = None
        self.last_error: BaseException | None = None
        self._requests: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._serve, daemon=True, name="dtlab-controls")
        self._worker.start()
        self.run_button.on_click(lambda _: self.submit())
        self.stop_button.on_click(lambda _: self.stop())
        for control in self.controls:
            control.observe(self._on_change, names="value")
        self.relabel(get_language())
        on_language_change(self.relabel)
        self._set_status("status.idle")
        self._predict(self.base)


    def relabel(self, lang: str) -> None:
        for control, key in [(self.tp, "pl.tp"), (self.pp, "pl.pp"), (self.micro, "pl.m"),
                             (self.schedule, "ctl.schedule"), (self.zero, "pl.zero"),
                             (self.dp, "ctl.dp"), (self.accum, "ctl.accum"), (self.batch, "ctl.batch"),
                             (self.steps, "ctl.steps"), (self.lr, "ctl.lr"), (self.model, "ctl.model"),
                             (self.seed, "ctl.seed"), (self.auto, "ctl.auto")]:
            control.description = t(key, lang)
            control.style = {"description_width": "initial"}
        self.run_button.description = t("ctl.run", lang)
        if hasattr(self, "prediction"):
            self._predict(self.config())
        self.stop_button.description = t("ctl.stop", lang)

    def config(self) -> TrainConfig:
        """The configuration the sliders describe now (validated when submitted)."""
        return dataclasses.replace(self.base, dp=self.dp.value, tp=self.tp.value, pp=self.pp.value,
                                   micro_batches=self.micro.value, schedule=self.schedule.value,
                                   zero=self.zero.value, grad_accum=self.accum.value,
                                   batch_size=self.batch.value, steps=self.steps.value,
                                   lr=self.lr.value, model=self.model.value, seed=self.seed.value)

    def _on_change(self, _change) -> None:
        if self.auto.value:
            self.submit()

    def submit(self) -> None:
        """Validate the sliders' configuration and queue it (replacing any pending one)."""
        try:
            config = self.config().validate(max_world_size=self.pool.max_size)
        except DtlabError as error:
            self.last_error = error
            self._set_status("status.error", message=error.message())
            return
        self._predict(config)
        if self.current is not None and not self.current.finished:
            self.current.stop()  # graceful: the ranks finish their step and stay warm
        self._requests.put(config)

    def stop(self) -> None:
        if self.current is not None and not self.current.finished:
            self.current.stop()

    def _serve(self) -> None:
        """One run at a time, always the newest request."""
        import dtlab.train

        while True:
            config = self._requests.get()
            while not self._requests.empty():  # skip configurations already superseded
                config = self._requests.get()
            self._set_status("status.running", dp=config.dp, world=config.world_size)
            try:
                self._draw_reference(config)
                run = dtlab.train.start(config, pool=self.pool)
                self.current = run
                self.dashboard.watch(run)
                summary = run.summary or {}
                if summary.get("stopped_early"):
                    self._set_status("status.stopped", steps=summary["steps"])
                else:
                    self._set_status("status.done", steps=summary.get("steps", 0),
                                     loss=summary.get("final_loss", float("nan")),
                                     tps=summary.get("mean_tokens_per_s", 0.0))
            except BaseException as error:  # noqa: BLE001 - shown in the panel, kept for the caller
                self.last_error = error
                message = error.message() if isinstance(error, DtlabError) else repr(error)
                self._set_status("status.error", message=message)

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

    def _set_status(self, key: str, **fmt) -> None:
        self.status.value = f"<b>{t(key, **fmt)}</b>"
