"""The course stays bilingual: every explanation, label and index entry in English and Chinese."""

import copy
import json

import dtlab.lab  # noqa: F401  (registers every label)
from dtlab.course import coverage
from dtlab.i18n import LABELS, set_language, t


def test_every_lesson_explains_in_both_languages():
    assert coverage.lesson_paths(), "no lessons found"
    for path in coverage.lesson_paths():
        notebook = json.loads(path.read_text(encoding="utf-8"))
        assert coverage.monolingual_cells(notebook) == [], path.name


def test_the_check_catches_a_lesson_that_loses_its_chinese():
    path = coverage.lesson_paths()[0]
    notebook = json.loads(path.read_text(encoding="utf-8"))
    broken = copy.deepcopy(notebook)
    first_md = next(i for i, c in enumerate(broken["cells"]) if c["cell_type"] == "markdown")
    source = "".join(broken["cells"][first_md]["source"])
    broken["cells"][first_md]["source"] = "".join(ch for ch in source if not coverage.CJK.match(ch))
    assert coverage.monolingual_cells(broken) == [first_md]


def test_every_label_and_title_has_both_languages():
    assert coverage.untranslated_labels() == []
    LABELS["test.only_english"] = {"en": "Only English words here", "zh": "Only English words here"}
    try:
        assert "test.only_english" in coverage.untranslated_labels()
    finally:
        del LABELS["test.only_english"]


def test_every_view_table_names_a_known_label():
    assert coverage.unknown_view_keys() == []


def test_views_take_their_labels_from_their_tables():
    from dtlab.lab.fit import wrap_title
    from dtlab.lab.offload_view import OffloadCost
    from dtlab.lab.planner_widget import PlannerExplorer
    from dtlab.lab.ring_view import RingView

    views = [RingView(), OffloadCost(), PlannerExplorer()]
    try:
        for lang in ("zh", "en"):
            set_language(lang)
            for view in views:
                for attr, key in view.labels.items():
                    assert getattr(view, attr).description == t(key, lang), (type(view).__name__, attr)
                for attr, spec in view.figures.items():
                    figure = getattr(view, attr)
                    assert figure.layout.title.text == wrap_title(t(spec.title, lang))  # wrapped to fit
                    assert [trace.name for trace in figure.data][: len(spec.traces)] == [
                        t(key, lang) for key in spec.traces
                    ]
    finally:
        set_language("en")


def test_set_language_switches_labels_everywhere():
    from dtlab.lab import Dashboard

    dash = Dashboard()
    try:
        set_language("zh")
        assert dash.loss.layout.title.text == t("loss.title", "zh") == "训练损失"
        assert dash.memory.data[0].name == "参数"
        set_language("en")
        assert dash.loss.layout.title.text == "Training loss"
    finally:
        set_language("en")


def test_readme_lists_every_lesson_in_both_languages():
    assert coverage.lessons_missing_from_readme() == []


def test_dtlab_lang_starts_a_kernel_in_the_language_it_names(monkeypatch):
    import pytest

    from dtlab.i18n import _starting_language

    monkeypatch.delenv("DTLAB_LANG", raising=False)
    assert _starting_language() == "en"
    monkeypatch.setenv("DTLAB_LANG", "zh")
    assert _starting_language() == "zh"
    monkeypatch.setenv("DTLAB_LANG", "fr")
    with pytest.warns(UserWarning, match=r"(?s)got 'fr'.*收到的是 'fr'"):
        assert _starting_language() == "en"
