"""Progress on long commands (stderr: a bar on a terminal, a line per stage otherwise; stdout the result),
and ``dtlab bench all`` (every benchmark, the machine named, each goal checked, a failure recorded).

The two end-to-end tests run ``python -m dtlab bench dp --json --repeats 1`` and ``python -m dtlab
calibrate --quick --json`` for real: stderr names their stages, stdout is one JSON object. No timing is
asserted (CI is a loaded 2-core machine): only that the lines come, and what they say.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dtlab.bench
from dtlab.cli import main
from dtlab.config import command_progress
from dtlab.config.command_progress import Progress, current, stdout_to_stderr
from dtlab.planner import plan
from dtlab.planner.calibrate import format_profile
from dtlab.planner.profile import BURST_KINDS, LINK_KINDS, load_profile

ROOT = Path(__file__).resolve().parent.parent


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def english(monkeypatch):
    for name in ("LC_ALL", "LC_MESSAGES", "LANG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm")


def test_a_line_per_stage_where_stderr_is_not_a_terminal():
    stream = io.StringIO()
    with Progress("dtlab bench dp", total=3, stream=stream) as progress:
        assert current() is progress
        progress.stage("loading", "加载")
        progress.more(2)
        progress.stage("2 ranks, repeat 1 of 1", "2 个 rank，第 1 次")
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("dtlab bench dp [1/3] loading (")
    assert lines[1].startswith("dtlab bench dp [2/3] 2 ranks, repeat 1 of 1 (")
    assert lines[2].startswith("dtlab bench dp done in ")
    assert "\r" not in stream.getvalue()
    assert current().silent  # outside any command: nothing is said


def test_a_part_reports_inside_the_command_that_runs_it():
    stream = io.StringIO()
    with Progress("dtlab bench all", total=2, stream=stream) as outer:
        outer.stage("dp (1 of 2)", "dp（第 1 个，共 2 个）")
        with Progress("dp", stream=stream):
            current().stage("loading", "加载")
    lines = stream.getvalue().splitlines()
    assert lines[1].startswith("dtlab bench all [1/2] › dp [1/?] loading")
    assert lines[2].startswith("dtlab bench all [1/2] › dp done in")


def test_an_error_says_the_work_stopped():
    stream = io.StringIO()
    with pytest.raises(RuntimeError):
        with Progress("dtlab calibrate", stream=stream) as progress:
            progress.stage("1 rank", "1 个 rank")
            raise RuntimeError("a rank failed")
    assert "stopped after" in stream.getvalue().splitlines()[-1]
    assert current().silent


class _View:
    def __init__(self):
        self.seen = []

    def show(self, index, total, text):
        self.seen.append((index, total, text))

    def end(self, text, ok):
        self.seen.append(("end", ok, text))


def test_a_library_call_draws_its_stages_in_a_notebook_view_and_joins_a_command(monkeypatch):
    """calibrate() and other long calls: in a notebook (a view registered by dtlab.lab) a widget shows their
    stages; outside any command and notebook they are silent; inside a command they are the command's."""
    views = []
    monkeypatch.setattr(command_progress, "_notebook_view", [lambda: views.append(_View()) or views[-1]])
    for ok in (True, False):
        with pytest.raises(RuntimeError) if not ok else contextlib.nullcontext():
            with command_progress.library_call("calibrate"):
                current().more(2)
                current().stage("1 rank: compute", "1 个 rank：计算")
                current().stage("2 ranks: links", "2 个 rank：链路")
                if not ok:
                    raise RuntimeError("a rank failed")
    assert [v.seen[:2] for v in views] == [[(1, 2, views[0].seen[0][2]), (2, 2, views[0].seen[1][2])]] * 2
    assert views[0].seen[1][2].startswith("calibrate [2/2] 2 ranks: links")
    assert views[0].seen[-1][:2] == ("end", True) and "done in" in views[0].seen[-1][2]
    assert views[1].seen[-1][:2] == ("end", False) and "stopped after" in views[1].seen[-1][2]
    monkeypatch.setattr(command_progress, "_notebook_view", [lambda: None])  # a script: nothing is said
    with command_progress.library_call("calibrate") as progress:
        assert progress.silent
    stream = io.StringIO()
    with Progress("dtlab calibrate", stream=stream):
        with command_progress.library_call("calibrate"):
            current().stage("1 rank", "1 个 rank")
    assert stream.getvalue().splitlines()[0].startswith("dtlab calibrate [1/?] 1 rank")
    from dtlab.lab.progress_bar import ProgressView, view_in_kernel

    assert view_in_kernel() is None  # pytest is no kernel
    bar = ProgressView()
    bar.show(2, 3, "calibrate [2/3] 2 ranks")
    assert (bar.bar.value, bar.bar.max, bar.label.value) == (1, 3, "calibrate [2/3] 2 ranks")
    bar.end("calibrate stopped after 3 s", ok=False)
    assert (bar.bar.value, bar.bar.bar_style) == (3, "danger")


def test_chinese_where_the_user_reads_chinese(monkeypatch):
    monkeypatch.setenv("LANG", "zh_CN.UTF-8")
    assert command_progress.language() == "zh"
    stream = io.StringIO()
    with Progress("dtlab calibrate", total=1, stream=stream) as progress:
        progress.stage("1 rank", "1 个 rank：计算")
    out = stream.getvalue()
    assert "1 个 rank：计算" in out and "完成，用时" in out and "1 rank" not in out.replace("1 个 rank", "")
    monkeypatch.setenv("LANG", "en_US.UTF-8")
    monkeypatch.setenv("LC_ALL", "zh_TW.UTF-8")  # LC_ALL before LANG
    assert command_progress.language() == "zh"
    monkeypatch.setenv("LC_ALL", "C")
    assert command_progress.language() == "en"


def test_a_bar_on_a_terminal_that_a_print_never_lands_on(capsys):
    stream = Terminal()
    with Progress("dtlab bench zero", total=4, stream=stream) as progress:
        progress.stage("2 ranks, repeat 1 of 3", "")
        progress.stage("2 ranks, repeat 2 of 3", "")
        drawn = stream.getvalue()
        print("the table")  # a print while the bar is drawn wipes it first
        assert stream.getvalue() == drawn + "\r\x1b[K"
    text = stream.getvalue()
    assert "\r\x1b[Kdtlab bench zero [#####...............] 2/4 2 ranks, repeat 2 of 3" in text
    assert text.endswith(" done in 0 s\n") and text.count("\n") == 1
    assert capsys.readouterr().out == "the table\n"
    assert not isinstance(sys.stdout, command_progress._ClearBarFirst)  # put back


def test_stdout_to_stderr_keeps_stdout_for_the_result(capfd):
    with stdout_to_stderr():
        print("a table")
        os.system("echo from a child")  # a child process's stdout too
    print("{}")
    out, err = capfd.readouterr()
    assert out == "{}\n" and "a table" in err and "from a child" in err


# -- dtlab bench all, with stand-ins for the benchmarks (no rank starts)

RESULTS = {
    "dp": {"ratio": 0.9, "headline": "dp", "results": {"2": {"ratio": 0.85}, "4": {"ratio": 0.9}}},
    "pipeline": {
        "ratio": 1.1,
        "rows": [{"schedule": "1f1b", "m": 4, "measured": 0.45, "formula": 0.429}]
        + [{"schedule": "gpipe", "m": 16, "measured": 0.25, "formula": 0.158}],
    },
    "pool": {"ratio": 0.03},
}


def _stand_ins(monkeypatch, calls):
    def run_one(name, args, *, title=None):
        calls.append((name, args.calibrate, args.repeats, args.quick))
        with Progress(title or name) as progress:
            progress.stage(f"measuring {name}", f"测量 {name}")
            if name == "allreduce":
                raise RuntimeError("rank 1 failed")
            print(f"{name}'s table")
            return RESULTS[name]

    monkeypatch.setattr(dtlab.bench, "available", lambda: ["allreduce", "dp", "pipeline", "pool"])
    monkeypatch.setattr(dtlab.bench, "run_one", run_one)


def test_bench_all_runs_every_benchmark_names_the_machine_and_checks_each_goal(monkeypatch, capsys, tmp_path):
    calls = []
    _stand_ins(monkeypatch, calls)
    out_file = tmp_path / "all.json"
    assert main(["bench", "all", "--json", "--quick", "--out", str(out_file)]) == 1  # a benchmark failed
    out, err = capsys.readouterr()
    result = json.loads(out)  # stdout: the one JSON object, nothing else
    assert json.loads(out_file.read_text()) == result
    assert [c[0] for c in calls] == ["allreduce", "dp", "pipeline", "pool"]  # the others ran after the failure
    assert all(c[2] == 1 and c[3] for c in calls)  # --quick: one repeat
    machine = result["machine"]
    assert machine["cpu"] and machine["cpu_count"] == os.cpu_count() and machine["cores_usable"] >= 1
    assert machine["torch"] and machine["python"] == sys.version.split()[0] and machine["date"].endswith("Z")
    benches = result["benches"]
    assert "rank 1 failed" in benches["allreduce"]["error"] and benches["allreduce"]["pass"] is False
    assert benches["dp"]["pass"] is True and benches["dp"]["by_case"] == {"2": 0.85, "4": 0.9}
    assert benches["pipeline"]["pass"] is False  # GPipe m=16 0.09 off the formula
    assert "goal" not in benches["pool"] and benches["pool"]["ratio"] == 0.03
    assert result["failed"] == ["allreduce"]
    assert (result["goals_met"], result["goals_checked"], result["ratio"]) == (1, 3, 1 / 3)
    assert "dp's table" in err and "rank 1 failed" in err  # tables and the traceback: stderr
    assert "dtlab bench all [3/5] dp (2 of 4)" in err and "dtlab bench all [3/5] › dp [1/?] measuring dp" in err
    assert "dtlab bench all [2/5] › allreduce stopped after" in err and "goals met: 1 of 3" in err


def test_bench_all_asks_the_planner_to_calibrate_first(monkeypatch, capsys):
    calls = []
    _stand_ins(monkeypatch, calls)
    monkeypatch.setattr(dtlab.bench, "available", lambda: ["dp", "planner"])
    RESULTS["planner"] = {"ratio": 1.0, "within_20_percent": 10, "layouts": 11, "kendall_tau": 0.79}
    assert main(["bench", "all"]) == 0
    assert calls == [("dp", False, 3, False), ("planner", True, 3, False)]
    out = capsys.readouterr().out
    assert "MISSED" in out and "goals met: 1 of 2" in out  # tau 0.79 < 0.8


@pytest.mark.parametrize("argv", [["bench", "all", "--cluster"], ["bench", "dp", "--out", "/nonexistent/x.json"]])
def test_bench_refuses_before_measuring(argv, capsys):
    assert main(argv) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_single_benchmark_says_its_stages_and_prints_only_json(monkeypatch, capsys):
    import dtlab.bench.pool as pool_bench

    def run(args):
        current().more(1)
        current().stage("a cold start", "冷启动")
        print("the table")
        return {"ratio": 0.5}

    monkeypatch.setattr(pool_bench, "run", run)
    assert dtlab.bench.main(argparse.Namespace(name="pool", json=True, repeats=None, quick=True, out=None)) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"ratio": 0.5}
    assert err.splitlines()[0].startswith("dtlab bench pool [1/?] loading the benchmark")
    assert "dtlab bench pool [2/2] a cold start" in err and "the table" in err


# -- the commands themselves, end to end


WITHOUT_THE_LAB = """
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("plotly", "ipywidgets", "jupyterlab", "anywidget", "notebook", "IPython"):
            raise ImportError(f"{name}: not installed on this machine (a test)")

sys.meta_path.insert(0, Refuse())
"""


def _without_the_lab(tmp_path) -> str:
    """A PYTHONPATH on which plotly, ipywidgets, JupyterLab and IPython cannot be imported (as on a GPU
    machine that has torch only), in this process's children and in theirs."""
    folder = tmp_path / "without_the_lab"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(WITHOUT_THE_LAB)
    return f"{folder}{os.pathsep}{ROOT}"


def test_every_benchmark_loads_without_the_lab(tmp_path):
    """``dtlab bench all`` needs neither plotly nor JupyterLab nor ipywidgets: the command line, every
    benchmark and what their ranks import load without them."""
    code = (
        "import importlib, dtlab.cli\n"
        "dtlab.cli.build_parser()\n"
        "from dtlab.bench import available\n"
        "for name in [*available(), '_all']: importlib.import_module('dtlab.bench.' + name)\n"
        "import dtlab.train.loop, dtlab.train.compare, dtlab.launch.worker, dtlab.planner.whole_steps\n"
        "from dtlab.bench._all import machine; assert machine()['torch']\n"
    )
    env = {**os.environ, "PYTHONPATH": _without_the_lab(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _first_stderr_line_and_result(argv: list[str], tmp_path) -> tuple[str, str, str]:
    path = _without_the_lab(tmp_path)
    env = {**os.environ, "PYTHONPATH": path, "DTLAB_HOME": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("LANG", None)
    env.pop("LC_ALL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dtlab", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = proc.stderr.readline()  # arrives while the command still works (no timing asserted)
    out, rest = proc.communicate(timeout=900)
    assert proc.returncode == 0, first + rest
    return first, rest, out


def test_dtlab_bench_dp_says_its_stages_on_stderr_and_prints_only_json(tmp_path):
    first, rest, out = _first_stderr_line_and_result(["bench", "dp", "--json", "--repeats", "1"], tmp_path)
    assert first.startswith("dtlab bench dp [1/?] loading the benchmark")
    stages = re.findall(r"^dtlab bench dp \[(\d+)/(\d+)\] (.*) \(\d+ s\)$", rest, flags=re.M)
    assert [int(k) for k, _, _ in stages] == list(range(2, 2 + len(stages)))  # stage k of n, in order
    assert {n for _, n, _ in stages} == {str(len(stages) + 1)}  # the total known from the second stage
    assert stages[0][2] == "2 ranks: OverlappedDP and DDP step times, repeat 1 of 1"
    assert stages[-1][2].endswith("ranks: overlap of communication") and "dtlab bench dp done in" in rest
    result = json.loads(out)  # stdout is the result alone
    assert result["bench"] == "dp" and result["ratio"] > 0
    assert "data parallelism" in rest  # the table went to stderr


def test_dtlab_calibrate_says_its_stages_on_stderr_and_prints_only_json(tmp_path):
    """One quick calibration, checked three ways: progress on stderr, the result alone on stdout, and the
    profile it saves read by the planner (a calibration costs tens of seconds here: it runs once)."""
    out_path = tmp_path / "p.json"
    first, rest, out = _first_stderr_line_and_result(
        ["calibrate", "--quick", "--json", "--out", str(out_path)], tmp_path
    )
    assert re.match(r"dtlab calibrate \[1/\d+\] 1 rank: compute", first)
    assert re.search(r"dtlab calibrate \[(\d+)/\1\] a few training steps on", rest) and "done in" in rest
    assert json.loads(out)["compute"]
    # the profile the planner reads, and the report `dtlab calibrate` without --json prints of it
    profile = load_profile(out_path)
    report = format_profile(profile, out_path)
    assert "saved / 已保存" in report and "all_reduce" in report and "per step" in report and "簿记开销" in report
    assert sorted(profile.compute) == [1, 2, 4] and sorted(profile.links) == [2, 4]
    assert all(set(kinds) == set(LINK_KINDS) | set(BURST_KINDS) for kinds in profile.links.values())
    assert all(c.flop_s > 0 and c.matmul_flop_s > 0 and c.step_s >= 0 for c in profile.compute.values())
    assert plan("small", gpu=str(out_path)).step_time_s > 0


def test_dtlab_cluster_run_says_its_set_up_on_stderr(tmp_path):
    from dtlab.cluster.spec import unavailable_reason

    if unavailable_reason(shaped=False) is not None:
        pytest.skip("no namespace nodes on this machine (root or user namespaces)")
    argv = ["cluster", "run", "--nodes", "2", "--nproc-per-node", "1", "--", "train", "--dp", "2", "--steps", "1"]
    first, rest, out = _first_stderr_line_and_result(
        [*argv, "--model", "tiny", "--batch-size", "4", "--json"], tmp_path
    )
    assert first.startswith("dtlab cluster run [1/4] checking the job")
    for stage in (
        "[2/4] building 2 nodes",
        "[3/4] starting a torchrun on each of 2 nodes",
        "[4/4] waiting for the first",
    ):
        assert f"dtlab cluster run {stage}" in rest
    assert "dtlab cluster run set up in" in rest
    records = [json.loads(line) for line in out.splitlines()]  # stdout: the records only
    assert records[0]["step"] == 0 and records[-1]["summary"] is True
