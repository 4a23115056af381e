"""Collectives left in flight on a shared-memory wire: *weak progress*, as MPI has it.

Who moves an asynchronous collective's messages while the program computes?
Two answers, and real libraries use both:

* **strong progress**: a thread of the library's own (gloo's worker, NCCL's
  proxy thread, dtlab's ring worker in :mod:`dtlab.comm.ring_backend`) sleeps until a
  neighbour's message arrives and acts on it at once, whatever the program is
  doing; every call costs a hand-over to that thread and back;
* **weak progress**: nobody does, unless the program looks in. An MPI
  library moves a nonblocking operation on only inside MPI calls (the MPI
  standard's "progress rule"), so programs call ``MPI_Test`` now and then to
  keep it moving.

:class:`InFlight` is the second for :class:`dtlab.comm.shared_memory.SharedMemoryWire`.
A collective is written as *steps*: a generator that does what it can and
yields the pipe it must wait on (:meth:`SharedMemoryWire.put`,
:meth:`~SharedMemoryWire.take`, and the ring made of them,
:func:`dtlab.comm.ring_pipeline.ring_steps_in_slots`). :meth:`InFlight.run` runs
steps to the end now; :meth:`InFlight.start` begins them and returns at once,
and they move on whenever the wire is advanced (:meth:`InFlight.advance`,
which data parallelism's gradient hooks reach through
:func:`dtlab.comm.calls.progress`) or used by any thread, and finish in the
returned work's ``wait()``. Collectives in flight keep the order they were
started in, and anything else sent on the wire goes after them (messages are
matched by their order alone).

The rule that comes with it, as with MPI: a rank that leaves a collective in
flight must wait for it before it blocks on anything that its peers may do
only after waiting for theirs; otherwise each waits for the other until the
group's timeout. dtlab starts a collective in flight only where the caller
promises that (:func:`dtlab.comm.calls.all_reduce`'s ``caller_progresses``: data
parallelism's buckets, waited for in ``finish_gradient_sync`` right after
backward) or waits for it at once (a synchronous call).
"""

from __future__ import annotations

import select
import time
from collections import deque
from concurrent.futures import Future


class InFlight:
    """What :class:`dtlab.comm.shared_memory.SharedMemoryWire` adds for steps run now or left in flight.

    It uses the wire's ``lock``, ``timeout_s``, ``_using()`` (the lock, refusing a broken wire),
    ``_sleep_on(pipes, deadline, limit)`` (poll, the group's timeout) and ``_no_message_posted()``.
    """

    def __init__(self):
        self.flights: deque = deque()  # collectives started, in order, not finished
        self._advancing = False  # a step is running: advance() may not re-enter

    def run(self, steps) -> None:
        """Run ``steps`` to the end, sleeping in ``poll`` on the pipe each waits on; after everything
        already in flight on this wire."""
        self._no_message_posted()
        with self._using():
            self._land()
            deadline = time.monotonic() + self.timeout_s
            for pipe in steps:
                self._sleep_on((pipe,), deadline, self.timeout_s)

    def start(self, steps) -> "Flight":
        """Begin ``steps`` behind whatever is in flight, and return at once (:class:`Flight`)."""
        self._no_message_posted()
        with self._using():
            flight = Flight(self, steps)
            self.flights.append(flight)
            self._advance()
            return flight

    def advance(self) -> None:
        """Move what is in flight on as far as it goes without waiting. Never blocks: if another thread
        holds the wire, that thread is moving them on; inside a step, it does nothing."""
        if not self.flights or self.broken or self._advancing or not self.lock.acquire(blocking=False):
            return
        try:
            with self._using():
                self._advance()
        finally:
            self.lock.release()

    def finish_flights(self) -> None:
        """Finish everything in flight (the group's timeout bounds the wait)."""
        with self._using():
            self._land()

    def _advance(self) -> None:
        if self._advancing:
            return
        self._advancing = True
        try:
            while self.flights:
                head = self.flights[0]
                try:
                    head.pipe = next(head.steps)
                    return
                except StopIteration:
                    self.flights.popleft()
                    head.future.set_result(None)
        finally:
            self._advancing = False

    def _land(self, last: "Flight | None" = None) -> None:
        """Finish what is in flight, up to ``last`` (default: all of it), sleeping on the pipe the first
        one waits on; the group's timeout bounds the wait. Called holding the lock."""
        last = last or (self.flights[-1] if self.flights else None)
        deadline = time.monotonic() + self.timeout_s
        while last is not None and not last.future.done():
            self._advance()
            if not last.future.done():
                self._sleep_on((self.flights[0].pipe,), deadline, self.timeout_s)

    def _fail_flights(self, error: BaseException) -> None:
        """The wire broke: nothing in flight can finish; each one's ``wait()`` raises ``error``."""
        while self.flights:
            self.flights.popleft().future.set_exception(error)


class Flight:
    """A collective begun by :meth:`InFlight.start`: ``wait()`` finishes it, and all begun before it."""

    def __init__(self, wire: InFlight, steps):
        self.wire, self.steps, self.pipe = wire, steps, None
        self.future: Future = Future()
        self.future.set_running_or_notify_cancel()  # it runs already: it cannot be cancelled

    def wait(self, timeout=None) -> bool:
        """Finish it, sleeping in ``poll`` between steps; raises what broke it. ``timeout`` (seconds or a
        ``timedelta``), as torch's ``Work.wait``: past it, ``TimeoutError``, and the call stays in flight
        (the group's timeout still bounds it)."""
        if timeout is not None and hasattr(timeout, "total_seconds"):
            timeout = timeout.total_seconds()
        if timeout is None and not self.future.done():
            with self.wire._using():
                self.wire._land(self)
        elif not self.future.done():
            self._wait_at_most(timeout)
        self.future.result(0)
        return True

    def _wait_at_most(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.wire.advance()
            left = deadline - time.monotonic()
            if self.future.done():
                return
            if left <= 0:
                raise TimeoutError(f"the all-reduce in flight did not finish within {timeout:g} s")
            try:
                pipe = self.wire.flights[0].pipe
            except IndexError:  # finished meanwhile by another thread
                pipe = None
            if pipe is None:
                time.sleep(min(left, 0.001))  # another thread holds the wire and is moving it on
            else:
                poll = select.poll()
                poll.register(pipe, select.POLLIN)
                poll.poll(max(1, min(round(left * 1e3), 50)))

    def is_completed(self) -> bool:
        self.wire.advance()
        return self.future.done()

    def get_future(self) -> Future:
        """Done when the last step has run (the tracer's 'finished' time)."""
        return self.future
