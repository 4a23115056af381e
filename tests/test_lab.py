"""The lab's widgets drive real runs: plots fill while records stream, sliders reuse the warm pool."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import dtlab
from dtlab import TrainConfig
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


def test_a_bad_slider_value_is_refused_in_the_panel_in_the_current_language():
    panel = ControlPanel(TrainConfig(steps=2, model="tiny", batch_size=8), pool=session_pool(), auto_run=False)
    try:
        set_language("zh")
        panel.batch.value = 7
        panel.dp.value = 2
        panel.submit()
        assert "batch_size 7" in panel.status.value and "整除" in panel.status.value
        assert panel.current is None  # nothing started
    finally:
        set_language("en")


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
