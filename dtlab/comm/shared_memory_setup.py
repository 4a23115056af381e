"""How the ranks of a process group set up their shared-memory wire (:mod:`dtlab.comm.shared_memory`).

Once per group, at the group's first call to dtlab's collectives, through the
group's store (so that it cannot interleave with the group's own
collectives), every rank of the group:

1. says where it is (:func:`this_machine`: boot, network namespace and the
   ``/dev/shm`` it sees) or that it may not share memory; unless all agree,
   every rank answers None and the group's calls go over gloo;
2. makes its inbox and the read ends of its two named pipes (FIFOs: the
   ranks are not parent and child, so they find each other's pipes by name)
   in a private folder rank 0 made, and says whether that worked
   (``posix_fallocate`` reserves the inbox's pages now: a tmpfs file only
   sized would get them on first write, and a full ``/dev/shm`` would then
   kill the writer with SIGBUS);
3. opens the write ends of its right neighbour's data pipe and its left
   neighbour's credit pipe, maps its right neighbour's inbox and its own,
   and says whether that worked; then rank 0 removes the folder, and
   nothing is left in the file system.

Each step's answers are gathered from every rank before anyone goes on, so
every rank takes the same branch.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import threading
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from dtlab.comm import shared_memory as sm
from dtlab.comm.shared_memory import SharedMemoryWire, _close_all_of
from dtlab.i18n import DtlabError
from dtlab.launch.resources import process_exists

_wires: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
"""Each process group's wire (or None: not on one machine; or the error its set-up raised), made on
its first use and kept with it."""
_setting_up = threading.Lock()
"""One set-up at a time (a set-up waits on its peers through the store)."""
_kept = threading.Lock()
"""Guards ``_wires`` only, so that :func:`close_all` never waits for a set-up."""


def wire_for(group=None) -> SharedMemoryWire | None:
    """``group``'s shared-memory wire, made on first use; None when its ranks cannot share memory.

    Every rank of the group must call it at the same point (the first call of dtlab's collectives
    on the group does); it talks through the group's store, so it cannot interleave with the
    group's own collectives. The answer is the same on every rank. A set-up that failed is not
    tried again (a retry on some ranks only would wait for the others for ever): its error is
    raised again.
    """
    group = dist.group.WORLD if group is None else group
    with _setting_up:
        with _kept:
            known = _wires.get(group, _wires)
        if known is _wires:
            try:
                known = _set_up(group)
            except Exception as error:  # noqa: BLE001 - kept, and raised again on every later call
                en, zh = (error.en, error.zh) if isinstance(error, DtlabError) else (str(error), str(error))
                known = DtlabError(
                    f"the shared-memory wire of this group could not be set up: {en}",
                    f"这个进程组的共享内存通道未能建立：{zh}",
                )
            with _kept:
                _wires[group] = known
    if isinstance(known, DtlabError):
        raise known
    return known


def known_wire(group=None) -> SharedMemoryWire | None:
    """``group``'s wire if it has been set up already (:func:`wire_for`), else None; never sets one up
    (a set-up waits on every rank, so it happens only where every rank makes the same call)."""
    group = dist.group.WORLD if group is None else group
    with _kept:
        known = _wires.get(group)
    return known if isinstance(known, SharedMemoryWire) else None


def in_flight_wires() -> list[SharedMemoryWire]:
    """This process's wires with a call in flight (:meth:`SharedMemoryWire.start`)."""
    with _kept:
        return [wire for wire in _wires.values() if isinstance(wire, SharedMemoryWire) and wire.flights]


def close_all() -> None:
    """Close every wire of this process (its process groups are about to be destroyed)."""
    with _kept:
        wires = [wire for wire in _wires.values() if isinstance(wire, SharedMemoryWire)]
        _wires.clear()
    for wire in wires:
        wire.close()


def this_machine() -> str:
    """What ranks that can share memory share, and ranks on two machines (or in two network
    namespaces, or with two different /dev/shm) do not."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        net = os.stat("/proc/self/ns/net").st_ino
        shm = os.stat(sm.ROOT).st_dev
    except OSError:
        return f"unknown:{socket.gethostname()}:{os.getpid()}"  # not Linux: never the same
    return f"{boot}:{net}:{shm}"


def _store_and_timeout(group) -> tuple[object, float] | None:
    """The group's store and timeout, or None for a group without a gloo (CPU) backend.

    torch has no public call for either; the private ones are looked up with care."""
    from torch.distributed import distributed_c10d as c10d

    try:
        if hasattr(c10d, "_get_process_group_store"):
            store = c10d._get_process_group_store(group)
        else:
            store = c10d._world.pg_map[group][1]
        timeout = group._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, KeyError, RuntimeError):
        return None
    return store, timeout.total_seconds()


class _Rendezvous:
    """The ranks of one group agreeing on their set-up through the group's store.

    Keys live under this set-up's own prefix (a count of set-ups of the group on this rank, the same
    on every rank), so a second set-up never reads the first one's."""

    def __init__(self, group, store, timeout_s: float):
        self.n, self.rank = group.size(), group.rank()
        self.names = [dist.get_global_rank(group, r) for r in range(self.n)]
        self.store, self.timeout_s = store, timeout_s
        self.wait = timedelta(seconds=timeout_s)
        attempt = store.add(f"dtlab-shm/{group.group_name}/attempts/{self.rank}", 1)
        self.key = f"dtlab-shm/{group.group_name}/{attempt}"

    def gather(self, name: str, value: str) -> list[str]:
        """Every rank's ``value`` under ``name``, once all have given theirs (a barrier)."""
        self.store.set(f"{self.key}/{name}/{self.rank}", value)
        keys = [f"{self.key}/{name}/{r}" for r in range(self.n)]
        self.store.wait(keys, self.wait)
        return [self.store.get(k).decode() for k in keys]

    def folder(self) -> str:
        """A fresh private folder in ROOT, made by rank 0 ("" if it could not be)."""
        if self.rank == 0:
            _sweep()
            try:
                made = tempfile.mkdtemp(prefix=f"dtlab-shm-{os.getpid()}-", dir=sm.ROOT)
            except OSError:
                made = ""
            self.store.set(f"{self.key}/folder", made)
        self.store.wait([f"{self.key}/folder"], self.wait)
        return self.store.get(f"{self.key}/folder").decode()


_OURS = re.compile(r"dtlab-shm-(\d+)-")
STALE_S = 600.0
"""A set-up folder this old whose maker has ended was left by a rank killed during set-up."""


def _sweep() -> None:
    """Remove set-up folders whose maker ended long ago (a rank killed in its few milliseconds)."""
    try:
        names = os.listdir(sm.ROOT)
    except OSError:
        return
    for name in names:
        found = _OURS.match(name)
        path = os.path.join(sm.ROOT, name)
        try:
            old = time.time() - os.stat(path).st_mtime > STALE_S
        except OSError:
            continue
        if found and old and not process_exists(int(found.group(1))):
            shutil.rmtree(path, ignore_errors=True)


def _set_up(group) -> SharedMemoryWire | None:
    if group.size() == 1:
        return None
    found = _store_and_timeout(group)
    if found is None:
        return None
    meeting = _Rendezvous(group, *found)
    # Every rank takes part, and a rank that cannot or may not share memory says so: all decide alike.
    usable = os.environ.get("DTLAB_SHARED_MEMORY", "1") != "0" and os.path.isdir(sm.ROOT)
    if len(set(meeting.gather("machine", this_machine() if usable else f"off:{meeting.rank}"))) != 1:
        return None
    folder = meeting.folder()
    if not folder:
        return None
    opened: list[int] = []
    wire = None
    try:
        wire = _open_wire(meeting, folder, opened)
    finally:
        if wire is None:
            _close_all_of(tuple(opened))
        if meeting.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)  # every rank has opened all it needs, or given up
    return wire


def _open_wire(meeting: _Rendezvous, folder: str, opened: list[int]) -> SharedMemoryWire | None:
    """Make this rank's inbox and pipes in ``folder``, then open its neighbours'; None on every rank
    if any rank failed.

    Every descriptor opened is appended to ``opened`` as it is (the caller closes them on failure).
    """
    n, rank = meeting.n, meeting.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    slot = sm.SLOT_BYTES + sm._SLACK
    path = lambda name: os.path.join(folder, name)  # noqa: E731

    def mapped(r: int) -> torch.Tensor:
        return torch.from_file(path(f"inbox-{r}"), shared=True, size=sm.SLOTS * slot, dtype=torch.uint8).view(
            sm.SLOTS, slot
        )

    # 1. my inbox (my left neighbour writes into it) and the read ends of my two pipes
    status = "ok"
    try:
        with open(path(f"inbox-{rank}"), "wb") as f:
            os.posix_fallocate(f.fileno(), 0, sm.SLOTS * slot)  # ENOSPC now, not SIGBUS later
        for pipe in (f"data-{rank}", f"credit-{rank}"):
            os.mkfifo(path(pipe), 0o600)
            opened.append(os.open(path(pipe), os.O_RDONLY | os.O_NONBLOCK))
    except OSError as error:
        status = f"{type(error).__name__}: {error}"
    if any(s != "ok" for s in meeting.gather("created", status)):
        return None
    # 2. the write ends of my neighbours' pipes (their read ends are open now), both inboxes mapped;
    # once every rank is past this, an empty read from a pipe means a neighbour that ended
    try:
        opened.append(os.open(path(f"data-{right}"), os.O_WRONLY | os.O_NONBLOCK))
        opened.append(os.open(path(f"credit-{left}"), os.O_WRONLY | os.O_NONBLOCK))
        inboxes = mapped(right), mapped(rank)
    except (OSError, RuntimeError) as error:
        status = f"{type(error).__name__}: {error}"
    if any(s != "ok" for s in meeting.gather("opened", status)):
        return None
    # Made only now: from here on the wire, not the caller, closes the descriptors (once).
    data_in, credit_in, data_out, credit_out = opened
    return SharedMemoryWire(
        right=right,
        left=left,
        outbox=inboxes[0],
        inbox=inboxes[1],
        data_in=data_in,
        credit_in=credit_in,
        data_out=data_out,
        credit_out=credit_out,
        timeout_s=meeting.timeout_s,
        names=(meeting.names[right], meeting.names[left]),
    )
