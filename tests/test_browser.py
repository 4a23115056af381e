"""The lab in a real (headless) Chromium: every lesson's figures fit, controls agree with the run shown.

JupyterLab opens a notebook built from ``tests/browser_gallery.py``: each view
the lessons show, built without training (English first). The test then

1. runs it all and fails on any error output;
2. measures every figure (its drawing, title and legend) against the output
   area that holds it, at windows of 1024, 1300 and 1920 px, the file browser
   open or closed (:func:`layouts`: each combination within two days): before
   any run;
3. moves the ControlPanel's "DP degree" slider with the keyboard and waits for
   the run it starts on the warm pool: the slider, the dashboard's header, the
   memory plot's bars and the loss curve's name must all name the same run;
4. moves every view on (steps, sliders), switches to Chinese, measures again;
5. opens today's third of the stored lessons (the date chooses which: all of
   them every three days) and fails on an error output in any;
6. stops the server the way a user does and checks that no process it started
   (kernels, rank workers, the resource tracker) is still running.

Needs Debian's ``chromium`` and the ``playwright`` package (``make test``
installs both). Without them the test is skipped, unless DTLAB_REQUIRE_BROWSER
is set, in which case it fails. The screenshot goes to
``tests/_artifacts/browser_gallery.png``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
import pytest

from tests import browser_gallery as gallery
from tests.browser_support import (
    CHROMIUM_ARGS,
    CODE_CELLS,
    CURRENT,
    ERROR_OUTPUTS,
    KERNEL_STATUS,
    JupyterLabServer,
    browser_unavailable,
    find_chromium,
    marked_processes,
    write_settings,
)

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(__file__).resolve().parent / "_artifacts"
SCREENSHOT = ARTIFACTS / "browser_gallery.png"
GALLERY = "gallery.ipynb"
WIDTHS = (1024, 1300, 1920)
KERNEL_IDLE_TIMEOUT_S = 240
RUN_ALL_TIMEOUT_S = 300
SETTLE_TIMEOUT_S = 10
SLIDER_RUN_TIMEOUT_S = 300

# Every plotly figure (its drawing, title and legend) against the output area holding it.
PLOTS = f"""() => {{
  const plots = [], out = [];
  for (const cell of {CURRENT}.content.widgets) {{
    if (cell.model.type !== 'code') continue;
    const name = cell.model.sharedModel.getSource().split('\\n').pop().slice(0, 60);
    for (const area of cell.node.querySelectorAll('.jp-OutputArea-output')) {{
      const a = area.getBoundingClientRect();
      for (const plot of area.querySelectorAll('.js-plotly-plot')) {{
        const drawn = plot._fullLayout ? plot._fullLayout.width : null;
        plots.push({{name, drawn, width: plot.clientWidth}});
        for (const sel of ['.main-svg', '.gtitle', '.legend']) {{
          const el = plot.querySelector(sel);
          const r = el && el.getBoundingClientRect();
          if (r && r.width && (r.right > a.right + 1 || r.left < a.left - 1))
            out.push({{name, part: sel, left: Math.round(r.left), right: Math.round(r.right),
                       area: [Math.round(a.left), Math.round(a.right)], text: el.textContent.slice(0, 80)}});
        }}
      }}
    }}
  }}
  return {{plots, out}};
}}"""
# The ControlPanel's cell: its slider's readout, status, dashboard header, memory bars and newest loss curve.
PANEL = f"""() => {{
  const cell = {CURRENT}.content.widgets.find(c => c.model.sharedModel.getSource().includes('panel = ControlPanel('));
  const texts = [...cell.node.querySelectorAll('.widget-html')].map(e => e.textContent.trim());
  const slider = [...cell.node.querySelectorAll('.widget-slider')].find(e => e.textContent.includes('DP degree'));
  const plot = title => [...cell.node.querySelectorAll('.js-plotly-plot')].find(
    e => e.layout && e.layout.title && (e.layout.title.text || '').startsWith(title));
  const memory = plot('Memory per rank'), loss = plot('Training loss');
  return {{
    readout: slider ? slider.querySelector('.widget-readout').textContent.trim() : null,
    status: texts.find(t => /^(ready|running|done|stopped|error)/.test(t)) || '',
    header: texts.find(t => t.startsWith('Latest run') || t.startsWith('No run')) || '',
    bars: memory && memory.data.length ? (memory.data[0].x || []).length : null,
    curve: loss && loss.data.length ? loss.data[loss.data.length - 1].name : null,
  }};
}}"""
# The long-context memory figure (lesson 07): its x-axis ticks and each CP degree's curve's x, as drawn.
CURVES = """() => {
  const plot = [...document.querySelectorAll('.js-plotly-plot')].find(
    p => p.layout && p.layout.xaxis && (p.layout.xaxis.ticktext || []).includes('128K'));
  return plot ? plot.data.filter(d => d.mode === 'lines+markers').map(d => Array.from(d.x || [])) : null;
}"""
EXECUTE = f"""async (code) => {{
  const reply = await {CURRENT}.sessionContext.session.kernel.requestExecute({{code}}).done;
  return reply.content.status === 'ok' ? 'ok' : reply.content.ename + ': ' + reply.content.evalue;
}}"""

pytestmark = pytest.mark.slow


def _require_browser() -> None:
    reason = browser_unavailable()
    if reason is None:
        return
    if os.environ.get("DTLAB_REQUIRE_BROWSER", "") not in ("", "0"):
        pytest.fail(f"DTLAB_REQUIRE_BROWSER is set but the {reason}", pytrace=False)
    pytest.skip(reason)


def _picture(page) -> None:
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)


def _wait(page, what: str, fn, timeout_s: float, interval_s: float = 0.25, details=lambda: ""):
    """Poll ``fn()`` until it returns something truthy; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            _picture(page)
            pytest.fail(
                f"timed out after {timeout_s:.0f} s waiting for {what}{details()} ({SCREENSHOT})", pytrace=False
            )
        page.wait_for_timeout(interval_s * 1000)


def _write_gallery(folder: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in gallery.gallery_cells()]
    nbformat.write(nb, folder / GALLERY)


def layouts(phase: int, today=None) -> list[tuple[int, str]]:
    """The window layouts measured in a phase (0: before the first run, 1: after): every width, the file
    browser open in one phase and closed in the other, swapped from one day to the next (each redraw of
    thirty figures costs seconds on a two-core machine)."""
    import datetime

    day = (today or datetime.date.today()).toordinal()
    return [(width, ("open", "closed")[(k + phase + day) % 2]) for k, width in enumerate(WIDTHS)]


def _check_fit(page, when: str, phase: int) -> int:
    """Every figure within its output area at each window width of the phase's :func:`layouts`."""
    shell = "window.jupyterapp.shell"
    measured = 0
    for width, side in layouts(phase):
        page.set_viewport_size({"width": width, "height": 1000})
        page.evaluate(f"{shell}.{'expandLeft' if side == 'open' else 'collapseLeft'}()")

        def settled():  # every plot drawn at its element's width (the resizer has run)
            plots = page.evaluate(PLOTS)["plots"]
            return plots if all(p["drawn"] and abs(p["drawn"] - p["width"]) <= 1 for p in plots) else None

        plots = _wait(
            page,
            f"the figures to settle at {width} px, file browser {side} ({when})",
            settled,
            SETTLE_TIMEOUT_S,
            details=lambda: f": {[p for p in page.evaluate(PLOTS)['plots'] if p['drawn'] != p['width']]}",
        )
        out = page.evaluate(PLOTS)["out"]
        assert not out, f"{when}, {width} px window, file browser {side}: past the output area: {out}"
        measured += len(plots)
    return measured


def test_every_view_a_lesson_imports_is_in_the_gallery():
    """The gallery cannot fall behind the lessons: a new view in a lesson must be built there (or excused)."""
    for name, lessons in gallery.views_lessons_import().items():
        assert name in gallery.NOT_IN_GALLERY or any(name in source for source in gallery.CELLS.values()), (
            f"lessons {sorted(lessons)} show {name}: add it to tests/browser_gallery.py's CELLS"
        )
    for key in gallery.CELLS:  # each cell named by views that a lesson shows (they say on which day it is drawn)
        assert gallery.cell_lessons(key), f"no lesson imports {key!r}: rename the gallery cell or drop it"


def test_the_lessons_opened_and_the_layouts_rotate_by_date():
    import datetime

    days = [datetime.date(2026, 12, 4) + datetime.timedelta(days=k) for k in range(6)]
    assert sorted(sum((gallery.todays_third(d) for d in days[:3]), [])) == gallery.lessons()
    seen = {layout for d in days[:2] for phase in (0, 1) for layout in layouts(phase, d)}
    assert seen == {(w, side) for w in WIDTHS for side in ("open", "closed")}
    shown = {cell for d in days[:3] for cell in gallery.gallery_cells(d)}
    assert set(gallery.CELLS.values()) <= shown


def test_every_lesson_view_fits_and_the_panel_names_its_run(tmp_path):
    _require_browser()
    from playwright.sync_api import sync_playwright

    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    _write_gallery(notebooks)
    for name in gallery.todays_third():
        (notebooks / name).write_bytes((gallery.NOTEBOOKS / name).read_bytes())
    home = tmp_path / "jupyter"
    write_settings(home)
    server = JupyterLabServer(notebooks, home)
    console: list[str] = []
    passed = False
    started = time.monotonic()

    def mark(what: str) -> None:
        print(f"\n{time.monotonic() - started:5.1f} s: {what}", end="")

    try:
        server.start()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=find_chromium(), args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            try:
                page.set_default_timeout(120_000)
                page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type == "error" else None)
                page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
                page.goto(server.url(f"lab/tree/{GALLERY}"))
                _wait(page, "the kernel", lambda: page.evaluate(KERNEL_STATUS) == "idle", KERNEL_IDLE_TIMEOUT_S)
                mark("kernel idle")

                # 1. Run All: every view built, no error output
                page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")

                def finished():
                    server.note_processes()
                    cells = page.evaluate(CODE_CELLS)
                    if any(c["errors"] for c in cells):
                        return cells
                    done = all(c["count"] is not None for c in cells) and gallery.READY in cells[-1]["text"]
                    return cells if done and page.evaluate(KERNEL_STATUS) == "idle" else None

                cells = _wait(page, "the gallery to run", finished, RUN_ALL_TIMEOUT_S, 0.5)
                assert not [e for c in cells for e in c["errors"]], f"cells raised: {cells}"
                mark(f"gallery built: {cells[-1]['text'].strip()}")

                # 2. before any run, in English
                before = _check_fit(page, "before the first run", 0)
                assert before >= 3 * 4, f"only {before} figures drawn over 3 window layouts"  # the panel's 4 at least
                assert not page.evaluate(ERROR_OUTPUTS), page.evaluate(ERROR_OUTPUTS)
                mark(f"{before} figures measured")

                # 3. the DP slider 2 -> 1: the run it starts, and every label naming it
                page.set_viewport_size({"width": 1300, "height": 1000})
                slider = page.locator(".widget-slider", has_text="DP degree").first
                slider.scroll_into_view_if_needed()
                assert page.evaluate(PANEL)["readout"] == "2"
                slider.locator(".noUi-handle").focus()
                page.keyboard.press("ArrowLeft")
                steps = gallery.PANEL_STEPS

                def ran():
                    server.note_processes()
                    panel = page.evaluate(PANEL)
                    assert "error" not in panel["status"], panel
                    return panel if panel["status"].startswith("done") and f"of {steps}" in panel["header"] else None

                panel = _wait(page, "the slider's run", ran, SLIDER_RUN_TIMEOUT_S, details=lambda: page.evaluate(PANEL))
                mark(f"panel after the slider's run: {panel}")
                dp = panel["readout"]
                assert dp == "1", panel
                assert panel["header"].startswith(f"Latest run: dp={dp}, tp=1, pp=1") and (
                    f"step {steps} of {steps}" in panel["header"]
                ), panel
                assert panel["bars"] == int(dp) and panel["curve"].startswith(f"dp={dp} "), panel

                # 4. every view moved on, in Chinese
                assert page.evaluate(EXECUTE, gallery.AFTER) == "ok"
                after = _check_fit(page, "after the views moved on, in Chinese", 1)
                assert after >= before, (before, after)
                assert not page.evaluate(ERROR_OUTPUTS), page.evaluate(ERROR_OUTPUTS)
                mark(f"{after} figures measured in Chinese")
                if any("LongContextMemoryView" in cell for cell in gallery.gallery_cells()):  # moved by AFTER
                    from dtlab.lab.long_context_view import CP_DEGREES, SEQ_LENS

                    curves = page.evaluate(CURVES)
                    assert curves == [list(SEQ_LENS)] * len(CP_DEGREES), f"curves drawn over x = {curves}"
                _picture(page)
                page.evaluate(f"async () => {{ await {CURRENT}.sessionContext.shutdown(); }}")

                # 5. today's third of the stored lessons, opened as they are stored
                # (read, not run: no kernel is started for them, as JupyterLab does for a viewer's factory)
                page.evaluate(
                    "() => { window.jupyterapp.docRegistry.getWidgetFactory('Notebook')._preferKernel = false; }"
                )
                for name in gallery.todays_third():
                    page.evaluate(
                        f"() => {{ window.jupyterapp.commands.execute('docmanager:open', {{path: {name!r}}}); }}"
                    )
                    _wait(page, f"{name} to open", lambda n=name: page.evaluate(f"{CURRENT}.context.path") == n, 60)
                    page.wait_for_timeout(300)
                    cells = page.evaluate(CODE_CELLS)
                    errors = [e for c in cells for e in c["errors"]] + page.evaluate(ERROR_OUTPUTS)
                    assert cells and not errors, f"{name}: error output {errors}"
                    page.evaluate(f"async () => {{ await {CURRENT}.sessionContext.shutdown(); }}")
                mark(f"opened {gallery.todays_third()}")
                passed = True
            finally:
                if not passed:
                    try:
                        _picture(page)
                    except Exception:  # noqa: BLE001 - a picture is a bonus on failure
                        pass
                    print("browser console errors:\n" + "\n".join(console[-30:]))
                    print("jupyterlab log:\n" + server.log_tail())
                browser.close()
    finally:
        # 6. stop it as a user would (File > Shut Down: kernels, then server) ...
        left = server.shutdown()
        server.kill()
        remaining = marked_processes(server.marker)
    assert not remaining, f"still running after kill: {remaining}"
    assert not left, f"still running 30 s after JupyterLab shut down: {left}"
    commands = [cmd for _, cmd in server.seen.values()]
    ranks = [cmd for cmd in commands if "spawn_main" in cmd or "multiprocessing.forkserver" in cmd]
    assert any("ipykernel" in cmd for cmd in commands) and ranks, (
        f"expected to have watched the kernel and its rank: {server.seen}"
    )
