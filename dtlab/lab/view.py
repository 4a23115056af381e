"""What every lab view shares: labels from a table, a status line, a run worker, and a clean exit.

A view is an object with a ``widget`` (a cell ending in the view displays
it). Its class declares, as data, what its labels are:

* ``labels``: widget attribute -> label key, the text of its ``description``
  (sliders, dropdowns, buttons, checkboxes);
* ``figures``: figure attribute -> :class:`FigureLabels`, the title, axis
  titles and trace names of a plotly figure;
* ``clicks`` and ``changes``: button attribute -> method called on a click,
  control attribute -> method called when its value changes.

:meth:`View.start` (the last line of a view's ``__init__``) wires these up
and relabels in the current language; :func:`dtlab.set_language` relabels
again. Keys may use ``{placeholders}`` filled from :meth:`View.label_args`;
text that depends on the view's state (a summary) is redrawn by
:meth:`View.refresh`.

Nothing here keeps a view alive: the language listener, the widget
callbacks and the run worker all hold the view through weak references, so
a view whose cell is re-run is garbage-collected with everything it
registered (ipywidgets itself keeps every widget until it is closed, and a
strong callback from a widget would keep its view too).
"""

from __future__ import annotations

import queue
import threading
import weakref
from dataclasses import dataclass
from typing import ClassVar, Mapping

from dtlab.i18n import DtlabError, get_language, on_language_change, t
from dtlab.lab import labels as _labels  # noqa: F401  (status.error)
from dtlab.lab.fit import set_title

_STOP = object()


@dataclass(frozen=True)
class FigureLabels:
    """Label keys of one plotly figure; ``None`` leaves that text alone."""

    title: str | None = None
    x: str | None = None
    y: str | None = None
    traces: tuple[str | None, ...] = ()
    """Keys of ``figure.data[i].name``, in trace order."""


def _weak_call(view: "View", method: str, *args):
    """A callback that calls ``view.<method>(*args)`` while the view lives, and nothing after."""
    ref = weakref.ref(view)

    def call(*_ignored):
        target = ref()
        if target is not None:
            getattr(target, method)(*args)

    return call


class View:
    """Base of the lab's widget classes (see the module docstring)."""

    widget: object
    labels: ClassVar[Mapping[str, str]] = {}
    figures: ClassVar[Mapping[str, FigureLabels]] = {}
    clicks: ClassVar[Mapping[str, str]] = {}
    changes: ClassVar[Mapping[str, str]] = {}

    _status: tuple[str, dict] | None = None
    _requests: queue.Queue | None = None
    last_error: BaseException | None = None

    def start(self) -> None:
        """Connect buttons and controls, relabel now and on every language change."""
        for attr, method in self.clicks.items():
            getattr(self, attr).on_click(_weak_call(self, method))
        for attr, method in self.changes.items():
            self.on_change(getattr(self, attr), method)
        for attr in self.labels:
            control = getattr(self, attr)
            if hasattr(control, "style") and hasattr(control.style, "description_width"):
                control.style.description_width = "initial"  # long labels are not cut off
        self.relabel(get_language())
        on_language_change(self.relabel)

    def on_change(self, control, method: str, *args) -> None:
        """Call ``self.<method>(*args)`` whenever ``control``'s value changes (held weakly)."""
        control.observe(_weak_call(self, method, *args), names="value")

    # -- labels
    def label_args(self) -> dict:
        """Values for the ``{placeholders}`` in this view's label keys (none by default)."""
        return {}

    def relabel(self, lang: str | None = None) -> None:
        """Every label in ``lang`` (default: the current language), from the tables; then :meth:`refresh`."""
        lang = lang or get_language()
        fmt = self.label_args()
        for attr, key in self.labels.items():
            getattr(self, attr).description = t(key, lang, **fmt)
        for attr, spec in self.figures.items():
            figure = getattr(self, attr)
            with figure.batch_update():
                if spec.title:
                    set_title(figure, t(spec.title, lang, **fmt))  # wrapped to the figure's width
                if spec.x:
                    figure.layout.xaxis.title = t(spec.x, lang, **fmt)
                if spec.y:
                    figure.layout.yaxis.title = t(spec.y, lang, **fmt)
                for trace, key in zip(figure.data, spec.traces):
                    if key:
                        trace.name = t(key, lang, **fmt)
        if self._status is not None:
            key, status_fmt = self._status
            self.status.value = f"<b>{t(key, lang, **status_fmt)}</b>"
        self.refresh(lang)

    def refresh(self, lang: str) -> None:
        """Redraw the text that depends on the view's state (summaries) in ``lang``."""

    # -- the status line (a view that has one keeps it in ``self.status``, an HTML widget)
    def set_status(self, key: str, **fmt) -> None:
        """Show label ``key`` in the status line; it follows later language changes."""
        self._status = (key, fmt)
        self.status.value = f"<b>{t(key, **fmt)}</b>"

    def show_error(self, error: BaseException) -> None:
        """Keep ``error`` in ``last_error`` and show it in the status line in the current language."""
        self.last_error = error
        self.set_status("status.error", message=error.message() if isinstance(error, DtlabError) else repr(error))

    # -- the run worker: one request at a time, always the newest, off the notebook's thread
    def submit_request(self, request) -> None:
        """Queue ``request`` for :meth:`handle` on this view's worker thread.

        A request not started yet is replaced by a newer one (a slider moved
        twice runs once, with its last value). The thread starts on the
        first request and ends when the view is garbage-collected.
        """
        if self._requests is None:
            self._requests = queue.Queue()
            _start_worker(self, self._requests)
        self._requests.put(request)

    def handle(self, request) -> None:
        """Carry out one request (on the worker thread); an error is shown by :meth:`show_error`."""
        raise NotImplementedError

    # -- display
    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)


class StepView(View):
    """A view that steps an algorithm over N ranks: a ranks slider, **Step** and **Reset** buttons.

    A subclass makes the controls with :meth:`step_controls` in its ``__init__``
    (before :meth:`View.start`), says how many steps there are
    (``total_steps``) and draws ``steps_done`` of them in :meth:`View.refresh`;
    ``step()`` and ``reset()`` are what the buttons call (and what tests call).
    """

    labels = {"ranks": "ctl.ranks", "step_button": "ctl.step", "reset_button": "ctl.reset"}
    clicks = {"step_button": "step", "reset_button": "reset"}
    changes = {"ranks": "reset"}
    steps_done = 0

    def step_controls(self, ranks: int, **slider) -> None:
        """The ranks slider (2 to 8) and the two buttons, at step 0."""
        import ipywidgets as widgets

        self.ranks = widgets.IntSlider(value=ranks, min=2, max=8, **slider)
        self.step_button = widgets.Button(icon="step-forward", button_style="primary")
        self.reset_button = widgets.Button(icon="undo")
        self.steps_done = 0

    def step_table(self, ranks: int, **slider) -> None:
        """The controls above one HTML ``table``: the whole widget of a view drawn as a table."""
        import ipywidgets as widgets

        self.step_controls(ranks, **slider)
        self.table = widgets.HTML()
        self.widget = widgets.VBox([widgets.HBox([self.ranks, self.step_button, self.reset_button]), self.table])

    @property
    def total_steps(self) -> int:
        raise NotImplementedError

    def step(self) -> None:
        """One more step (stays at the last one)."""
        self.steps_done = min(self.steps_done + 1, self.total_steps)
        self.refresh(get_language())

    def reset(self) -> None:
        """Back to before the first step."""
        self.steps_done = 0
        self.refresh(get_language())


def _start_worker(view: View, requests: queue.Queue) -> None:
    ref = weakref.ref(view)
    weakref.finalize(view, requests.put, _STOP)

    def serve():
        while True:
            batch = [requests.get()]
            while not requests.empty():  # skip requests already superseded
                batch.append(requests.get())
            target = ref()
            if _STOP in batch or target is None:
                return
            try:
                target.handle(batch[-1])
            except BaseException as error:  # noqa: BLE001 - shown in the view, kept for the caller
                target.show_error(error)
            del target  # hold the view only while it works

    threading.Thread(target=serve, daemon=True, name=f"dtlab-{type(view).__name__}").start()
