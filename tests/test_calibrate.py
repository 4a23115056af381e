"""``dtlab calibrate``'s fits and profile, and ``dtlab plan --gpu local`` on a profile given here.

The fits are checked on synthetic timings that lie on a line (alpha and beta
come back exactly); the local step time against what the runtime issues per
step (tests/expected_comm.py, the tracer's counts), priced with a profile
written by the test, never measured in it. One real ``dtlab calibrate
--quick`` run is marked slow.
"""

import json
import math

import pytest

from dtlab.cli import main
from dtlab.config import TrainConfig
from dtlab.config.layout import Layout
from dtlab.i18n import ConfigError
from dtlab.planner import flops_per_iteration, plan, plan_for_config
from dtlab.planner.architectures import as_architecture
from dtlab.planner.communication import ring_all_gather_time, ring_allreduce_time, ring_reduce_scatter_time
from dtlab.planner.profile import (
    BURST_KINDS,
    LINK_KINDS,
    ComputeCost,
    LinkCost,
    MachineProfile,
    fit_line,
    fit_nonnegative,
    load_profile,
    save_profile,
)
from dtlab.train.run import local_prediction
from tests.expected_comm import expected_comm

ALPHA, BETA = {"all_reduce": 2e-4, "all_gather": 1e-4, "reduce_scatter": 1.5e-4, "send_recv": 5e-5}, 1e-9
FLOP_S = 2e10


def synthetic_profile(*, overhead_s=0.0, optimizer_s_per_param=0.0, step_s=0.0) -> MachineProfile:
    compute = {
        w: ComputeCost(
            flop_s=FLOP_S / w,
            overhead_s=overhead_s,
            matmul_flop_s=4e10 / w,
            optimizer_s_per_param=optimizer_s_per_param,
            step_s=step_s * w,
        )
        for w in (1, 2, 4)
    }
    links = {w: {k: LinkCost(alpha_s=ALPHA[k] * w, beta_s_per_byte=BETA * w) for k in LINK_KINDS} for w in (2, 4)}
    return MachineProfile(
        machine={"description": "test machine", "cores": 2, "memory_bytes": 8 * 2**30},
        torch="test",
        created="2026-12-01T00:00:00Z",
        model="small",
        compute=compute,
        links=links,
    )


@pytest.fixture
def profile_file(tmp_path, monkeypatch):
    path = tmp_path / "machine.json"
    save_profile(synthetic_profile(), path)
    monkeypatch.setenv("DTLAB_PROFILE", str(path))
    return path


def test_fit_recovers_alpha_and_beta_exactly():
    sizes = [4096, 65536, 262144, 1 << 20]
    for alpha, beta in ((1e-3, 6.7e-10), (25e-6, 8e-11), (0.0, 1e-9)):
        cost = LinkCost.fit(sizes, [alpha + beta * n for n in sizes])
        assert math.isclose(cost.alpha_s, alpha, rel_tol=1e-9, abs_tol=1e-15)
        assert math.isclose(cost.beta_s_per_byte, beta, rel_tol=1e-9)
    overhead, slope = fit_line([1e8, 2e8, 4e8, 8e8], [5e-3 + f / 3e10 for f in (1e8, 2e8, 4e8, 8e8)])
    assert math.isclose(overhead, 5e-3, rel_tol=1e-9) and math.isclose(1 / slope, 3e10, rel_tol=1e-9)
    # Noise that tilts the line below 0 is fitted under the constraint (non-negative least squares).
    assert fit_nonnegative([1, 2, 3], [3.0, 2.0, 1.0]) == (2.0, 0.0)
    assert fit_nonnegative([1, 2], [0.5, 2.5]) == (0.0, (0.5 + 5.0) / 5)
    assert LinkCost.fit([1, 2, 3], [3.0, 2.0, 1.0]) == LinkCost(alpha_s=2.0, beta_s_per_byte=1e-15)
    with pytest.raises(ConfigError) as error:
        fit_line([4096, 4096], [1.0, 2.0])
    assert "distinct" in error.value.en and "不同" in error.value.zh


def test_a_link_gives_back_the_measured_line_through_the_ring_formulas():
    profile = synthetic_profile()
    for n, formula in (
        (2, ring_allreduce_time),
        (4, ring_allreduce_time),
        (4, ring_all_gather_time),
        (2, ring_reduce_scatter_time),
    ):
        kind = {
            ring_allreduce_time: "all_reduce",
            ring_all_gather_time: "all_gather",
            ring_reduce_scatter_time: "reduce_scatter",
        }[formula]
        for nbytes in (8, 131072, 1 << 20):
            assert math.isclose(formula(nbytes, n, profile.link(kind, n)), profile.links[n][kind].time(nbytes))


def test_profile_round_trip_is_atomic(tmp_path):
    profile = synthetic_profile(overhead_s=1e-3, optimizer_s_per_param=1e-8)
    path = save_profile(profile, tmp_path / "dir" / "machine.json")
    assert load_profile(path) == profile
    assert [p.name for p in path.parent.iterdir()] == ["machine.json"]  # no temporary file left
    data = json.loads(path.read_text())
    assert data["version"] == 1 and data["torch"] == "test" and data["machine"]["description"] == "test machine"


def test_the_steps_own_cost_is_added_once_per_step_at_its_world_size(tmp_path):
    """``step_s`` (the trainer's bookkeeping, measured by calibrate) is added to the step as it is,
    whatever the micro-batches; a profile written before it existed reads as 0."""
    plain, with_step = tmp_path / "plain.json", tmp_path / "step.json"
    save_profile(synthetic_profile(), plain)
    save_profile(synthetic_profile(step_s=3e-3), with_step)
    for layout, world in ((dict(), 1), (dict(dp=2), 2), (dict(dp=4), 4), (dict(pp=2, micro_batches=4), 2)):
        config = TrainConfig(**layout)
        without, added = (plan_for_config(config, gpu=str(p)) for p in (plain, with_step))
        assert math.isclose(added.step_time_s - without.step_time_s, 3e-3 * world, rel_tol=1e-9), layout
    old = synthetic_profile().to_dict()
    for cost in old["compute"].values():
        del cost["step_s"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert load_profile(tmp_path / "old.json") == synthetic_profile()


def test_bucket_bursts_are_priced_as_calibrate_timed_them(tmp_path):
    """DP's bucket all-reduces and ZeRO-2's bucket reduce-scatters and all-gathers use the profile's burst
    kinds (several in flight at once, or back to back); ZeRO-1's single window and TP do not; a profile
    without them prices the plain kinds."""
    plain, burst = synthetic_profile(), synthetic_profile()
    for w in (2, 4):
        for kind, of in BURST_KINDS.items():
            burst.links[w][kind] = LinkCost(alpha_s=ALPHA[of] * w / 4, beta_s_per_byte=BETA * w)
    save_profile(plain, tmp_path / "plain.json")
    save_profile(burst, tmp_path / "burst.json")
    assert load_profile(tmp_path / "burst.json") == burst
    for layout in (dict(dp=2), dict(dp=4), dict(dp=2, zero=1), dict(dp=2, zero=2), dict(dp=4, zero=2), dict(tp=2)):
        config = TrainConfig(**layout)
        before, after = (plan_for_config(config, gpu=str(tmp_path / f)) for f in ("plain.json", "burst.json"))
        calls = expected_comm(config, {"rank": 0, "dp": 0, "tp": 0, "pp": 0})
        bursty = {0: ("all_reduce",), 2: ("reduce_scatter", "all_gather")}.get(config.zero, ()) if config.dp > 1 else ()
        saved = sum(calls[kind]["count"] * ALPHA[kind] * config.dp * 3 / 4 for kind in bursty)
        assert math.isclose(before.comm_time_s["dp"] - after.comm_time_s["dp"], saved, abs_tol=1e-12), layout
        assert (saved > 0) == bool(bursty) and after.comm_time_s["tp"] == before.comm_time_s["tp"]


def test_missing_and_corrupt_profiles_are_refused_in_both_languages(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_profile(tmp_path / "none.json")
    assert "dtlab calibrate" in error.value.en and "dtlab calibrate" in error.value.zh and "请先运行" in error.value.zh
    good = synthetic_profile().to_dict()
    for text in (
        "{not json",
        json.dumps({**good, "version": 99}),
        json.dumps({**good, "compute": {}}),
        json.dumps({**good, "kind": "something else"}),
        json.dumps([1, 2]),
    ):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(ConfigError) as error:
            load_profile(tmp_path / "bad.json")
        assert "not a machine profile" in error.value.en and "dtlab calibrate" in error.value.en
        assert "配置文件" in error.value.zh and "dtlab calibrate" in error.value.zh


def test_plan_gpu_local_without_a_profile_is_a_clean_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DTLAB_PROFILE", str(tmp_path / "absent.json"))
    assert main(["plan", "--model", "small", "--gpu", "local"]) == 2
    err = capsys.readouterr().err
    assert "run `dtlab calibrate` first" in err and "请先运行 `dtlab calibrate`" in err


def test_one_rank_is_its_flops_over_the_measured_flop_rate(profile_file, capsys):
    assert main(["plan", "--model", "small", "--batch-size", "8", "--gpu", "local", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    flops = flops_per_iteration(as_architecture("small"), batch_size=8)
    assert p["gpu"] == "local" and p["flops_per_iteration"] == flops
    assert math.isclose(p["step_time_s"], flops / FLOP_S) and p["comm_time_s"] == {"dp": 0, "tp": 0, "pp": 0}
    assert math.isclose(p["mfu"], p["model_flops_per_iteration"] / (p["step_time_s"] * 4e10))
    # The same plan from a file named on the command line.
    assert main(["plan", "--model", "small", "--batch-size", "8", "--gpu", str(profile_file), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == p["step_time_s"]


LAYOUTS = [
    dict(dp=2),
    dict(dp=4),
    dict(tp=2),
    dict(pp=2, micro_batches=4),
    dict(dp=2, zero=1),
    dict(dp=2, zero=2),
    dict(dp=2, zero=3),
    dict(dp=2, tp=2),
    dict(tp=2, recompute=True),
    dict(pp=2, micro_batches=4, schedule="interleaved", virtual_stages=2),
    dict(dp=2, pp=2, micro_batches=2, schedule="interleaved", virtual_stages=2),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_local_communication_prices_what_the_runtime_issues(layout, profile_file):
    """Every collective the tracer counts for the layout (tests/expected_comm.py), alpha + beta x bytes."""
    config = TrainConfig(**layout)
    p = plan_for_config(config, gpu="local")
    profile = load_profile(profile_file)
    want = {"dp": 0.0, "tp": 0.0, "pp": 0.0}
    rank = {"rank": 0, "dp": 0, "tp": 0, "pp": 0}
    axis = {
        "all_reduce.forward": "tp",
        "all_reduce.backward": "tp",
        "send.forward": "pp",
        "recv.backward": "pp",
        "recv.forward": "pp",
        "send.backward": "pp",  # rank 0's later chunks, interleaved
        "all_reduce": "dp",
        "reduce_scatter": "dp",
        "all_gather": "dp",
    }
    size = {"tp": config.tp, "dp": config.dp, "pp": 2}
    for kind, figures in expected_comm(config, rank).items():
        link = {
            "all_reduce.forward": "all_reduce",
            "all_reduce.backward": "all_reduce",
            "send.forward": "send_recv",
            "recv.backward": "send_recv",
            "recv.forward": "send_recv",
            "send.backward": "send_recv",
        }.get(kind, kind)
        cost = profile.links[size[axis[kind]]][link]
        want[axis[kind]] += figures["count"] * cost.alpha_s + figures["bytes"] * cost.beta_s_per_byte
    for name in ("dp", "tp", "pp"):
        assert math.isclose(p.comm_time_s[name], want[name], rel_tol=1e-9), (name, p.comm_time_s, want)
    # No overhead and no optimizer in this profile: compute stretched by the bubble, plus every collective.
    assert p.comm_time_s["step"] > 0
    assert math.isclose(p.step_time_s, p.compute_time_s / (1 - p.bubble_fraction) + sum(p.comm_time_s.values()))


def test_unsupported_local_layouts_are_refused_in_both_languages(profile_file):
    for model, layout in ((7_000_000_000, dict()), ("small", dict(cp=2))):
        with pytest.raises(ConfigError) as error:
            plan(model, Layout(**layout), gpu="local", seq_len=64)
        assert "--gpu local" in error.value.en and "--gpu local" in error.value.zh


def test_the_summary_sets_this_machines_prediction_beside_the_measurement(profile_file):
    config = TrainConfig(dp=2, steps=3)
    ranks = lambda c: [{"compute_s": c, "comm_s": 0.01}, {"compute_s": c / 2, "comm_s": 0.02}]  # noqa: E731
    records = [{"step_time_s": t, "ranks": ranks(c)} for t, c in ((9.0, 9.0), (0.05, 0.04), (0.07, 0.03))]
    local = local_prediction(config, records)
    predicted = plan_for_config(config, gpu="local")
    assert local["step_time_s"] == predicted.step_time_s and local["compute_s"] == predicted.compute_time_s
    assert local["measured_step_time_s"] == 0.07 and local["measured_compute_s"] == 0.04  # the first step left out
    assert local["measured_comm_s"] == 0.02 and local["step_time_ratio"] == 0.07 / predicted.step_time_s
    assert local["profile"] == str(profile_file)


def test_the_dashboard_draws_this_machines_prediction_beside_the_measured_speed(profile_file, tmp_path, monkeypatch):
    from dtlab.i18n import set_language
    from dtlab.lab.dashboard import Dashboard

    config = TrainConfig(dp=2, steps=6)
    dash = Dashboard()
    before = len(dash.speed.data)
    tokens_per_s = dash.add_prediction(config, "dp=2")
    predicted = plan_for_config(config, gpu="local")
    assert tokens_per_s == config.batch_size * config.model_config().seq_len / predicted.step_time_s
    line = dash.speed.data[-1]
    assert len(dash.speed.data) == before + 1
    assert list(line.x) == [0, 5] and list(line.y) == [tokens_per_s] * 2 and line.line.dash == "dot"
    assert line.name == "dp=2: predicted for this machine (planner)"
    try:
        set_language("zh")
        assert line.name == "dp=2：本机预测（规划器）"  # the dashboard follows the language
    finally:
        set_language("en")
    monkeypatch.setenv("DTLAB_PROFILE", str(tmp_path / "absent.json"))
    assert dash.add_prediction(config, "dp=2") is None and len(dash.speed.data) == before + 1  # no profile


@pytest.mark.slow
def test_kendall_tau_b():
    from dtlab.bench.planner import kendall_tau

    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    # 6 pairs: 4 concordant, 1 discordant, 1 tied in b only: (4 - 1) / sqrt(6 * 5)
    assert math.isclose(kendall_tau([1, 2, 3, 4], [1, 3, 2, 3]), 3 / math.sqrt(30))
    # Ties in both (tau-b, as scipy.stats.kendalltau): 4 concordant, one tied in each: 4 / sqrt(5 * 5)
    assert math.isclose(kendall_tau([1, 1, 2, 3], [1, 2, 2, 3]), 0.8)


def test_bench_planner_without_a_profile_is_refused_before_any_rank(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DTLAB_PROFILE", str(tmp_path / "absent.json"))
    assert main(["bench", "planner"]) == 2
    err = capsys.readouterr().err
    assert "dtlab calibrate" in err and "请先运行" in err


def test_bench_planner_calibrate_measures_first_and_predicts_with_that_profile(tmp_path, monkeypatch, capsys):
    """``--calibrate``: no profile is needed beforehand; the one measured on the bench's own pool is saved
    where ``dtlab calibrate`` saves it and is the one every prediction uses (here a synthetic profile
    stands in for the measurement, and a fake of the passes for the runs, so no rank starts)."""
    import dtlab.bench.planner as bench_planner
    import dtlab.planner.calibrate

    path = tmp_path / "machine.json"
    monkeypatch.setenv("DTLAB_PROFILE", str(path))
    pools = []
    monkeypatch.setattr(
        dtlab.planner.calibrate,
        "calibrate",
        lambda *, model, pool: pools.append(pool) or synthetic_profile(step_s=0.01),
    )
    categories = bench_planner.CATEGORIES

    def passes(configs, pool, *, warmup, passes, on_run=None):
        assert pools == [pool]  # calibrated on the same pool, before any layout ran
        ranks = [{"mem": {k: 1 for k in categories}}]
        return {name: {"step_times": [0.05], "runs": [[{"ranks": ranks}]]} for name in configs}

    monkeypatch.setattr(bench_planner, "run_in_passes", passes)
    monkeypatch.setattr(bench_planner, "speed_against", lambda profile, pool: {1: 1.0, 4: 1.0})
    assert main(["bench", "planner", "--calibrate", "--json"]) == 0
    out, err = capsys.readouterr()  # --json: the result alone on stdout, the tables on stderr
    assert "measured in this run" in err and "本次运行中测得" in err
    result = json.loads(out)
    assert result["profile"] == str(path) and load_profile(path).to_dict() == synthetic_profile(step_s=0.01).to_dict()
    for row in result["rows"]:
        config = TrainConfig(model="small", batch_size=8, steps=1, **bench_planner.LAYOUTS[row["layout"]])
        assert math.isclose(row["predicted_s"], plan_for_config(config, gpu=str(path)).step_time_s)
        assert math.isclose(row["ratio"], row["predicted_s"] / 0.05)


def test_calibrate_is_refused_for_other_benchmarks(capsys):
    assert main(["bench", "zero", "--calibrate"]) == 2
    err = capsys.readouterr().err
    assert "--calibrate" in err and "只用于" in err


def test_bench_planner_says_when_every_miss_is_the_machines_drift():
    from dtlab.bench.planner import machine_drift

    rows = lambda *ratios: [{"ratio": r} for r in ratios]
    assert machine_drift(rows(1.0, 1.1, 0.9, 1.19)) is None  # nothing outside ±20%
    assert machine_drift(rows(1.3, 1.25, 1.0)) is None  # two misses: could be the model
    assert machine_drift(rows(1.3, 1.25, 1.4, 1.0)) == "faster"  # predicted above measured everywhere
    assert machine_drift(rows(0.66, 0.74, 0.72, 0.96)) == "slower"
    assert machine_drift(rows(1.3, 0.7, 1.4)) is None  # misses both ways: the model, not drift


@pytest.mark.parametrize("fresh", [False, True])
def test_the_drift_hint_is_printed_in_both_languages(fresh, capsys):
    from dtlab.bench.planner import CATEGORIES, _print, machine_drift

    memory = {k: {"predicted": 1, "measured": 1} for k in CATEGORIES}
    rows = [
        {"layout": f"L{i}", "predicted_s": 0.03, "measured_s": 0.04, "ratio": 0.75, "memory": memory} for i in range(4)
    ]
    result = lambda rows: {
        "rows": rows,
        "kendall_tau": 1.0,
        "within_20_percent": 0,
        "machine_drift": machine_drift(rows),
        "load_average": [0.0, 0.0],
    }
    _print(result(rows), synthetic_profile(), fresh)
    out = capsys.readouterr().out
    assert "ran slower than when it was calibrated" in out and "比校准时跑得更慢" in out
    assert "run it again" in out and "再运行一次" in out
    _print(result(rows[:1]), synthetic_profile(), fresh)  # one miss: no hint
    assert "off the same way" not in capsys.readouterr().out
    checked = {**result(rows), "speed_check": {"after": {1: 1.05, 4: 0.97}}}  # the machine as calibrated
    _print(checked, synthetic_profile(), fresh)
    out = capsys.readouterr().out
    assert "these misses are the planner's" in out and "来自规划器" in out and "run it again" not in out


def test_the_speed_check_is_one_on_the_runs_calibrate_fitted_and_scales_with_the_machine(monkeypatch):
    """Calibrate keeps whatever its DP runs on 1, 2 and 4 ranks took beyond the profile's prediction, so
    the same runs timed again read 1.0 when they take what they took at calibration, and 1.3 when they
    take 30% longer (synthetic step times here; a real machine's read about 1.0)."""
    from dtlab.planner import whole_steps

    seconds = {1: 0.041, 2: 0.052, 4: 0.087}  # synthetic step times, above the profile's compute
    slower = {"by": 1.0}
    monkeypatch.setattr(
        whole_steps, "timed_steps", lambda config, pool: [seconds[config.dp] * slower["by"]] * whole_steps.STEP_TIMED
    )
    profile = whole_steps.measure_steps(synthetic_profile(), pool=None)
    assert all(profile.compute[n].step_s > 0 for n in (1, 2, 4))
    assert whole_steps.speed_against(profile, pool=None) == pytest.approx({1: 1.0, 4: 1.0})
    slower["by"] = 1.3
    assert whole_steps.speed_against(profile, pool=None) == pytest.approx({1: 1.3, 4: 1.3})


@pytest.mark.parametrize(
    "speed, recalibrates",
    [({1: 1.02, 4: 0.9}, False), ({1: 1.31, 4: 1.12}, True), ({1: 0.8, 4: 0.8}, True), ({1: 1.2, 4: 0.95}, False)],
)
def test_bench_planner_calibrates_again_when_the_profile_no_longer_fits_this_machine(
    speed, recalibrates, profile_file, monkeypatch, capsys
):
    """Before the layouts the bench times calibrate's own runs against the saved profile; more than 15%
    off either way (the two runs' geometric mean: one run swinging alone is not enough), it says so in
    both languages and calibrates again on the same pool first, and the predictions come from the new
    profile. The check is repeated after the layouts."""
    import dtlab.bench.planner as bench_planner
    import dtlab.planner.calibrate

    events = []
    monkeypatch.setattr(
        bench_planner,
        "speed_against",
        lambda profile, pool: events.append(("check", pool)) or (dict(speed) if len(events) == 1 else {1: 1.0, 4: 1.0}),
    )
    monkeypatch.setattr(
        dtlab.planner.calibrate,
        "calibrate",
        lambda *, model, pool: events.append(("calibrate", pool)) or synthetic_profile(step_s=0.01),
    )

    def passes(configs, pool, *, warmup, passes, on_run=None):
        events.append(("layouts", pool))
        ranks = [{"mem": {k: 1 for k in bench_planner.CATEGORIES}}]
        return {name: {"step_times": [0.05], "runs": [[{"ranks": ranks}]]} for name in configs}

    monkeypatch.setattr(bench_planner, "run_in_passes", passes)
    assert main(["bench", "planner", "--json"]) == 0
    out, err = capsys.readouterr()  # --json: the result alone on stdout, the tables on stderr
    assert [e[0] for e in events] == ["check"] + ["calibrate"] * recalibrates + ["layouts", "check"]
    assert len({id(e[1]) for e in events}) == 1  # one pool throughout
    assert ("no longer describes this machine" in err and "已不再符合本机" in err) == recalibrates
    result = json.loads(out)
    assert result["recalibrated"] == recalibrates
    first = "replaced" if recalibrates else "before"  # the check against a replaced profile is kept apart
    assert result["speed_check"] == {first: {str(k): v for k, v in speed.items()}, "after": {"1": 1.0, "4": 1.0}}
    used = synthetic_profile(step_s=0.01 if recalibrates else 0.0)
    assert load_profile(profile_file).to_dict() == used.to_dict()
    config = TrainConfig(model="small", batch_size=8, steps=1)
    assert math.isclose(result["rows"][0]["predicted_s"], plan_for_config(config, gpu=str(profile_file)).step_time_s)
