"""How a run on the pool fails, as the caller sees it: each error names the rank(s) to blame.

A rank that raises is reported with its own traceback (:class:`RankError`);
a collective that some peer never joined, with the ranks that were still
waiting (:class:`CollectiveTimeout`, or :class:`RunTimeout` when no rank
reported anything); a process that vanished, with its exit code
(:class:`RankDied`). Every message is in English and Simplified Chinese.
"""
from __future__ import annotations

from dtlab.i18n import DtlabError


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


def rank_failure(rank: int, tb: str, unfinished: list[int], timeout_s: float) -> RankError:
    """The error for a rank that reported traceback ``tb``: a timeout if its last line says so."""
    last_line = tb.strip().splitlines()[-1].lower() if tb.strip() else ""
    if "timed out" in last_line or "timeout" in last_line:
        return CollectiveTimeout(rank, tb, unfinished, timeout_s)
    return RankError(rank, tb, unfinished)
