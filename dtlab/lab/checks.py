"""Predict, then measure: the printed, deterministic check every lesson ends a step with."""

from __future__ import annotations

import math

from dtlab.course.exercises import predictions as _answers
from dtlab.course.exercises import progress as _progress
from dtlab.course.exercises import registry as _registry
from dtlab.i18n import ConfigError, t

SOURCES = {
    "measured": ("measured", "实测"),
    "formula": ("formula", "公式"),
    "planner": ("planner", "规划器"),
    "simulated": ("simulated", "模拟"),
    "glossary": ("glossary", "术语表"),
    "spec": ("spec", "规格"),
}
"""Where a checked value comes from, as printed beside it. Only a value taken from a
run on ranks is "measured"; a term looked up is "glossary"; a number format's defined
properties (``torch.finfo``: IEEE 754's fp16, bf16's layout) are "spec".
tests/test_honest_labels.py checks the lessons' calls."""


def check(
    name: str, predicted, measured, *, rel_tol: float = 0.0, name_zh: str | None = None, source: str = "measured"
) -> bool:
    """Print the prediction beside the measurement in both languages; return whether they agree.

    ``source`` says where ``measured`` comes from, and is printed beside it:
    ``"measured"`` (a run on ranks), ``"formula"``, ``"planner"``,
    ``"simulated"``, ``"glossary"`` or ``"spec"`` (:data:`SOURCES`).

    When ``name`` is a key of the course's answer key (``"03.stage1_bytes"``,
    :mod:`dtlab.course.exercises`), the entry sets the names, the tolerance
    (stated in the verdict) and the explanations of a wrong prediction, and
    the result goes to the learner's progress file; a prediction left
    ``None`` may have been typed into a :func:`dtlab.lab.prediction_box`.
    Otherwise numbers agree within ``rel_tol`` (relative) and anything else
    must be equal. A prediction left as ``None`` (the cell not filled in yet)
    prints the measurement and a reminder, and counts as not agreeing.
    """
    if source not in SOURCES:
        raise ConfigError(
            f"source={source!r}: allowed {', '.join(SOURCES)}", f"source={source!r}：允许的取值为 {'、'.join(SOURCES)}"
        )
    words = SOURCES[source]
    entry = _registry.prediction(name)
    if entry is not None:
        if predicted is None:
            predicted = _answers.TYPED.get(name)
        verdict = _answers.judge(entry, predicted, measured, source=words)
        for line in verdict.en + verdict.zh:
            print(line)
        if verdict.status != "none" and not verdict.filled:
            _progress.record_prediction(name, entry.lesson, right=verdict.right)
        _progress.log_verdict("prediction", name, entry.lesson, verdict.status, by_key=verdict.filled)
        return verdict.right
    if predicted is None:
        print(t("check.none", "en", name=name, measured=measured, source=words[0]))
        print(t("check.none", "zh", name=name_zh or name, measured=measured, source=words[1]))
        _progress.log_verdict("check", name, -1, "none", by_key=False)
        return False
    if isinstance(predicted, (int, float)) and isinstance(measured, (int, float)):
        ok = math.isclose(predicted, measured, rel_tol=rel_tol, abs_tol=0.0)
    else:
        ok = predicted == measured
    key = "check.pass" if ok else "check.fail"
    print(t(key, "en", name=name, predicted=predicted, measured=measured, source=words[0]))
    print(t(key, "zh", name=name_zh or name, predicted=predicted, measured=measured, source=words[1]))
    _progress.log_verdict("check", name, -1, "right" if ok else "wrong", by_key=False)
    return ok


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units, as memory is allocated)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
