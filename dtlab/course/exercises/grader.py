"""The caller side of grading: ship the learner's source to real ranks, print the verdict.

``grade("01.ring_step", ring_step)`` takes the function the learner wrote in
a notebook cell, reads its source, and runs the exercise's check on
``world_size`` ranks of the warm pool (:func:`dtlab.launch.run`): fast after
the first run. A function whose body is still ``raise NotImplementedError``
(the stub the stored notebook holds) is "not done yet" without starting
anything. In instructor mode (:data:`SOLUTIONS_ENV`, or ``dtlab lab
--solutions``) a stub is replaced by dtlab's reference solution, which is
printed, then graded the same way.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import textwrap

from dtlab.course.exercises import progress, registry
from dtlab.course.exercises.model import NOT_DONE, Exercise

SOLUTIONS_ENV = "DTLAB_SOLUTIONS"
"""Set to 1 (``dtlab lab --solutions`` does), the lessons show and grade the reference solutions."""


def solutions_shown() -> bool:
    return os.environ.get(SOLUTIONS_ENV, "") not in ("", "0")


def source_of(fn) -> str:
    """The source of a function, from a notebook cell or a file, unindented."""
    return textwrap.dedent(inspect.getsource(fn))


def is_stub(source: str) -> bool:
    """True if the (first) function in ``source`` only raises NotImplementedError (or is ``...``/``pass``)."""
    tree = ast.parse(source)
    fn = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if fn is None:
        return False
    body = (
        fn.body[1:]
        if (
            fn.body
            and isinstance(fn.body[0], ast.Expr)
            and isinstance(fn.body[0].value, ast.Constant)
            and isinstance(fn.body[0].value.value, str)
        )
        else fn.body
    )
    if not body:
        return True
    if len(body) != 1:
        return False
    stmt = body[0]
    if isinstance(stmt, ast.Pass) or (
        isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and stmt.value.value is Ellipsis
    ):
        return True
    if isinstance(stmt, ast.Raise) and stmt.exc is not None:
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
    return False


def grade_source(exercise: Exercise, source: str, name: str, *, pool=None) -> dict:
    """Run ``exercise``'s check on real ranks with ``source``; return the verdict as data.

    ``{"ok", "not_done", "en": [lines], "zh": [lines], "results": [per rank]}``. A run
    that hangs (a send with no receive) or crashes is reported, not raised.
    """
    from dtlab.launch import RankDied, RankError, RunTimeout, run

    if is_stub(source):
        results = [{"rank": None, "ok": False, "not_done": True, "problem": None}]
    else:
        try:
            results = run(exercise.check, exercise.world_size, source, name, timeout=exercise.timeout_s, pool=pool)
        except (RankError, RunTimeout, RankDied) as error:
            results = [{"rank": getattr(error, "rank", None), "ok": False, "problem": _not_finished(error)}]
    return _report(exercise, name, results)


def _not_finished(error) -> tuple[str, str]:
    """The problem of a run that hung or crashed: where the learner's code waited, with that rank's traceback."""
    from dtlab.launch.errors import last_line

    tb = getattr(error, "traceback", "") or ""
    if "ranks.Hang: " in tb:  # the learner's own call timed out (dtlab.course.exercises.ranks.Hang)
        frames = "".join(re.findall(r'(?m)^ *File "<your [^"]+", line \d+, in .+\n(?: {4,}.+\n)?', tb))
        return (
            f"{last_line(tb).split(': ', 1)[-1]}\n    traceback of rank {error.rank} (your lines):\n{textwrap.indent(frames, '    ').rstrip()}",
            f"{last_line(tb, 'zh')}（rank {error.rank} 的回溯见上方英文部分）",
        )
    return (
        f"the ranks did not finish: {error.en.splitlines()[0]} (a send without its receive, or a "
        "collective some ranks skip, leaves the others waiting)",
        f"各 rank 没有完成：{error.zh.splitlines()[0]}（只发送没有对应的接收，或者只有部分 rank "
        "调用了集合通信，其余 rank 就会一直等待）",
    )


def _report(exercise: Exercise, name: str, results: list[dict]) -> dict:
    title_en, title_zh = exercise.title_en, exercise.title_zh
    if any(r.get("not_done") for r in results):
        en = [f"· {title_en}: " + NOT_DONE[0].format(name=name)]
        zh = [f"· {title_zh}：" + NOT_DONE[1].format(name=name)]
        return {"ok": False, "not_done": True, "en": en, "zh": zh, "results": results}
    if all(r["ok"] for r in results):
        n = exercise.world_size
        return {
            "ok": True,
            "not_done": False,
            "results": results,
            "en": [f"✓ {title_en}: your {name} gives what dtlab's gives on {n} real rank{'s' if n > 1 else ''}"],
            "zh": [f"✓ {title_zh}：你的 {name} 在 {n} 个真实 rank 上与 dtlab 的结果一致"],
        }
    en, zh = [f"✗ {title_en}: not yet"], [f"✗ {title_zh}：还没有通过"]
    by_problem: dict[tuple, list] = {}  # the same message from several ranks, said once
    for r in results:
        if not r["ok"]:
            by_problem.setdefault(tuple(r["problem"]), []).append(r["rank"])
    for (problem_en, problem_zh), ranks in by_problem.items():
        ranks = [r for r in ranks if r is not None]
        label = "" if not ranks else ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
        en.append(f"  {label + ': ' if label else ''}{problem_en}")
        zh.append(f"  {label + '：' if label else ''}{problem_zh}")
    return {"ok": False, "not_done": False, "en": en, "zh": zh, "results": results}


def grade(key: str, fn, *, pool=None) -> bool:
    """Grade the learner's ``fn`` for exercise ``key`` on real ranks; print the verdict in both languages."""
    exercise = registry.exercise(key)
    source, name = source_of(fn), fn.__name__
    by_key = is_stub(source) and solutions_shown()
    if by_key:
        source, name = source_of(exercise.reference), exercise.reference.__name__
        print(
            "instructor mode: dtlab's solution, graded as a learner's would be / 教师模式：dtlab 的参考答案，"
            "按学生答案同样评分"
        )
        print(source)
    verdict = grade_source(exercise, source, name, pool=pool)
    for line in verdict["en"] + verdict["zh"]:
        print(line)
    if not (by_key or verdict["not_done"]):
        progress.record_exercise(key, exercise.lesson, passed=verdict["ok"])
    status = "not_done" if verdict["not_done"] else "right" if verdict["ok"] else "wrong"
    progress.log_verdict("exercise", key, exercise.lesson, status, by_key=by_key)
    return verdict["ok"]


def solution(key: str) -> None:
    """Print dtlab's solution to exercise ``key`` in instructor mode; otherwise say how to see it."""
    exercise = registry.exercise(key)
    if solutions_shown():
        print(source_of(exercise.reference))
    else:
        print("solutions are hidden: instructors start `dtlab lab --solutions` (or set DTLAB_SOLUTIONS=1)")
        print("参考答案已隐藏：教师可用 `dtlab lab --solutions` 启动（或设置 DTLAB_SOLUTIONS=1）")
