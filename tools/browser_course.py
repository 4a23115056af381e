"""Every lesson, run from the top in JupyterLab in Chromium, its figures measured and its sliders moved.

    .venv/bin/python tools/browser_course.py                  (every lesson: an hour or more on two cores)
    .venv/bin/python tools/browser_course.py --lessons 00,02  (those lessons only)

Issue 40's acceptance, checked the way a learner meets it (too slow for CI:
the browser test, ``tests/test_browser.py``, builds each view cheaply instead).
JupyterLab starts on 127.0.0.1 with a temporary copy of ``notebooks/`` (and a
temporary ``DTLAB_HOME``); for each lesson the script

1. opens it in headless Chromium, clears its outputs and runs every cell
   (``notebook:run-all-cells``), waiting for the kernel to finish (lessons
   train on real ranks: minutes on two cores);
2. at each window width (1024, 1300, 1920 px: the lesson is run once, then the
   window resized) measures every plotly figure (its drawing, title and legend)
   against the output area that holds it, and looks for error outputs (an
   ``error`` output, a traceback or an ``...Error:`` line in stderr or a widget);
3. moves the lesson's sliders with the keyboard, as a learner does (the ControlPanel's
   dropdowns too): at the first width every slider through its values (all of
   them when it has few: Home, then right to the end and back; a sample of the
   ends and their neighbours when it has many; every value both ways under
   ``--every-value``), at the other widths one move each. After every move the figures are measured again and checked against
   the controls:

   * a ControlPanel: its dashboard's header ("Latest run: dp=2, tp=1, ... · step
     k of n"), the memory plot's bars (one per rank) and the newest loss curve's
     name must name the configuration the controls show, within a run's time;
     a refused configuration counts as stale (the figures still show the last
     run while the controls show another);
   * any other view, whose figures are a function of its controls: a slider
     value visited twice (going right, then back) must show the same figures
     and texts both times; a figure that lags a move behind shows the
     neighbouring value's instead.

On every look it also counts curves drawn with no x on an axis with ticks of
its own (lesson 07's sequence lengths): plotly draws those at x = 0, 1, 2, ...

It prints a table (lesson, width, figures measured, overflows, errors, slider
moves, stale figures, curves off their axis, a note) and exits 1 on any
failure, with the details above the table and as JSON under ``--json``. A lesson that cannot run here
(a timeout, a kernel that died) is a row saying so, and a failure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.browser_support import (  # noqa: E402
    CHROMIUM_ARGS,
    CODE_CELLS,
    CURRENT,
    ERROR_OUTPUTS,
    KERNEL_STATUS,
    JupyterLabServer,
    browser_unavailable,
    find_chromium,
    write_settings,
)

NOTEBOOKS = ROOT / "notebooks"
WIDTHS = (1024, 1300, 1920)
HEIGHT = 1000
SWEEP = 6
"""Moves each way along a slider at the first width; a slider with more values is sampled."""

# -- what the page is asked
NOTEBOOK_DONE = f"""() => {{
  const cells = {CURRENT}.content.widgets.filter(c => c.model.type === 'code');
  const errors = cells.some(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'));
  const pending = cells.filter(c => c.model.executionCount === null && c.model.sharedModel.getSource().trim()).length;
  return {{pending, errors, total: cells.length}};
}}"""
# Every visible plotly figure (drawing, title, legend) against its output area, by cell.
FIGURES = f"""() => {{
  const plots = [], out = [], off = [];
  {CURRENT}.content.widgets.forEach((cell, index) => {{
    if (cell.model.type !== 'code') return;
    for (const area of cell.node.querySelectorAll('.jp-OutputArea-output')) {{
      const a = area.getBoundingClientRect();
      for (const plot of area.querySelectorAll('.js-plotly-plot')) {{
        if (!plot.clientWidth) continue;  // hidden (a closed tab or accordion)
        const drawn = plot._fullLayout ? plot._fullLayout.width : null;
        plots.push({{cell: index, drawn, width: plot.clientWidth}});
        // a curve on an axis with ticks of its own (lesson 07's sequence lengths) must be drawn over x values:
        // with no x, plotly draws it at x = 0, 1, 2, ..., far from the ticks
        const ticks = plot.layout && plot.layout.xaxis && plot.layout.xaxis.tickvals;
        if (ticks && ticks.length)
          for (const trace of plot.data || [])
            if (trace.y && trace.y.length > 1 && (!trace.x || trace.x.length !== trace.y.length))
              off.push({{cell: index, trace: trace.name || '', x: trace.x ? trace.x.length : 0, y: trace.y.length}});
        for (const sel of ['.main-svg', '.gtitle', '.legend']) {{
          const el = plot.querySelector(sel);
          const r = el && el.getBoundingClientRect();
          if (r && r.width && (r.right > a.right + 1 || r.left < a.left - 1))
            out.push({{cell: index, part: sel, past: Math.round(Math.max(r.right - a.right, a.left - r.left)),
                       text: (el.textContent || '').slice(0, 60)}});
        }}
      }}
    }}
  }});
  return {{plots, out, off}};
}}"""
STDERR_ERRORS = f"""() => [...{CURRENT}.node.querySelectorAll(
    '.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]')]
  .map(e => e.textContent).filter(t => /Traceback|Error/.test(t)).map(t => t.slice(0, 300))"""
# The controls a learner moves: sliders everywhere, dropdowns in a ControlPanel's cell.
CONTROLS = f"""() => {{
  const found = [];
  {CURRENT}.content.widgets.forEach((cell, index) => {{
    if (cell.model.type !== 'code') return;
    const panel = cell.model.sharedModel.getSource().includes('ControlPanel(');
    cell.node.querySelectorAll('.jp-OutputArea-output .widget-slider').forEach((el, k) => {{
      const target = el.querySelector('.noUi-target');
      found.push({{cell: index, kind: 'slider', k, panel, label: (el.querySelector('.widget-label') || {{}}).textContent || '',
                  value: (el.querySelector('.widget-readout') || {{}}).textContent || '',
                  disabled: !target || target.hasAttribute('disabled')}});
    }});
    if (panel) cell.node.querySelectorAll('.jp-OutputArea-output .widget-dropdown').forEach((el, k) => {{
      const select = el.querySelector('select');
      found.push({{cell: index, kind: 'dropdown', k, panel, label: (el.querySelector('.widget-label') || {{}}).textContent || '',
                  value: select ? select.value : '', options: select ? [...select.options].map(o => o.value) : [],
                  disabled: !select || select.disabled}});
    }});
  }});
  return found;
}}"""
# What a cell shows: ``names``, what its figures say they are (titles, trace names, x values: a function of
# the controls); ``data``, what they and its texts measure or compute (y values, status lines: timings vary
# from run to run in the views that train).
CELL_STATE = f"""(index) => {{
  const cell = {CURRENT}.content.widgets[index];
  const round = v => typeof v === 'number' ? Number(v.toPrecision(3)) : v;
  const arr = a => a ? Array.from(a).map(round) : null;
  const plots = [...cell.node.querySelectorAll('.js-plotly-plot')];
  const title = p => p.layout && p.layout.title ? (p.layout.title.text || p.layout.title) : '';
  const names = plots.map(p => [title(p), (p.data || []).map(d => [d.type || '', d.name || '', arr(d.x)])]);
  const data = plots.map(p => (p.data || []).map(d => [arr(d.y), d.z ? JSON.stringify(d.z).slice(0, 400) : '',
                                                       d.text ? JSON.stringify(d.text).slice(0, 200) : '']));
  const texts = [...cell.node.querySelectorAll('.jp-OutputArea-output .widget-html, .jp-OutputArea-output .widget-label')]
    .map(e => e.textContent.trim()).filter(Boolean);
  const busy = texts.some(t => /^(running|正在)/.test(t));
  return {{names, data, texts, busy}};
}}"""
# A ControlPanel's cell: its controls, status, dashboard header, memory bars and newest loss curve.
PANEL_STATE = f"""(index) => {{
  const cell = {CURRENT}.content.widgets[index];
  const controls = {{}};
  cell.node.querySelectorAll('.widget-slider').forEach(el => {{
    controls[(el.querySelector('.widget-label') || {{}}).textContent || ''] = el.querySelector('.widget-readout').textContent.trim();
  }});
  cell.node.querySelectorAll('.widget-dropdown').forEach(el => {{
    controls[(el.querySelector('.widget-label') || {{}}).textContent || ''] = el.querySelector('select').value;
  }});
  const texts = [...cell.node.querySelectorAll('.widget-html')].map(e => e.textContent.trim());
  const plots = [...cell.node.querySelectorAll('.js-plotly-plot')];
  const memory = plots.find(p => p.layout && p.layout.barmode === 'stack' && p.data.length >= 7);
  const loss = plots[0];
  return {{
    controls,
    status: texts.find(t => /^(ready|running|done|stopped|error|就绪|正在|完成|已在|错误)/.test(t)) || '',
    header: texts.find(t => /^(Latest run|No run|最新一次运行|还没有)/.test(t)) || '',
    bars: memory && memory.data.length ? (memory.data[0].x || []).length : null,
    curve: loss && loss.data.length ? loss.data[loss.data.length - 1].name : null,
  }};
}}"""
SLIDER_HANDLE = f"""([cell, k]) => {{
  const el = {CURRENT}.content.widgets[cell].node.querySelectorAll('.jp-OutputArea-output .widget-slider')[k];
  const handle = el && el.querySelector('.noUi-handle');
  if (!handle) return null;
  handle.scrollIntoView({{block: 'center'}});
  handle.focus();
  return (el.querySelector('.widget-readout') || {{}}).textContent || '';
}}"""
SLIDER_VALUE = f"""([cell, k]) => {{
  const el = {CURRENT}.content.widgets[cell].node.querySelectorAll('.jp-OutputArea-output .widget-slider')[k];
  return el ? (el.querySelector('.widget-readout') || {{}}).textContent || '' : null;
}}"""
SELECT = f"""([cell, k, value]) => {{
  const el = {CURRENT}.content.widgets[cell].node.querySelectorAll('.jp-OutputArea-output .widget-dropdown')[k];
  const select = el.querySelector('select');
  select.scrollIntoView({{block: 'center'}});
  select.value = value;
  select.dispatchEvent(new Event('change', {{bubbles: true}}));
  return select.value;
}}"""


@dataclasses.dataclass
class Row:
    lesson: str
    width: int
    figures: int = 0
    overflows: int = 0
    errors: int = 0
    moves: int = 0
    stale: int = 0
    data_differs: int = 0
    off_axis: int = 0
    note: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.overflows or self.errors or self.stale or self.off_axis or self.note.startswith("NOT RUN"))


# -- what a ControlPanel's header should say, from its controls' labels
def _panel_fields() -> tuple[dict[str, str], dict[str, str]]:
    """Control label (English and Chinese) -> TrainConfig field; field -> its default, as the header writes it."""
    from dtlab import TrainConfig
    from dtlab.i18n import t
    from dtlab.lab.controls import LABEL_KEYS

    labels = {}
    for field, key in LABEL_KEYS.items():
        for lang in ("en", "zh"):
            labels[t(key, lang)] = field
    defaults = {f.name: str(f.default) for f in dataclasses.fields(TrainConfig)}
    return labels, defaults


def panel_disagreement(state: dict, labels: dict, defaults: dict) -> str | None:
    """Why the panel's figures do not show the configuration its controls name (None when they do)."""
    from dtlab.lab.dashboard import SHOWN_FIELDS

    header = state["header"]
    if not re.search(r"dp=\d", header):
        return f"the header names no run: {header!r}"
    config, _, progress = header.partition("·")
    named = dict(re.findall(r"(\w+)=([^,\s]+)", config))
    numbers = [int(n) for n in re.findall(r"\d+", progress)]
    for label, value in state["controls"].items():
        field = labels.get(label.strip())
        if field is None or field in ("lr", "seed"):
            continue  # not named by the header
        if field == "steps":
            if len(numbers) < 2 or str(numbers[1]) != value:
                return f"controls: steps={value}; header: {header!r}"
        elif field in named:
            if named[field] != value:
                return f"controls: {field}={value}; header: {header!r}"
        elif field in SHOWN_FIELDS and value != defaults[field]:
            return f"controls: {field}={value}; header names no {field}: {header!r}"
    world = int(named["dp"]) * int(named.get("tp", 1)) * int(named.get("pp", 1))
    if state["bars"] is not None and state["bars"] != world:
        return f"header: {header!r}, memory plot: {state['bars']} ranks"
    curve = f"dp={named['dp']} tp={named.get('tp')} pp={named.get('pp')}"
    if state["curve"] and not state["curve"].startswith(curve):
        return f"header: {header!r}, newest loss curve: {state['curve']!r}"
    return None


class Course:
    def __init__(self, page, server, args):
        self.page, self.server, self.args = page, server, args
        self.labels, self.defaults = _panel_fields()
        self.details: list[str] = []
        self.seen_errors: dict[int, set] = {}
        self.unsettled: list = []
        self.last_value: str | None = None  # the slider's value after the last key pressed

    def detail(self, line: str, stale: bool = True) -> None:
        """A finding: kept for the end, and printed now (a course run takes an hour)."""
        self.details.append(line)
        print(("  ! " if stale else "  ~ ") + line[:1200], flush=True)

    # -- waiting
    def wait(self, fn, timeout_s: float, interval_s: float = 0.5):
        deadline = time.monotonic() + timeout_s
        while True:
            value = fn()
            if value or time.monotonic() > deadline:
                return value
            self.page.wait_for_timeout(interval_s * 1000)

    def idle(self, timeout_s: float = 120) -> bool:
        return bool(self.wait(lambda: self.page.evaluate(KERNEL_STATUS) == "idle", timeout_s, 0.25))

    # -- checks
    def fit(self, row: Row, lesson: str, when: str) -> None:
        """Every figure redrawn at its element's width (the same in two looks, 0.3 s apart), then measured
        against its output area."""
        last, measured = None, None
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            self.page.wait_for_timeout(300)
            measured = self.page.evaluate(FIGURES)
            unsettled = [p for p in measured["plots"] if not p["drawn"] or abs(p["drawn"] - p["width"]) > 1]
            if measured == last and (not unsettled or unsettled == self.unsettled):
                break  # settled, or as unsettled as at the last look (not waited for again)
            last = measured
        if unsettled:
            self.unsettled = unsettled
            self.detail(f"{lesson} {row.width}px {when}: figures not redrawn to their width: {unsettled[:4]}")
        row.figures += len(measured["plots"])
        if measured["out"]:
            row.overflows += len(measured["out"])
            self.detail(f"{lesson} {row.width}px {when}: past the output area: {measured['out'][:6]}")
        if measured["off"]:
            row.off_axis += len(measured["off"])
            self.detail(f"{lesson} {row.width}px {when}: curves with no x on a ticked axis: {measured['off'][:6]}")

    def errors(self, row: Row, lesson: str, when: str) -> None:
        """Error outputs not seen before at this width (each counted once)."""
        cells = self.page.evaluate(CODE_CELLS)
        found = [e for c in cells for e in c["errors"]]
        found += self.page.evaluate(ERROR_OUTPUTS) + self.page.evaluate(STDERR_ERRORS)
        new = sorted(set(found) - self.seen_errors.setdefault(row.width, set()))
        if new:
            self.seen_errors[row.width].update(new)
            row.errors += len(new)
            self.detail(f"{lesson} {row.width}px {when}: error output: {[e[:400] for e in new]}")

    def settle_view(self, cell: int) -> dict:
        """The cell's state once the kernel is idle and nothing in it changes for a second."""
        self.idle(60)
        looks, deadline = [], time.monotonic() + self.args.settle_timeout
        while time.monotonic() < deadline:
            looks = [*looks[-2:], self.page.evaluate(CELL_STATE, cell)]
            if len(looks) == 3 and looks[0] == looks[1] == looks[2] and not looks[2]["busy"]:
                break
            self.page.wait_for_timeout(500)
        return looks[-1]

    def settle_panel(self, cell: int) -> str | None:
        """None once the panel's figures and header name its controls' configuration, else why not."""
        deadline = time.monotonic() + self.args.settle_timeout
        why = None
        while time.monotonic() < deadline:
            state = self.page.evaluate(PANEL_STATE, cell)
            if state["status"].startswith(("error", "错误")):
                return f"refused: {state['status'][:200]} (controls {state['controls']}, header {state['header']!r})"
            why = panel_disagreement(state, self.labels, self.defaults)
            if why is None:
                return None
            self.page.wait_for_timeout(500)
        return why

    # -- moving controls
    def press(self, control: dict, key: str) -> str:
        self.page.evaluate(SLIDER_HANDLE, [control["cell"], control["k"]])
        self.page.keyboard.press(key)
        self.page.wait_for_timeout(150)
        return self.page.evaluate(SLIDER_VALUE, [control["cell"], control["k"]])

    def moves(self, control: dict, full: bool) -> list:
        """The moves for a control, (kind, key or option): every value at the first width, one move at the others."""
        if control["kind"] == "dropdown":
            options = [o for o in control["options"] if o != control["value"]]
            return [("select", o) for o in (options + [control["value"]] if full else options[:1])]
        if not full:
            return [("key", "ArrowRight"), ("key", "ArrowLeft")]  # the second only where the first did nothing
        if self.args.every_value:  # every value going right, then every value again going left
            return [("key", "Home"), ("sweep", "ArrowRight"), ("sweep", "ArrowLeft")]
        right, left = [("key", "ArrowRight")] * SWEEP, [("key", "ArrowLeft")] * SWEEP
        return [("key", "Home"), *right, ("key", "End"), *left, ("key", "Home")]

    def move_all(self, row: Row, lesson: str, full: bool) -> None:
        controls = [c for c in self.page.evaluate(CONTROLS) if not c["disabled"]]
        for control in controls:
            name = f"cell {control['cell']} {control['kind']} {control['label'].strip() or control['k']!r}"
            seen: dict[str, dict] = {}  # what the view showed at each value a move reached (not before the
            # first move: the lesson's cells may have stepped the view on, and a move starts it afresh)
            for kind, what in self.moves(control, full):
                if kind == "sweep":  # press until the slider stops at its end, checking after each move
                    while (value := self.press(control, what)) != self.last_value:
                        self.last_value = value
                        self.check_move(row, lesson, control, name, value, seen)
                    continue
                if kind == "key":
                    previous = self.page.evaluate(SLIDER_VALUE, [control["cell"], control["k"]])
                    value = self.press(control, what)
                    self.last_value = value
                    if value == previous:
                        continue  # at that end already: nothing moved
                else:
                    value = self.page.evaluate(SELECT, [control["cell"], control["k"], what])
                self.check_move(row, lesson, control, name, value, seen)
                if not full:
                    break
            print(f"    {lesson} {row.width}px {name}: {row.moves} moves so far, {row.stale} stale", flush=True)

    def check_move(self, row: Row, lesson: str, control: dict, name: str, value: str, seen: dict) -> None:
        row.moves += 1
        when = f"after {name} -> {value}"
        if control["panel"]:
            why = self.settle_panel(control["cell"])
            if why:
                row.stale += 1
                self.detail(f"{lesson} {row.width}px {when}: {why}")
        else:
            state = self.settle_view(control["cell"])
            before = seen.get(value)
            if before is not None and before["names"] != state["names"]:
                row.stale += 1
                self.detail(
                    f"{lesson} {row.width}px {when}: not the figures it showed at {value} before: "
                    f"{_difference(before['names'], state['names'])}"
                )
            elif before is not None and (before["data"], before["texts"]) != (state["data"], state["texts"]):
                row.data_differs += 1
                self.detail(
                    f"{lesson} {row.width}px {when}: same figures as at {value} before, other values "
                    f"(measured?): {_difference(before['texts'], state['texts'])}",
                    stale=False,
                )
            seen[value] = state
        self.fit(row, lesson, when)
        self.errors(row, lesson, when)

    # -- a lesson
    def lesson(self, name: str) -> list[Row]:
        page, rows = self.page, []
        started = time.monotonic()
        page.goto(self.server.url(f"lab/tree/{name}") + "&reset")
        if not self.idle(self.args.kernel_timeout):
            return [Row(name[:2], w, note="NOT RUN: the kernel did not start") for w in self.args.widths]
        if self.args.file_browser == "closed":
            page.evaluate("window.jupyterapp.shell.collapseLeft()")
        else:
            page.evaluate("window.jupyterapp.commands.execute('filebrowser:activate')")
        page.evaluate("window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_timeout(2000)

        def finished():
            self.server.note_processes()
            state = page.evaluate(NOTEBOOK_DONE)
            done = (state["pending"] == 0 or state["errors"]) and page.evaluate(KERNEL_STATUS) == "idle"
            return state if done else None

        state = self.wait(finished, self.args.run_timeout * 4, 2)
        ran_s = time.monotonic() - started
        if not state:
            state = page.evaluate(NOTEBOOK_DONE)
            note = f"NOT RUN: {state['pending']} of {state['total']} cells unfinished after {ran_s:.0f} s"
            rows = [Row(name[:2], w, note=note) for w in self.args.widths]
            self.errors(rows[0], name, "run all")
            return rows
        page.wait_for_timeout(3000)  # figures drawn after the last reply
        print(f"  {name}: ran in {ran_s:.0f} s", flush=True)
        for k, width in enumerate(self.args.widths):
            row = Row(name[:2], width, note=f"run {ran_s:.0f} s" if k == 0 else "")
            page.set_viewport_size({"width": width, "height": HEIGHT})
            self.fit(row, name, "after Run All")
            self.errors(row, name, "after Run All")
            if not self.args.no_moves:
                self.move_all(row, name, full=(k == 0))
            rows.append(row)
            print(f"  {name} {width}px: {dataclasses.asdict(row)}", flush=True)
        return rows

    def close(self) -> None:
        page = self.page
        try:
            page.evaluate(f"async () => {{ await {CURRENT}.sessionContext.shutdown(); }}")
        except Exception as error:  # noqa: BLE001 - the next lesson starts fresh anyway
            self.detail(f"closing: {error}")
        page.evaluate("window.jupyterapp.commands.execute('application:close-all')")


def _difference(a, b) -> str:
    """Where two looks at a cell differ, briefly."""
    if len(a) != len(b):
        return f"{len(a)} items -> {len(b)}"
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"item {k}: {json.dumps(x, ensure_ascii=False)[:300]} -> {json.dumps(y, ensure_ascii=False)[:300]}"
    return "data"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--lessons", help="comma-separated lesson numbers (00,02), run in that order; default: all")
    parser.add_argument(
        "--widths", default=",".join(map(str, WIDTHS)), help="window widths in px (default %(default)s)"
    )
    parser.add_argument("--run-timeout", type=float, default=600, help="s for one training run (Run All: 4x)")
    parser.add_argument("--settle-timeout", type=float, default=120, help="s for a panel's figures to show a move")
    parser.add_argument("--kernel-timeout", type=float, default=180, help="s for a kernel to start")
    parser.add_argument("--no-moves", action="store_true", help="measure only; move no control")
    parser.add_argument(
        "--every-value",
        action="store_true",
        help="at the first width, move each slider through every value (both ways), not a sample of a long one",
    )
    parser.add_argument(
        "--lang", choices=("en", "zh"), default="en", help="the kernels' language (DTLAB_LANG; default %(default)s)"
    )
    parser.add_argument(
        "--file-browser",
        choices=("open", "closed"),
        default="open",
        help="JupyterLab's file browser (default %(default)s)",
    )
    parser.add_argument("--json", help="write the rows and details to this file")
    args = parser.parse_args(argv)
    args.widths = [int(w) for w in args.widths.split(",")]
    reason = browser_unavailable()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    names = sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if args.lessons:
        wanted = [n.strip().zfill(2) for n in args.lessons.split(",")]  # in the order given
        names = [n for w in wanted for n in names if n[:2] == w]
    from playwright.sync_api import sync_playwright

    rows: list[Row] = []
    details: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dtlab-course-") as tmp:
        tmp = Path(tmp)
        notebooks = tmp / "notebooks"
        shutil.copytree(NOTEBOOKS, notebooks, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        write_settings(tmp / "jupyter")
        os.environ["DTLAB_HOME"] = str(tmp / "dtlab-home")  # the kernels' progress file, not the user's
        os.environ["DTLAB_LANG"] = args.lang  # every label, title and message in the kernels
        # the dtlab beside this script (a clean copy of a commit runs its own), kernels and ranks alike
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        server = JupyterLabServer(notebooks, tmp / "jupyter", python=str(Path(sys.executable)))
        try:
            server.start()
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=find_chromium(), args=CHROMIUM_ARGS, headless=True)
                for name in names:
                    print(f"{name}: opening", flush=True)
                    page = browser.new_page(viewport={"width": args.widths[0], "height": HEIGHT})
                    page.set_default_timeout(120_000)
                    course = Course(page, server, args)
                    try:
                        rows += course.lesson(name)
                    except (Exception, KeyboardInterrupt) as error:  # one lesson's failure is a row, not the end
                        rows += [
                            Row(name[:2], w, note=f"NOT RUN: {type(error).__name__}: {error}"[:200])
                            for w in args.widths
                            if not any(r.lesson == name[:2] and r.width == w for r in rows)
                        ]
                        if isinstance(error, KeyboardInterrupt):  # Ctrl-C: the table of what was done
                            names = names[: names.index(name) + 1]
                    finally:
                        try:
                            course.close()
                        except Exception:  # noqa: BLE001
                            pass
                        details += course.details
                        page.close()
                    if name == names[-1]:
                        break
                browser.close()
        finally:
            server.shutdown()
            server.kill()
    for line in details:
        print("-", line)
    print()
    header = ("lesson", "width", "figures", "overflows", "errors", "moves", "stale", "off_axis", "data_differs", "note")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for row in rows:
        print(" | ".join(str(getattr(row, h if h != "width" else "width")) for h in header))
    failed = [r for r in rows if r.failed]
    print(f"\n{len(failed)} of {len(rows)} rows failed" if failed else f"\nall {len(rows)} rows passed")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": [dataclasses.asdict(r) for r in rows], "details": details}, indent=1)
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
