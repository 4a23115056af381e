"""Faults a hostile tester would inject, each ending cleanly.

Each scenario must end within the run's timeout plus a few seconds, with a
message in English and Chinese naming the rank and the cause, no process left
behind, and the newest complete checkpoint intact and resumable:

* a rank killed (SIGKILL) mid-step and mid-save: rank 0, a middle rank, the
  last pipeline stage (dp 2 x pp 2: ranks 0 and 1 hold stage 0, ranks 2 and 3 the last);
* a rank stopped (SIGSTOP): its peers time out, and the error names it;
* a disk that fills up during a save;
* SIGINT, SIGTERM and SIGHUP to the ``dtlab train`` command.

Every scenario kills a pool, so each pays a cold start: slow, but it runs in CI.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import dtlab
from dtlab.config import TrainConfig
from dtlab.launch import CollectiveTimeout, RankDied, RankPool, RunTimeout
from dtlab.launch.resources import descendants
from dtlab.state.checkpoint import latest_step
from tests.harness import alive

pytestmark = pytest.mark.slow

CJK = re.compile(r"[\u4e00-\u9fff]")
LAYOUT = dict(dp=2, pp=2, micro_batches=2, model="tiny", batch_size=4)
VICTIMS = {"rank 0": 0, "a middle rank": 1, "the last pipeline stage": 3}
TIMEOUT_S = 20.0
"""The runs' collective timeout: a failure must be reported well within it (plus a few seconds)."""


def train_stalling_in_save(ctx, config, victim: int, stall_step: int, marker: str):
    """Train as dtlab does, but ``victim`` stalls half-way through saving step ``stall_step``.

    Half-way: right after its own rank file is in place and before the
    checkpoint is committed (the manifest is the commit), so a kill now
    leaves an interrupted save behind. ``marker`` appears when it stalls.
    """
    from dtlab.train.loop import train_rank

    if ctx.rank == victim:
        real_replace = os.replace

        def replace(src, dst, *args, **kwargs):
            real_replace(src, dst, *args, **kwargs)
            if re.search(rf"step0*{stall_step}\b", str(dst)):
                open(marker, "w").close()
                time.sleep(600)

        os.replace = replace
    return train_rank(ctx, config)


def _wait_for(marker, within: float = 180.0) -> None:
    """Until the stalling rank writes ``marker`` (the run's records wait in its queue meanwhile)."""
    deadline = time.monotonic() + within
    while not marker.exists():
        assert time.monotonic() < deadline, "the victim never reached the save of step 4"
        time.sleep(0.05)


def _no_process_left(pids: list[int], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def _assert_names(error, rank: int, cause: str) -> None:
    assert f"rank {rank}" in error.en and cause in error.en, error.en
    assert f"rank {rank}" in error.zh and CJK.search(error.zh), error.zh


@pytest.mark.parametrize("victim", VICTIMS.values(), ids=VICTIMS.keys())
def test_a_rank_killed_mid_step_is_named_and_nothing_is_left(victim):
    pool = RankPool(max_size=4)
    run = dtlab.train(TrainConfig(steps=100_000, timeout_s=TIMEOUT_S, **LAYOUT), pool=pool)
    with pytest.raises(RankDied) as info:
        for record in run:
            if record["step"] == 1:
                pids = list(pool.pids)  # now: a start that failed to form is retried on new workers
                os.kill(pids[victim], signal.SIGKILL)
                killed = time.monotonic()
    assert time.monotonic() - killed < TIMEOUT_S + 5
    _assert_names(info.value, victim, "SIGKILL")
    assert _no_process_left(pids)


@pytest.mark.parametrize("victim", VICTIMS.values(), ids=VICTIMS.keys())
def test_a_rank_killed_mid_save_leaves_the_newest_complete_checkpoint(victim, tmp_path):
    """Saves at steps 2 and 4; the victim dies inside the save of step 4, so step 2 is the newest.

    Once (the last stage's death), the run then resumes from it, on the same pool.
    """
    marker, save = tmp_path / "stalled", tmp_path / "ckpt"
    config = TrainConfig(steps=6, save=str(save), save_every=2, timeout_s=TIMEOUT_S, **LAYOUT)
    pool = RankPool(max_size=4)
    run = pool.run(train_stalling_in_save, 4, config, victim, 4, str(marker), timeout=TIMEOUT_S)
    _wait_for(marker)
    pids = list(pool.pids)
    os.kill(pids[victim], signal.SIGKILL)
    killed = time.monotonic()
    with pytest.raises(RankDied) as info:
        run.wait()
    assert time.monotonic() - killed < TIMEOUT_S + 5
    _assert_names(info.value, victim, "SIGKILL")
    assert _no_process_left(pids)
    assert latest_step(save) == 2
    if victim == VICTIMS["the last pipeline stage"]:
        resumed = dtlab.train(TrainConfig(steps=6, resume=str(save), timeout_s=TIMEOUT_S, **LAYOUT), pool=pool)
        resumed.wait()
        assert [r["step"] for r in resumed.records] == [2, 3, 4, 5]
    pool.close()


@pytest.mark.parametrize("collectives", ["torch", "dtlab"])
def test_a_stopped_rank_is_named_when_its_peers_time_out(collectives):
    """Under torch's collectives gloo times out; under dtlab's, the ring over shared memory does."""
    pool = RankPool(max_size=4)
    dtlab.train(TrainConfig(steps=1, **LAYOUT), pool=pool).wait()  # warm: start-up is not the test
    run = dtlab.train(TrainConfig(steps=100_000, timeout_s=3.0, collectives=collectives, **LAYOUT), pool=pool)
    pids = list(pool.pids)
    try:
        with pytest.raises((CollectiveTimeout, RunTimeout)) as info:
            for record in run:
                if record["step"] == 1:
                    os.kill(pids[2], signal.SIGSTOP)
                    stopped = time.monotonic()
        assert time.monotonic() - stopped < 3.0 + 15
        assert info.value.culprits == [2] and info.value.stopped == [2]
        _assert_names(info.value, 2, "SIGSTOP")
        assert "SIGSTOP" in info.value.zh
        assert _no_process_left(pids)
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def small_disk(tmp_path):
    """A 1.5 MiB tmpfs: room for the check before step 0 (one checkpoint), not for a run's saves."""
    folder = tmp_path / "disk"
    folder.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(folder)], capture_output=True
    ).returncode:
        pytest.skip("a full disk needs a tmpfs mount (root)")
    yield folder
    subprocess.run(["umount", str(folder)], capture_output=True)


def test_a_disk_that_fills_during_a_save_is_named_and_the_last_checkpoint_resumes(small_disk):
    save = small_disk / "ckpt"
    pool = RankPool(max_size=4)
    run = dtlab.train(TrainConfig(steps=200, save=str(save), save_every=1, timeout_s=TIMEOUT_S, **LAYOUT), pool=pool)
    pids = list(pool.pids)
    with pytest.raises(dtlab.launch.RankError) as info:
        run.wait()
    assert "No space left on device" in info.value.en and "磁盘已满" in info.value.zh
    assert f"rank {info.value.rank}" in info.value.zh
    assert _no_process_left(pids)
    newest = latest_step(save)
    assert newest is not None and newest >= 1
    resumed = dtlab.train(TrainConfig(steps=newest + 1, resume=str(save), timeout_s=TIMEOUT_S, **LAYOUT), pool=pool)
    resumed.wait()
    pool.close()
    assert [r["step"] for r in resumed.records] == [newest]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_the_command_ends_every_rank_with_a_bilingual_message(signum):
    proc = subprocess.Popen(
        [sys.executable, "-m", "dtlab.cli", "train", "--dp", "2", "--model", "tiny", "--steps", "100000", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    try:
        assert json.loads(proc.stdout.readline())["step"] == 0
        children = descendants(proc.pid)
        assert len(children) >= 2  # two ranks (and multiprocessing's helpers)
        proc.send_signal(signum)
        sent = time.monotonic()
        try:
            _, err = proc.communicate(timeout=60)  # keep reading: a full stdout pipe would block its exit
        except subprocess.TimeoutExpired:  # show where it hangs (faulthandler dumps on SIGABRT)
            proc.send_signal(signal.SIGABRT)
            pytest.fail(f"no exit 60 s after {signum.name}:\n{proc.communicate(timeout=30)[1][-8000:]}")
        assert proc.returncode == 128 + signum, err
        assert time.monotonic() - sent < 15
        assert signum.name in err and "已中断" in err and "every rank was ended" in err, err
        assert "Traceback" not in err and "frame #" not in err, err
        assert _no_process_left(children)
    finally:
        proc.kill()


NO_GUARD_SCRIPT = """
import dtlab
dtlab.train(dtlab.TrainConfig(dp=2, model="tiny", steps=2)).wait()
"""


def test_a_script_without_a_main_guard_gets_a_hint(tmp_path):
    script = tmp_path / "no_guard.py"
    script.write_text(NO_GUARD_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert 'if __name__ == "__main__":' in proc.stderr and CJK.search(proc.stderr), proc.stderr


def test_a_timeout_where_every_rank_joined_says_the_calls_did_not_match():
    """Every rank was inside a call when the timeout fired (a send whose receive never came): no rank is
    to blame for not arriving, so the message says the calls did not match, in both languages."""
    error = CollectiveTimeout(0, "Traceback ...\nRuntimeError: Timed out", unfinished=[0, 1], timeout_s=5, culprits=[])
    assert "did not match" in error.en and "no rank" not in error.en and "waited for it" not in error.en
    assert "不匹配" in error.zh and "no rank" not in error.zh and "一直在等它" not in error.zh
    named = CollectiveTimeout(0, "", unfinished=[0, 1], timeout_s=5, culprits=[1])
    assert "rank 1 never joined it, while rank 0 waited for it" in named.en and "rank 1 没有加入" in named.zh
