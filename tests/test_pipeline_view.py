"""The pipeline timeline (dtlab.lab.pipeline_view) draws a row per rank, interleaved too.

Interleaved actions are labelled by virtual stage (chunk x p + rank); the
figure must keep p rows, draw every action once on the rank that ran it, and
show its chunk (hover text, shade). Built from the schedule's simulated
timeline and from a measured-style one (the runtime's dicts); no processes,
no timings asserted.
"""

from __future__ import annotations

from dtlab.i18n import set_language
from dtlab.lab.pipeline_view import COLORS, PipelineView, TimelineComparison, TimelineFigure, boxes, in_flight_at
from dtlab.parallel.pipeline.schedule import BACKWARD, FORWARD, max_in_flight, schedule, simulate

P, M, V = 2, 4, 2


def _drawn(figure) -> list[tuple[int, str, str]]:
    """(row, label, hover) of every bar, forward and backward."""
    return [(y, text, hover) for trace in figure.data for y, text, hover in zip(trace.y, trace.text, trace.hovertext)]


def test_an_interleaved_timeline_has_a_row_per_rank_and_shows_each_chunk():
    actions = schedule("interleaved", P, M, V)
    sim = simulate(actions)
    chart = TimelineFigure(title_key="pipe.title.ideal", x_key="pipe.axis.slots")
    chart.draw(sim.timeline, stages=P, schedule="interleaved 1F1B", p=P, m=M)
    drawn = _drawn(chart.figure)
    # Every action of the schedule once, on the rank whose list holds it: rows 0 .. p-1 only.
    want = sorted((rank, str(a)) for rank, mine in enumerate(actions) for a in mine)
    assert sorted((row, label) for row, label, _ in drawn) == want
    assert len(drawn) == 2 * P * V * M and {row for row, _, _ in drawn} == set(range(P))
    assert list(chart.figure.layout.yaxis.tickvals) == list(range(P))
    assert list(chart.figure.layout.yaxis.ticktext) == ["rank 0: stages 0, 2", "rank 1: stages 1, 3"]
    # The chunk in the hover text and in the shade: chunk 0 the plain colour, chunk 1 darker.
    for row, label, hover in drawn:
        stage = int(label[:-2])
        assert hover.startswith(f"{label} (rank {row}, chunk {stage // P}, virtual stage {stage}):")
    for trace, kind in zip(chart.figure.data, (FORWARD, BACKWARD)):
        chunks = {text: color for text, color in zip(trace.text, trace.marker.color)}
        assert {chunks[f"0{kind}0"], chunks[f"1{kind}0"]} == {COLORS[kind]}
        assert chunks[f"2{kind}0"] == chunks[f"3{kind}0"] != COLORS[kind]
        assert "darker" in trace.name
    # In flight per rank: (chunk, micro-batch) pairs, at the end none, at most the schedule's.
    assert in_flight_at(sim.timeline, sim.makespan) == [0] * P
    peaks = [max(in_flight_at(sim.timeline, t.end)[r] for rank in sim.timeline for t in rank) for r in range(P)]
    assert peaks == max_in_flight(actions)
    try:  # the words follow the language
        set_language("zh")
        assert list(chart.figure.layout.yaxis.ticktext) == ["rank 0：阶段 0, 2", "rank 1：阶段 1, 3"]
        assert "模型块" in chart.figure.data[0].hovertext[0]
    finally:
        set_language("en")


def test_a_measured_interleaved_run_beside_its_ideal_schedule():
    # What PipelineRuntime records, per rank: {"action", "start", "end"} in seconds (made up here).
    measured = [
        [{"action": str(a), "start": 0.01 * i, "end": 0.01 * i + 0.008} for i, a in enumerate(mine)]
        for mine in schedule("interleaved", P, M, V)
    ]
    comparison = TimelineComparison(measured, schedule="interleaved", micro_batches=M, virtual_stages=V)
    for chart in (comparison.ideal, comparison.measured):
        assert {row for row, _, _ in _drawn(chart.figure)} == set(range(P))
        assert len(_drawn(chart.figure)) == 2 * P * V * M
        assert "interleaved 1F1B, v=2" in chart.figure.layout.title.text.replace("<br>", " ")  # wrapped
    assert {b.chunk for b in boxes(measured)} == {0, 1}


def test_gpipe_and_1f1b_keep_a_row_per_stage_in_two_colours():
    view = PipelineView(stages=4, micro_batches=4, schedule="1f1b")
    drawn = _drawn(view.chart.figure)
    assert sorted((row, label) for row, label, _ in drawn) == sorted(
        (s, str(a)) for s, mine in enumerate(view.actions) for a in mine
    )
    assert list(view.chart.figure.layout.yaxis.ticktext) == [f"stage {s}" for s in range(4)]
    assert [trace.marker.color for trace in view.chart.figure.data] == [COLORS[FORWARD], COLORS[BACKWARD]]
    assert all(hover.startswith(f"{label}: ") and "chunk" not in hover for _, label, hover in drawn)
    assert view.in_flight_now() == [0] * 4
    assert [o[1] for o in view.schedule.options] == ["gpipe", "1f1b", "interleaved"]


def test_the_view_interleaves_with_a_v_slider_and_says_what_it_cannot_run():
    view = PipelineView(stages=4, micro_batches=4, schedule="1f1b")
    assert view.virtual_stages.disabled and [o[1] for o in view.schedule.options][-1] == "interleaved"
    view.schedule.value = "interleaved"  # v = 2 chunks per rank
    assert not view.virtual_stages.disabled
    drawn = _drawn(view.chart.figure)
    assert len(drawn) == 2 * 4 * 2 * 4 and {row for row, _, _ in drawn} == set(range(4))
    assert "interleaved 1F1B, v=2" in view.chart.figure.layout.title.text.replace("<br>", " ")
    assert "(p−1)/(v·m+p−1) = 3/11" in view.summary.value  # v m + p - 1 = 2 * 4 + 3
    assert abs(view.simulation.bubble_fraction - 3 / 11) < 1e-9
    view.micro_batches.value = 6  # not a multiple of p = 4: said, in both languages
    assert "micro_batches=6" in view.summary.value and "allowed" in view.summary.value
    set_language("zh")
    try:
        view.refresh("zh")
        assert "允许" in view.summary.value
    finally:
        set_language("en")
    view.micro_batches.value = 8
    assert "3/19" in view.summary.value and view.problem is None
    view.reset()
    assert view.in_flight_now() == [0] * 4 and not _drawn(view.chart.figure)
