"""The training loop against the single-process reference, and the record contract."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import dtlab.train
from dtlab import cli
from dtlab.config import MODEL_PRESETS, TrainConfig
from dtlab.reference import reference_train
from tests.harness import session_pool
from tests.test_bad_inputs import nothing_may_start  # noqa: F401 - a fixture

CONTRACT_STEP = {"step", "loss", "lr", "tokens_per_s", "step_time_s", "loss_scale", "skipped", "ranks", "events"}
CONTRACT_RANK = {"rank", "dp", "tp", "pp", "compute_s", "comm_s", "idle_s", "mem"}
CONTRACT_MEM = {"params", "grads", "optimizer", "activations"}


def relative(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


@pytest.fixture(scope="module")
def reference_losses():
    return reference_train(TrainConfig(steps=20, seed=0))[0]


@pytest.mark.parametrize("dp,grad_accum", [(1, 1), (2, 1), (4, 1), (2, 2)])
def test_data_parallel_matches_the_single_process_reference(dp, grad_accum, reference_losses):
    run = dtlab.train(TrainConfig(dp=dp, grad_accum=grad_accum, steps=20, seed=0), pool=session_pool()).wait()
    losses = run.losses()
    assert len(losses) == 20
    assert max(relative(a, b) for a, b in zip(losses, reference_losses)) < 1e-4
    assert losses[-1] < losses[0] - 0.5  # it learns


def test_every_step_line_carries_the_contract_and_exact_parameter_bytes():
    config = TrainConfig(dp=4, steps=3, seed=1, model="tiny")
    run = dtlab.train(config, pool=session_pool()).wait()
    n_params = MODEL_PRESETS["tiny"].param_count()
    assert [r["step"] for r in run.records] == [0, 1, 2]
    for record in run.records:
        assert CONTRACT_STEP <= record.keys()
        assert record["loss_scale"] is None and record["skipped"] is False
        assert isinstance(record["events"], list)
        assert [r["rank"] for r in record["ranks"]] == [0, 1, 2, 3]
        for rank in record["ranks"]:
            assert CONTRACT_RANK <= rank.keys() and CONTRACT_MEM <= rank["mem"].keys()
            assert rank["mem"]["params"] == 4 * n_params  # fp32: 4 bytes per parameter
            assert rank["mem"]["grads"] == 4 * n_params
            assert rank["mem"]["optimizer"] == 8 * n_params  # Adam's two moments
            assert rank["mem"]["activations"] > 0
            assert min(rank["compute_s"], rank["comm_s"], rank["idle_s"]) >= 0
        json.dumps(record)  # JSON-serialisable as it stands
    assert run.summary["summary"] is True and run.summary["params"] == n_params


def test_activation_bytes_shrink_with_the_per_rank_batch():
    """Each DP rank holds activations for its own slice: B/4 sequences instead of B."""
    pool = session_pool()
    one = dtlab.train(TrainConfig(dp=1, steps=1, batch_size=8), pool=pool).wait()
    four = dtlab.train(TrainConfig(dp=4, steps=1, batch_size=8), pool=pool).wait()
    a1 = one.records[0]["ranks"][0]["mem"]["activations"]
    a4 = four.records[0]["ranks"][0]["mem"]["activations"]
    assert 3.5 < a1 / a4 < 4.5


def test_a_straggler_is_flagged_in_the_records():
    run = dtlab.train(TrainConfig(dp=4, steps=3, model="tiny", straggler=(2, 0.5)), pool=session_pool()).wait()
    for record in run.records:
        assert {"kind": "straggler", "rank": 2} in record["events"]
        waits = {r["rank"]: r["comm_s"] for r in record["ranks"]}
        # the other ranks wait for rank 2 inside the gradient all-reduce
        assert min(waits[r] for r in (0, 1, 3)) > 0.3


def _cli_losses(*flags: str) -> list[float]:
    out = subprocess.run(
        [sys.executable, "-m", "dtlab.cli", "train", *flags, "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[-1]["summary"] is True
    return [line["loss"] for line in lines[:-1]]


def test_cli_dp4_matches_single_process_at_every_step():
    """Acceptance: `dtlab train --dp 4 --steps 20 --seed 0 --json` vs `dtlab train --steps 20 --seed 0 --json`."""
    one = _cli_losses("--steps", "20", "--seed", "0")
    four = _cli_losses("--dp", "4", "--steps", "20", "--seed", "0")
    assert len(one) == len(four) == 20
    assert max(relative(a, b) for a, b in zip(four, one)) < 1e-4


def test_cli_rejects_bad_configuration_in_both_languages_before_starting(nothing_may_start, capsys):
    """The real command once, as a process; the rest in this process (tests/test_bad_inputs.py's way: no rank
    may start), since each extra process costs seconds of torch import and proves nothing more."""
    cases = [
        (["--dp", "0"], "dp=0"),
        (["--model", "huge"], "huge"),
        (["--dp", "16"], "16"),
        (["--tp", "3"], "tp=3"),
        (["--dp", "3"], "batch_size 8"),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "dtlab.cli", "train", *cases[0][0]], capture_output=True, text=True, timeout=120
    )
    outcomes = [(proc.returncode, proc.stderr, proc.stdout, cases[0][1])]
    for flags, needle in cases[1:]:
        try:
            code = cli.main(["train", *flags])
        except SystemExit as exit_:  # argparse's errors exit from inside parse_args
            code = exit_.code
        captured = capsys.readouterr()
        outcomes.append((code, captured.err, captured.out, needle))
    for returncode, stderr, stdout, needle in outcomes:
        assert returncode == 2, stderr
        english, chinese = stderr.strip().splitlines()[-2:]
        assert needle in english and needle.split("=")[0] in chinese
        assert any("\u4e00" <= ch <= "\u9fff" for ch in chinese)
        assert stdout == ""


def test_python_dash_m_dtlab_is_the_dtlab_command():
    """``python -m dtlab`` (no scripts on PATH) runs the same command line as ``dtlab``."""
    outputs = [
        subprocess.run(
            [sys.executable, "-m", module, "plan", "--model", "small", "--dp", "2", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        for module in ("dtlab", "dtlab.cli")
    ]
    assert [p.returncode for p in outputs] == [0, 0], outputs[0].stderr
    assert json.loads(outputs[0].stdout) == json.loads(outputs[1].stdout)
    assert json.loads(outputs[0].stdout)["params"] > 0


def test_torchrun_runs_the_same_entry_point():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "-m",
            "dtlab.train",
            "--dp",
            "2",
            "--steps",
            "3",
            "--seed",
            "0",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert lines[-1]["summary"] is True and lines[-1]["world_size"] == 2
    reference = reference_train(TrainConfig(steps=3, seed=0))[0]
    assert max(relative(a["loss"], b) for a, b in zip(lines[:-1], reference)) < 1e-4
