"""The lab's widgets drive real runs: plots fill while records stream, sliders reuse the warm pool."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import dtlab
from dtlab import TrainConfig
from dtlab.config import MODEL_PRESETS
from dtlab.i18n import listeners, set_language
from dtlab.lab import ControlPanel, Dashboard
from dtlab.lab.ring_view import RingView
from tests.harness import session_pool
from tests.test_launch import identity


def wait_until(condition, timeout=300.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_dashboard_draws_every_record_of_a_run():
    dash = Dashboard(min_interval_s=0.0)
    run = dash.watch(dtlab.train(TrainConfig(dp=2, steps=5, model="tiny"), pool=session_pool()))
    loss_trace = dash.loss.data[-1]
    assert list(loss_trace.x) == [0, 1, 2, 3, 4] and list(loss_trace.y) == run.losses()
    assert list(dash.memory.data[0].x) == ["0", "1"]
    assert list(dash.memory.data[0].y) == [r["mem"]["params"] for r in run.records[-1]["ranks"]]


def test_moving_a_slider_runs_again_on_the_same_processes():
    pool = session_pool()
    pids = [r["pid"] for r in pool.run(identity, 2).wait()]
    panel = ControlPanel(TrainConfig(dp=1, steps=3, model="tiny"), pool=pool, auto_run=True)
    panel.dp.value = 2  # a learner moves the DP slider
    wait_until(lambda: panel.current is not None and panel.current.finished and panel.current.summary)
    first = panel.current
    assert first.config.dp == 2 and len(first.records) == 3
    panel.accum.value = 2  # and then the accumulation slider
    wait_until(lambda: panel.current is not first and panel.current.finished and panel.current.summary)
    assert panel.current.config.grad_accum == 2
    assert [r["pid"] for r in pool.run(identity, 2).wait()] == pids  # no process was restarted
    assert len(panel.dashboard.loss.data) == 2


def test_a_bad_configuration_is_refused_in_the_panel_in_the_current_language():
    panel = ControlPanel(TrainConfig(steps=2, model="tiny", batch_size=7, dp=2), pool=session_pool(), auto_run=False)
    try:
        set_language("zh")
        assert panel.dp.value == 2  # the slider shows what the panel holds, even where it is refused
        panel.submit()
        assert "batch_size 7" in panel.status.value and "整除" in panel.status.value
        assert panel.current is None  # nothing started
    finally:
        set_language("en")


# -- the rules the panel's sliders follow, and what its dashboard says it shows (no processes)
def test_a_slider_offers_only_the_values_the_rest_of_the_panel_allows():
    from dtlab.lab.controls import allowed_values

    model = MODEL_PRESETS["small"]  # 4 heads, 4 layers
    assert allowed_values(TrainConfig(batch_size=8), "dp", max_ranks=8) == [1, 2, 4, 8]
    assert allowed_values(TrainConfig(batch_size=6), "dp", max_ranks=4) == [1, 2, 3]  # the pool's 4 ranks
    assert all(model.n_head % tp == 0 for tp in allowed_values(TrainConfig(), "tp", max_ranks=8))
    assert all(model.n_layer % pp == 0 for pp in allowed_values(TrainConfig(), "pp", max_ranks=8))
    assert allowed_values(TrainConfig(dp=2, tp=2, pp=2), "dp", max_ranks=8) == [1, 2]  # 8 ranks at most
    assert allowed_values(TrainConfig(dp=3, batch_size=8), "dp", max_ranks=8) == [1, 2, 3, 4, 8]  # kept: current


def test_the_sliders_narrow_as_other_controls_move():
    panel = ControlPanel(TrainConfig(dp=2, steps=2, model="tiny"), pool=session_pool(), auto_run=False)
    assert list(panel.dp.options) == [1, 2, 4, 8]  # the global batch of 8
    panel.batch.value = 6
    assert list(panel.dp.options) == [1, 2, 3, 6] and panel.dp.value == 2
    panel.dp.value = 3
    assert all(b % 3 == 0 for b in panel.batch.options) and list(panel.accum.options) == [1, 2]


def test_dropdowns_and_checkboxes_narrow_too():
    """A dropdown offers only the choices the rest of the panel allows; a checkbox whose other value
    is refused cannot be clicked (lesson 09's schedule offered 'interleaved', refused without virtual stages)."""
    panel = ControlPanel(
        TrainConfig(dp=1, tp=1, pp=2, micro_batches=2, steps=2, model="tiny"),
        pool=session_pool(),
        auto_run=False,
        show=("tp", "pp", "micro", "schedule", "model", "sp"),
    )
    assert list(panel.schedule.options) == ["gpipe", "1f1b"]
    assert panel.sp.disabled  # sequence parallelism needs tp > 1
    panel.tp.value = 2
    assert not panel.sp.disabled
    panel.model.value = "medium"  # 8 heads: tp 8 would divide them, but 8 x pp 2 is past the pool's 8 ranks
    panel.pp.value = 1
    panel.tp.value = 8
    assert list(panel.model.options) == ["medium"]  # tiny and small have 4 heads


def test_a_refusal_stays_until_a_valid_run_replaces_it():
    panel = ControlPanel(TrainConfig(dp=2, steps=2, model="tiny"), pool=session_pool(), auto_run=False)
    panel.show_error(ValueError("refused"))
    panel._asked = 2  # a request refused after the run queued as request 1 (as submit() numbers them)
    panel.handle((1, panel.config().validate()))  # the older run's turn on the worker: it does not start
    assert panel.current is None and "refused" in panel.status.value


def test_a_run_that_starts_after_the_controls_moved_on_is_stopped(monkeypatch):
    """A slider moved while the pool was starting the previous request's run: that run stops at its next
    step, so the figures show the controls' configuration a step later, not after the whole run (a 1,000-step
    run drew for 40 s under a steps slider reading 999)."""
    import dtlab.train

    panel = ControlPanel(TrainConfig(dp=2, steps=1000, model="tiny"), pool=session_pool(), auto_run=False)
    config = panel.config().validate()

    class Run:
        finished, summary, stopped = False, {}, False

        def __init__(self, config):
            self.config = config

        def stop(self):
            self.stopped = True

        def __iter__(self):
            return iter(())

    def start(config, pool):
        panel._asked += 1  # the learner moves a slider while the ranks set up
        return Run(config)

    monkeypatch.setattr(dtlab.train, "start", start)
    panel._asked = 1
    panel.handle((1, config))
    assert panel.current.stopped


def test_the_dashboard_names_the_run_its_figures_show():
    from dtlab.lab.dashboard import describe, header_text

    config = TrainConfig(dp=4, zero=2, steps=40)
    assert describe(config) == "dp=4, tp=1, pp=1, zero=2"
    assert header_text(config, 12, "en").startswith("Latest run: dp=4, tp=1, pp=1, zero=2 · step 12 of 40")
    assert "第 12 步，共 40 步" in header_text(config, 12, "zh")
    dash = Dashboard()
    assert "No run drawn yet" in dash.header.value
    entry = dash.add_run("a", config)
    dash.push(entry, {"step": 2, "loss": 1.0, "tokens_per_s": 1.0, "ranks": []}, force=True)
    assert "step 3 of 40" in dash.header.value
    set_language("zh")
    try:
        assert "第 3 步" in dash.header.value
    finally:
        set_language("en")


def test_a_long_title_wraps_instead_of_being_cut():
    from dtlab.lab.fit import TITLE_UNITS, wrap_title

    title = "Dropped assignments and the balance term over the steps of the run"
    lines = wrap_title(title).split("<br>")
    assert len(lines) > 1 and " ".join(lines) == title and all(len(line) <= TITLE_UNITS for line in lines)
    zh = wrap_title("每个 rank 的显存与时间（最近一步），以及规划器对同一布局在集群上的预测")
    assert all(sum(2 if ord(c) > 0x2E80 else 1 for c in line) <= TITLE_UNITS for line in zh.split("<br>"))
    assert "rank" in zh.replace("<br>", "")  # a Latin word is never split


def test_a_view_that_is_garbage_collected_leaves_no_language_listener():
    gc.collect()
    before = len(listeners())
    view = RingView()  # as a notebook cell makes it
    assert len(listeners()) == before + 1
    view.step_button.click()  # its widget callbacks work...
    assert view.steps_done == 1
    button, gone = view.step_button, weakref.ref(view)
    del view  # ...the cell is run again: the old view goes
    gc.collect()
    assert gone() is None and len(listeners()) == before
    button.click()  # a click on the old widget does nothing
    set_language("zh")  # and no dead callback is called
    set_language("en")


def test_a_panel_that_is_garbage_collected_ends_its_worker_and_listeners():
    gc.collect()
    before = len(listeners())
    panel = ControlPanel(TrainConfig(steps=2, model="tiny"), pool=session_pool(), auto_run=False)
    assert len(listeners()) == before + 2  # the panel and its dashboard
    existing = set(threading.enumerate())
    panel.submit()  # starts the panel's worker thread
    wait_until(lambda: panel.status.value.startswith("<b>done: 2 steps"))  # noqa: F821 - deleted below, after
    (worker,) = [w for w in threading.enumerate() if w not in existing and w.name == "dtlab-ControlPanel"]
    del panel
    gc.collect()
    assert len(listeners()) == before
    worker.join(timeout=60)
    assert not worker.is_alive()


def test_a_figure_changed_before_its_first_view_is_drawn_sends_its_whole_state(monkeypatch):
    """The page's copy of a lab figure opens whole (plotly's opens empty, its data and layout following as
    updates), and every change before the first view reports being drawn resends the whole state, so a view
    drawn late on a busy page starts from the figure as it is; after that, only plotly's one-off messages go
    (the browser half: tools/browser_course.py under load)."""
    import ipywidgets.widgets.widget as ipywidget

    from dtlab.lab.fit import FigureWidget, figure, set_title

    opened = []
    create_comm = ipywidget.comm.create_comm
    monkeypatch.setattr(ipywidget.comm, "create_comm", lambda **args: opened.append(args) or create_comm(**args))
    FigureWidget(data=[dict(type="scatter", y=[1, 2])], layout=dict(height=200, width=900, title="made"))
    state = opened[-1]["data"]["state"]  # the page's copy opens whole: what a view drawn first starts from
    assert state["_config"]["responsive"] is True and state["_widget_layout"]["autosize"] is True
    assert "width" not in state["_widget_layout"] and state["_widget_layout"]["title"]["text"] == "made"
    assert len(opened) == 1 and len(state["_widget_data"]) == 1
    fig = figure(height=200)
    assert isinstance(fig, FigureWidget)
    assert fig._widget_layout["autosize"] is True and "width" not in fig._widget_layout
    set_title(fig, "before the first view")
    fig.add_scatter(y=[1, 2, 3], name="loss")
    with fig.batch_update():
        fig.data[0].y = [3, 2, 1]
        fig.layout.xaxis.title = "step"
    assert fig._widget_layout["title"]["text"] == "before the first view"
    assert fig._widget_layout["xaxis"]["title"]["text"] == "step"
    assert [list(t["y"]) for t in fig._widget_data] == [[3, 2, 1]]
    fig._js2py_traceDeltas = {"trace_deltas": [{"uid": fig.data[0].uid}], "trace_edit_id": fig._last_trace_edit_id}
    set_title(fig, "after it")
    fig.add_scatter(y=[0])
    assert fig._widget_layout["title"]["text"] == "before the first view" and len(fig._widget_data) == 1
    assert fig.layout.title.text == "after it" and len(fig.data) == 2
