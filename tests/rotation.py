"""Which slow end-to-end checks CI runs today: a rotation by date, each group once every len(ROTATION) days.

Shared by tests/test_exercises.py (the answer-filled lesson runs) and tests/test_binder.py (the fresh
Binder environment, a day of its own).
"""

from __future__ import annotations

import datetime
import os

import pytest

END_TO_END = ("00", "01", "04", "06", "08", "03", "13")
"""The lessons CI runs end to end with their answers filled in: the six with a code exercise (the ring, a
ZeRO shard, a parallel MLP, 1F1B, the loss scale, the attention scores' bytes) and the first lesson. What the others would add is
already checked: every lesson's answer key against its stored measurements (above; nbval keeps those
equal to a fresh run) and every exercise's reference graded on real ranks (test_exercises_graded_on_real_ranks).
DTLAB_EVERY_LESSON=1 runs every one of the eighteen (do that before a course ships)."""
NO_CLUSTER = "16-no-cluster"
"""Lesson 16 again as a learner without namespace nodes sees it (the test below), a run of its own."""
BINDER = "binder"
"""tests/test_binder.py's fresh Binder environment (about 70 s), a day of the rotation on its own."""
ROTATION = (("01",), (NO_CLUSTER, "03"), ("00", "06"), ("04", "08", "13"), (BINDER,))
"""Each lesson's slow path runs once per CI run, under nbval; the answer-filled runs repeat it, so CI runs
a fifth of them each day (groups of about equal time: lesson 01's alone is the longest), the fifth chosen
by the date, every one within five days, and skips the others saying when they run; the fifth day builds
the Binder environment instead (tests/test_binder.py), which repeats lesson 00's nbval run in it, so
that no day pays for both. DTLAB_EVERY_LESSON=1 runs them all."""


def _todays_share(today: datetime.date) -> tuple[str, ...]:
    return ROTATION[today.toordinal() % len(ROTATION)]


def skip_unless_today(key: str) -> None:
    today = _todays_share(datetime.date.today())
    if os.environ.get("DTLAB_EVERY_LESSON") != "1" and key not in today:
        pytest.skip(f"runs end to end on another day (today: {', '.join(today)}; DTLAB_EVERY_LESSON=1 runs all)")
