"""How a run on the pool fails, as the caller sees it: each error names the rank(s) to blame.

A rank that raises is reported with its own traceback (:class:`RankError`);
a collective that some peer never joined, with the rank that stopped and the
ranks left waiting for it (:class:`CollectiveTimeout`, or :class:`RunTimeout`
when no rank reported anything); a group that never formed (:class:`GroupNotFormed`); a
process that vanished, with its exit code or the signal that ended it (:class:`RankDied`).
Every message is in English and Simplified Chinese. A traceback shown to a learner keeps the Python
frames and drops the C++ frames torch appends to its errors.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import sys

from dtlab.i18n import DtlabError

WORKER_NAME = "dtlab-rank-"
"""Pooled workers are named ``dtlab-rank-0``, ``dtlab-rank-1``, ...: how a process knows it is one."""
EXIT_NO_MAIN_GUARD = 86
"""Exit code of a worker that found itself starting a run while importing the user's script."""


class RankError(DtlabError, RuntimeError):
    """A rank raised: carries the rank and its traceback, as printed inside that rank."""

    def __init__(self, rank: int, tb: str, unfinished: list[int]):
        self.rank, self.traceback, self.unfinished = rank, tb, unfinished
        cause, cause_zh = last_line(tb), last_line(tb, "zh")
        super().__init__(
            f"rank {rank} failed: {cause} (ranks still running when it did: {unfinished}); "
            f"its traceback:\n{python_frames(tb)}",
            f"rank {rank} 出错：{cause_zh}{_cause_zh(cause)}（当时仍在运行的 rank：{unfinished}）；它的回溯信息见上。",
        )


_CAUSES_ZH = {
    "No space left on device": "磁盘已满",
    "Read-only file system": "只读文件系统",
    "Permission denied": "没有权限",
    "Too many open files": "打开的文件过多",
    "Cannot allocate memory": "内存不足",
}


def _cause_zh(cause: str) -> str:
    return "".join(f"（{zh}）" for en, zh in _CAUSES_ZH.items() if en in cause)


class CollectiveTimeout(RankError):
    """Ranks gave up waiting inside a collective: ``culprits`` are the ranks that never came.

    A rank whose process is stopped (SIGSTOP, a debugger) is named as such;
    otherwise the culprits are the unfinished ranks that did not report a
    timeout themselves: they were somewhere else (a long computation, a
    different collective) while their peers waited.
    """

    def __init__(
        self,
        rank: int,
        tb: str,
        unfinished: list[int],
        timeout_s: float,
        culprits: list[int] | None = None,
        stopped: list[int] | None = None,
    ):
        self.rank, self.traceback, self.unfinished = rank, tb, unfinished
        self.stopped = sorted(stopped or [])
        self.culprits = sorted(culprits if culprits is not None else unfinished)
        waiting = sorted(set(unfinished + [rank]) - set(self.culprits))
        DtlabError.__init__(
            self,
            f"a collective timed out after {timeout_s:g} s: {_who_en(self.culprits, self.stopped)}"
            + (f", while {_ranks(waiting)} waited for it" if self.culprits or self.stopped else "")
            + f"; traceback of rank {rank}:\n{python_frames(tb)}",
            f"集合通信在 {timeout_s:g} 秒后超时：{_who_zh(self.culprits, self.stopped)}"
            + (f"，{_ranks(waiting)} 一直在等它" if self.culprits or self.stopped else ""),
        )


class GroupNotFormed(RankError):
    """The ranks never formed their process group (``init_process_group`` failed), even after retries.

    No user code ran. Under heavy load on a small machine gloo's rendezvous
    can time out; a bad backend fails at once: the cause says which.
    """

    def __init__(self, rank: int, tb: str, unfinished: list[int], world_size: int, attempts: int):
        self.rank, self.traceback, self.unfinished = rank, tb, unfinished
        cause = last_line(tb)
        busy = is_timeout(tb)
        DtlabError.__init__(
            self,
            f"the {world_size} ranks could not form their process group ({attempts} tries): {cause}"
            + (
                "; the machine may be too busy to start every rank in time: close what else is running and try again"
                if busy
                else ""
            )
            + f"; traceback of rank {rank}:\n{python_frames(tb)}",
            f"{world_size} 个 rank 未能组成进程组（尝试了 {attempts} 次）：{cause}"
            + ("；机器可能太忙，无法及时启动所有 rank：请关闭其他正在运行的程序后重试" if busy else ""),
        )


class RunTimeout(DtlabError, TimeoutError):
    """No rank made progress for longer than the run's timeout; ``culprits`` are the ranks to blame."""

    def __init__(self, seconds: float, stuck: list[int], stopped: list[int] | None = None):
        self.seconds, self.stuck = seconds, stuck
        self.stopped = sorted(stopped or [])
        self.culprits = self.stopped or stuck
        super().__init__(
            f"no progress for {seconds:.0f} s: {_who_en(self.culprits, self.stopped)} (unfinished: {stuck})",
            f"{seconds:.0f} 秒内没有任何进展：{_who_zh(self.culprits, self.stopped)}（尚未结束：{stuck}）",
        )


class RankDied(DtlabError, RuntimeError):
    """A worker process vanished (killed, out of memory, crashed in C++)."""

    def __init__(self, rank: int, exitcode: int | None):
        self.rank, self.exitcode = rank, exitcode
        if exitcode == EXIT_NO_MAIN_GUARD:
            en, zh = _NO_MAIN_GUARD
        elif exitcode is not None and exitcode < 0:
            name = _signal_name(-exitcode)
            en = f"rank {rank} was killed by signal {name} (exit code {exitcode})"
            zh = f"rank {rank} 被信号 {name} 终止（退出码 {exitcode}）"
        else:
            en = f"rank {rank} exited unexpectedly with exit code {exitcode}"
            zh = f"rank {rank} 意外退出，退出码 {exitcode}"
        super().__init__(en, zh)


_NO_MAIN_GUARD = (
    "the ranks could not start: each rank is a fresh Python process that imports your script "
    "again, and your script starts a run when it is imported. Put the code that starts runs "
    'under `if __name__ == "__main__":`',
    "rank 无法启动：每个 rank 都是一个新的 Python 进程，会重新导入你的脚本，而你的脚本在被导入时"
    '就会启动训练。请把启动训练的代码放到 `if __name__ == "__main__":` 之下',
)


def refuse_inside_a_worker() -> None:
    """Called before a pool starts processes: a pooled worker must never start ranks of its own.

    While a spawned worker imports the user's ``__main__`` script (to find the
    functions it will run), a script without a ``__main__`` guard would start
    a pool inside every worker. The worker exits with :data:`EXIT_NO_MAIN_GUARD`
    instead, which the caller reports as a hint (:class:`RankDied`).
    """
    process = mp.current_process()
    if not process.name.startswith(WORKER_NAME):
        return
    if getattr(process, "_inheriting", False):  # still importing the parent's __main__
        sys.stderr.flush()
        os._exit(EXIT_NO_MAIN_GUARD)  # not sys.exit: a fork server's child exits 1 on SystemExit
    raise DtlabError(
        "a function running on a rank cannot start a run of its own", "在 rank 上运行的函数不能再启动一次新的运行"
    )


def python_frames(tb: str) -> str:
    """``tb`` without the C++ stack torch appends to its errors ("Exception raised from ...")."""
    return re.sub(r"(?m)^Exception raised from .*\n(?:frame #\d+:.*\n?|\s*\n)*", "", tb)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _ranks(ranks: list[int]) -> str:
    """``rank 2`` or ``ranks 1, 3``: the same words in both languages' messages."""
    if not ranks:
        return "no rank"
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _who_en(culprits: list[int], stopped: list[int]) -> str:
    if stopped:
        return f"{_ranks(stopped)} stopped (the process is suspended: SIGSTOP or a debugger)"
    if not culprits:
        return (
            "every rank was in a collective or a send/receive, but their calls did not match "
            "(a send without its receive, or collectives issued in a different order)"
        )
    return f"{_ranks(culprits)} never joined it"


def _who_zh(culprits: list[int], stopped: list[int]) -> str:
    if stopped:
        return f"{_ranks(stopped)} 已停止（进程被挂起：SIGSTOP 或调试器）"
    if not culprits:
        return "每个 rank 都在集合通信或收发中，但它们的调用不匹配（有发送没有对应的接收，或各 rank 发起集合通信的顺序不同）"
    return f"{_ranks(culprits)} 没有加入"


_CJK = re.compile(r"[\u3400-\u9fff\uff00-\uffef]")
_HEADER = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*: ")
"""An exception's first line, ``module.Error: message`` (so a source line above a Chinese message is not one)."""


def last_line(tb: str, lang: str = "en") -> str:
    """The exception a traceback ends with (its last line, C++ frames left out).

    A dtlab error (:class:`dtlab.i18n.DtlabError`) ends in two lines, the
    English one and then the Chinese: ``lang`` picks which.
    """
    lines = [line.strip() for line in python_frames(tb).strip().splitlines()]
    if not lines:
        return ""
    if len(lines) > 1 and _CJK.search(lines[-1]) and _HEADER.match(lines[-2]) and not _CJK.search(lines[-2]):
        return lines[-1] if lang == "zh" else lines[-2]
    return lines[-1]


def is_timeout(tb: str) -> bool:
    """True if the exception the traceback ends with says a collective timed out."""
    line = last_line(tb).lower()
    return "timed out" in line or "timeout" in line
