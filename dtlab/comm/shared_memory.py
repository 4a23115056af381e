"""Shared memory between the ranks of one machine: the ring's messages without the network stack.

gloo moves every message over TCP, even between two processes on the same
machine: the sender's bytes are copied into the kernel, through the loopback
interface, and out again into the receiver, with a system call or several
and a hand-over between gloo's threads on each side. NCCL does not do that
inside a node: it picks a transport by where the ranks are (direct
GPU-to-GPU copies within a machine where it can, P2P; shared host memory
where it cannot, SHM; the network only between machines, NET; NCCL's
documentation, "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE"), and so does MPI. :class:`SharedMemoryWire` is that transport for dtlab's ring,
between each rank and its two neighbours:

    left ──data──▶ [ my inbox: SLOTS slots in shared memory ] ──▶ me
    left ◀─credit─                                                 me

A sender copies a message into a free slot of its right neighbour's inbox
(a file in ``/dev/shm`` both have mapped: ``/dev/shm`` is a RAM-backed
tmpfs, and a file mapped by two processes is the same physical pages in
both) and writes one byte to that neighbour's *data* pipe; the receiver
copies the slot out (or adds it straight from there) and writes one byte
back on the sender's *credit* pipe, which frees the slot. One copy into
memory the receiver can read, one copy out. TCP also copies twice (into the socket buffer and out); what this saves
is the protocol stack, most system calls, and the hand-over to and from
gloo's TCP thread. The pipes carry only these one-byte notifications (not
Unix signals), and a rank waiting for one sleeps in the kernel (``poll``)
instead of spinning, which matters where ranks outnumber cores. :func:`dtlab.comm.collectives.ring_all_reduce` runs on it
with the same steps and the same additions in the same order, so the same
bits as over gloo: its pipelined form (:class:`dtlab.comm.ring_pipeline.PipelinedRing`)
through ``isend`` to the right and ``irecv`` from the left, and where each
chunk fits one slot as *steps* (``put``, ``take``), run at once or left in
flight (:mod:`dtlab.comm.shared_memory_flights`).

``--collectives dtlab`` (:mod:`dtlab.comm.ring_backend`) uses it for every
all-reduce, reduce-scatter and all-gather of a group whose ranks are all on
this machine (the same boot, network namespace and ``/dev/shm``: two of lesson
15's namespace "nodes" on one machine count as two machines, so their link
stays the shaped one). Set up once per process group, on its first call,
through the group's store (not a collective, so it cannot interleave with
the group's own calls); when it cannot be (no ``/dev/shm``, no space there,
ranks on several machines, ``DTLAB_SHARED_MEMORY=0``), every rank of the
group finds the same answer and the calls go over gloo
(:mod:`dtlab.comm.shared_memory_setup`).

Nothing outlives the processes: the inboxes and pipes are unlinked from the
file system as soon as every rank has opened them, so the kernel frees them
when the last rank holding them ends, however it ends (a set-up folder left
by a rank killed in those few milliseconds is swept by a later set-up, once
it is ten minutes old and its maker has ended). A
wait lasts at most the group's timeout; a neighbour that ended closes its
pipes, which ends the wait at once with an error naming it. Messages are
matched by their order alone, as on any ordered channel: after an error the
wire refuses further use rather than hand a later message to the wrong
receive.
"""

from __future__ import annotations

import os
import select
import threading
import time
import weakref
from collections import deque
from contextlib import contextmanager

import torch

from dtlab.comm.shared_memory_flights import InFlight
from dtlab.i18n import DtlabError

SLOT_BYTES = 1 << 20
"""The largest message one slot holds: the ring's segments over shared memory are cut to this size
(:data:`dtlab.comm.collectives.SHARED_MEMORY_SEGMENT_BYTES`)."""
SLOTS = 4
"""Slots in each inbox: how many messages a sender may have written that its neighbour has not yet
read. Two keep a ring from ever waiting on itself; more let a sender run ahead."""
_SLACK = 4096
"""Bytes added to each slot, for a segment a few elements over SLOT_BYTES (``tensor_split`` rounds up)."""
ROOT = "/dev/shm"


class SharedMemoryWire(InFlight):
    """One rank's messages to its right neighbour and from its left one, through shared memory.

    ``isend(tensor, right)`` and ``irecv(tensor, left)`` as :class:`dtlab.comm.calls.Messages` has them,
    returning a work whose ``wait()`` returns once the message has gone (or arrived); or ``put`` and
    ``take`` as steps, for :meth:`~dtlab.comm.shared_memory_flights.InFlight.run` now or
    :meth:`~dtlab.comm.shared_memory_flights.InFlight.start` in flight. Messages of
    each direction arrive in the order sent. One thread at a time (a lock); made by
    :func:`dtlab.comm.shared_memory_setup.wire_for`.
    ``names``: how errors name the two neighbours (their ranks in the whole job).
    """

    def __init__(
        self,
        *,
        right: int,
        left: int,
        outbox: torch.Tensor,
        inbox: torch.Tensor,
        data_out: int,
        data_in: int,
        credit_out: int,
        credit_in: int,
        timeout_s: float,
        names: tuple[int, int],
    ):
        self.right, self.left, self.timeout_s = right, left, timeout_s
        self.right_name, self.left_name = names
        self.outbox, self.inbox = outbox, inbox  # (SLOTS, slot bytes) uint8 each
        self.data_out, self.data_in, self.credit_out, self.credit_in = data_out, data_in, credit_out, credit_in
        self.slots = inbox.shape[0]
        self.sent = self.freed = 0  # messages written to the right; slots it freed
        self.arrived = self.taken = 0  # messages signalled from the left; copied out
        self.sending: deque = deque()  # tensors waiting for a free slot, in order
        self.receiving: deque = deque()  # tensors posted, not yet copied out, in order
        self.lock = threading.RLock()
        self.broken: str | None = None  # why the wire may not be used any more
        InFlight.__init__(self)  # collectives left in flight (weak progress)
        self._close = weakref.finalize(self, _close_all_of, (data_out, data_in, credit_out, credit_in))

    # ------------------------------------------------------------------ as comm.Messages
    def isend(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> "_Work":
        return self._post(tensor, peer, sending=True)

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> "_Work":
        return self._post(tensor, peer, sending=False)

    def _post(self, tensor: torch.Tensor, peer: int, *, sending: bool) -> "_Work":
        """Queue one message in its direction; its number is how many went that way before it."""
        self._check(peer, tensor, sending=sending)
        queue, counter = (self.sending, "sent") if sending else (self.receiving, "taken")
        with self._using():
            self._land()  # what is in flight goes first
            number = getattr(self, counter) + len(queue)
            queue.append(tensor)
            self._progress()
            return _Work(self, counter, number + 1)

    def _check(self, peer: int, tensor: torch.Tensor, *, sending: bool) -> None:
        nbytes, room = tensor.numel() * tensor.element_size(), self.inbox.shape[1]
        neighbour = self.right if sending else self.left
        if peer != neighbour and sending:
            en, zh = (
                f"can only send to its right neighbour, rank {neighbour} of the group, not to rank {peer}",
                f"只能发送给它的右邻居（组内 rank {neighbour}），不能发给 rank {peer}",
            )
        elif peer != neighbour:
            en, zh = (
                f"can only receive from its left neighbour, rank {neighbour} of the group, not from rank {peer}",
                f"只能从它的左邻居（组内 rank {neighbour}）接收，不能从 rank {peer} 接收",
            )
        elif nbytes > room:
            en, zh = (
                f"carries messages of at most {room} bytes, not {nbytes}",
                f"每条消息最多 {room} 字节，而这条有 {nbytes} 字节",
            )
        elif not tensor.is_contiguous():
            en, zh = "carries contiguous tensors only", "只能传输连续存储的张量"
        else:
            return
        raise DtlabError(f"the shared-memory wire {en}", f"共享内存通道{zh}")

    # ------------------------------------------------------------------ one message as steps
    def put(self, tensor: torch.Tensor):
        """Copy ``tensor`` into the right neighbour's inbox, as steps (a generator): it yields the pipe it
        waits on while that inbox is full, for :meth:`run` or :meth:`start` to wait on or come back to."""
        self._check(self.right, tensor, sending=True)
        while not self._slot_free():
            yield self.credit_in
        self._write(tensor)

    def take(self, like: torch.Tensor, use):
        """Take the next message from the left, shaped as ``like``, as steps (it yields the pipe it waits on
        until the message has arrived): ``use(message)`` where it lies in the inbox (no copy out: an
        addition can read it there), then its slot is freed."""
        self._check(self.left, like, sending=False)
        while not self._message_waiting():
            yield self.data_in
        self._read(like, use)

    def _write(self, tensor: torch.Tensor) -> None:
        """Copy ``tensor`` into the next slot of the right neighbour's inbox (one is free) and signal it."""
        _bytes_of(self.outbox[self.sent % self.slots], tensor).copy_(tensor.reshape(-1))
        _signal(self.data_out, self.right_name)
        self.sent += 1

    def _read(self, like: torch.Tensor, use) -> None:
        """``use`` the next message (it has arrived) where it lies, shaped as ``like``; then free its slot."""
        use(_bytes_of(self.inbox[self.taken % self.slots], like).view(like.shape))
        self.taken += 1
        _credit(self.credit_out, self.left_name)

    def _slot_free(self) -> bool:
        if self.sent - self.freed >= self.slots:
            self.freed += _signals(self.credit_in, self.right_name, needed=True)
        return self.sent - self.freed < self.slots

    def _message_waiting(self) -> bool:
        if self.taken == self.arrived:
            self.arrived += _signals(self.data_in, self.left_name, needed=True)
        return self.taken < self.arrived

    def _no_message_posted(self) -> None:
        """Steps are run or started only when no isend or irecv is waiting (the ring's worker finishes
        its own before it returns), since messages are matched by their order alone."""
        if self.sending or self.receiving:
            raise DtlabError(
                "the shared-memory wire can run or start steps only when no isend or irecv is "
                "still waiting (messages are matched by their order alone)",
                "共享内存通道只能在没有尚未完成的 isend 或 irecv 时运行或开始新的步骤（消息只按顺序配对）",
            )

    # ------------------------------------------------------------------ progress
    def wait_for(self, counter: str, number: int, timeout_s: float | None = None) -> None:
        """Make progress until ``counter`` (``sent`` or ``taken``) reaches ``number``; at most the
        group's timeout (or ``timeout_s``, if shorter)."""
        limit = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        deadline = time.monotonic() + limit
        with self._using():
            while True:
                self._progress()
                if getattr(self, counter) >= number:
                    return
                self._sleep_on(
                    (self.credit_in,) * bool(self.sending) + (self.data_in,) * bool(self.receiving), deadline, limit
                )

    def _sleep_on(self, pipes: tuple[int, ...], deadline: float, limit: float) -> None:
        """Sleep in ``poll`` until one of ``pipes`` has something to read; past ``deadline``, a timeout
        error that breaks the wire."""
        poll = select.poll()
        for fd in pipes:
            poll.register(fd, select.POLLIN)
        left = deadline - time.monotonic()
        if left <= 0 or not poll.poll(max(1, round(left * 1e3))):
            self.broken = "timeout"
            raise self._timeout("sent" if pipes == (self.credit_in,) else "taken", limit)
        if self._close.alive is False:
            raise self._refusal()

    def _timeout(self, counter: str, limit: float) -> DtlabError:
        if counter == "taken":
            en, zh = (f"no message from rank {self.left_name}", f"没有收到 rank {self.left_name} 的消息")
        else:
            en, zh = (
                f"no free slot in rank {self.right_name}'s inbox (it has not read what it was sent)",
                f"rank {self.right_name} 的收件箱没有空出槽位（它还没有读走已发给它的消息）",
            )
        return DtlabError(
            f"shared-memory ring: {en} within {limit:g} s (timed out): a rank is stuck, stopped or far "
            "behind (DTLAB_SHARED_MEMORY=0 runs the ring over gloo instead)",
            f"共享内存环：{limit:g} 秒内{zh}（超时）：有 rank 卡住、被挂起或远远落后"
            "（设置 DTLAB_SHARED_MEMORY=0 可改经 gloo 运行）",
        )

    def _progress(self) -> None:
        """Do whatever can be done now without waiting for the queued isends and irecvs: write each
        while a slot is free, copy each out once it has arrived.

        A neighbour that has sent all it had to may finish its run and close
        its pipes before this rank has read the last signals; so a pipe is
        read only when the signals already read do not cover the next message
        or slot (:meth:`_slot_free`, :meth:`_message_waiting`), and only then
        is an empty read from a closed pipe an error.
        """
        while self.sending and self._slot_free():
            self._write(self.sending.popleft())
        while self.receiving and self._message_waiting():
            tensor = self.receiving.popleft()
            self._read(tensor, tensor.copy_)

    @contextmanager
    def _using(self):
        """The lock, refusing a wire closed, or broken by an earlier error (its counters would no
        longer match its neighbours'); an error inside breaks it."""
        with self.lock:
            if self.broken or not self._close.alive:
                raise self._refusal()
            try:
                yield
            except BaseException as error:
                self.broken = self.broken or f"{type(error).__name__}: {error}".splitlines()[0]
                self._fail_flights(error)
                raise

    def _refusal(self) -> DtlabError:
        why = self.broken or "closed"
        return DtlabError(
            f"shared-memory ring: this wire can no longer be used ({why})", f"共享内存环：这个通道已不能再用（{why}）"
        )

    def close(self) -> None:
        """Close the pipes, once (a number closed twice could by then be another file's). A thread
        still waiting on them gives up when it next wakes (a neighbour's message, or its timeout)."""
        self._close()


def _close_all_of(fds: tuple[int, ...]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class _Work:
    """What isend and irecv return: ``wait()`` until the wire's ``counter`` reaches ``number``."""

    def __init__(self, wire: SharedMemoryWire, counter: str, number: int):
        self.wire, self.counter, self.number = wire, counter, number

    def wait(self, timeout=None) -> bool:
        if timeout is not None and hasattr(timeout, "total_seconds"):
            timeout = timeout.total_seconds()
        self.wire.wait_for(self.counter, self.number, timeout)
        return True

    def is_completed(self) -> bool:
        with self.wire._using():
            self.wire._progress()
            return getattr(self.wire, self.counter) >= self.number


def _bytes_of(slot: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The first bytes of ``slot`` (uint8) viewed as ``like``'s dtype, as many elements as ``like`` has."""
    return slot[: like.numel() * like.element_size()].view(like.dtype)


def _signal(fd: int, peer: int) -> None:
    try:
        os.write(fd, b"\0")
    except BrokenPipeError:
        raise _ended(peer) from None


def _credit(fd: int, peer: int) -> None:
    """Free a slot of the sender's: tell it so, unless it has already finished and closed (it needs no
    more room)."""
    try:
        _signal(fd, peer)
    except DtlabError:
        pass


def _ended(peer: int) -> DtlabError:
    return DtlabError(
        f"shared-memory ring: rank {peer} has ended (its pipe closed)",
        f"共享内存环：rank {peer} 已经结束（它的管道已关闭）",
    )


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
