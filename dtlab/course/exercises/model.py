"""What a lesson asks of the learner, as data: a prediction with its answer, an exercise with its grader.

Nothing here runs anything. A lesson's module (``lessonNN.py`` beside this
one) lists its :class:`Prediction` and :class:`Exercise` entries; the registry
(:mod:`dtlab.course.exercises.registry`) collects them; the check
(:func:`dtlab.course.exercises.predictions.judge`) and the grader
(:mod:`dtlab.course.exercises.grader`) read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

NOT_DONE = (
    "not done yet: write the body of {name} (replace `raise NotImplementedError`) and re-run",
    "尚未完成：请写出 {name} 的函数体（替换 `raise NotImplementedError`），然后重新运行",
)
"""What the grader says of a stub, in English and Chinese."""

MEASURED = object()
"""An answer that is whatever this machine measures (a timing, an ordering of timings): the
check compares with the measurement, and the answer key has no fixed value to fill in."""


@dataclass(frozen=True)
class Mistake:
    """A wrong answer learners commonly give, and why it is wrong (both languages)."""

    value: Any
    """The wrong prediction (a number is matched within the prediction's tolerance)."""
    en: str
    zh: str


@dataclass(frozen=True)
class Prediction:
    """One prediction cell of a lesson: what is asked, the right answer, and how close is right."""

    key: str
    """The name the lesson's ``check(key, my_prediction, measured)`` uses, e.g. ``"03.stage1_bytes"``."""
    lesson: int
    name_en: str
    name_zh: str
    answer: Any
    """The right answer, worked out from the course's facts (not from a measurement); or
    :data:`MEASURED` where only this machine can say (timings)."""
    rel_tol: float = 0.0
    """A number within this relative distance of the measurement is right (0: exact)."""
    hint_en: str = ""
    """The units or form of the answer ("bytes, an integer"), shown while the cell is empty."""
    hint_zh: str = ""
    mistakes: tuple[Mistake, ...] = ()
    """Wrong answers keyed to their explanation; matched before the generic gap explanation."""
    why_en: str = ""
    """One sentence on how to get the answer, shown with a wrong prediction that matches no mistake."""
    why_zh: str = ""
    words_zh: tuple[tuple[str, str], ...] = ()
    """For a one-word answer: (Chinese word, the English option it means), so that ``"更低"`` is
    judged as ``"lower"`` (the hint in Chinese names both)."""


@dataclass(frozen=True)
class Exercise:
    """One code exercise: the learner writes ``function`` in a cell; ``check`` runs it on real ranks.

    ``check(ctx, source, name) -> dict`` is a module-level function of the
    package (spawned ranks look it up by name); it compiles ``source`` on the
    rank (:func:`dtlab.course.exercises.ranks.learner_function`), runs it
    against dtlab's own component and returns ``{"rank", "ok", "problem"}``
    with ``problem`` an ``(english, chinese)`` pair naming what differs (which
    rank, which element, expected vs got), or ``None``. Every rank must run the
    same collectives whatever its verdict, so none is left waiting.
    """

    key: str
    """e.g. ``"01.ring_step"``."""
    lesson: int
    title_en: str
    title_zh: str
    function: str
    """The name of the function the learner defines in the notebook."""
    check: Callable
    reference: Callable
    """dtlab's solution, with the learner's signature; its source must compile on its own
    in the exercise's namespace, since the grader ships it exactly as it ships the learner's."""
    world_size: int = 2
    timeout_s: float = 30.0
    """Seconds a collective may wait (a learner's ring that deadlocks ends after this)."""
