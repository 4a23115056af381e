"""The layout race (dtlab.lab.layout_race): the search's top layouts really run, and the figures are theirs.

The profile is written here (tests/test_calibrate.py's synthetic one): the
planner's numbers then do not depend on this machine, and nothing asserts a
timing, only that each layout ran, what it measured is what the result says,
and Kendall's tau is that of the returned numbers.
"""

import math

import pytest

from dtlab.i18n import ConfigError, set_language
from dtlab.lab.layout_race import LayoutRace
from dtlab.launch import RankPool
from dtlab.planner.profile import save_profile
from dtlab.planner.search import search
from tests.harness import session_pool
from tests.test_calibrate import synthetic_profile

FIELDS = (
    "dp",
    "tp",
    "pp",
    "micro_batches",
    "schedule",
    "virtual_stages",
    "zero",
    "recompute",
    "sequence_parallel",
    "precision",
)


def tau_b(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b written as the sum of sign products over the tie-corrected number of pairs."""
    sign = lambda v: (v > 0) - (v < 0)  # noqa: E731
    pairs = [(i, j) for i in range(len(x)) for j in range(i + 1, len(x))]
    s = sum(sign(x[i] - x[j]) * sign(y[i] - y[j]) for i, j in pairs)
    untied_x = sum(x[i] != x[j] for i, j in pairs)
    untied_y = sum(y[i] != y[j] for i, j in pairs)
    return s / math.sqrt(untied_x * untied_y)


def test_the_race_runs_the_searchs_top_layouts_and_reports_what_they_measured(tmp_path):
    path = save_profile(synthetic_profile(), tmp_path / "machine.json")
    race = LayoutRace(
        model="tiny", ranks=2, top=3, batch_size=4, steps=2, warmup=1, passes=1, profile=str(path), pool=session_pool()
    )
    ranked = search("tiny", gpus=2, gpu=str(path), batch_size=4).ranked
    expected, shapes = [], set()
    for plan in ranked:  # the fastest of each (dp, tp, pp), in the search's order
        if (plan.dp, plan.tp, plan.pp) not in shapes:
            shapes.add((plan.dp, plan.tp, plan.pp))
            expected.append(plan)
    expected = expected[:3]
    assert len(expected) == 3 and [p.to_dict() for p in race.layouts] == [p.to_dict() for p in expected]

    result = race.run()
    assert [r.predicted_rank for r in result.rows] == [1, 2, 3]
    predicted = [r.predicted_s for r in result.rows]
    assert predicted == [p.step_time_s for p in expected] == sorted(predicted)
    for row, plan in zip(result.rows, expected):
        assert row.plan.to_dict() == plan.to_dict()
        layout = row.config.layout
        assert (
            layout.dp,
            layout.tp,
            layout.pp,
            layout.micro_batches,
            layout.schedule,
            layout.virtual_stages,
            layout.zero,
            layout.recompute,
            layout.sp,
            layout.precision,
        ) == tuple(getattr(plan, f) for f in FIELDS)
        assert len(row.runs) == 1 and len(row.runs[0]) == 3  # 1 warm-up + 2 measured steps
        assert all(len(record["ranks"]) == 2 for record in row.runs[0])  # on both ranks
        assert row.step_times == [record["step_time_s"] for record in row.runs[0][1:]]
        assert all(s > 0 for s in row.step_times) and row.measured_s > 0
    measured = [r.measured_s for r in result.rows]
    assert sorted(r.measured_rank for r in result.rows) == [1, 2, 3]
    assert [r.measured_rank for r in sorted(result.rows, key=lambda r: r.measured_s)] == [1, 2, 3]
    assert result.fastest == min(result.rows, key=lambda r: r.measured_s).predicted_rank
    assert result.kendall_tau == pytest.approx(tau_b(predicted, measured), abs=1e-12)
    # What is drawn is what was returned: the planner's bars and the measured ones, labelled apart.
    assert list(race.figure.data[0].y) == [s * 1e3 for s in predicted]
    assert list(race.figure.data[1].y) == [s * 1e3 for s in measured]
    assert "planner" in race.figure.data[0].name and "measured" in race.figure.data[1].name
    assert f"{result.kendall_tau:.2f}" in race.table.value and "measured rank" in race.table.value


def test_without_a_profile_the_race_says_so_in_both_languages(tmp_path, monkeypatch):
    absent = tmp_path / "absent.json"
    monkeypatch.setenv("DTLAB_PROFILE", str(absent))  # where dtlab calibrate would write
    race = LayoutRace(ranks=2, pool=session_pool())
    assert race.layouts == [] and race.run_button.disabled and race.calibrate_button.layout.display is None
    with pytest.raises(ConfigError) as refusal:
        race.run()
    assert str(absent) in refusal.value.en and "run `dtlab calibrate`" in refusal.value.en
    assert "没有机器配置文件" in refusal.value.zh and "`dtlab calibrate`" in refusal.value.zh
    assert "dtlab calibrate" in race.status.value and "no machine profile" in race.status.value
    try:
        set_language("zh")
        assert "没有机器配置文件" in race.status.value and "校准本机" in race.calibrate_button.description
    finally:
        set_language("en")


def test_the_race_refuses_a_bad_number_of_ranks_in_both_languages():
    with pytest.raises(ConfigError) as refusal:
        LayoutRace(ranks=9, pool=RankPool(max_size=4))  # never started: the race refuses before any rank
    assert "ranks=9" in refusal.value.en and "from 2 to 4" in refusal.value.en and "ranks=9" in refusal.value.zh
