"""Judge a prediction against a measurement, and say in both languages why it is off.

:func:`judge` is pure: it takes the learner's prediction (``None`` while
the cell is still empty), the measurement, and the lesson's
:class:`~dtlab.course.exercises.model.Prediction` entry, and returns a
:class:`Verdict` whose lines the lab prints (``dtlab.lab.check``). The
tolerance is stated in the verdict, so a learner knows what "right" meant.

Why a wrong prediction is wrong, in this order: a *common mistake* the lesson
lists (``Mistake(3 * psi, "you predicted 3Ψ: stage 1 reduce-scatters, so
2Ψ", ...)``), else the gap itself (a ratio for numbers, "expected … got …"
for layouts and words) with the entry's one-line ``why``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from dtlab.course.exercises.model import MEASURED, Prediction

FILL_ENV = "DTLAB_FILL_PREDICTIONS"
"""Set to 1, an empty prediction is filled from the answer key (the test that every lesson's
answers agree with its measurements runs the lessons this way)."""


TYPED: dict[str, Any] = {}
"""Predictions typed into a prediction box in this kernel, by key (``dtlab.lab.prediction_box``)."""


def filling() -> bool:
    return os.environ.get(FILL_ENV, "") not in ("", "0")


@dataclass(frozen=True)
class Verdict:
    status: str
    """``"none"`` (no prediction yet), ``"right"`` or ``"wrong"``."""
    en: tuple[str, ...]
    zh: tuple[str, ...]
    predicted: Any = None
    filled: bool = False
    """The prediction came from the answer key (:data:`FILL_ENV`), not from the learner."""

    @property
    def right(self) -> bool:
        return self.status == "right"


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


QUOTES = "\"'“”‘’「」"
"""Quotation marks a typed word may come wrapped in (a Chinese keyboard types “ ” and 「 」)."""


def word(text: str) -> str:
    """A typed word as it is compared: without surrounding spaces or quotation marks, lower case."""
    return text.strip().strip(QUOTES).strip().lower()


def in_english(entry: Prediction, predicted):
    """``predicted`` with a Chinese word the entry lists (``words_zh``) replaced by its English option."""
    if isinstance(predicted, str):
        return dict(entry.words_zh).get(word(predicted), predicted)
    return predicted


def agrees(predicted, measured, rel_tol: float = 0.0) -> bool:
    """Numbers within ``rel_tol`` (relative), containers element by element, anything else equal."""
    if _number(predicted) and _number(measured):
        return math.isclose(predicted, measured, rel_tol=rel_tol, abs_tol=0.0)
    if isinstance(predicted, str) and isinstance(measured, str):
        return word(predicted) == word(measured)
    if isinstance(predicted, (list, tuple)) and isinstance(measured, (list, tuple)):
        return len(predicted) == len(measured) and all(agrees(p, m, rel_tol) for p, m in zip(predicted, measured))
    if isinstance(predicted, dict) and isinstance(measured, dict):
        return predicted.keys() == measured.keys() and all(
            agrees(predicted[k], measured[k], rel_tol) for k in predicted
        )
    return predicted == measured


def tolerance_text(rel_tol: float) -> tuple[str, str]:
    if rel_tol == 0:
        return "exact", "须完全一致"
    return f"within {rel_tol:.0%}", f"误差 {rel_tol:.0%} 以内"


def _gap(predicted, measured) -> tuple[str, str]:
    """The size of the miss, in words."""
    if _number(predicted) and _number(measured) and measured != 0 and predicted != 0:
        ratio = predicted / measured
        if ratio >= 1:
            return f"your prediction is {ratio:.3g}x the measurement", f"你的预测是实测值的 {ratio:.3g} 倍"
        return (f"your prediction is 1/{1 / ratio:.3g} of the measurement", f"你的预测只有实测值的 1/{1 / ratio:.3g}")
    if _number(predicted) != _number(measured) or type(predicted) is not type(measured):
        return (
            f"the measurement is a {type(measured).__name__}, your prediction a {type(predicted).__name__}",
            f"实测值的类型是 {type(measured).__name__}，你的预测是 {type(predicted).__name__}",
        )
    return f"expected {measured!r}, got {predicted!r}", f"应为 {measured!r}，你写的是 {predicted!r}"


def judge(entry: Prediction, predicted, measured, *, source: tuple[str, str] = ("measured", "实测")) -> Verdict:
    """The verdict on ``predicted`` for ``entry``, given what was ``measured``.

    ``source`` is the (English, Chinese) word printed beside the value: "measured"
    only for a run's result (:data:`dtlab.lab.checks.SOURCES`)."""
    src_en, src_zh = source
    filled = False
    if predicted is None and filling():
        predicted, filled = (measured if entry.answer is MEASURED else entry.answer), True
    tol_en, tol_zh = tolerance_text(entry.rel_tol)
    if predicted is None:
        en = [f"· {entry.name_en}: no prediction yet: write yours and re-run; {src_en} {measured}"]
        zh = [f"· {entry.name_zh}：还没有预测：写下你的预测后重新运行；{src_zh} {measured}"]
        if entry.hint_en:
            en.append(f"  (form of the answer: {entry.hint_en})")
            zh.append(f"  （答案形式：{entry.hint_zh}）")
        return Verdict("none", tuple(en), tuple(zh))
    typed, predicted = predicted, in_english(entry, predicted)
    # a Chinese word is shown as written, with the option it was read as
    shown_en, shown_zh = (
        (predicted, predicted) if typed is predicted else (f"{typed} ({predicted})", f"{typed}（{predicted}）")
    )
    if agrees(predicted, measured, entry.rel_tol):
        return Verdict(
            "right",
            (f"✓ {entry.name_en}: predicted {shown_en}, {src_en} {measured} ({tol_en})",),
            (f"✓ {entry.name_zh}：预测 {shown_zh}，{src_zh} {measured}（{tol_zh}）",),
            predicted,
            filled,
        )
    en = [f"✗ {entry.name_en}: predicted {shown_en}, {src_en} {measured} ({tol_en})"]
    zh = [f"✗ {entry.name_zh}：预测 {shown_zh}，{src_zh} {measured}（{tol_zh}）"]
    mistake = next((m for m in entry.mistakes if agrees(predicted, m.value, entry.rel_tol)), None)
    if mistake is not None:
        en.append(f"  {mistake.en}")
        zh.append(f"  {mistake.zh}")
    else:
        gap_en, gap_zh = _gap(predicted, measured)
        en.append(f"  {gap_en}" + (f". {entry.why_en}" if entry.why_en else ""))
        zh.append(f"  {gap_zh}" + (f"。{entry.why_zh}" if entry.why_zh else ""))
    return Verdict("wrong", tuple(en), tuple(zh), predicted, filled)


def free_entry(name: str, name_zh: str | None, rel_tol: float, lesson: int = -1) -> Prediction:
    """An entry for a check the answer key does not list (no answer to fill in, no mistakes)."""
    return Prediction(key=name, lesson=lesson, name_en=name, name_zh=name_zh or name, answer=None, rel_tol=rel_tol)
