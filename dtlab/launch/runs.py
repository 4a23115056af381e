"""One run on the pool, as the caller sees it: its records, its progress, how it fails.

A :class:`Run` keeps to its own state (which ranks joined and finished, the
records received, when it last heard from a rank, whether a failed start may
be retried) and asks its pool (``dtlab/launch/pool.py``) for everything about
processes through the pool's public methods: ``receive``, ``submit``,
``restart``, ``exitcode``, ``is_ready``, ``request_stop``, ``shutdown``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Iterator, Protocol

from dtlab.launch.errors import CollectiveTimeout, GroupNotFormed, RankDied, RankError, RunTimeout, is_timeout
from dtlab.launch.worker import Job, Message

STARTUP_TIMEOUT_S = 180.0
"""How long a cold worker may take to import torch (generous: a loaded 2-core box is slow)."""
START_RETRIES = 2
"""How often a run whose process group failed to form is tried again (twice: under heavy load on 2 cores
a retry has failed to form too, a gloo rendezvous 'Wait timeout')."""
REJOIN_GRACE_S = 60.0
"""After one rank fails to join, how long its peers have to report back before the workers are replaced.

A failed join leaves a worker healthy and idle, so the retry reuses it (no
start-up paid); only a worker that does not come back is replaced."""
TIMEOUT_GRACE_S = 3.0
"""After one rank reports a collective timeout, how long to wait for its peers' reports.

Ranks that entered the collective together time out together; a rank that
reports nothing in this time never joined it, and is the one to blame."""


class Workers(Protocol):
    """What a run asks of its pool; :class:`dtlab.launch.pool.RankPool` provides it."""

    def receive(self, timeout: float) -> Message | None: ...
    def submit(self, run_id: str, job: Job) -> None: ...
    def restart(self, n: int) -> None: ...
    def release(self, run_id: str) -> None: ...
    def exitcode(self, rank: int) -> int | None: ...
    def is_stopped(self, rank: int) -> bool: ...
    def is_ready(self, rank: int) -> bool: ...
    def request_stop(self, run_id: str) -> None: ...
    def shutdown(self) -> None: ...


class Run:
    """One job on the pool. Iterate it to receive records as ranks emit them.

    ``for record in run: ...`` yields each emitted record as soon as it
    arrives; :meth:`wait` returns every rank's return value. Any failure raises
    (:class:`RankError`, :class:`RunTimeout`, :class:`RankDied`) after every
    worker has been ended. ``KeyboardInterrupt`` ends every worker too.
    """

    def __init__(self, pool: Workers, job: Job):
        self.pool, self.job = pool, job
        self.world_size, self.timeout_s = job.world_size, job.timeout_s
        self.run_id = uuid.uuid4().hex[:12]
        self.results: list[Any] = [None] * job.world_size
        self.records: list[Any] = []
        self.started_at = time.monotonic()
        self.first_record_s: float | None = None
        self._joined: set[int] = set()  # ranks whose process group formed
        self._done: set[int] = set()
        self._retries_left = START_RETRIES
        self.rejoins = 0
        """How often this run's group failed to form and was tried again on the same workers."""
        self._last_progress = time.monotonic()
        self._finished = False
        self._error: BaseException | None = None

    @property
    def finished(self) -> bool:
        return self._finished

    def __iter__(self) -> Iterator[Any]:
        try:
            while not self._finished:
                message = self.pool.receive(timeout=0.1)
                if message is None:
                    self._check_health()
                    continue
                record = self._handle(message)
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
        if not self._finished:
            self.pool.request_stop(self.run_id)

    def cancel(self) -> None:
        """End the run now by ending every worker (the only safe way out of a collective)."""
        if not self._finished:
            self._fail(KeyboardInterrupt("cancelled"))

    def abandon(self) -> None:
        """The pool ended its workers under this run: it ends here, with what it received."""
        self._finished = True

    # -- one message at a time
    def _handle(self, message: Message) -> Any:
        """Account for one message; return the record it carries, if any. Raises on failure."""
        kind, run_id, rank, payload = message
        if kind != "ready" and run_id != self.run_id:
            return None  # a message from an earlier, abandoned run
        self._last_progress = time.monotonic()
        if kind == "started":
            self._joined.add(rank)
        elif kind == "record":
            if self.first_record_s is None:
                self.first_record_s = time.monotonic() - self.started_at
            self.records.append(payload)
            return payload
        elif kind == "done":
            self.results[rank] = payload
            self._done.add(rank)
            if len(self._done) == self.world_size:
                self._finished = True
                self.pool.release(self.run_id)
        elif kind == "error":
            self._on_error(rank, payload)
        return None

    def _on_error(self, rank: int, tb: str) -> None:
        # A rank that died outright makes its peers' collectives fail with
        # "connection closed": blame the dead one, not the messenger.
        time.sleep(0.2)
        self._check_health()
        if self._retries_left > 0 and self._failed_joining(rank, tb):
            # The group never formed (seen under heavy load: a peer's socket reset while
            # gloo connected the mesh). No user code ran, so try once more: on the same
            # workers once every rank is back, on fresh ones if one is not.
            self._retries_left -= 1
            if self._peers_back(rank):
                self.rejoins += 1
                self.pool.release(self.run_id)
            else:
                self.pool.restart(self.world_size)
            self.run_id = uuid.uuid4().hex[:12]
            self._joined, self._last_progress = set(), time.monotonic()
            self.pool.submit(self.run_id, self.job)
            return
        others = [r for r in self._unfinished() if r != rank]
        if self._failed_joining(rank, tb):  # and no retry is left: the branch above returned
            error: RankError = GroupNotFormed(rank, tb, others, self.world_size, attempts=START_RETRIES + 1)
        elif is_timeout(tb):
            waited = self._timed_out_peers(rank)
            stopped = [r for r in self._unfinished() if self.pool.is_stopped(r)]
            culprits = stopped or [r for r in self._unfinished() if r not in waited]
            error = CollectiveTimeout(rank, tb, others, self.timeout_s, culprits=culprits, stopped=stopped)
        else:
            error = RankError(rank, tb, others)
        self._fail(error)
        raise error

    def _timed_out_peers(self, first: int) -> set[int]:
        """The ranks that report a collective timeout within the grace period (``first`` did already)."""
        waited = {first}
        deadline = time.monotonic() + TIMEOUT_GRACE_S
        while time.monotonic() < deadline:
            silent = [r for r in self._unfinished() if r not in waited and not self.pool.is_stopped(r)]
            if not silent:
                break
            message = self.pool.receive(timeout=0.1)
            if message is not None and message.run_id == self.run_id and message.kind == "error":
                waited.add(message.rank)
        return waited

    def _peers_back(self, failed: int) -> bool:
        """Wait (at most ``REJOIN_GRACE_S``) until every rank but ``failed`` has ended this attempt.

        A rank that joined before the mesh broke ends too: its first collective
        (or its job, if it has none) finishes one way or the other. Its records
        and result belong to the abandoned attempt and are dropped.
        """
        pending = set(self._unfinished()) - {failed}
        deadline = time.monotonic() + max(REJOIN_GRACE_S, self.timeout_s + 5.0)  # a peer's own join may time out
        while pending and time.monotonic() < deadline:
            message = self.pool.receive(timeout=0.1)
            if message is None:
                if any(self.pool.exitcode(r) is not None for r in pending):
                    return False
                continue
            if message.run_id == self.run_id and message.kind in ("error", "done"):
                pending.discard(message.rank)
        return not pending

    def _failed_joining(self, rank: int, tb: str) -> bool:
        """``rank`` failed while joining (the worker's ``_join_group``): the group never formed, no user code ran."""
        return not self.records and rank not in self._joined and "_join_group" in tb

    def _check_health(self) -> None:
        for rank in self._unfinished():
            exitcode = self.pool.exitcode(rank)
            if exitcode is not None:
                error = RankDied(rank, exitcode)
                self._fail(error)
                raise error
        # A cold pool is still importing torch: that is start-up, not a hang.
        warming = len(self._joined) < self.world_size and not all(self.pool.is_ready(r) for r in range(self.world_size))
        limit = STARTUP_TIMEOUT_S if warming else self.timeout_s + 5.0
        if time.monotonic() - self._last_progress > limit:
            error = RunTimeout(
                limit, self._unfinished(), stopped=[r for r in self._unfinished() if self.pool.is_stopped(r)]
            )
            self._fail(error)
            raise error

    def _fail(self, exc: BaseException) -> None:
        if not self._finished:
            self._finished = True
            self._error = exc
            self.pool.shutdown()

    def _unfinished(self) -> list[int]:
        return sorted(set(range(self.world_size)) - self._done)
