"""Our small multi-process test harness, on top of dtlab's own launcher.

``run_ranks(fn, world_size, *args)`` runs ``fn(ctx, *args)`` in real spawned
processes joined into a gloo group over loopback, with a short collective
timeout, and returns each rank's return value; if a rank raises, its
traceback is re-raised here (as ``dtlab.launch.RankError``). One pool is kept
warm for the whole test session, because on two cores process start-up costs
far more than the checks themselves: batch several checks into one launch, and
use ``session_pool()`` (up to 8 ranks, started as the first run needs them)
rather than a pool of a module's own, unless the test kills or replaces ranks.

Functions passed to ``run_ranks`` must live at module level in an importable
module (a test module is fine): spawned processes look them up by name.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from dtlab.launch import RankPool

TEST_TIMEOUT_S = 30.0
_pool: RankPool | None = None


def session_pool() -> RankPool:
    global _pool
    if _pool is None:
        _pool = RankPool(max_size=8)  # grows on demand: a run of 2 starts 2
    return _pool


def run_ranks(fn, world_size: int, *args, timeout: float = TEST_TIMEOUT_S, **kwargs) -> list:
    return session_pool().run(fn, world_size, *args, timeout=timeout, **kwargs).wait()


def close_session_pool() -> None:
    global _pool
    if _pool is not None:
        _pool.close()
        _pool = None


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


LAYOUTS = [
    dict(dp=2, tp=2, pp=2, micro_batches=2),
    dict(tp=4),
    dict(pp=4, micro_batches=8, schedule="gpipe"),
    dict(pp=4, micro_batches=8, schedule="1f1b"),
    dict(dp=2, pp=2, zero=1, micro_batches=2),
    dict(dp=4, zero=1),
    dict(dp=4, zero=2),
    dict(dp=4, zero=3),
    dict(dp=2, zero=2, offload=True, grad_accum=2),
    dict(dp=4, recompute=True),
]
"""The layouts every training-path test runs at (tests/test_layouts.py, tests/test_clipping.py)."""


@contextmanager
def cores_per_rank(enough: bool | None):
    """Inside, this rank believes its machine has a core for every rank (``True``: all-reduces over
    shared memory start on the calling thread, weak progress) or not (``False``: the worker thread
    runs them); None: as it is. The pool's process is left as it was."""
    before = os.environ.pop("LOCAL_WORLD_SIZE", None)
    if enough is not None:
        os.environ["LOCAL_WORLD_SIZE"] = "1" if enough else str(1 << 20)
    try:
        yield
    finally:
        os.environ.pop("LOCAL_WORLD_SIZE", None)
        if before is not None:
            os.environ["LOCAL_WORLD_SIZE"] = before
