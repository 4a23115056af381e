"""Every lesson's predictions and exercises, found by key.

Each ``lessonNN`` module of this package lists ``PREDICTIONS`` and
``EXERCISES``; this module collects them once, and refuses two entries with
one key. A lesson added to the course adds its module to ``LESSON_MODULES``.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

from dtlab.course.exercises.model import Exercise, Prediction

LESSON_MODULES = (
    "lesson00",
    "lesson01",
    "lesson02",
    "lesson03",
    "lesson04",
    "lesson05",
    "lesson06",
    "lesson07",
    "lesson08",
    "lesson09",
    "lesson10",
    "lesson11",
    "lesson12",
    "lesson13",
    "lesson14",
    "lesson15",
    "lesson16",
    "lesson17",
)
"""Modules of ``dtlab.course.exercises`` that hold a lesson's answer key (a missing one is skipped)."""


@lru_cache(maxsize=None)
def _load() -> tuple[dict[str, Prediction], dict[str, Exercise]]:
    predictions: dict[str, Prediction] = {}
    exercises: dict[str, Exercise] = {}
    for name in LESSON_MODULES:
        try:
            module = importlib.import_module(f"dtlab.course.exercises.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"dtlab.course.exercises.{name}":
                raise
            continue
        for table, entries in (
            (predictions, getattr(module, "PREDICTIONS", ())),
            (exercises, getattr(module, "EXERCISES", ())),
        ):
            for entry in entries:
                if entry.key in table:
                    raise ValueError(f"two entries with the key {entry.key!r} ({name})")
                table[entry.key] = entry
    return predictions, exercises


def predictions() -> dict[str, Prediction]:
    return _load()[0]


def exercises() -> dict[str, Exercise]:
    return _load()[1]


def prediction(key: str) -> Prediction | None:
    """The answer-key entry of ``key``, or None if the answer key does not list it."""
    return predictions().get(key)


def exercise(key: str) -> Exercise:
    try:
        return exercises()[key]
    except KeyError:
        from dtlab.i18n import ConfigError

        raise ConfigError(
            f"no exercise {key!r}; there are: {', '.join(sorted(exercises()))}",
            f"没有名为 {key!r} 的练习；现有：{', '.join(sorted(exercises()))}",
        ) from None


def by_lesson() -> dict[int, tuple[list[Prediction], list[Exercise]]]:
    """Lesson number -> (its predictions, its exercises), in key order."""
    out: dict[int, tuple[list[Prediction], list[Exercise]]] = {}
    for entry in predictions().values():
        out.setdefault(entry.lesson, ([], []))[0].append(entry)
    for entry in exercises().values():
        out.setdefault(entry.lesson, ([], []))[1].append(entry)
    return dict(sorted(out.items()))
