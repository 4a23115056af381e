"""A long library call's progress in the notebook: a bar and the stage it is at, under the cell.

``calibrate()`` and the other long calls say their stages through
:mod:`dtlab.config.command_progress`; in a terminal command they go to
stderr. Importing :mod:`dtlab.lab` registers :func:`view_in_kernel`, so that
called from a notebook they draw this widget instead: the stage (k of n),
what it measures in the learner's language and the seconds so far; green
with "done in N s" at the end, red where the call stopped on an error.
"""

from __future__ import annotations

from dtlab.config.command_progress import set_notebook_view


class ProgressView:
    """An ``IntProgress`` bar and a label, displayed once, updated at each stage."""

    def __init__(self):
        import ipywidgets as widgets
        from IPython.display import display

        self.bar = widgets.IntProgress(min=0, max=1, value=0, layout=widgets.Layout(width="160px"))
        self.label = widgets.Label()
        self.box = widgets.HBox([self.bar, self.label], layout=widgets.Layout(flex_flow="row wrap"))
        display(self.box)

    def show(self, index: int, total: int | None, text: str) -> None:
        """Stage ``index`` of ``total`` (None: not known yet) begins; ``text`` says what it measures."""
        self.bar.max = max(total or index, 1)
        self.bar.value = max(index - 1, 0)  # the stages finished so far
        self.label.value = text

    def end(self, text: str, ok: bool) -> None:
        """The call ended: finished (a full green bar) or stopped by an error (red)."""
        self.bar.value, self.bar.bar_style = self.bar.max, "success" if ok else "danger"
        self.label.value = text


def view_in_kernel() -> ProgressView | None:
    """A :class:`ProgressView` when this runs in a notebook kernel (where widgets can be drawn), else None."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return None
    return ProgressView()


set_notebook_view(view_in_kernel)
