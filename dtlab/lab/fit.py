"""Figures that fit the output area they are drawn in, at any window width.

A plotly ``FigureWidget`` with a fixed ``width`` runs past the right edge of
a narrow output area, and one without a width is drawn at plotly's default
of 700 px when its element is not yet in the page (the widget renders before
JupyterLab attaches it). So every lab figure here:

* has no pixel width of its own (:func:`figure`: ``autosize``, plotly's
  ``responsive`` config);
* sits in a :func:`fitting_grid` cell whose width comes from the output area,
  two or more to a row when there is room, one under the other when not;
* is redrawn to its cell's width whenever that cell changes size (window
  resize, the file browser opened or closed, the cell first shown), by a small
  script (:class:`PlotResizer`) that watches the grid with a ``ResizeObserver``;
* keeps its title within its width: long titles wrap (:func:`wrap_title`).

A figure whose widget cannot be drawn (a page reloaded while the kernel runs:
the figures' models are not restored) leaves a bilingual note in its place
asking to re-run the cell, instead of an empty space.

Every lab figure is a :class:`FigureWidget`, which keeps the state a new view
is drawn from up to date until one view has been drawn (see the class).
"""

from __future__ import annotations

import copy

import anywidget
import ipywidgets as widgets
import plotly.graph_objects as go
import traitlets

from dtlab.i18n import register

register(
    {
        "fit.rerun": (
            "↻ The figure is not drawn (the page was reloaded?): run this cell again to draw it.",
            "↻ 图表没有显示（页面刷新过？）：重新运行这个单元格即可重新绘制。",
        ),
    }
)

TITLE_UNITS = 36
"""A title's line length, in Latin characters (a CJK character counts 2): what fits a 360 px cell at
plotly's 17 px title font."""
MIN_CELL_PX = 360

CSS = """<style>
.dtlab-fit .dtlab-cell > * { flex: 1 1 100%; min-width: 0; max-width: 100%; }
.dtlab-fit .js-plotly-plot { width: 100% !important; }
.dtlab-fit .dtlab-rerun { visibility: hidden; max-height: 0; overflow: hidden; color: #8a6d3b; }
.dtlab-fit:not(:has(.js-plotly-plot)) .dtlab-rerun { animation: dtlab-late 0.1s 4s forwards; }
@keyframes dtlab-late { to { visibility: visible; max-height: 6em; } }
</style>"""
"""Each plot's element takes its cell's width (not its content's), so plotly measures the cell. The
re-run note shows only where, 4 s after the output appeared, the box still holds no plotly plot."""

RESIZER_JS = """
function render({ el }) {
  let box = null, timer = null, tries = 0;
  const observers = [];
  // Redraw a plot whose drawn width differs from its element's (only then: no redraw loop).
  const fit = () => {
    timer = null;
    let fallback = false;
    for (const plot of box.querySelectorAll('.js-plotly-plot')) {
      const drawn = plot._fullLayout && plot._fullLayout.width;
      if (!drawn || !plot.clientWidth || Math.abs(drawn - plot.clientWidth) <= 1) continue;
      if (plot._responsiveChartHandler) plot._responsiveChartHandler();
      else fallback = true;
    }
    if (fallback) window.dispatchEvent(new Event('resize'));
  };
  const soon = () => { if (box && !timer) timer = setTimeout(fit, 80); };
  const attach = () => {
    box = el.closest('.dtlab-fit');
    if (!box) {  // not in the page yet: try again next frame (for at most about 30 s)
      if (tries++ < 1800) requestAnimationFrame(attach);
      return;
    }
    const sizes = new ResizeObserver(soon);
    sizes.observe(box);
    const added = new MutationObserver(soon);
    added.observe(box, { childList: true, subtree: true });
    observers.push(sizes, added);
    soon();
  };
  attach();
  return () => observers.forEach((o) => o.disconnect());
}
export default { render };
"""


class PlotResizer(anywidget.AnyWidget):
    """Redraws the plotly plots of the grid it sits in to their cells' widths (see the module docstring)."""

    _esm = traitlets.Unicode(RESIZER_JS).tag(sync=True)


def _then_resend(send):
    """plotly's ``send`` of a one-off change message, followed by :meth:`FigureWidget._resend_state`."""

    def sending(self, *args, **kwargs):
        send(self, *args, **kwargs)
        self._resend_state()

    return sending


class FigureWidget(go.FigureWidget):
    """A plotly ``FigureWidget`` whose views are drawn from the figure as it is, even on a busy machine.

    Under load (other runs sharing the cores), ``tools/browser_course.py`` found lab figures drawn
    empty: no title, no traces, plotly's default 700 px, past their output area (lessons 00, 08, 10,
    11 and 14, intermittently). That is what a view draws from the state plotly's widget opens
    with, because of how a plotly widget reaches the page:

    * ipywidgets opens the page's copy at the start of plotly's ``__init__``, with empty defaults;
      the data, the layout and the config follow as updates. A view drawn before they are
      applied starts empty, and a config without ``responsive`` never follows its cell's width.
    * Each later change (a title, new traces) is a one-off message that the page's copy applies to
      its state once plotly's script for the figure (a 5 MB module) has loaded; one that arrives
      before is not applied, and a view drawn afterwards starts without it.

    So this figure opens its copy only once it is whole (:meth:`open`), responsive and ``autosize``
    from the start, and, until a view reports being drawn (plotly's first ``_js2py_traceDeltas``),
    sends its whole state again with every change. After that only the one-off messages go.
    """

    _dtlab_whole = False

    def __init__(self, data=None, layout=None, **kwargs):
        super().__init__(data=data, layout=layout, **kwargs)
        self._dtlab_drawn = False
        self.observe(self._on_trace_deltas, names="_js2py_traceDeltas")
        responsive(self)  # before the page's copy opens (its state resent: part of the first one)
        self._dtlab_whole = True
        self.open()

    def open(self) -> None:
        """Open the page's copy only once the figure is whole (ipywidgets opens it at the start of
        plotly's ``__init__``, before the data, layout and config are set), so that its first state is
        the whole figure, not plotly's empty defaults."""
        if self._dtlab_whole:
            super().open()

    def _on_trace_deltas(self, change) -> None:
        if change["new"]:
            self._dtlab_drawn = True

    def _resend_state(self) -> None:
        # (While plotly's __init__ runs there is no flag yet: it syncs the whole state itself at its end.)
        if not getattr(self, "_dtlab_drawn", True):
            self._widget_layout = copy.deepcopy(self._layout_obj._props)
            self._widget_data = copy.deepcopy(self._data)

    _send_relayout_msg = _then_resend(go.FigureWidget._send_relayout_msg)
    _send_restyle_msg = _then_resend(go.FigureWidget._send_restyle_msg)
    _send_addTraces_msg = _then_resend(go.FigureWidget._send_addTraces_msg)
    _send_moveTraces_msg = _then_resend(go.FigureWidget._send_moveTraces_msg)
    _send_update_msg = _then_resend(go.FigureWidget._send_update_msg)
    _send_animate_msg = _then_resend(go.FigureWidget._send_animate_msg)
    _send_deleteTraces_msg = _then_resend(go.FigureWidget._send_deleteTraces_msg)


def figure(*, height: int = 300, margin: dict | None = None, legend: dict | None = None, **layout) -> go.FigureWidget:
    """A plotly figure with no width of its own: it takes its cell's (``autosize``, redrawn on resize)."""
    return responsive(
        FigureWidget(
            layout=go.Layout(
                height=height,
                margin=margin or dict(l=60, r=10, t=40, b=40),
                legend=legend if legend is not None else dict(orientation="h", y=-0.25),
                **layout,
            )
        )
    )


def static_figure(**layout) -> go.Figure:
    """A plotly ``Figure`` (drawn once, no widget) with no width of its own: it takes its output's."""
    fig = go.Figure(layout=go.Layout(autosize=True, **layout))
    fig.layout.width = None
    return fig


def fitting_grid(figures, *, min_px: int = MIN_CELL_PX) -> widgets.VBox:
    """Plots side by side as the output area allows, one under the other when it is narrow.

    Each plot sits in a cell of at least ``min_px`` that shares the row's
    width and has no pixel width of its own, so no plot runs past the output
    area's right edge (the browser test checks every lesson's figures).
    One figure alone takes the whole width.
    """
    cells = []
    for fig in figures:
        cell = widgets.Box([fig], layout=widgets.Layout(width="100%", min_width="0", overflow="hidden"))
        cell.add_class("dtlab-cell")
        cells.append(cell)
    grid = widgets.GridBox(
        cells,
        layout=widgets.Layout(
            width="100%", grid_template_columns=f"repeat(auto-fit, minmax(min({min_px}px, 100%), 1fr))", grid_gap="4px"
        ),
    )
    from dtlab.i18n import t

    note = widgets.HTML(f'{CSS}<div class="dtlab-rerun">{t("fit.rerun", "en")}<br>{t("fit.rerun", "zh")}</div>')
    box = widgets.VBox([note, PlotResizer(), grid], layout=widgets.Layout(width="100%"))
    box.add_class("dtlab-fit")
    return box


def fitted(fig) -> widgets.VBox:
    """One figure in a box that fits the output area (:func:`fitting_grid` of one)."""
    return fitting_grid([fig])


def row(children, **layout) -> widgets.HBox:
    """Controls side by side that wrap onto the next line where the output area is narrow."""
    return widgets.HBox(list(children), layout=widgets.Layout(flex_flow="row wrap", **layout))


def _units(ch: str) -> int:
    return 2 if ord(ch) > 0x2E80 else 1


def wrap_title(text: str, units: int = TITLE_UNITS) -> str:
    """``text`` broken into lines (``<br>``) of at most ``units`` (a CJK character counts 2).

    Latin text breaks between words; CJK text between any two characters, but
    never inside a run of Latin letters or digits. Existing ``<br>`` are kept.
    """
    lines = []
    for paragraph in text.split("<br>"):
        tokens, word = [], ""
        for ch in paragraph:  # words (with their trailing space) and single CJK characters
            if _units(ch) == 2:
                tokens += [word] if word else []
                tokens.append(ch)
                word = ""
            else:
                word += ch
                if ch == " ":
                    tokens.append(word)
                    word = ""
        tokens += [word] if word else []
        line = ""
        for token in tokens:
            if line and sum(map(_units, line + token.rstrip())) > units:
                lines.append(line.rstrip())
                line = token.lstrip()
            else:
                line += token
        lines.append(line.rstrip())
    return "<br>".join(lines)


def set_title(fig, text: str, *, units: int = TITLE_UNITS) -> None:
    """Set ``fig``'s title to ``text``, wrapped, pushing the plot down to make room for every line."""
    fig.layout.title = dict(text=wrap_title(text, units) if text else "", automargin=True, yref="paper")


def responsive(fig):
    """``fig`` (a ``FigureWidget``) without a pixel width: it takes its cell's and follows it."""
    fig.layout.width = None
    fig.layout.autosize = True
    fig._config = {**fig._config, "responsive": True}
    return fig
