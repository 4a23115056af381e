"""A small box to type a numeric prediction into, instead of writing it in code.

``prediction_box("03.stage1_bytes")`` shows the prediction's name and the
form of its answer; what is typed there (``1024``, ``3e6``, ``1,024``,
``0.75``, or a word) is what ``check("03.stage1_bytes", None, measured)`` compares
when the code cell's prediction is still ``None``. A value written in code wins.
"""

from __future__ import annotations

import ipywidgets as widgets

from dtlab.course.exercises.predictions import TYPED
from dtlab.course.exercises.registry import prediction
from dtlab.i18n import get_language


def parse(text: str):
    """'1,024' -> 1024, '3e6' -> 3000000.0, '0.75' -> 0.75, '' -> None, anything else stays a word."""
    text = text.strip().replace(",", "").replace("_", "")
    if not text:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def prediction_box(key: str) -> widgets.Text:
    """A text box bound to the prediction ``key`` of the answer key (typed values go to ``check``)."""
    entry = prediction(key)
    zh = get_language() == "zh"
    name = key if entry is None else (entry.name_zh if zh else entry.name_en)
    hint = "" if entry is None else (entry.hint_zh if zh else entry.hint_en)
    box = widgets.Text(
        value="",
        placeholder=hint or "…",
        description=name,
        style={"description_width": "initial"},
        layout=widgets.Layout(width="32em"),
    )

    def typed(change) -> None:
        value = parse(change["new"])
        if value is None:
            TYPED.pop(key, None)
        else:
            TYPED[key] = value

    TYPED.pop(key, None)  # a new, empty box: nothing typed yet
    box.observe(typed, names="value")
    return box
