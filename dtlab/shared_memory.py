"""Shared memory between the ranks of one machine: the ring's messages without the network stack.

gloo moves every message over TCP, even between two processes on the same
machine: the sender's bytes are copied into the kernel, through the loopback
interface, and out again into the receiver, with a system call or several
and a hand-over between gloo's threads on each side. NCCL does not do that
inside a node: it picks a transport by where the ranks are (shared memory
or direct GPU-to-GPU copies within a machine, the network only between
machines; NCCL's documentation, "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE"), and
so does MPI. :class:`SharedMemoryWire` is that transport for dtlab's ring,
between each rank and its two neighbours:

    left ──data──▶ [ my inbox: SLOTS slots in shared memory ] ──▶ me
    left ◀─credit─                                                 me

A sender copies a message into a free slot of its right neighbour's inbox
(a file in ``/dev/shm`` both have mapped) and writes one byte to that
neighbour's *data* pipe; the receiver copies the slot out and writes one
byte back on the sender's *credit* pipe, which frees the slot. One copy into
memory the receiver can read, one copy out: no kernel buffer, no TCP. The
pipes carry only these one-byte signals, and a rank waiting for one sleeps
in the kernel (``select``) instead of spinning, which matters where ranks
outnumber cores. :func:`dtlab.collectives.ring_all_reduce` runs on it
unchanged (the same steps, the same additions in the same order, so the same
bits as over gloo): it needs only ``isend`` to the right and ``irecv`` from
the left.

``--collectives dtlab`` (:mod:`dtlab.comm_ring`) uses it for every
all-reduce, reduce-scatter and all-gather of a group whose ranks are all on
this machine (the same boot and the same network namespace: two of lesson
15's namespace "nodes" on one machine count as two machines, so their link
stays the shaped one). Set up once per process group, on its first call,
through the group's store (not a collective, so it cannot interleave with
the group's own calls); when it cannot be (no ``/dev/shm``, no space there,
ranks on several machines, ``DTLAB_SHARED_MEMORY=0``), every rank of the
group finds the same answer and the calls go over gloo.

Nothing outlives the processes: the inboxes and pipes are unlinked from the
file system as soon as every rank has opened them, so the kernel frees them
when the last rank holding them ends, however it ends. A wait lasts at most
the group's timeout; a neighbour that ended closes its pipes, which ends the
wait at once with an error naming it.
"""
from __future__ import annotations

import os
import select
import shutil
import socket
import tempfile
import time
import weakref
from collections import deque
from datetime import timedelta

import torch
import torch.distributed as dist

from dtlab.i18n import DtlabError

SLOT_BYTES = 1 << 20
"""The largest message one slot holds: the ring's segments over shared memory are cut to this size
(:data:`dtlab.collectives.SHARED_MEMORY_SEGMENT_BYTES`)."""
SLOTS = 4
"""Slots in each inbox: how many messages a sender may have written that its neighbour has not yet
read. Two keep a ring from ever waiting on itself; more let a sender run ahead."""
_SLACK = 4096
"""Bytes added to each slot, for a segment a few elements over SLOT_BYTES (``tensor_split`` rounds up)."""
ROOT = "/dev/shm"


class SharedMemoryWire:
    """One rank's messages to its right neighbour and from its left one, through shared memory.

    ``isend(tensor, right)`` and ``irecv(tensor, left)`` as :class:`dtlab.comm.Messages` has them,
    returning a work whose ``wait()`` returns once the message has gone (or arrived). Messages of
    each direction arrive in the order sent. Made by :func:`wire_for`.
    """

    def __init__(self, *, right: int, left: int, outbox: torch.Tensor, inbox: torch.Tensor,
                 data_out: int, data_in: int, credit_out: int, credit_in: int, timeout_s: float):
        self.right, self.left, self.timeout_s = right, left, timeout_s
        self.outbox, self.inbox = outbox, inbox            # (SLOTS, slot bytes) uint8 each
        self.data_out, self.data_in, self.credit_out, self.credit_in = data_out, data_in, credit_out, credit_in
        self.sent = self.freed = 0                         # messages written to the right; slots it freed
        self.arrived = self.taken = 0                      # messages signalled from the left; copied out
        self.sending: deque = deque()                      # (number, tensor) waiting for a free slot
        self.receiving: deque = deque()                    # (number, tensor) posted, not yet copied out
        self.posted_sends = self.posted_recvs = 0
        self.closed = False

    # ------------------------------------------------------------------ as comm.Messages
    def isend(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> "_Work":
        self._check(peer, self.right, "send to", "发送给", tensor)
        self.sending.append((self.posted_sends, tensor))
        self.posted_sends += 1
        self._progress()
        return _Work(self, "sent", self.posted_sends)

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> "_Work":
        self._check(peer, self.left, "receive from", "接收自", tensor)
        self.receiving.append((self.posted_recvs, tensor))
        self.posted_recvs += 1
        self._progress()
        return _Work(self, "taken", self.posted_recvs)

    def _check(self, peer: int, neighbour: int, verb: str, verb_zh: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if peer != neighbour or nbytes > self.inbox.shape[1] or not tensor.is_contiguous():
            raise DtlabError(
                f"the shared-memory wire can only {verb} rank {neighbour}, contiguous messages of at most "
                f"{self.inbox.shape[1]} bytes; asked for rank {peer}, {nbytes} bytes",
                f"共享内存通道只能{verb_zh} rank {neighbour}，且消息须连续、不超过 {self.inbox.shape[1]} 字节；"
                f"实际请求 rank {peer}，{nbytes} 字节")

    # ------------------------------------------------------------------ progress
    def wait_for(self, counter: str, number: int) -> None:
        """Make progress until ``counter`` (``sent`` or ``taken``) reaches ``number``; at most the timeout."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            self._progress()
            if getattr(self, counter) >= number:
                return
            readable = [self.credit_in] if self.sending else []
            if self.receiving and self.taken == self.arrived:
                readable.append(self.data_in)
            left = deadline - time.monotonic()
            if left <= 0 or not select.select(readable, [], [], left)[0]:
                raise DtlabError(
                    f"shared-memory ring: no message from rank {self.left} or room at rank {self.right} "
                    f"within {self.timeout_s:g} s (the group's timeout); a rank is stuck or slow",
                    f"共享内存环：{self.timeout_s:g} 秒（进程组超时）内既没有收到 rank {self.left} 的消息，"
                    f"rank {self.right} 也没有空位；有 rank 卡住或过慢")

    def _progress(self) -> None:
        """Do whatever can be done now without waiting: take freed slots, write, copy out.

        A neighbour that has sent all it had to may finish its run and close
        its pipes before this rank has read the last signals; so an empty
        read from a closed pipe is an error only when a signal from it is
        still to come (``needed``), and the data pipe is read only when the
        signals already read do not cover the next message.
        """
        while self.sending:
            full = self.sent - self.freed >= SLOTS
            self.freed += _signals(self.credit_in, self.right, needed=full)
            if self.sent - self.freed >= SLOTS:
                break
            number, tensor = self.sending.popleft()
            _bytes_of(self.outbox[number % SLOTS], tensor).copy_(tensor.reshape(-1))
            _signal(self.data_out, self.right)
            self.sent += 1
        while self.receiving:
            if self.taken == self.arrived:
                self.arrived += _signals(self.data_in, self.left, needed=True)
                if self.taken == self.arrived:
                    break
            number, tensor = self.receiving.popleft()
            tensor.reshape(-1).copy_(_bytes_of(self.inbox[number % SLOTS], tensor))
            try:
                _signal(self.credit_out, self.left)
            except DtlabError:
                pass         # the sender has already finished and closed: it needs no more room
            self.taken += 1

    def close(self) -> None:
        """Close the pipes (once: a number closed twice could by then be another file's)."""
        fds, self.closed = () if self.closed else (self.data_out, self.data_in, self.credit_out,
                                                    self.credit_in), True
        for fd in fds:
            os.close(fd)


class _Work:
    """What isend and irecv return: ``wait()`` until the wire's ``counter`` reaches ``number``."""

    def __init__(self, wire: SharedMemoryWire, counter: str, number: int):
        self.wire, self.counter, self.number = wire, counter, number

    def wait(self, timeout=None) -> bool:
        self.wire.wait_for(self.counter, self.number)
        return True

    def is_completed(self) -> bool:
        self.wire._progress()
        return getattr(self.wire, self.counter) >= self.number


def _bytes_of(slot: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The first bytes of ``slot`` (uint8) viewed as ``like``'s dtype, as many elements as ``like`` has."""
    return slot[:like.numel() * like.element_size()].view(like.dtype)


def _signal(fd: int, peer: int) -> None:
    try:
        os.write(fd, b"\0")
    except BrokenPipeError:
        raise _ended(peer) from None


def _ended(peer: int) -> DtlabError:
    return DtlabError(f"shared-memory ring: rank {peer} has ended (its pipe closed)",
                      f"共享内存环：rank {peer} 已经结束（它的管道已关闭）")


def _signals(fd: int, peer: int, *, needed: bool) -> int:
    """How many one-byte signals are waiting on ``fd`` (read without blocking).

    Nothing to read and the writer gone: an error if a signal is ``needed``, else just none."""
    try:
        got = os.read(fd, 65536)
    except BlockingIOError:
        return 0
    if not got and needed:
        raise _ended(peer)
    return len(got)


# ---------------------------------------------------------------------- set-up

_wires: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
"""Each process group's wire (or None: not on one machine), made on its first use and kept with it."""


def wire_for(group=None) -> SharedMemoryWire | None:
    """``group``'s shared-memory wire, made on first use; None when its ranks cannot share memory.

    Every rank of the group must call it at the same point (the first call of dtlab's collectives
    on the group does); it talks through the group's store, so it cannot interleave with the
    group's own collectives. The answer is the same on every rank.
    """
    group = dist.group.WORLD if group is None else group
    if group not in _wires:
        _wires[group] = _set_up(group)
    return _wires[group]


def close_all() -> None:
    """Close every wire of this process (its process groups are about to be destroyed)."""
    for wire in list(_wires.values()):
        if wire is not None:
            wire.close()
    _wires.clear()


def this_machine() -> str:
    """What ranks on the same machine share, and ranks on two (or in two network namespaces) do not."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        net = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return f"unknown:{socket.gethostname()}:{os.getpid()}"   # not Linux: never the same
    return f"{boot}:{net}"


def _store_and_timeout(group) -> tuple[object, float]:
    """The group's store and timeout. torch has no public call for either; the private ones are checked."""
    from torch.distributed import distributed_c10d as c10d

    store = c10d._world.pg_map[group][1]
    timeout = group._get_backend(torch.device("cpu")).options._timeout
    return store, timeout.total_seconds()


class _Rendezvous:
    """The ranks of one group agreeing on their set-up through the group's store (keys under ``key``)."""

    def __init__(self, group):
        self.n, self.rank = group.size(), group.rank()
        self.store, self.timeout_s = _store_and_timeout(group)
        self.wait = timedelta(seconds=self.timeout_s)
        self.key = f"dtlab-shm/{group.group_name}"

    def gather(self, name: str, value: str) -> list[str]:
        """Every rank's ``value`` under ``name``, once all have given theirs (a barrier)."""
        self.store.set(f"{self.key}/{name}/{self.rank}", value)
        keys = [f"{self.key}/{name}/{r}" for r in range(self.n)]
        self.store.wait(keys, self.wait)
        return [self.store.get(k).decode() for k in keys]

    def folder(self) -> str:
        """A fresh private folder in ROOT, made by rank 0 ("" if it could not be)."""
        if self.rank == 0:
            try:
                made = tempfile.mkdtemp(prefix="dtlab-shm-", dir=ROOT)
            except OSError:
                made = ""
            self.store.set(f"{self.key}/folder", made)
        self.store.wait([f"{self.key}/folder"], self.wait)
        return self.store.get(f"{self.key}/folder").decode()


def _set_up(group) -> SharedMemoryWire | None:
    if group.size() == 1 or os.environ.get("DTLAB_SHARED_MEMORY", "1") == "0" or not os.path.isdir(ROOT):
        return None
    meeting = _Rendezvous(group)
    if len(set(meeting.gather("machine", this_machine()))) != 1:
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
            for fd in opened:
                os.close(fd)
        # Once every rank has opened what it needs (or given up), nothing is left in the file system,
        # and every pipe has its writer (so that an empty read means a neighbour that ended).
        try:
            meeting.gather("done", "1")
        finally:
            if meeting.rank == 0:
                shutil.rmtree(folder, ignore_errors=True)
    return wire


def _open_wire(meeting: _Rendezvous, folder: str, opened: list[int]) -> SharedMemoryWire | None:
    """Make this rank's inbox and pipes in ``folder``, then open its neighbours'; None if any rank failed.

    Every descriptor opened is appended to ``opened`` as it is (the caller closes them on failure).
    """
    n, rank = meeting.n, meeting.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    slot = SLOT_BYTES + _SLACK
    path = lambda name: os.path.join(folder, name)   # noqa: E731
    # 1. my inbox (my left neighbour writes into it) and the read ends of my two pipes
    status = "ok"
    try:
        with open(path(f"inbox-{rank}"), "wb") as f:
            os.posix_fallocate(f.fileno(), 0, SLOTS * slot)     # ENOSPC now, not SIGBUS later
        for pipe in (f"data-{rank}", f"credit-{rank}"):
            os.mkfifo(path(pipe), 0o600)
            opened.append(os.open(path(pipe), os.O_RDONLY | os.O_NONBLOCK))
    except OSError as error:
        status = f"{type(error).__name__}: {error}"
    if any(s != "ok" for s in meeting.gather("created", status)):
        return None
    # 2. the write ends of my neighbours' pipes (their read ends are open now), both inboxes mapped
    data_in, credit_in = opened
    opened.append(data_out := os.open(path(f"data-{right}"), os.O_WRONLY | os.O_NONBLOCK))
    opened.append(credit_out := os.open(path(f"credit-{left}"), os.O_WRONLY | os.O_NONBLOCK))

    def mapped(r: int) -> torch.Tensor:
        return torch.from_file(path(f"inbox-{r}"), shared=True, size=SLOTS * slot,
                               dtype=torch.uint8).view(SLOTS, slot)

    return SharedMemoryWire(right=right, left=left, outbox=mapped(right), inbox=mapped(rank),
                            data_in=data_in, credit_in=credit_in, data_out=data_out, credit_out=credit_out,
                            timeout_s=meeting.timeout_s)
