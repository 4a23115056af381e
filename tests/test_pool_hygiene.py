"""The local pool keeps to itself and gives everything back: loopback only, flat after many runs."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import tempfile
import time

import pytest
import torch
import torch.distributed as dist

from dtlab.launch import RankPool
from dtlab.launch.resources import is_loopback, listening_sockets

ROOT = pathlib.Path(__file__).resolve().parents[1]


def hold_sockets(ctx, gate):
    """Open gloo connections (the world and a subgroup), report, and hold them until ``gate`` exists."""
    dist.all_reduce(torch.ones(1))
    dist.all_reduce(torch.ones(1), group=dist.new_group())
    ctx.emit({"rank": ctx.rank, "ifname": os.environ.get("GLOO_SOCKET_IFNAME")})
    while not os.path.exists(gate):
        time.sleep(0.01)
    return ctx.rank


def test_during_a_run_nothing_listens_beyond_loopback_and_the_store_is_private():
    pool = RankPool(max_size=4)
    with tempfile.TemporaryDirectory() as tmp:
        gate = os.path.join(tmp, "go")
        try:
            run = pool.run(hold_sockets, 4, gate, timeout=60)
            records = [next(iter(run)) for _ in range(4)]
            listening = listening_sockets([os.getpid(), *pool.pids])
            store_dir = os.stat(pool.rendezvous)
            open(gate, "w").close()
            assert run.wait() == [0, 1, 2, 3]
        finally:
            pool.close()
    assert listening, "the ranks' gloo sockets should be listening during the run"
    assert [s for s in listening if not is_loopback(s[1])] == []
    assert not [s for s in listening if s[0] == os.getpid()]  # the caller listens on nothing
    assert {r["ifname"] for r in records} == {"lo"}
    assert store_dir.st_mode & 0o777 == 0o700 and store_dir.st_uid == os.getuid()


def _soak_module():
    spec = importlib.util.spec_from_file_location("soak", ROOT / "benchmarks" / "soak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_thirty_runs_with_stops_leave_no_descriptor_thread_or_memory_behind():
    """The soak benchmark, short: every layout, every other run stopped; nothing grows."""
    result = _soak_module().soak(30)
    start, end = result["start"], result["end"]
    assert set(start) == set(end) == {"caller", "rank 0", "rank 1", "rank 2", "rank 3"}
    for name in start:
        assert end[name]["fds"] <= start[name]["fds"], (name, start[name], end[name])
        assert end[name]["threads"] <= start[name]["threads"], (name, start[name], end[name])
        assert end[name]["rss_mib"] - start[name]["rss_mib"] < 25, (name, start[name], end[name])
