"""The rank side of grading: compile the learner's source on the rank, say what differs.

A function defined in a notebook cell cannot be pickled to a spawned rank (it
lives in the kernel's ``__main__``), so the grader sends its *source*, and
each rank compiles it with :func:`learner_function` in a namespace holding
``torch``, ``dist`` (``torch.distributed``), ``math``, ``os`` and whatever the
exercise adds. An exercise's check then runs it beside dtlab's own component
and reports the first difference with :func:`difference`.

A check returns :func:`verdict`'s dict. Whatever the learner's code does, a
check must run the same collectives on every rank (using dtlab's component
in place of a function that raised), so no rank is left waiting.
"""

from __future__ import annotations

import inspect
import linecache
import math
import os
from collections import Counter

import torch
import torch.distributed as dist

from dtlab.course.exercises.hints import factor_hint, with_hint
from dtlab.course.exercises.model import NOT_DONE
from dtlab.i18n import DtlabError


class NotDone(Exception):
    """The learner's function is still the stub."""


CURRENT_NAMES = {"reduce_scatter_single": "reduce_scatter_tensor", "all_gather_single": "all_gather_into_tensor"}
"""torch 2.13's names for the single-tensor collectives, and the older names they replace (which now warn)."""


def current_dist():
    """``torch.distributed``, with the current collective names on a torch that predates them.

    A learner writes ``dist.reduce_scatter_single`` whatever the installed torch (dtlab supports
    2.6 on): the names of :data:`CURRENT_NAMES` fall back to the older ones there.
    """
    return dist if all(hasattr(dist, new) for new in CURRENT_NAMES) else _WithCurrentNames()


class _WithCurrentNames:
    """``torch.distributed`` before 2.13, answering the current names with the older functions."""

    def __getattr__(self, name: str):
        return getattr(dist, CURRENT_NAMES.get(name, name))


def learner_function(source: str, name: str, **extra):
    """Compile ``source`` and return its function ``name``; the namespace also holds ``extra``.

    The source is registered with :mod:`linecache` so that a traceback through the learner's
    code shows their lines (a hang names the line it waited on).
    """
    namespace = {"torch": torch, "dist": current_dist(), "math": math, "os": os, **extra}
    filename = f"<your {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    if not callable(namespace.get(name)):
        raise NameError(f"the cell defines no function {name!r}")
    return namespace[name]


def does_not_compile(error: Exception) -> tuple[str, str]:
    """The problem of a cell that does not compile, or defines no function of the exercise's name."""
    return f"the cell does not compile: {error}", f"单元格无法编译：{error}"


def compiled(source: str, name: str, **extra):
    """``(function, None)``, or ``(None, problem)`` when the cell does not compile (:func:`learner_function`)."""
    try:
        return learner_function(source, name, **extra), None
    except Exception as error:  # the learner's cell: report it, keep this rank in step
        return None, does_not_compile(error)


def any_rank_stops(problem: tuple[str, str] | None) -> bool:
    """Whether any rank found a problem at this step: a vote over the world, so every rank stops at the same step."""
    vote = torch.tensor([0.0 if problem is None else 1.0])
    dist.all_reduce(vote, op=dist.ReduceOp.MAX)
    return vote.item() > 0


def call(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, or the problem it caused as an (en, zh) pair in place of a result.

    Returns ``(result, None)`` or ``(None, problem)``; ``NotImplementedError`` is "not done yet".
    """
    try:
        return fn(*args, **kwargs), None
    except NotImplementedError:
        raise NotDone() from None
    except Exception as error:  # the learner's code: report it, keep this rank in step
        if _timed_out(error):  # the group is broken: no rank can be kept in step, say where it hung
            raise Hang(error) from error
        return None, (
            f"your function raised {type(error).__name__}: {error}",
            f"你的函数抛出了 {type(error).__name__}：{error}",
        )


def _timed_out(error: Exception) -> bool:
    text = str(error).lower()
    return isinstance(error, (RuntimeError, TimeoutError)) and ("timed out" in text or "timeout" in text)


class Hang(DtlabError, TimeoutError):
    """The learner's code waited past the timeout in a send, a receive or a collective: where, on which rank.

    Raised (not returned) by :func:`call`: a timed-out gloo pair is closed, so the run ends here, and the
    caller shows this rank's traceback through the learner's lines
    (:func:`dtlab.course.exercises.grader.grade_source`).
    """

    def __init__(self, error: Exception):
        frames = _learner_frames(error.__traceback__)
        rank = dist.get_rank() if dist.is_initialized() else 0
        if frames:
            filename, lineno, fn_name = frames[-1]
            line = linecache.getline(filename, lineno).strip()
            where_en = f"at line {lineno} of {fn_name}, `{line}`"
            where_zh = f"{fn_name} 的第 {lineno} 行 `{line}`"
        else:
            line, where_en, where_zh = "", "in a call", "某个调用"
        p2p = any(word in line for word in ("send", "recv"))
        why_en = (
            "a blocking send returns only once the peer has posted its receive, so if every rank sends first, "
            "all wait: post the receive first (dist.irecv, then wait), or let even ranks send while odd ranks receive"
            if p2p
            else "a collective returns only once every rank of its group calls it: some rank skipped it, or "
            "called collectives in another order"
        )
        why_zh = (
            "阻塞的 send 要等对方挂上接收才返回，所以如果每个 rank 都先发送，大家就会一起等下去："
            "先挂上接收（dist.irecv，再 wait），或者让偶数 rank 先发、奇数 rank 先收"
            if p2p
            else "集合通信要等组内每个 rank 都调用了才返回：有的 rank 跳过了它，或者调用集合通信的顺序不同"
        )
        self.rank, self.line = rank, line
        super().__init__(
            f"rank {rank} timed out waiting {where_en}: {why_en}",
            f"rank {rank} 在 {where_zh} 处一直等到超时：{why_zh}",
        )


def _learner_frames(tb) -> list[tuple[str, int, str]]:
    """(filename, line, function) of each frame of the learner's source in a traceback, outermost first."""
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename.startswith("<your "):
            frames.append((code.co_filename, tb.tb_lineno, code.co_name))
        tb = tb.tb_next
    return frames


class CountingDist:
    """``torch.distributed`` as a learner's cell sees it: every call works, and collectives are counted.

    ``calls`` counts each collective by name (``all_reduce``, ``reduce_scatter_tensor``, ...), so a
    check can say "you all-reduced the whole gradient where a reduce-scatter does"; ``log`` keeps each
    call in order as (name, its arguments by parameter name), so a check can see which group and how
    many elements (lesson 16's cross-node traffic).
    """

    COLLECTIVES = frozenset(
        {
            "all_reduce",
            "reduce_scatter",
            "reduce_scatter_tensor",
            "reduce_scatter_single",
            "all_gather",
            "all_gather_into_tensor",
            "all_gather_single",
            "broadcast",
            "all_to_all",
            "all_to_all_single",
            "send",
            "recv",
            "isend",
            "irecv",
            "batch_isend_irecv",
            "barrier",
        }
    )

    def __init__(self):
        self.calls: Counter = Counter()
        self.log: list[tuple[str, dict]] = []

    def __getattr__(self, name: str):
        attr = getattr(current_dist(), name)
        if name not in self.COLLECTIVES:
            return attr

        def counted(*args, **kwargs):
            self.calls[name] += 1
            try:
                arguments = inspect.signature(attr).bind(*args, **kwargs).arguments
            except (TypeError, ValueError):  # torch will say what is wrong with the call
                arguments = kwargs
            self.log.append((name, dict(arguments)))
            return attr(*args, **kwargs)

        return counted


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.6g}"
    return repr(x)


def difference(
    what: str, what_zh: str, expected, got, *, atol: float = 1e-6, rtol: float = 1e-5, neighbours=()
) -> tuple[str, str] | None:
    """The first way ``got`` differs from ``expected`` (tensors, numbers, lists, tuples, dicts), or None.

    Names the element: ``what[3]``, ``what['lr']``, ``what[1][0]``, and, where the wrong number has a
    common shape (N or 2 times too big or too small, one off, a neighbouring step's value:
    :func:`~dtlab.course.exercises.hints.factor_hint`, ``neighbours`` as it takes them), says so.
    """
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return (
                f"{what}: expected a tensor, got {type(got).__name__}",
                f"{what_zh}：应为张量，得到的是 {type(got).__name__}",
            )
        if tuple(got.shape) != tuple(expected.shape):
            return (
                f"{what}: expected shape {tuple(expected.shape)}, got {tuple(got.shape)}",
                f"{what_zh}：形状应为 {tuple(expected.shape)}，得到的是 {tuple(got.shape)}",
            )
        close = torch.isclose(got.detach().double(), expected.detach().double(), rtol=rtol, atol=atol)
        if bool(close.all()):
            return None
        index = tuple(int(i) for i in (~close).nonzero()[0])
        e, g = expected[index].item(), got[index].item()
        where = ", ".join(map(str, index))
        return with_hint(
            (
                f"{what}[{where}]: expected {_fmt(e)}, got {_fmt(g)}",
                f"{what_zh}[{where}]：应为 {_fmt(e)}，得到的是 {_fmt(g)}",
            ),
            factor_hint(expected, got, neighbours=neighbours),
        )
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            n = len(got) if isinstance(got, (list, tuple)) else type(got).__name__
            return (
                f"{what}: expected {len(expected)} items, got {n}",
                f"{what_zh}：应有 {len(expected)} 项，得到的是 {n}",
            )
        for i, (e, g) in enumerate(zip(expected, got)):
            found = difference(f"{what}[{i}]", f"{what_zh}[{i}]", e, g, atol=atol, rtol=rtol)
            if found:
                return found
        return None
    if isinstance(expected, dict):
        if not isinstance(got, dict) or set(got) != set(expected):
            keys = sorted(got) if isinstance(got, dict) else type(got).__name__
            return (
                f"{what}: expected keys {sorted(expected)}, got {keys}",
                f"{what_zh}：键应为 {sorted(expected)}，得到的是 {keys}",
            )
        for k in expected:
            found = difference(f"{what}[{k!r}]", f"{what_zh}[{k!r}]", expected[k], got[k], atol=atol, rtol=rtol)
            if found:
                return found
        return None
    if isinstance(expected, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        if math.isclose(got, expected, rel_tol=rtol, abs_tol=atol):
            return None
    elif (
        got == expected
        and type(got) is type(expected)
        or (isinstance(expected, int) and isinstance(got, int) and got == expected)
    ):
        return None
    return with_hint(
        (
            f"{what}: expected {_fmt(expected)}, got {_fmt(got)}",
            f"{what_zh}：应为 {_fmt(expected)}，得到的是 {_fmt(got)}",
        ),
        factor_hint(expected, got, neighbours=neighbours),
    )


def verdict(rank: int, problem: tuple[str, str] | None = None, **extra) -> dict:
    """What a check returns: the rank, whether it passed, and what differs (en, zh) if not."""
    return {"rank": rank, "ok": problem is None, "problem": problem, **extra}


def not_done(rank: int, name: str) -> dict:
    return verdict(rank, (NOT_DONE[0].format(name=name), NOT_DONE[1].format(name=name)), not_done=True)
