"""The rank side of the launcher: what runs inside each rank's process.

A rank is one process of a distributed job. Here it joins its *process
group* (the set of ranks a collective spans) through the *rendezvous* store
the caller owns, picks its *backend* (gloo on CPU, NCCL on GPUs) and device,
and calls the job's function with a :class:`RankContext`: who it is, and how
to stream records back to the caller.

Two ways a process becomes a rank:

* :func:`worker_main`, the loop of a pooled worker (``dtlab/launch/pool.py``
  starts it): wait for an :class:`Assignment`, join that run's group, run,
  report, and wait again, so the next run needs no new process;
* :func:`torchrun_context`, when torchrun started the process: join torchrun's
  group once.

The interface to the caller is this module's public data: an
:class:`Assignment` (a :class:`Job` plus this rank's number and the run's
store file) comes in, :class:`Message` tuples go out (``ready``, ``started``,
``record``, ``done``, ``error``), and :data:`STOP_KEY` in the run's store asks
the ranks to stop.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from dtlab.launch.resources import watch_for_exit

DEFAULT_TIMEOUT_S = 60.0
"""How long one collective may wait for its peers before the run is declared stuck."""
STOP_KEY = "dtlab/stop"
"""Store key the caller sets to ask a run to end at its next step boundary."""
JOINED_KEY, ALL_JOINED_KEY, JOIN_FAILED_KEY = "dtlab/joined", "dtlab/all_joined", "dtlab/join_failed"
"""Store keys of the barrier that ends joining: how many ranks' groups formed, set by the last of them
when all have, and set by a rank whose group did not form (its peers then stop waiting)."""


@dataclass(frozen=True)
class Job:
    """What every rank of one run is asked to do: ``fn(ctx, *args, **kwargs)`` on ``world_size`` ranks."""

    fn: Callable
    args: tuple
    kwargs: dict
    world_size: int
    backend: str
    timeout_s: float


@dataclass(frozen=True)
class Assignment:
    """One rank's share of a run, as sent to its worker."""

    run_id: str  # each run forms a fresh group, through a store of its own
    rank: int
    store: str  # the run's rendezvous: a file in the caller's private directory
    job: Job


class Message(NamedTuple):
    """What a worker reports to the caller, in order.

    ``ready`` (torch imported; ``payload`` is the pid), ``started`` (joined the
    group), any number of ``record`` (``payload`` is what ``ctx.emit`` was
    given), then ``done`` (the return value) or ``error`` (the traceback text).
    """

    kind: str
    run_id: str | None
    rank: int
    payload: Any


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


def loopback_interface() -> str | None:
    """The name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS), if any."""
    import socket

    names = [name for _, name in socket.if_nameindex()] if hasattr(socket, "if_nameindex") else []
    return next((name for name in ("lo", "lo0") if name in names), None)


def _listen_on_loopback() -> None:
    """Make this process's gloo and NCCL sockets bind to the loopback interface only.

    Without it, gloo binds to the address the host name resolves to, which on
    many machines is the public interface: anyone who can reach the machine
    could connect to a rank. A local pool's ranks all live on this machine,
    so loopback is all they need. (Under torchrun the cluster's own settings
    apply; this runs only in a pooled worker.)
    """
    interface = loopback_interface()
    if interface is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = interface
        os.environ["NCCL_SOCKET_IFNAME"] = interface


def env_timeout() -> float:
    """``DTLAB_TIMEOUT`` (seconds a collective may wait under torchrun; unset: the default), from 1 s to a day."""
    text = os.environ.get("DTLAB_TIMEOUT", "")
    if not text.strip():
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text) if text.strip().isascii() else float("nan")
    except ValueError:
        value = float("nan")
    if not 1 <= value <= 86400:  # NaN fails both
        from dtlab.i18n import ConfigError

        raise ConfigError(
            f"DTLAB_TIMEOUT={text!r} is not allowed; expected seconds from 1 to 86400 (unset: {DEFAULT_TIMEOUT_S:g})",
            f"环境变量 DTLAB_TIMEOUT={text!r} 不合法；应为 1 到 86400 之间的秒数（未设置时为 {DEFAULT_TIMEOUT_S:g}）",
        )
    return value


def _exit_when_orphaned(parent_pid: int) -> None:
    """Workers end themselves if the notebook kernel (or command) that started them dies.

    The worker's own parent is the kernel (spawn) or multiprocessing's fork
    server; a change of parent, or a kernel that has exited, means nobody will
    ever send work again. The kernel's exit is seen through a pidfd, which
    becomes readable when it exits even if its own parent has not reaped it
    yet (``kill(pid, 0)`` would still succeed on that zombie:
    dtlab/launch/resources.py), and the fork server's through the kernel's
    parent-death signal (``PR_SET_PDEATHSIG``), set where Linux has it.
    """
    launcher = os.getppid()
    _die_with_parent()
    exited = watch_for_exit(parent_pid)

    def watch():
        while True:
            if exited() or os.getppid() != launcher:
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="dtlab-orphan-watch").start()


def _die_with_parent() -> None:
    """SIGKILL this process when its parent process exits (Linux ``prctl(PR_SET_PDEATHSIG)``; else nothing).

    Only under a fork server: a spawned worker's parent is the thread that started it, which may end long
    before the pool does."""
    import multiprocessing

    if multiprocessing.get_start_method(allow_none=True) == "spawn" or not os.path.exists("/proc/self"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return


def worker_main(slot: int, commands, results, parent_pid: int, environ: dict | None = None) -> None:
    """The loop each pooled process runs: wait for an assignment, run it, report; ``None`` ends it.

    ``environ`` is the caller's environment when it started this worker: a
    worker forked from a fork server would otherwise have the server's, from
    whenever the server started.
    """
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    # The notebook's stop button sends SIGINT to the whole process group, and a
    # closed terminal SIGHUP; the parent decides what to do about them (it ends
    # the ranks), so the ranks ignore both.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _exit_when_orphaned(parent_pid)
    _listen_on_loopback()
    import torch

    torch.set_num_threads(1)  # one core each: ranks share a small machine
    results.put(Message("ready", None, slot, os.getpid()))
    while True:
        assignment = commands.get()
        if assignment is None:
            return
        _run_assignment(assignment, results)


def _run_assignment(assignment: Assignment, results) -> None:
    """Join this run's group (a fresh one, through the run's own store), call the job, report.

    ``done`` goes out only after the group is destroyed and the store let go:
    when the caller has every rank's ``done``, no rank holds the run's
    sockets or its store file any more, so the caller may delete it. An
    ``error`` goes out at once, before this rank's sockets close: its peers
    then fail too ("connection closed"), and the caller must hear from the
    rank that failed first.
    """
    import torch.distributed as dist

    from dtlab.comm import shared_memory_setup

    job, rank, run_id = assignment.job, assignment.rank, assignment.run_id

    def emit(record):
        results.put(Message("record", run_id, rank, record))

    try:
        store = dist.FileStore(assignment.store, -1)
        _join_group(job, rank, store)
        results.put(Message("started", run_id, rank, None))
        ctx = RankContext(
            rank=rank,
            world_size=job.world_size,
            local_rank=rank,
            backend=job.backend,
            device=_device_for(job.backend, rank),
            _emit=emit,
            _store=store,
        )
        outcome = Message("done", run_id, rank, job.fn(ctx, *job.args, **job.kwargs))
    except BaseException:  # noqa: BLE001 - every failure must reach the caller
        outcome = None
        results.put(Message("error", run_id, rank, traceback.format_exc()))
    finally:
        try:
            shared_memory_setup.close_all()  # the groups' shared-memory wires, if dtlab's collectives made any
        except Exception:  # noqa: BLE001 - never keep the group from being destroyed
            pass
        if dist.is_initialized():
            dist.destroy_process_group()
        else:
            _forget_failed_group()
        store = ctx = None
    if outcome is not None:
        results.put(outcome)


def _join_group(job: Job, rank: int, store) -> None:
    """Form the run's process group; return once every rank's has formed (a barrier on the store).

    ``init_process_group`` returns on a rank as soon as its own connections
    are up, while a peer may still be connecting the rest of the mesh. A job
    with no collective would then end and close its sockets under that peer,
    whose start fails with gloo's "Connection closed by peer" (seen once in
    about 100 runs of a job that only reads its rank). The barrier is on the
    store, not a collective, so it needs no device and works for any backend.
    """
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=job.timeout_s)
    try:
        dist.init_process_group(job.backend, store=store, rank=rank, world_size=job.world_size, timeout=timeout)
    except BaseException:
        store.set(JOIN_FAILED_KEY, str(rank))
        raise
    if store.add(JOINED_KEY, 1) == job.world_size:
        store.set(ALL_JOINED_KEY, "1")
    deadline, pause = time.monotonic() + job.timeout_s, 0.0005
    while not store.check([ALL_JOINED_KEY]):
        if store.check([JOIN_FAILED_KEY]):
            raise RuntimeError(f"rank {store.get(JOIN_FAILED_KEY).decode()} could not join the process group")
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"Wait timeout: {store.add(JOINED_KEY, 0)} of {job.world_size} ranks joined within {job.timeout_s:g} s"
            )
        time.sleep(pause)
        pause = min(2 * pause, 0.01)


def _forget_failed_group() -> None:
    """After a failed join, let this worker's next group have the name its peers' groups will have.

    torch names a default group after a per-process counter that
    ``init_process_group`` increments and only ``destroy_process_group``
    resets. A join that failed leaves nothing to destroy, so the counter
    stays one ahead: this worker's next group would be "1" while its peers'
    is "0", each would wait for keys under the other's name in the store, and
    every later run on this worker would end in "Wait timeout". torch has no
    public call for this, hence the private attribute, checked first.
    """
    from torch.distributed import distributed_c10d as c10d

    world = getattr(c10d, "_world", None)
    if world is not None and hasattr(world, "group_count"):
        world.group_count = 0


def _print_json(record: Any) -> None:
    print(json.dumps(record), flush=True)


def torchrun_context(emit: Callable[[Any], None] = _print_json) -> RankContext | None:
    """When started by torchrun (RANK, WORLD_SIZE, LOCAL_RANK set), join its group.

    Rank 0 hands each record to ``emit``; by default it prints one JSON object
    per line, the same lines ``dtlab train --json`` prints locally. Other
    ranks' records are dropped. Returns None outside torchrun.
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    import torch
    import torch.distributed as dist

    from dtlab.config.torch_support import check_torch

    check_torch()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = _device_for(backend, local_rank)
    timeout = datetime.timedelta(seconds=env_timeout())
    dist.init_process_group(backend, timeout=timeout)

    def rank_zero_emit(record):
        if rank == 0:
            emit(record)

    return RankContext(
        rank=rank, world_size=world_size, local_rank=local_rank, backend=backend, device=device, _emit=rank_zero_emit
    )
