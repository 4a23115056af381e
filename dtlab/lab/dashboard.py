"""The live dashboard: loss, throughput, memory per rank and time per rank, as runs stream.

Four plotly ``FigureWidget``s. Records are drawn as they arrive, but at most a
few times a second (``min_interval_s``): a 1,000-step run sends 1,000 records,
and redrawing on each would flood the browser. Every title and axis follows
``dtlab.set_language``.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import ipywidgets as widgets
import plotly.graph_objects as go

from dtlab.i18n import t
from dtlab.lab import labels as _labels  # noqa: F401  (registers the catalogue)
from dtlab.lab.fit import figure, fitting_grid
from dtlab.lab.view import FigureLabels, View

MEMORY_CATEGORIES = ("params", "grads", "master", "optimizer", "activations", "copies", "buffers", "workspace")
TIME_CATEGORIES = ("compute_s", "comm_s", "idle_s")
COLORS = {
    "params": "#4C78A8",
    "grads": "#F58518",
    "optimizer": "#54A24B",
    "master": "#EECA3B",
    "activations": "#E45756",
    "copies": "#B279A2",
    "buffers": "#72B7B2",
    "workspace": "#9D755D",
    "compute_s": "#4C78A8",
    "comm_s": "#F58518",
    "idle_s": "#BAB0AC",
}
CATEGORY_LABELS = {
    "params": "mem.params",
    "grads": "mem.grads",
    "optimizer": "mem.optimizer",
    "master": "mem.master",
    "activations": "mem.activations",
    "copies": "mem.copies",
    "buffers": "mem.buffers",
    "workspace": "mem.workspace",
    "compute_s": "time.compute",
    "comm_s": "time.comm",
    "idle_s": "time.idle",
}


def _figure(*, barmode: str | None = None) -> go.FigureWidget:
    """A plot with no width of its own: it takes its cell's (:func:`dtlab.lab.fit.figure`)."""
    return figure(barmode=barmode)


SHOWN_FIELDS = (
    "cp", "ep", "experts", "zero", "micro_batches", "schedule", "grad_accum", "batch_size",
    "precision", "recompute", "sp", "seq_len", "model",
)  # fmt: skip
"""Fields the header names besides dp, tp and pp, where they differ from TrainConfig's default."""


def describe(config) -> str:
    """``dp=4, tp=1, pp=1`` and every field of ``SHOWN_FIELDS`` set away from its default: what a run is."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    parts = [f"dp={config.dp}", f"tp={config.tp}", f"pp={config.pp}"]
    parts += [f"{name}={getattr(config, name)}" for name in SHOWN_FIELDS if getattr(config, name) != defaults[name]]
    return ", ".join(parts)


def header_text(config, step: int, lang: str | None = None) -> str:
    """The dashboard's header: which run its per-rank plots show, and how far it is (``step k of n``)."""
    if config is None:
        return t("dash.none", lang)
    return t("dash.shown", lang, config=describe(config), step=step, steps=config.steps)


class Dashboard(View):
    """Live plots for one or more training runs.

    ``dash.watch(run)`` draws a run while it streams and returns when it ends
    (the notebook cell stays busy, so the stop button interrupts it);
    ``dash.follow(run)`` does the same in a background thread.
    With a machine profile from ``dtlab calibrate``, the throughput plot
    also shows each run's predicted tokens/s on this machine, dotted
    (:meth:`add_prediction`). ``Dashboard(grad_norm=True)`` adds a fifth plot: each step's global
    gradient norm before clipping (``grad_norm`` of runs with ``clip_grad``).
    """

    figures = {
        "loss": FigureLabels("loss.title", "axis.step", "axis.loss"),
        "speed": FigureLabels("speed.title", "axis.step", "axis.tokens_per_s"),
        "memory": FigureLabels(
            "memory.title", "axis.rank", "axis.bytes", tuple(CATEGORY_LABELS[c] for c in MEMORY_CATEGORIES)
        ),
        "time": FigureLabels(
            "time.title", "axis.rank", "axis.seconds", tuple(CATEGORY_LABELS[c] for c in TIME_CATEGORIES)
        ),
        "grad_norm": FigureLabels("grad_norm.title", "axis.step", "axis.grad_norm"),
    }

    def __init__(self, *, min_interval_s: float = 0.25, grad_norm: bool = False):
        self.min_interval_s = min_interval_s
        self.loss = _figure()
        self.speed = _figure()
        self.memory = _figure(barmode="stack")
        self.time = _figure(barmode="stack")
        with self.memory.batch_update():
            for cat in MEMORY_CATEGORIES:
                self.memory.add_bar(x=[], y=[], marker_color=COLORS[cat])
        with self.time.batch_update():
            for cat in TIME_CATEGORIES:
                self.time.add_bar(x=[], y=[], marker_color=COLORS[cat])
        self.grad_norm = _figure()
        shown = [self.loss, self.speed, self.memory, self.time] + ([self.grad_norm] if grad_norm else [])
        self.header = widgets.HTML()
        self._shown = (None, 0)  # the configuration the per-rank plots show, and its last step drawn
        self.widget = widgets.VBox([self.header, fitting_grid(shown)])  # 2 x 2 (and one), or stacked
        self._runs: list[dict] = []
        self._lock = threading.Lock()
        self.start()

    def refresh(self, lang: str) -> None:
        """The header and the reference curve's name (run curves keep the label they were given)."""
        self.header.value = f"<b>{header_text(*self._shown, lang)}</b>"
        for trace in self.loss.data:
            if getattr(trace, "meta", None) == "reference":
                trace.name = t("trace.reference", lang)
        for trace in self.speed.data:
            meta = getattr(trace, "meta", None)
            if isinstance(meta, dict) and "predicted" in meta:
                trace.name = t("trace.predicted", lang, label=meta["predicted"])

    # -- data
    def add_reference(self, losses: list[float]) -> None:
        """Draw the single-process reference curve (dashed) to compare runs against."""
        self.loss.add_scatter(
            x=list(range(len(losses))),
            y=list(losses),
            mode="lines",
            line=dict(dash="dash", color="black"),
            meta="reference",
            name=t("trace.reference"),
        )

    def add_prediction(self, config, label: str) -> float | None:
        """Draw the planner's tokens/s for ``config`` on this machine, dotted, on the throughput plot.

        The prediction is ``dtlab plan --gpu local``'s step time, from the
        profile ``dtlab calibrate`` wrote (computed here, on the caller's side),
        turned into tokens/s as the records count them. Returns it; None, with
        nothing drawn, without a profile or for a layout the local planner does
        not model.
        """
        from dtlab.i18n import ConfigError
        from dtlab.planner import plan_for_config
        from dtlab.planner.profile import default_path

        if not default_path().is_file():
            return None
        try:
            predicted = plan_for_config(config, gpu="local")
        except ConfigError:
            return None
        tokens_per_s = config.batch_size * config.model_config().seq_len / predicted.step_time_s
        self.speed.add_scatter(
            x=[0, max(config.steps - 1, 1)],
            y=[tokens_per_s] * 2,
            mode="lines",
            line=dict(dash="dot"),
            meta={"predicted": label},
            name=t("trace.predicted", label=label),
        )
        return tokens_per_s

    def add_run(self, label: str, config=None) -> dict:
        """Start new traces (loss, throughput, gradient norm) for a run of ``config``; returns its buffer."""
        self.loss.add_scatter(x=[], y=[], mode="lines+markers", name=label, marker=dict(size=4))
        self.speed.add_scatter(x=[], y=[], mode="lines", name=label)
        self.grad_norm.add_scatter(x=[], y=[], mode="lines+markers", name=label, marker=dict(size=4))
        entry = {
            "loss": self.loss.data[-1],
            "speed": self.speed.data[-1],
            "norm": self.grad_norm.data[-1],
            "steps": [],
            "losses": [],
            "tps": [],
            "norms": [],
            "last": None,
            "config": config,
            "drawn_at": 0.0,
        }
        self._runs.append(entry)
        return entry

    def push(self, entry: dict, record: dict, *, force: bool = False) -> None:
        """Add one step record; redraw if enough time has passed (or ``force``)."""
        if record is not None:
            entry["steps"].append(record["step"])
            entry["losses"].append(record["loss"])
            entry["tps"].append(record["tokens_per_s"])
            entry["norms"].append(record.get("grad_norm"))  # None: no clipping, or an fp16 overflow
            entry["last"] = record
        now = time.monotonic()
        if force or now - entry["drawn_at"] >= self.min_interval_s:
            entry["drawn_at"] = now
            self._draw(entry)

    def _draw(self, entry: dict) -> None:
        with self._lock:
            with self.loss.batch_update():
                entry["loss"].x, entry["loss"].y = list(entry["steps"]), list(entry["losses"])
            with self.speed.batch_update():
                entry["speed"].x, entry["speed"].y = list(entry["steps"]), list(entry["tps"])
            with self.grad_norm.batch_update():
                entry["norm"].x, entry["norm"].y = list(entry["steps"]), list(entry["norms"])
            last = entry["last"]
            if last is None:
                return
            if entry["config"] is not None:  # the header names the run the per-rank plots now show
                self._shown = (entry["config"], last["step"] + 1)
                self.header.value = f"<b>{header_text(*self._shown)}</b>"
            ranks = [f"{r['rank']}" for r in last["ranks"]]
            with self.memory.batch_update():
                for trace, cat in zip(self.memory.data, MEMORY_CATEGORIES):
                    trace.x, trace.y = ranks, [r["mem"].get(cat, 0) for r in last["ranks"]]  # workspace: newer records
            with self.time.batch_update():
                for trace, cat in zip(self.time.data, TIME_CATEGORIES):
                    trace.x, trace.y = ranks, [r[cat] for r in last["ranks"]]

    # -- following a run
    def watch(self, run, label: str | None = None):
        """Draw ``run`` live until it ends; returns the run (its records kept)."""
        cfg = run.config
        label = label or t("trace.run", dp=cfg.dp, tp=cfg.tp, pp=cfg.pp)
        self.add_prediction(cfg, label)  # with a profile from dtlab calibrate only
        entry = self.add_run(label, cfg)
        for record in run:
            self.push(entry, record)
        self.push(entry, None, force=True)
        return run

    def follow(self, run, label: str | None = None, *, on_end=None) -> threading.Thread:
        """Like :meth:`watch`, in a background thread, so the notebook stays free."""

        def consume():
            error = None
            try:
                self.watch(run, label)
            except BaseException as exc:  # noqa: BLE001 - reported to the caller's callback
                error = exc
            if on_end is not None:
                on_end(run, error)

        thread = threading.Thread(target=consume, daemon=True, name="dtlab-dashboard")
        thread.start()
        return thread
