"""Training state that survives: exact resume and rollback at every layout, resharding, refusals before start.

One warm pool of 8 ranks runs everything. Each layout of tests/test_layouts.py's
matrix trains the tiny GPT for 16 steps with a corrupted batch at step 13 and
the ``rollback`` policy, saving at step 11 and 16; a second run resumes from
the step-11 save. The resumed run must continue bit for bit (the spike
detector's window and the rollback snapshot, taken at step 10, come back with
it), and the rollback must equal the same rollback on one process. Three of
the saves are then resumed at other layouts (resharding).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

import dtlab.train
from dtlab.config import TrainConfig
from dtlab.i18n import DtlabError
from dtlab.launch import RankPool
from dtlab.state.checkpoint import step_folder
from tests.harness import session_pool

RUN = dict(model="tiny", steps=16, seed=0, lr=3e-2, spike=13, spike_policy="rollback")
SAVED = 11  # resumed from here; the rollback snapshot (taken at step 10) comes back with it
MATRIX = {
    "dp": dict(dp=2),
    "zero1": dict(dp=2, zero=1),
    "zero2": dict(dp=2, zero=2),
    "zero3": dict(dp=2, zero=3),
    "zero2-offload-accum": dict(dp=2, zero=2, offload=True, grad_accum=2),
    "zero3-offload": dict(dp=2, zero=3, offload=True),
    "zero3-prefetch": dict(dp=2, zero=3, zero3_prefetch=1),
    "tp": dict(tp=2),
    "pp-gpipe": dict(pp=2, micro_batches=2, schedule="gpipe"),
    "pp-1f1b": dict(pp=2, micro_batches=2, schedule="1f1b"),
    "pp4": dict(pp=4, micro_batches=4),
    "2x2x2": dict(dp=2, tp=2, pp=2, micro_batches=2),
    "fp16": dict(dp=2, precision="fp16"),
    "bf16": dict(dp=2, zero=3, precision="bf16"),
    "recompute": dict(dp=2, recompute=True),
    "accum": dict(dp=2, grad_accum=2),
}
RESHARD = {"zero3": dict(tp=2), "2x2x2": dict(dp=4, zero=1), "pp4": dict()}
"""Saved at the key's layout, resumed at the value's (the issue's three examples)."""


@pytest.fixture(scope="module")
def pool():
    return session_pool()  # warm ranks shared with the rest of the suite (tests/harness.py)


def _steps(run) -> list[tuple]:
    """What a resumed run must repeat exactly (straggler events are timings, and are left out)."""
    return [
        (r["step"], r["loss"], r["skipped"], r["loss_scale"], [e for e in r["events"] if e["kind"] != "straggler"])
        for r in run.records
    ]


@pytest.fixture(scope="module")
def runs(pool, tmp_path_factory):
    """name -> (uninterrupted run, run resumed from its step-11 save, save folder); plus one-process runs."""
    root = tmp_path_factory.mktemp("resume")
    out = {}
    for precision in ("fp32", "fp16", "bf16"):
        out[f"one process {precision}"] = dtlab.train(TrainConfig(**RUN, precision=precision), pool=pool).wait()
    for name, layout in MATRIX.items():
        saved = root / name
        straight = dtlab.train(TrainConfig(**RUN, **layout, save=str(saved), save_every=SAVED), pool=pool).wait()
        resumed = dtlab.train(TrainConfig(**RUN, **layout, resume=str(step_folder(saved, SAVED))), pool=pool).wait()
        out[name] = (straight, resumed, saved)
    for name, layout in RESHARD.items():
        out[f"{name} resharded"] = dtlab.train(
            TrainConfig(**RUN, **layout, resume=str(step_folder(out[name][2], SAVED))), pool=pool
        ).wait()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MATRIX))
def test_a_run_resumed_from_its_save_continues_bit_for_bit(runs, name):
    straight, resumed, _ = runs[name]
    assert [r["step"] for r in resumed.records] == list(range(SAVED, 16))
    assert _steps(resumed) == _steps(straight)[SAVED:], name  # losses, scales, events: exactly


@pytest.mark.slow
def test_zero3_prefetch_saves_resumes_and_rolls_back_as_without_it(runs):
    """Prefetch moves only when parameters arrive: the same steps, saves, rollback and resume, bit for bit."""
    for plain, prefetched in zip(runs["zero3"][:2], runs["zero3-prefetch"][:2]):
        assert _steps(prefetched) == _steps(plain)


def _guard_events(run) -> list[list[tuple]]:
    return [
        [(e["kind"], e.get("to_step")) for e in r["events"] if e["kind"] in ("spike", "rollback")] for r in run.records
    ]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MATRIX))
def test_a_spike_rolled_back_equals_the_same_rollback_on_one_process(runs, name):
    straight = runs[name][0]
    precision = MATRIX[name].get("precision", "fp32")
    alone = runs[f"one process {precision}"]
    events = _guard_events(straight)
    assert events == [[("spike", None), ("rollback", 10)] if step == 13 else [] for step in range(16)], name
    assert events == _guard_events(alone)
    tolerance = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 2e-2}[precision]
    assert max(abs(a - b) / b for a, b in zip(straight.losses(), alone.losses())) < tolerance, name
    assert straight.records[13]["skipped"] is True


@pytest.mark.slow
@pytest.mark.parametrize("source", list(RESHARD))
def test_a_checkpoint_resumes_at_another_layout(runs, source):
    """Resharded on load: the continued run equals continuing on the original layout within fp32
    reduction-order tolerance; Adam's state and the rollback snapshot follow."""
    straight = runs[source][0]
    resharded = runs[f"{source} resharded"]
    assert [r["step"] for r in resharded.records] == list(range(SAVED, 16))
    ranks = resharded.records[0]["ranks"]
    assert len(ranks) == TrainConfig(**RESHARD[source]).world_size
    assert max(abs(a - b) / b for a, b in zip(resharded.losses(), straight.losses()[SAVED:])) < 1e-5
    assert [[e["kind"] for e in r["events"] if e["kind"] != "straggler"] for r in resharded.records] == [
        [e["kind"] for e in r["events"] if e["kind"] != "straggler"] for r in straight.records[SAVED:]
    ]


# --------------------------------------------------------------------------- refused before any rank starts


def _refusal(config: TrainConfig) -> DtlabError:
    pool = RankPool(max_size=8)  # never started: a refusal must come before any rank
    try:
        with pytest.raises(DtlabError) as error:
            dtlab.train(config, pool=pool)
        assert pool.size == 0
    finally:
        pool.close()
    return error.value


@pytest.mark.slow
def test_a_resume_that_cannot_work_is_refused_before_any_rank_starts(runs, tmp_path):
    saved = runs["zero3"][2]  # steps 11 and 16 saved at dp=2 zero=3
    base = dict(RUN, dp=2, zero=3)
    cases = {
        "missing": (dict(resume=str(tmp_path / "nowhere")), "does not exist", "不存在"),
        "past the end": (dict(resume=str(saved)), "nothing is left to train", "没有剩下要训练的步"),
        "another model": (dict(resume=str(saved), steps=20, model="small"), "another model", "另一个模型"),
        "other data": (dict(resume=str(saved), steps=20, seed=1), "resume with --seed 0", "请用 --seed 0 恢复"),
        "other batches": (dict(resume=str(saved), steps=20, batch_size=16), "--batch-size 8", "--batch-size 8"),
    }
    for case, (changes, en, zh) in cases.items():
        error = _refusal(TrainConfig(**{**base, **changes}))
        assert en in error.en and zh in error.zh, (case, error.en)
    # A damaged newest save is reported, not passed over for the older one beside it.
    damaged = tmp_path / "damaged"
    shutil.copytree(saved, damaged)
    newest = step_folder(damaged, 16) / "rank00001.pt"
    newest.write_bytes(newest.read_bytes()[:-8])
    error = _refusal(TrainConfig(**{**base, "steps": 20, "resume": str(damaged)}))
    assert "step00000016/rank00001.pt is truncated" in error.en and "被截断" in error.zh
    (step_folder(damaged, 16) / "manifest.json").write_text("{")
    error = _refusal(TrainConfig(**{**base, "steps": 20, "resume": str(damaged)}))
    assert "step00000016/manifest.json is missing or damaged" in error.en


def test_the_command_line_refuses_a_missing_checkpoint_without_a_traceback(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "dtlab.train", "--model", "tiny", "--steps", "2", "--resume", str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "does not exist" in done.stderr and "不存在" in done.stderr
