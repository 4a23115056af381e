"""Start real ranks: a warm local pool for notebooks, or attach under torchrun.

A *rank* is one process of a distributed job; the *world size* is how many
there are; a *process group* is the set of ranks a collective spans; the
*backend* (gloo on CPU, NCCL on GPUs) moves the bytes; the *rendezvous* is how
ranks find each other before the first collective.

Here the rendezvous is a ``TCPStore`` that the *caller* owns, bound to port 0
on 127.0.0.1, so the operating system picks a free port that stays reserved
for as long as the pool lives: two notebooks can never pick the same one.

Start-up is the expensive part (importing torch in each new process takes
seconds), so :class:`RankPool` keeps its processes alive between runs. A run
only creates a fresh process group over the already-running workers, which
takes milliseconds. Any failure (a rank that raises, a collective that never
completes, an interrupt) ends *every* worker: a process stuck inside a
collective cannot be trusted again, and a learner must never be left with
orphaned processes. The next run starts a fresh pool.
"""
from __future__ import annotations

import atexit
import datetime
import json
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from dtlab.i18n import DtlabError

DEFAULT_TIMEOUT_S = 60.0
"""How long one collective may wait for its peers before the run is declared stuck."""
STARTUP_TIMEOUT_S = 180.0
"""How long a cold worker may take to import torch (generous: a loaded 2-core box is slow)."""
STOP_KEY = "dtlab/stop"
"""Store key the caller sets to ask a run to end at its next step boundary."""
MAX_LOCAL_RANKS = int(os.environ.get("DTLAB_MAX_RANKS", "8"))
"""The most ranks a local pool will start."""


# --------------------------------------------------------------------------- errors

class RankError(DtlabError, RuntimeError):
    """A rank raised: carries the rank and its traceback, as printed inside that rank."""

    def __init__(self, rank: int, tb: str, unfinished: list[int]):
        self.rank, self.traceback, self.unfinished = rank, tb, unfinished
        super().__init__(
            f"rank {rank} failed (ranks still running when it did: {unfinished}); "
            f"its traceback:\n{tb}",
            f"rank {rank} 出错（当时仍在运行的 rank：{unfinished}）；它的回溯信息见上。",
        )


class CollectiveTimeout(RankError):
    """A rank gave up waiting inside a collective: some peer never joined it."""

    def __init__(self, rank: int, tb: str, unfinished: list[int], timeout_s: float):
        self.rank, self.traceback, self.unfinished = rank, tb, unfinished
        DtlabError.__init__(
            self,
            f"a collective timed out after {timeout_s:g} s on rank {rank}; ranks that had not "
            f"finished (the stuck ones, and whoever never joined): {sorted(unfinished + [rank])}; "
            f"traceback of rank {rank}:\n{tb}",
            f"rank {rank} 上的集合通信在 {timeout_s:g} 秒后超时；尚未结束的 rank"
            f"（卡住的，以及没来参加的）：{sorted(unfinished + [rank])}",
        )


class RunTimeout(DtlabError, TimeoutError):
    """No rank made progress for longer than the run's timeout."""

    def __init__(self, seconds: float, stuck: list[int]):
        self.seconds, self.stuck = seconds, stuck
        super().__init__(
            f"no progress for {seconds:.0f} s: rank(s) {stuck} never finished "
            f"(stuck in a collective that some rank did not join?)",
            f"{seconds:.0f} 秒内没有任何进展：rank {stuck} 一直没有结束"
            f"（可能卡在某个 rank 没有参加的集合通信里）",
        )


class RankDied(DtlabError, RuntimeError):
    """A worker process vanished (killed, out of memory, crashed in C++)."""

    def __init__(self, rank: int, exitcode: int | None):
        self.rank, self.exitcode = rank, exitcode
        super().__init__(
            f"rank {rank} exited unexpectedly with exit code {exitcode}",
            f"rank {rank} 意外退出，退出码 {exitcode}",
        )


# --------------------------------------------------------------------------- inside a rank

@dataclass
class RankContext:
    """What a function running on a rank is given: who it is, and where to send records."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: str
    _emit: Callable[[Any], None] = field(repr=False)

    _store: Any = field(default=None, repr=False)

    def emit(self, record: Any) -> None:
        """Stream ``record`` to the caller now (the notebook, or stdout under torchrun)."""
        self._emit(record)

    def stop_requested(self) -> bool:
        """True once the caller asked this run to stop early (a slider moved, say).

        Ranks may notice at different steps, so a loop must agree on it
        collectively (the training loop ORs it across ranks each step).
        """
        return self._store is not None and self._store.check([STOP_KEY])


def pick_backend(world_size: int) -> str:
    """NCCL when every rank can have a GPU of its own, gloo otherwise.

    NCCL moves GPU memory over NVLink/PCIe/InfiniBand without a CPU copy; gloo
    is PyTorch's CPU backend and works everywhere, which is why it is the
    default for a laptop.
    """
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


def _device_for(backend: str, local_rank: int) -> str:
    if backend == "nccl":
        import torch

        torch.cuda.set_device(local_rank)
        return f"cuda:{local_rank}"
    return "cpu"


def _exit_when_orphaned(parent_pid: int) -> None:
    """Workers end themselves if the notebook kernel that started them dies."""

    def watch():
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="dtlab-orphan-watch").start()


def _worker_main(slot: int, commands, results, parent_pid: int) -> None:
    """The loop each pooled process runs: wait for a run, join its group, run, report."""
    # The notebook's stop button sends SIGINT to the whole process group; the
    # parent decides what to do about it, so the ranks ignore it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_when_orphaned(parent_pid)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # one core each: ranks share a small machine
    results.put(("ready", None, slot, os.getpid()))
    while True:
        command = commands.get()
        if command is None:
            return
        run_id, fn, args, kwargs, world_size, rank, port, backend, timeout_s = command

        def emit(record, _run_id=run_id, _rank=rank):
            results.put(("record", _run_id, _rank, record))

        try:
            timeout = datetime.timedelta(seconds=timeout_s)
            client = dist.TCPStore("127.0.0.1", port, None, False, timeout)
            store = dist.PrefixStore(run_id, client)
            dist.init_process_group(backend, store=store, rank=rank,
                                    world_size=world_size, timeout=timeout)
            results.put(("started", run_id, rank, None))
            ctx = RankContext(rank=rank, world_size=world_size, local_rank=rank,
                              backend=backend, device=_device_for(backend, rank), _emit=emit,
                              _store=store)
            value = fn(ctx, *args, **kwargs)
            results.put(("done", run_id, rank, value))
        except BaseException:  # noqa: BLE001 - every failure must reach the caller
            results.put(("error", run_id, rank, traceback.format_exc()))
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


# --------------------------------------------------------------------------- in the caller

class Run:
    """One job on the pool. Iterate it to receive records as ranks emit them.

    ``for record in run: ...`` yields each emitted record as soon as it
    arrives; :meth:`wait` returns every rank's return value. Any failure raises
    (:class:`RankError`, :class:`RunTimeout`, :class:`RankDied`) after every
    worker has been ended. ``KeyboardInterrupt`` ends every worker too.
    """

    def __init__(self, pool: "RankPool", run_id: str, world_size: int, timeout_s: float):
        self.pool, self.run_id, self.world_size, self.timeout_s = pool, run_id, world_size, timeout_s
        self.results: list[Any] = [None] * world_size
        self.records: list[Any] = []
        self.started_at = time.monotonic()
        self.first_record_s: float | None = None
        self._done: set[int] = set()
        self._finished = False
        self._error: BaseException | None = None

    @property
    def finished(self) -> bool:
        return self._finished

    def __iter__(self) -> Iterator[Any]:
        try:
            while not self._finished:
                record = self.pool._next_record(self)
                if record is not None:
                    yield record
        except GeneratorExit:
            # The caller stopped iterating (``break``): the run goes on, and a
            # new ``for`` over it (or ``wait()``) picks up where this one left.
            raise
        except BaseException as exc:  # KeyboardInterrupt included: leave nothing behind
            self._fail(exc)
            raise

    def wait(self) -> list[Any]:
        """Block until every rank returns; consume (and keep) the records."""
        for _ in self:
            pass
        return self.results

    def stop(self) -> None:
        """Ask the ranks to finish at their next step boundary; the pool stays warm.

        Only loops that check ``ctx.stop_requested()`` notice (the training loop does).
        """
        if not self._finished and self.pool._store is not None:
            import torch.distributed as dist

            dist.PrefixStore(self.run_id, self.pool._store).set(STOP_KEY, "1")

    def cancel(self) -> None:
        """End the run now by ending every worker (the only safe way out of a collective)."""
        if not self._finished:
            self._fail(KeyboardInterrupt("cancelled"))

    def _fail(self, exc: BaseException) -> None:
        if not self._finished:
            self._finished = True
            self._error = exc
            self.pool.shutdown()

    def _unfinished(self) -> list[int]:
        return sorted(set(range(self.world_size)) - self._done)


class RankPool:
    """A set of warm worker processes that run jobs of any world size up to ``max_size``.

    Each run gets a fresh process group (new store prefix), so world size and
    configuration can change between runs without starting new processes.
    """

    def __init__(self, max_size: int = MAX_LOCAL_RANKS):
        self.max_size = max_size
        self._ctx = mp.get_context("spawn")
        self._workers: list[Any] = []
        self._commands: list[Any] = []
        self._results = None
        self._ready: set[int] = set()
        self._store = None
        self._active: Run | None = None
        self._lock = threading.Lock()
        self.pids: list[int] = []
        self.restarts = 0
        """How many times a run that could not form its group was retried on fresh workers."""

    # -- lifecycle
    @property
    def size(self) -> int:
        return len(self._workers)

    def start(self, n: int) -> None:
        """Make sure at least ``n`` workers exist (starting them is the slow part)."""
        if n > self.max_size:
            raise DtlabError(
                f"world size {n} is larger than this pool allows (at most {self.max_size}; "
                f"set DTLAB_MAX_RANKS to change it)",
                f"world size {n} 超过了本地进程池的上限（最多 {self.max_size}；"
                f"可用环境变量 DTLAB_MAX_RANKS 调整）",
            )
        if self._results is None:
            import torch.distributed as dist

            self._results = self._ctx.Queue()
            # The caller owns the rendezvous: port 0 lets the OS choose a free
            # port, and holding the store keeps it ours for the pool's life.
            self._store = dist.TCPStore("127.0.0.1", 0, None, True,
                                        datetime.timedelta(seconds=STARTUP_TIMEOUT_S),
                                        wait_for_workers=False)
        while len(self._workers) < n:
            slot = len(self._workers)
            commands = self._ctx.SimpleQueue()
            worker = self._ctx.Process(target=_worker_main, name=f"dtlab-rank-{slot}",
                                       args=(slot, commands, self._results, os.getpid()),
                                       daemon=True)
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
            if worker.is_alive():
                worker.kill()
                worker.join(2.0)
        for q in self._commands:
            q.close()
        if self._results is not None:
            self._results.close()
            self._results.cancel_join_thread()
        self._commands, self._results, self._ready, self.pids = [], None, set(), []
        self._store = None
        if self._active is not None and not self._active._finished:
            self._active._finished = True
        self._active = None

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
    def run(self, fn: Callable, world_size: int, *args, timeout: float = DEFAULT_TIMEOUT_S,
            backend: str | None = None, **kwargs) -> Run:
        """Run ``fn(ctx, *args, **kwargs)`` on ranks ``0..world_size-1``; returns at once.

        ``fn`` must be importable by name (defined in a module, not a notebook
        cell): spawned processes find it by its module and qualified name.
        """
        with self._lock:
            if self._active is not None and not self._active.finished:
                raise DtlabError(
                    "this pool is still running a job; wait for it or cancel it first",
                    "进程池仍在运行上一个任务；请等待它结束或先取消它",
                )
            if world_size < 1:
                raise DtlabError(f"world size must be >= 1, got {world_size}",
                                 f"world size 必须 >= 1，收到的是 {world_size}")
            self.start(world_size)
            backend = backend or pick_backend(world_size)
            run_id = uuid.uuid4().hex[:12]
            run = Run(self, run_id, world_size, timeout)
            run._job = (fn, args, kwargs, backend)
            run._start_retries = 1
            self._submit(run)
            return run

    def _submit(self, run: Run) -> None:
        fn, args, kwargs, backend = run._job
        run._last_progress = time.monotonic()
        run._started = set()
        for rank in range(run.world_size):
            self._commands[rank].put((run.run_id, fn, args, kwargs, run.world_size, rank,
                                      self._store.port, backend, run.timeout_s))
        self._active = run

    def _restart(self, run: Run) -> None:
        """Start fresh workers and submit ``run`` again under a new id (nothing of it ran yet)."""
        self._active = None
        self.shutdown()
        self.restarts += 1
        self.start(run.world_size)
        run.run_id = uuid.uuid4().hex[:12]
        self._submit(run)

    def _next_record(self, run: Run) -> Any:
        """Wait a little for the next message of ``run``; raise on failure."""
        try:
            kind, run_id, rank, payload = self._results.get(timeout=0.1)
        except queue.Empty:
            self._check_health(run)
            return None
        if kind == "ready":
            self._ready.add(rank)
            run._last_progress = time.monotonic()
            return None
        if run_id != run.run_id:
            return None  # a message from an earlier, abandoned run
        run._last_progress = time.monotonic()
        if kind == "started":
            run._started.add(rank)
        elif kind == "record":
            if run.first_record_s is None:
                run.first_record_s = time.monotonic() - run.started_at
            run.records.append(payload)
            return payload
        elif kind == "done":
            run.results[rank] = payload
            run._done.add(rank)
            if len(run._done) == run.world_size:
                run._finished = True
                self._active = None
        elif kind == "error":
            # A rank that died outright makes its peers' collectives fail with
            # "connection closed": blame the dead one, not the messenger.
            time.sleep(0.2)
            self._check_health(run)
            if self._failed_joining(run, rank, payload):
                # The group never formed (seen under heavy load: a peer's socket reset while
                # gloo connected the mesh). No user code ran, so try once more on fresh workers.
                run._start_retries -= 1
                self._restart(run)
                return None
            unfinished = [r for r in run._unfinished() if r != rank]
            last_line = payload.strip().splitlines()[-1] if payload.strip() else ""
            if "timed out" in last_line.lower() or "timeout" in last_line.lower():
                error = CollectiveTimeout(rank, payload, unfinished, run.timeout_s)
            else:
                error = RankError(rank, payload, unfinished)
            run._fail(error)
            raise error
        return None

    @staticmethod
    def _failed_joining(run: Run, rank: int, tb: str) -> bool:
        return (run._start_retries > 0 and not run.records and rank not in run._started
                and "init_process_group" in tb)

    def _check_health(self, run: Run) -> None:
        for rank in run._unfinished():
            worker = self._workers[rank] if rank < len(self._workers) else None
            if worker is not None and not worker.is_alive():
                error = RankDied(rank, worker.exitcode)
                run._fail(error)
                raise error
        # A cold pool is still importing torch: that is start-up, not a hang.
        warming = len(run._started) < run.world_size and any(
            r not in self._ready for r in range(run.world_size))
        limit = STARTUP_TIMEOUT_S if warming else run.timeout_s + 5.0
        if time.monotonic() - run._last_progress > limit:
            error = RunTimeout(limit, run._unfinished())
            run._fail(error)
            raise error


_default_pool: RankPool | None = None


def default_pool() -> RankPool:
    """The pool a notebook kernel keeps warm between runs (created on first use)."""
    global _default_pool
    if _default_pool is None:
        _default_pool = RankPool()
        atexit.register(_default_pool.shutdown)
    return _default_pool


def run(fn: Callable, world_size: int, *args, timeout: float = DEFAULT_TIMEOUT_S,
        pool: RankPool | None = None, **kwargs) -> list[Any]:
    """Run ``fn(ctx, ...)`` on ``world_size`` ranks of the warm pool and return each rank's result."""
    return (pool or default_pool()).run(fn, world_size, *args, timeout=timeout, **kwargs).wait()


# --------------------------------------------------------------------------- torchrun

def torchrun_context() -> RankContext | None:
    """When started by torchrun (RANK, WORLD_SIZE, LOCAL_RANK set), join its group.

    Records are printed by rank 0 as one JSON object per line, the same lines
    ``dtlab train --json`` prints locally.
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = _device_for(backend, local_rank)
    timeout = datetime.timedelta(seconds=float(os.environ.get("DTLAB_TIMEOUT", DEFAULT_TIMEOUT_S)))
    dist.init_process_group(backend, timeout=timeout)

    def emit(record):
        if rank == 0:
            print(json.dumps(record), flush=True)

    return RankContext(rank=rank, world_size=world_size, local_rank=local_rank,
                       backend=backend, device=device, _emit=emit)

