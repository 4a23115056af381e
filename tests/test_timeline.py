"""The step timeline widget draws what the tracer recorded, follows new steps, speaks both languages."""

from __future__ import annotations

import pytest

from dtlab.i18n import set_language
from dtlab.lab.timeline import StepTimeline, step_bars


def _record(step: int, shift: float = 0.0) -> dict:
    """Two ranks: rank 1 computes 0.1-0.5 s; rank 0 computes 0.1-0.2, waits for rank 1 in an
    all-reduce until 0.5, while a bucket it issued at 0.15 was in flight (done at 0.3)."""

    def rank(r, compute, comm, figures):
        spans = {
            "window": [shift, shift + 0.6],
            "compute": [[shift + a, shift + b] for a, b in compute],
            "comm": [
                {
                    **c,
                    **{k: shift + c[k] for k in ("start", "wait", "end")},
                    "done": None if c["done"] is None else shift + c["done"],
                }
                for c in comm
            ],
        }
        return {
            "rank": r,
            "dp": r,
            "tp": 0,
            "pp": 0,
            "spans": spans,
            **figures,
            "comm": {"all_reduce": {"count": 1, "bytes": 64, "wire_bytes": 64, "seconds": 0.3}},
        }

    wait = {"kind": "all_reduce", "group": "dp", "bytes": 64, "start": 0.15, "wait": 0.2, "end": 0.5, "done": 0.3}
    return {
        "step": step,
        "ranks": [
            rank(0, [(0.1, 0.55)], [wait], dict(compute_s=0.15, comm_s=0.3, overlap_s=0.05, idle_s=0.15)),
            rank(
                1,
                [(0.1, 0.55)],
                [{**wait, "start": 0.5, "wait": 0.5, "end": 0.5, "done": None}],
                dict(compute_s=0.45, comm_s=0.0, overlap_s=0.0, idle_s=0.15),
            ),
        ],
    }


def test_bars_cut_each_rank_into_compute_blocked_idle_and_overlap():
    bars = step_bars(_record(3, shift=10.0))
    assert bars["blocked"]["y"] == ["rank 0"]
    assert bars["blocked"]["base"][0] == pytest.approx(200) and bars["blocked"]["x"][0] == pytest.approx(300)
    assert "all_reduce (dp, 64 B)" in bars["blocked"]["text"][0]
    assert bars["overlap"]["x"] == [pytest.approx(50)]  # issued 0.15, waited for at 0.2
    rank0 = [x for y, x in zip(bars["compute"]["y"], bars["compute"]["x"]) if y == "rank 0"]
    assert sum(rank0) == pytest.approx(150)


def test_the_widget_follows_the_newest_step_and_relabels():
    view = StepTimeline()
    for step in range(3):
        view.push(_record(step))
    assert view.step == 2 and view.slider.max == 2
    view.slider.value = 0  # look back: stays there
    view.push(_record(3))
    assert view.step == 0
    view.show(3)
    assert view.step == 3 and "Step 3" in view.figure.layout.title.text
    try:
        set_language("zh")
        assert "第 3 步" in view.figure.layout.title.text and "计算" in view.summary.value
        assert view.figure.data[0].name == "计算"
    finally:
        set_language("en")


def test_a_new_height_keeps_the_figure_following_its_cells_width(monkeypatch):
    """plotly.js pins a figure's width when its height is set alone; the timeline sends width null with
    each new height (tools/browser_course.py: lesson 09's 8-rank timeline stayed 700 px in a 592 px cell)."""
    view = StepTimeline()
    sent = []
    monkeypatch.setattr(view.figure, "_send_relayout_msg", lambda data, **kw: sent.append(dict(data)))
    import dtlab.lab.timeline as timeline

    empty = {key: {"y": [], "base": [], "x": [], "text": []} for key, _, _ in timeline.CATEGORIES}
    monkeypatch.setattr(timeline, "step_bars", lambda record: empty)
    monkeypatch.setattr(view, "relabel", lambda *a, **k: None)  # its summary reads real records
    record = {"step": 0, "ranks": [{"rank": r} for r in range(8)]}
    view.draw(record)
    assert {"height": 150 + 40 * 8, "width": None} in sent
