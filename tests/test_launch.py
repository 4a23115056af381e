"""The launcher: real spawned ranks, a warm pool, streaming, and failures that leave nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from dtlab.course.experiments import basics
from dtlab.launch import CollectiveTimeout, GroupNotFormed, RankDied, RankError, RankPool, RunTimeout
from dtlab.launch.runs import START_RETRIES
from dtlab.launch.worker import Assignment, Job
from tests.harness import alive, run_ranks, session_pool

# ---- functions the ranks run (module level, so spawned processes can import them)


def identity(ctx):
    return {
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "pid": os.getpid(),
        "threads": torch.get_num_threads(),
        "backend": dist.get_backend(),
    }


def read_env(ctx, name):
    return os.environ.get(name)


def raise_on(ctx, bad_rank):
    if ctx.rank == bad_rank:
        raise ValueError(f"deliberate failure on rank {ctx.rank}")
    x = torch.ones(1)
    dist.all_reduce(x)
    return x.item()


def skip_collective(ctx, absent_rank):
    """Every rank but one enters an all-reduce; the absent one sleeps, so the others are stuck."""
    if ctx.rank == absent_rank:
        time.sleep(600)
    x = torch.ones(1)
    dist.all_reduce(x)
    return x.item()


def die_on(ctx, bad_rank):
    if ctx.rank == bad_rank:
        os._exit(7)
    x = torch.ones(1)
    dist.all_reduce(x)
    return x.item()


def emit_then_wait_for_file(ctx, path):
    """Emit a record, then block until the caller creates ``path``: proves records stream."""
    ctx.emit({"rank": ctx.rank, "phase": "before"})
    while not os.path.exists(path):
        time.sleep(0.01)
    return ctx.rank


# ---- tests


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_ranks_know_who_they_are(world_size):
    results = run_ranks(identity, world_size)
    assert [r["rank"] for r in results] == list(range(world_size))
    assert {r["world"] for r in results} == {world_size}
    assert {r["threads"] for r in results} == {1}
    assert {r["backend"] for r in results} == {"gloo"}
    assert len({r["pid"] for r in results}) == world_size


def test_all_reduce_of_rank_plus_one_is_ten_on_every_rank():
    assert run_ranks(basics.all_reduce_rank_plus_one, 4) == [10.0] * 4


def test_warm_pool_reuses_processes_across_world_sizes():
    pool = session_pool()
    first = [r["pid"] for r in run_ranks(identity, 4)]
    second = [r["pid"] for r in run_ranks(identity, 2)]
    third = [r["pid"] for r in run_ranks(identity, 4)]
    assert second == first[:2] and third == first
    assert pool.pids[:4] == first


def test_records_stream_before_the_ranks_finish():
    with tempfile.TemporaryDirectory() as tmp:
        gate = os.path.join(tmp, "go")
        run = session_pool().run(emit_then_wait_for_file, 2, gate, timeout=30)
        records = iter(run)
        first = next(records)  # arrives while every rank is still blocked on the gate
        assert first["phase"] == "before" and not run.finished
        open(gate, "w").close()
        rest = list(records)
        assert len(rest) == 1 and run.results == [0, 1]


def test_a_raising_rank_is_named_with_its_traceback_and_leaves_no_process():
    pool = RankPool(max_size=4)
    pool.start(4)
    pids = list(pool.pids)
    with pytest.raises(RankError) as info:
        pool.run(raise_on, 4, 2, timeout=30).wait()
    assert info.value.rank == 2
    assert "deliberate failure on rank 2" in str(info.value)
    assert "Traceback" in info.value.traceback and "raise_on" in info.value.traceback
    assert "rank 2" in info.value.zh
    assert not any(alive(p) for p in pids)
    assert pool.size == 0


def test_a_stuck_collective_times_out_naming_the_rank_that_never_came_and_leaves_no_process():
    pool = RankPool(max_size=2)
    pool.start(2)
    pids = list(pool.pids)
    with pytest.raises((CollectiveTimeout, RunTimeout)) as info:
        pool.run(skip_collective, 2, 1, timeout=2).wait()
    error = info.value
    assert error.culprits == [1]  # rank 0 waits in the all-reduce, rank 1 never joined it
    assert "rank 1 never joined" in error.en and "rank 1 没有加入" in error.zh
    assert not any(alive(p) for p in pids)


def test_a_rank_that_dies_is_named_and_leaves_no_process():
    pool = RankPool(max_size=2)
    pool.start(2)
    pids = list(pool.pids)
    with pytest.raises(RankDied) as info:
        pool.run(die_on, 2, 1, timeout=30).wait()
    assert info.value.rank == 1 and info.value.exitcode == 7
    assert not any(alive(p) for p in pids)


def test_a_failed_run_does_not_poison_the_next_one():
    pool = RankPool(max_size=2)
    with pytest.raises(RankError):
        pool.run(raise_on, 2, 0, timeout=30).wait()
    assert pool.run(basics.all_reduce_rank_plus_one, 2).wait() == [3.0, 3.0]
    pool.close()


INTERRUPT_SCRIPT = textwrap.dedent("""
    import sys
    from dtlab.launch import RankPool
    from dtlab.course.experiments import basics
    if __name__ == "__main__":
        pool = RankPool(max_size=4)
        run = pool.run(basics.emit_ticks, 4, 100000, 0.01, timeout=60)
        for i, record in enumerate(run):
            if i == 8:
                print(" ".join(map(str, pool.pids)), flush=True)
""")


def test_an_interrupt_ends_every_rank_within_five_seconds():
    """The notebook's stop button is SIGINT to the kernel; every rank must be gone soon after."""
    proc = subprocess.Popen(
        [sys.executable, "-c", INTERRUPT_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()  # printed once records are streaming
        pids = [int(p) for p in line.split()]
        assert len(pids) == 4 and all(alive(p) for p in pids)
        proc.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        while any(alive(p) for p in pids) and time.monotonic() - interrupted < 5.0:
            time.sleep(0.05)
        assert not any(alive(p) for p in pids), "ranks still alive 5 s after the interrupt"
        proc.wait(timeout=30)
        assert "KeyboardInterrupt" in proc.stderr.read()
    finally:
        proc.kill()


def test_two_pools_at_once_do_not_collide():
    """Two kernels each own their rendezvous: a private directory of store files."""
    a, b = RankPool(max_size=2), RankPool(max_size=2)
    try:
        run_a = a.run(basics.all_reduce_rank_plus_one, 2)
        run_b = b.run(basics.all_reduce_rank_plus_one, 2)
        assert a.rendezvous != b.rendezvous
        assert all(os.stat(d).st_mode & 0o777 == 0o700 for d in (a.rendezvous, b.rendezvous))
        assert run_a.wait() == [3.0, 3.0] and run_b.wait() == [3.0, 3.0]
    finally:
        a.close()
        b.close()


def test_a_pool_refuses_more_ranks_than_it_allows():
    from dtlab.i18n import DtlabError

    with pytest.raises(DtlabError, match="at most 4"):
        RankPool(max_size=4).run(identity, 5)


def test_breaking_out_of_the_records_neither_ends_the_run_nor_the_pool():
    pool = session_pool()
    before = [r["pid"] for r in run_ranks(identity, 2)]
    run = pool.run(basics.emit_ticks, 2, 5)
    for record in run:
        break  # a notebook cell may stop reading early
    assert run.wait() == [5, 5] and len(run.records) == 10
    assert [r["pid"] for r in run_ranks(identity, 2)] == before


def test_stop_ends_a_training_run_early_and_keeps_the_pool_warm():
    import dtlab.train
    from dtlab.config import TrainConfig

    pool = session_pool()
    before = [r["pid"] for r in run_ranks(identity, 2)]
    run = dtlab.train(TrainConfig(dp=2, steps=1000, model="tiny"), pool=pool)
    for record in run:
        if record["step"] == 2:
            run.stop()
    run.wait()
    assert run.summary["stopped_early"] is True and 3 <= run.summary["steps"] < 1000
    assert [r["step"] for r in run.records] == list(range(run.summary["steps"]))
    assert [r["pid"] for r in run_ranks(identity, 2)] == before


def test_a_group_that_fails_to_form_is_retried_on_the_same_workers():
    """Start-up failures (before any rank joined) get START_RETRIES retries, on the same warm workers
    when every rank reports back; the failure after them is reported and ends the workers."""
    pool = RankPool(max_size=2)
    pool.start(2)
    first = list(pool.pids)
    run = pool.run(identity, 2, backend="no-such-backend", timeout=30)
    with pytest.raises(GroupNotFormed) as info:
        run.wait()
    assert "_join_group" in info.value.traceback and isinstance(info.value, RankError)
    # Said as what it is, in both languages: no busy-machine advice for a cause that is not a timeout.
    assert "could not form their process group (3 tries)" in info.value.en and "no-such-backend" in info.value.en
    assert "未能组成进程组（尝试了 3 次）" in info.value.zh and "busy" not in info.value.en
    assert run.rejoins == START_RETRIES == 2  # retried exactly START_RETRIES times ...
    assert pool.restarts == 0  # ... without paying start-up again
    assert not any(alive(p) for p in first)  # the failure then ended the workers
    assert pool.size == 0


def test_a_worker_whose_join_failed_alone_forms_the_next_group_with_its_peers():
    """torch names a process's default group after a counter that only destroy_process_group resets;
    a join that failed (its peer never came) must not leave this worker's next group a name ahead of
    its peers' (every later run on it then ended in "Wait timeout", seen once in ~100 runs)."""
    pool = RankPool(max_size=2)
    try:
        pool.start(2)
        alone = Job(fn=identity, args=(), kwargs={}, world_size=2, backend="gloo", timeout_s=2.0)
        pool._commands[0].put(Assignment(run_id="alone", rank=0, store=pool._store_file("alone"), job=alone))
        deadline, failed = time.monotonic() + 180, None
        while failed is None and time.monotonic() < deadline:
            message = pool.receive(timeout=1.0)
            if message is not None and message.run_id == "alone":
                failed = message
        assert failed is not None and failed.kind == "error" and "_join_group" in failed.payload
        pids = list(pool.pids)
        run = pool.run(identity, 2, timeout=20)
        assert [r["pid"] for r in run.wait()] == pids and run.rejoins == 0 and pool.restarts == 0
    finally:
        pool.shutdown()


def test_a_job_with_no_collective_never_ends_under_a_peer_still_joining():
    """init_process_group returns on a rank before its peers have all connected; without the
    barrier that ends joining, a job that only reads its rank closed its sockets under a slower
    peer, whose start failed ("Connection closed by peer", about once in 100 runs)."""
    pool = RankPool(max_size=4)
    try:
        for world_size in [4, 2, 3] * 40:
            run = pool.run(basics.hello, world_size)
            assert [r["rank"] for r in run.wait()] == list(range(world_size))
            assert run.rejoins == 0 and pool.restarts == 0
    finally:
        pool.shutdown()


def test_a_worker_has_the_environment_its_pool_started_in_not_the_fork_servers(monkeypatch):
    """Workers fork from a server started earlier; each must still see the caller's environment of now."""
    earlier = RankPool(max_size=1)
    earlier.start(1)  # the fork server (where there is one) is running from here on
    earlier.shutdown()
    monkeypatch.setenv("DTLAB_TEST_MARK", "set after the first pool started")
    pool = RankPool(max_size=2)
    try:
        assert pool.run(read_env, 2, "DTLAB_TEST_MARK").wait() == ["set after the first pool started"] * 2
    finally:
        pool.shutdown()


KILLED_KERNEL = """
import time
from dtlab.launch import RankPool

if __name__ == "__main__":
    pool = RankPool(max_size=2)
    pool.start(2)
    print(" ".join(map(str, pool.pids)), flush=True)
    time.sleep(600)
"""


def test_workers_end_themselves_when_the_kernel_that_started_them_is_killed(tmp_path):
    """A kernel killed outright (SIGKILL: no atexit, no shutdown) leaves no worker behind."""
    script = tmp_path / "kernel.py"
    script.write_text(KILLED_KERNEL)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert len(workers) == 2 and all(alive(p) for p in workers)
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in workers)
    finally:
        proc.kill()


def test_a_group_whose_rendezvous_timed_out_says_the_machine_may_be_too_busy():
    tb = (
        'Traceback (most recent call last):\n  File "worker.py", line 202, in _run_assignment\n'
        "    dist.init_process_group(job.backend, store=store)\nRuntimeError: Wait timeout\n"
    )
    error = GroupNotFormed(1, tb, [0, 2, 3], world_size=4, attempts=3)
    assert "the 4 ranks could not form their process group (3 tries): RuntimeError: Wait timeout" in error.en
    assert "too busy" in error.en and "太忙" in error.zh and "rank 1" in error.en
