"""What a wrong number most likely means: a factor of N, a factor of 2, or one step off.

A grader that says only "expected 2.25, got 9" leaves the learner to find
the 4 in it. The common slips in distributed code have a shape: a sum where
a mean is wanted is N times too big (N the world size), a mean taken twice
is N times too small, counting one direction of a ring (or forward without
backward) is half, and a loop or a schedule one step early or late gives the
value of the neighbouring step. :func:`factor_hint` recognises those shapes
in ``got`` against ``expected`` and names them, in English and Chinese;
:func:`~dtlab.course.exercises.ranks.difference` appends what it finds to the
element it reports.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def world_size() -> int:
    """The world size of this rank's default group, 1 outside a distributed run."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _scaled(expected, got, k: float, rtol: float) -> bool:
    """``got`` is ``k`` times ``expected`` wherever ``expected`` is not zero, and zero where it is."""
    if isinstance(expected, torch.Tensor):
        e, g = expected.detach().double().flatten(), got.detach().double().flatten()
        big = e.abs() > 1e-12
        if not bool(big.any()):
            return False
        return bool(torch.isclose(g, k * e, rtol=rtol, atol=1e-9).all())
    if expected == 0:
        return False
    return math.isclose(got, k * expected, rel_tol=rtol, abs_tol=1e-12)


def _factors(n: int) -> list[tuple[float, str, str]]:
    """(factor, English, Chinese) to try in order: the world size first, then 2."""
    found = []
    if n > 1:
        found += [
            (
                float(n),
                f"{n}× too big: did you forget to divide by the world size N = {n}?",
                f"大了 {n} 倍：是不是忘了除以 world size N = {n}？",
            ),
            (
                1.0 / n,
                f"{n}× too small: divided by the world size N = {n} once too often, or where a sum is wanted?",
                f"小了 {n} 倍：是不是多除了一次 world size N = {n}，或者这里要的其实是总和？",
            ),
        ]
    if n != 2:
        found += [
            (
                2.0,
                "2× too big: something counted twice (both directions of a link, or forward and backward)?",
                "大了 2 倍：是不是有东西算了两遍（链路的两个方向，或者前向加反向）？",
            ),
            (
                0.5,
                "half of it: a factor 2 missing (both directions of a link, or forward and backward)?",
                "只有一半：是不是漏了因子 2（链路的两个方向，或者前向加反向）？",
            ),
        ]
    return found


def factor_hint(expected, got, *, n: int | None = None, rtol: float = 1e-4, neighbours=()) -> tuple[str, str] | None:
    """Why ``got`` may differ from ``expected``, if it has one of the common shapes; else None.

    ``n`` is the world size (this rank's by default). ``neighbours`` holds
    ``(label_en, label_zh, value)`` for the values a step earlier and later:
    ``got`` equal to one of them is an off-by-one.
    """
    numbers = (int, float)
    tensors = isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor)
    if not tensors and not (
        isinstance(expected, numbers)
        and isinstance(got, numbers)
        and not isinstance(expected, bool)
        and not isinstance(got, bool)
    ):
        return None
    if tensors and (got.shape != expected.shape or got.is_complex() or not torch.isfinite(got).all()):
        return None
    if not tensors and not math.isfinite(got):
        return None
    for label_en, label_zh, value in neighbours:
        if value is not None and not _scaled(value, expected, 1.0, rtol) and _same(value, got, rtol):
            return (
                f"one step off: that is the value {label_en}",
                f"差了一步：这是{label_zh}的值",
            )
    for k, en, zh in _factors(n if n is not None else world_size()):
        if _scaled(expected, got, k, rtol):
            return en, zh
    if not tensors and float(got).is_integer() and float(expected).is_integer() and abs(got - expected) == 1:
        more = got > expected
        return (
            f"one {'more' if more else 'less'} than expected: an off-by-one "
            f"({'N where N - 1' if more else 'N - 1 where N'} is wanted, or a step {'counted twice' if more else 'missed'})?",
            f"比应有的{'多' if more else '少'} 1：差一错误"
            f"（{'该用 N - 1 却用了 N' if more else '该用 N 却用了 N - 1'}，或者{'多算' if more else '漏掉'}了一步）？",
        )
    return None


def _same(a, b, rtol: float) -> bool:
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return False
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and bool(torch.isclose(b.double(), a.double(), rtol=rtol, atol=1e-9).all())
    return math.isclose(b, a, rel_tol=rtol, abs_tol=1e-12)


def with_hint(problem: tuple[str, str], hint: tuple[str, str] | None) -> tuple[str, str]:
    """``problem`` with ``hint`` appended after a dash, in each language."""
    if hint is None:
        return problem
    return f"{problem[0]} — {hint[0]}", f"{problem[1]} —— {hint[1]}"
