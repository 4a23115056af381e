"""The caller side of the launcher: a warm pool of ranks, and the runs it carries.

Here the rendezvous is private to this user: each run's store is a file
(torch's ``FileStore``) in a directory that only this user may enter (mode
0700, made by the pool, removed with it), so no other user on the machine,
and nobody beyond it, can read or write the keys the ranks trust. Two
notebooks each have a directory of their own, so they never collide. The
ranks' own gloo sockets listen on the loopback interface only
(``dtlab/launch/worker.py``).

Start-up is the expensive part (importing torch in each new process takes
seconds), so :class:`RankPool` keeps its processes alive between runs. A run
only creates a fresh process group over the already-running workers, which
takes milliseconds. Any failure (a rank that raises, a collective that never
completes, an interrupt) ends *every* worker: a process stuck inside a
collective cannot be trusted again, and a learner must never be left with
orphaned processes. The next run starts a fresh pool.

:class:`RankPool` owns the processes, their queues and the store (start,
submit, receive, end); each run's own progress is a :class:`Run`
(``dtlab/launch/runs.py``), which asks the pool for the rest through its
public methods.
"""

from __future__ import annotations

import atexit
import inspect
import multiprocessing as mp
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Callable

from dtlab.config.rank_limit import local_rank_limit
from dtlab.config.torch_support import check_torch
from dtlab.i18n import DtlabError
from dtlab.launch.errors import refuse_inside_a_worker
from dtlab.launch.resources import RENDEZVOUS_PREFIX, sweep_rendezvous, sweep_semaphores
from dtlab.launch.runs import Run
from dtlab.launch.worker import DEFAULT_TIMEOUT_S, STOP_KEY, Assignment, Job, Message, pick_backend, worker_main


class RankPool:
    """A set of warm worker processes that run jobs of any world size up to ``max_size``.

    Each run gets a fresh process group (new store prefix), so world size and
    configuration can change between runs without starting new processes.
    """

    def __init__(self, max_size: int | None = None, start_method: str | None = None):
        """``max_size``: the most ranks a run may have (None: ``DTLAB_MAX_RANKS``, 8 unless set)."""
        self.max_size = local_rank_limit() if max_size is None else max_size
        self._ctx = worker_context(start_method)
        self._workers: list[Any] = []
        self._commands: list[Any] = []
        self._results = None
        self._ready: set[int] = set()
        self._rendezvous: str | None = None
        self._active: Run | None = None
        self._lock = threading.Lock()
        self.pids: list[int] = []
        self.restarts = 0
        """How many times a run that could not form its group had its workers replaced (a retry on the same workers is counted by ``Run.rejoins``)."""

    # -- lifecycle
    @property
    def size(self) -> int:
        return len(self._workers)

    @property
    def rendezvous(self) -> str | None:
        """The private directory (mode 0700) holding each run's store file; None while no worker runs."""
        return self._rendezvous

    def start(self, n: int) -> None:
        """Make sure at least ``n`` workers exist (starting them is the slow part)."""
        if n > self.max_size:
            raise DtlabError(
                f"world size {n} is larger than this pool allows (at most {self.max_size}; "
                f"set DTLAB_MAX_RANKS to change it)",
                f"world size {n} 超过了本地进程池的上限（最多 {self.max_size}；可用环境变量 DTLAB_MAX_RANKS 调整）",
            )
        refuse_inside_a_worker()
        if self._results is None:
            check_torch()  # a torch outside the supported range fails here, not inside a rank
            self._results = self._ctx.Queue()
            sweep_rendezvous()  # what a killed launcher left behind
            sweep_semaphores()
            self._rendezvous = tempfile.mkdtemp(prefix=f"{RENDEZVOUS_PREFIX}{os.getpid()}-")  # mode 0700
        while len(self._workers) < n:
            slot = len(self._workers)
            commands = self._ctx.SimpleQueue()
            worker = self._ctx.Process(
                target=worker_main,
                name=f"dtlab-rank-{slot}",
                args=(slot, commands, self._results, os.getpid(), dict(os.environ)),
                daemon=True,
            )
            worker.start()
            self._workers.append(worker)
            self._commands.append(commands)
            self.pids.append(worker.pid)

    def shutdown(self) -> None:
        """End every worker: SIGTERM, then SIGKILL after a second. Leaves no process behind."""
        workers, self._workers = self._workers, []
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
        deadline = time.monotonic() + 1.0
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        for worker in workers:  # all SIGKILLs first, then the waits: one grace, not one per worker
            if worker.is_alive():
                worker.kill()
        for worker in workers:
            worker.join(2.0)
        for q in self._commands:
            q.close()
        if self._results is not None:
            self._results.close()
            self._results.cancel_join_thread()
        self._commands, self._results, self._ready, self.pids = [], None, set(), []
        if self._rendezvous is not None:
            shutil.rmtree(self._rendezvous, ignore_errors=True)
        self._rendezvous = None
        active, self._active = self._active, None
        if active is not None:
            active.abandon()

    def restart(self, n: int) -> None:
        """End every worker and start ``n`` fresh ones; the active run stays active (to be resubmitted)."""
        active, self._active = self._active, None
        self.shutdown()
        self.restarts += 1
        self.start(n)
        self._active = active

    def close(self) -> None:
        """Ask idle workers to exit cleanly; fall back to :meth:`shutdown`."""
        for q in self._commands:
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        for worker in self._workers:
            worker.join(2.0)
        self.shutdown()

    # -- running
    def run(
        self,
        fn: Callable,
        world_size: int,
        *args,
        timeout: float = DEFAULT_TIMEOUT_S,
        backend: str | None = None,
        **kwargs,
    ) -> Run:
        """Run ``fn(ctx, *args, **kwargs)`` on ranks ``0..world_size-1``; returns at once.

        ``fn`` must be importable by name (defined in a module, not a notebook
        cell): spawned processes find it by its module and qualified name.
        """
        check_importable(fn)
        with self._lock:
            if self._active is not None and not self._active.finished:
                raise DtlabError(
                    "this pool is still running a job; wait for it or cancel it first",
                    "进程池仍在运行上一个任务；请等待它结束或先取消它",
                )
            if world_size < 1:
                raise DtlabError(
                    f"world size must be >= 1, got {world_size}", f"world size 必须 >= 1，收到的是 {world_size}"
                )
            self.start(world_size)
            job = Job(
                fn=fn,
                args=args,
                kwargs=kwargs,
                world_size=world_size,
                backend=backend or pick_backend(world_size),
                timeout_s=timeout,
            )
            self._active = Run(self, job)
            self.submit(self._active.run_id, job)
            return self._active

    def submit(self, run_id: str, job: Job) -> None:
        """Send each of ranks ``0..job.world_size-1`` its assignment (the workers must exist)."""
        store = self._store_file(run_id)
        for rank in range(job.world_size):
            self._commands[rank].put(Assignment(run_id=run_id, rank=rank, store=store, job=job))

    def release(self, run_id: str) -> None:
        """Delete a finished run's store (its ranks reported ``done`` only after letting go of it)."""
        if self._rendezvous is not None:
            try:
                os.remove(self._store_file(run_id))
            except FileNotFoundError:
                pass

    def _store_file(self, run_id: str) -> str:
        return os.path.join(self._rendezvous, run_id)

    def receive(self, timeout: float) -> Message | None:
        """The next message from any worker, or None after ``timeout`` seconds without one."""
        try:
            message = self._results.get(timeout=timeout)
        except queue.Empty:
            return None
        if message.kind == "ready":
            self._ready.add(message.rank)
        return message

    def is_ready(self, rank: int) -> bool:
        """True once the worker for ``rank`` has imported torch and waits for work."""
        return rank in self._ready

    def exitcode(self, rank: int) -> int | None:
        """The exit code of the worker for ``rank`` once it has ended; None while it lives."""
        return self._workers[rank].exitcode if rank < len(self._workers) else None

    def is_stopped(self, rank: int) -> bool:
        """True while the worker for ``rank`` is suspended (SIGSTOP, a debugger): Linux's /proc only."""
        if rank >= len(self.pids):
            return False
        try:
            with open(f"/proc/{self.pids[rank]}/stat") as f:
                return f.read().rsplit(")", 1)[-1].split()[0] in ("T", "t")
        except (OSError, IndexError):
            return False

    def request_stop(self, run_id: str) -> None:
        """Set the run's stop key: its ranks see ``ctx.stop_requested()`` become true."""
        if self._rendezvous is not None:
            import torch.distributed as dist

            dist.FileStore(self._store_file(run_id), -1).set(STOP_KEY, "1")


PRELOAD = ["torch", "torch.distributed", "torch.optim", "torch._dynamo"]
"""What the fork server imports once for every worker: torch, and torch._dynamo, which the optimizers
import on first use (1.6 s of CPU in each new rank, more than half of a first step)."""


def worker_context(start_method: str | None = None):
    """How workers start: forked from a server that has imported torch once, where the platform allows.

    Importing torch is most of a worker's start-up (about 1 s of CPU each; 4
    ranks on 2 cores: 3.5-4.5 s), and a first training step imports more
    (``PRELOAD``). multiprocessing's fork server imports it all once, on the
    first start, and forks every later worker from there: 4 ranks then start
    in about 0.1 s, so a pool that a failure ended comes back at once. Each
    worker still begins clean: the server is a fresh interpreter that only
    imported torch (no Python thread, no CUDA context), and the worker gets
    the caller's environment, path and working directory as a spawned one
    does. Where there is no fork server (Windows), or when
    ``start_method`` says so, spawn: every worker imports torch itself, as
    under torchrun (``dtlab bench pool`` times both).
    """
    if start_method == "spawn" or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def check_importable(fn: Callable) -> None:
    """Refuse a function a spawned rank could not find by name (a lambda, a nested or notebook function)."""
    if not inspect.isfunction(fn):
        return  # a partial, a callable object: pickle judges those
    module, name = fn.__module__, fn.__qualname__
    if "<" in name or (module == "__main__" and not getattr(sys.modules.get("__main__"), "__file__", None)):
        raise DtlabError(
            f"{name} cannot run on a rank: each rank is a separate process that finds the "
            f"function by its module and name, so define it at the top level of a .py module "
            f"(not in a notebook cell, not nested, not a lambda) and import it",
            f"{name} 无法在 rank 上运行：每个 rank 都是独立的进程，按模块名和函数名查找函数，"
            f"所以请在一个 .py 模块的顶层定义它（不要在 notebook 单元格里、不要嵌套、不要用 lambda），再导入它",
        )


_default_pool: RankPool | None = None


def default_pool() -> RankPool:
    """The pool a notebook kernel keeps warm between runs (created on first use)."""
    global _default_pool
    if _default_pool is None:
        _default_pool = RankPool()
        atexit.register(_default_pool.shutdown)
    return _default_pool


def run(
    fn: Callable, world_size: int, *args, timeout: float = DEFAULT_TIMEOUT_S, pool: RankPool | None = None, **kwargs
) -> list[Any]:
    """Run ``fn(ctx, ...)`` on ``world_size`` ranks of the warm pool and return each rank's result."""
    return (pool or default_pool()).run(fn, world_size, *args, timeout=timeout, **kwargs).wait()
