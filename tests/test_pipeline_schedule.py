"""Pipeline schedules as data: ordering rules, deadlock freedom, bubble and memory, no processes."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest

from dtlab.i18n import ConfigError
from dtlab.parallel.pipeline.schedule import (
    Action,
    Deadlock,
    bubble_over_ideal,
    check_deadlock_free,
    dependencies,
    format_grid,
    gpipe,
    ideal_bubble_fraction,
    max_in_flight,
    one_f_one_b,
    peak_in_flight,
    schedule,
    simulate,
    stage_layers,
)

KINDS = ("gpipe", "1f1b")
LAYOUTS = [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 7, 16)]


def test_action_prints_like_pytorch():
    assert str(Action(1, "F", 0)) == "1F0"
    assert str(Action(3, "B", 12)) == "3B12"


@pytest.mark.parametrize("kind", KINDS)
def test_every_forward_and_backward_exactly_once_per_stage(kind):
    for p, m in LAYOUTS:
        actions = schedule(kind, p, m)
        assert len(actions) == p
        for s, mine in enumerate(actions):
            assert {a.stage for a in mine} == {s}  # one stage per rank
            counts = Counter((a.kind, a.micro_batch) for a in mine)
            assert counts == Counter({(k, i): 1 for k in "FB" for i in range(m)})
            forwards = [a.micro_batch for a in mine if a.kind == "F"]
            backwards = [a.micro_batch for a in mine if a.kind == "B"]
            assert forwards == sorted(forwards) and backwards == sorted(backwards)  # sends match receives
            for n, a in enumerate(mine):  # own F before own B
                if a.kind == "B":
                    assert Action(s, "F", a.micro_batch) in mine[:n]


@pytest.mark.parametrize("kind", KINDS)
def test_deadlock_free(kind):
    assert all(check_deadlock_free(schedule(kind, p, m)) for p, m in LAYOUTS)


def test_a_bad_order_deadlocks():
    # Stage 0 wants micro-batch 0's gradient before it has sent micro-batch 0 forward.
    bad = [[Action(0, "B", 0), Action(0, "F", 0)], [Action(1, "F", 0), Action(1, "B", 0)]]
    assert not check_deadlock_free(bad)
    with pytest.raises(Deadlock, match="0B0"):
        simulate(bad)


def test_dependencies():
    assert dependencies(Action(0, "F", 2), 4) == []
    assert dependencies(Action(2, "F", 1), 4) == [Action(1, "F", 1)]
    assert dependencies(Action(3, "B", 1), 4) == [Action(3, "F", 1)]
    assert set(dependencies(Action(1, "B", 0), 4)) == {Action(1, "F", 0), Action(2, "B", 0)}


def test_one_f_one_b_shape():
    # Stage s: p - s - 1 warm-up forwards, then alternate, then drain.
    assert [str(a) for a in one_f_one_b(4, 6)[0]] == [
        "0F0",
        "0F1",
        "0F2",
        "0F3",
        "0B0",
        "0F4",
        "0B1",
        "0F5",
        "0B2",
        "0B3",
        "0B4",
        "0B5",
    ]
    assert [str(a) for a in one_f_one_b(4, 6)[3]] == [
        "3F0",
        "3B0",
        "3F1",
        "3B1",
        "3F2",
        "3B2",
        "3F3",
        "3B3",
        "3F4",
        "3B4",
        "3F5",
        "3B5",
    ]
    assert [str(a) for a in gpipe(2, 2)[1]] == ["1F0", "1F1", "1B0", "1B1"]


@pytest.mark.parametrize("kind", KINDS)
def test_bubble_is_gpipe_formula(kind):
    assert simulate(schedule(kind, 4, 4), f_time=1, b_time=1).bubble_fraction == pytest.approx(3 / 7)
    assert simulate(schedule(kind, 4, 16), f_time=1, b_time=1).bubble_fraction == pytest.approx(3 / 19)
    assert ideal_bubble_fraction(4, 4) == Fraction(3, 7)
    for p, m in LAYOUTS:
        for b_time in (1, 2):  # the fraction does not depend on the backward / forward ratio
            sim = simulate(schedule(kind, p, m), f_time=1, b_time=b_time)
            assert sim.bubble_fraction == pytest.approx(float(ideal_bubble_fraction(p, m)))
            assert sim.makespan == (m + p - 1) * (1 + b_time)


@pytest.mark.parametrize("kind", KINDS)
def test_measured_durations_lay_out_as_the_dependencies_allow(kind):
    """simulate(durations=...) with every action's own time: uniform times give the formula back; a last
    stage twice as slow makes every other stage wait on it (by hand: 2 stages, 2 micro-batches)."""
    actions = schedule(kind, 4, 16)
    uniform = {a: 1.0 if a.kind == "F" else 2.0 for mine in actions for a in mine}
    assert simulate(actions, durations=uniform) == simulate(actions, f_time=1, b_time=2)
    slow_last = {a: (2.0 if a.stage == 1 else 1.0) for mine in schedule(kind, 2, 2) for a in mine}
    sim = simulate(schedule(kind, 2, 2), durations=slow_last)
    # stage 1: F0 [1,3], then F1, B0 or B0, F1, then B1 [7,9]; stage 0: F0 [0,1], F1 [1,2], B0 [5,6] or
    # [7,8], B1 [9,10]. Busy 4 + 8 of 2 x 10.
    assert sim.makespan == 10 and sim.bubble_fraction == pytest.approx(1 - (4 + 8) / (2 * 10))


def test_the_bench_reads_the_bubble_from_each_actions_cpu_time():
    """dtlab bench pipeline's figure: each action's median CPU time over the step records, laid out by the
    schedule; a record whose actions ran in another order is refused."""
    from dtlab.bench.pipeline import measured_bubble

    for kind in KINDS:
        sim = simulate(schedule(kind, 4, 4), f_time=1, b_time=2)

        def record(scale):
            return {
                "ranks": [
                    {"pp": r, "timeline": [{"action": str(t.action), "cpu": scale * (t.end - t.start)} for t in timed]}
                    for r, timed in reversed(list(enumerate(sim.timeline)))
                ]
            }

        slow = record(1.0)
        slow["ranks"][0]["timeline"][0]["cpu"] = 50.0  # one step's outlier: the median leaves it out
        assert measured_bubble([record(1.0), slow, record(1.0)], kind, 4, 4) == pytest.approx(3 / 7)
        shuffled = record(1.0)
        shuffled["ranks"][0]["timeline"].reverse()
        with pytest.raises(RuntimeError, match="not the"):
            measured_bubble([shuffled], kind, 4, 4)


def test_in_flight_micro_batches():
    for p, m in LAYOUTS:
        assert max_in_flight(gpipe(p, m)) == [m] * p
        in_flight = max_in_flight(one_f_one_b(p, m))
        assert in_flight == [min(p - s, m) for s in range(p)]
        assert max(in_flight) <= p


@pytest.mark.parametrize("kind", KINDS)
def test_closed_forms_match_the_schedules(kind):
    # The planner's arithmetic (written once, here) against the schedules themselves.
    for p, m in LAYOUTS:
        assert [peak_in_flight(kind, p, m, s) for s in range(p)] == max_in_flight(schedule(kind, p, m))
        assert bubble_over_ideal(p, m) == Fraction(p - 1, m)
        # Narayanan et al. 2021: bubble over ideal time; GPipe's fraction of the total.
        assert ideal_bubble_fraction(p, m) == bubble_over_ideal(p, m) / (1 + bubble_over_ideal(p, m))
    assert float(ideal_bubble_fraction(4, 4)) == 3 / 7 and float(ideal_bubble_fraction(4, 16)) == 3 / 19


def test_stage_layers():
    assert stage_layers(4, 2) == [range(0, 2), range(2, 4)]
    assert stage_layers(5, 2) == [range(0, 3), range(3, 5)]  # uneven: the first stages take more
    assert [len(r) for r in stage_layers(10, 4)] == [3, 3, 2, 2]
    with pytest.raises(ConfigError, match="pp=5"):
        stage_layers(4, 5)


def test_format_grid():
    assert format_grid(gpipe(2, 2)) == (
        "t       0   1   2   3   4   5\nrank 0 0F0 0F1  .   .  0B0 0B1\nrank 1  .  1F0 1F1 1B0 1B1  ."
    )
    grid = format_grid(one_f_one_b(4, 8), b_time=2).splitlines()
    assert len(grid) == 5 and grid[4].startswith("rank 3  .   .   .  3F0 3B0 3B0 3F1")


def test_bad_arguments_are_bilingual():
    with pytest.raises(ConfigError, match="schedule='zb'") as err:
        schedule("zb", 2, 2)
    assert "不合法" in str(err.value)
    with pytest.raises(ConfigError, match="micro_batches=0"):
        gpipe(2, 0)


# --------------------------------------------------------------------------- interleaved 1F1B

INTERLEAVED = [(p, v, m) for p in (2, 3, 4, 8) for v in (2, 3, 4) for m in (p, 2 * p, 3 * p, 4 * p)]


def test_interleaved_runs_every_chunk_of_every_micro_batch_exactly_once():
    for p, v, m in INTERLEAVED:
        actions = schedule("interleaved", p, m, v)
        assert len(actions) == p
        for r, mine in enumerate(actions):
            assert {a.stage for a in mine} == {c * p + r for c in range(v)}  # rank r: chunks r, r+p, ...
            counts = Counter((a.stage, a.kind, a.micro_batch) for a in mine)
            assert counts == Counter({(c * p + r, k, i): 1 for c in range(v) for k in "FB" for i in range(m)})
            for stage in {a.stage for a in mine}:  # per chunk, micro-batches in order: sends match receives
                for kind in "FB":
                    order = [a.micro_batch for a in mine if a.stage == stage and a.kind == kind]
                    assert order == sorted(order)


def test_interleaved_respects_the_dependencies():
    for p, v, m in INTERLEAVED:
        sim = simulate(schedule("interleaved", p, m, v), f_time=1, b_time=2)  # raises if it deadlocks
        at = {t.action: t for rank in sim.timeline for t in rank}
        last = p * v - 1
        for a, t in at.items():
            s, kind, i = a.stage, a.kind, a.micro_batch
            if kind == "F" and s > 0:  # chunk s after chunk s - 1, for the same micro-batch
                assert t.start >= at[Action(s - 1, "F", i)].end
            if kind == "B":  # backward reversed, after its own forward
                assert t.start >= at[Action(s, "F", i)].end
                if s < last:
                    assert t.start >= at[Action(s + 1, "B", i)].end


def test_interleaved_bubble_is_the_papers_formula():
    # Narayanan et al. 2021, Sec. 2.2.2: bubble time over ideal time = (1/v)(p - 1)/m.
    for p, v, m in INTERLEAVED:
        for b_time in (1, 2):
            sim = simulate(schedule("interleaved", p, m, v), f_time=1, b_time=b_time)
            ideal = m * v * (1 + b_time)  # every chunk's forward and backward, no idle time
            assert Fraction(sim.makespan - ideal) / ideal == Fraction(p - 1, v * m) == bubble_over_ideal(p, m, v)
            assert sim.bubble_fraction == pytest.approx(float(ideal_bubble_fraction(p, m, v)))
    # v = 1 would be the plain schedules' bubble; v chunks divide it by v.
    assert bubble_over_ideal(4, 8, 2) == bubble_over_ideal(4, 8) / 2 == Fraction(3, 16)


def test_interleaved_in_flight_closed_form_and_korthikantis_factor():
    for p, v, m in INTERLEAVED:
        held = max_in_flight(schedule("interleaved", p, m, v))
        assert [peak_in_flight("interleaved", p, m, r, v) for r in range(p)] == held
        if m > p:  # rank 0 holds p (1 + (p - 1) / (p v)) micro-batches of a whole stage (Korthikanti et al. 2022)
            assert Fraction(held[0], v) == p * (1 + Fraction(p - 1, p * v))


def test_interleaved_layers_in_flight_match_the_schedule():
    from dtlab.parallel.pipeline.schedule import peak_layers_in_flight

    for n_layer in (8, 12, 24, 25):
        for p, v, m in [(2, 2, 4), (4, 2, 8), (2, 3, 6), (4, 3, 4)]:
            if p * v > n_layer:
                continue
            chunks = stage_layers(n_layer, p * v)
            peaks = []
            for mine in schedule("interleaved", p, m, v):
                held = peak = 0
                for a in mine:
                    held += len(chunks[a.stage]) * (1 if a.kind == "F" else -1)
                    peak = max(peak, held)
                peaks.append(peak)
            closed = peak_layers_in_flight(n_layer, "interleaved", p, m, v)
            if n_layer % (p * v) == 0:
                assert closed == max(peaks)
            assert closed >= max(peaks)
        assert peak_layers_in_flight(n_layer, "1f1b", 4, 8) == max(
            peak_in_flight("1f1b", 4, 8, r) * len(blocks) for r, blocks in enumerate(stage_layers(n_layer, 4))
        )


@pytest.mark.parametrize(
    "args, words",
    [
        (("interleaved", 4, 6, 2), ("micro_batches a multiple of pp", "pp=4, micro_batches=6")),
        (("interleaved", 1, 4, 2), ("pp >= 2",)),
        (("interleaved", 4, 8, 1), ("virtual_stages=1", ">= 2")),
        (("1f1b", 4, 8, 2), ("virtual_stages=2 needs schedule='interleaved'",)),
    ],
)
def test_interleaved_refusals_are_bilingual(args, words):
    with pytest.raises(ConfigError) as refusal:
        schedule(*args)
    for word in words:
        assert word in refusal.value.en
    assert any("\u4e00" <= c <= "\u9fff" for c in refusal.value.zh)
