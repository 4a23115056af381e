"""Checks that the course stays bilingual: lesson prose, labels and the README's index.

Used by the test suite; a teacher can run them too (``python -m dtlab.course.coverage``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from dtlab.i18n import LABELS

CJK = re.compile(r"[\u4e00-\u9fff]")
LATIN_WORDS = re.compile(r"[A-Za-z]{3,}(?:\s+[A-Za-z]{2,}){2,}")  # a run of three English words
REPO = Path(__file__).resolve().parents[2]


def lesson_paths(root: Path = REPO) -> list[Path]:
    return sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def monolingual_cells(notebook: dict) -> list[int]:
    """Indices of markdown cells that lack either English sentences or Chinese text."""
    bad = []
    for i, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if not CJK.search(text) or not LATIN_WORDS.search(text):
            bad.append(i)
    return bad


def load_all_labels() -> None:
    """Import every module of the lab and the glossary, so every label they register is in the catalogue."""
    import importlib
    import pkgutil

    import dtlab.course.glossary  # noqa: F401  (the glossary's own labels)
    import dtlab.lab

    for module in pkgutil.iter_modules(dtlab.lab.__path__):
        importlib.import_module(f"dtlab.lab.{module.name}")


def untranslated_labels() -> list[str]:
    """Label keys whose Chinese text is missing or has no Chinese in it (when the English has words)."""
    load_all_labels()
    bad = []
    for key, texts in LABELS.items():
        en, zh = texts.get("en", ""), texts.get("zh", "")
        if not zh or (re.search(r"[A-Za-z]{4,}", en) and not CJK.search(zh) and zh == en):
            bad.append(key)
    return bad


def unknown_view_keys() -> list[str]:
    """``"View: key"`` for each label key a lab view's tables name that the catalogue lacks."""
    load_all_labels()
    from dtlab.lab.view import View

    views, bad = [View], []
    while views:
        view = views.pop()
        views += view.__subclasses__()
        specs = view.__dict__.get("figures", {}).values()
        keys = [
            *view.__dict__.get("labels", {}).values(),
            *(key for spec in specs for key in (spec.title, spec.x, spec.y, *spec.traces) if key),
        ]
        bad += [f"{view.__name__}: {key}" for key in keys if key not in LABELS]
    return sorted(bad)


def lessons_missing_from_readme(root: Path = REPO) -> list[str]:
    """Lesson notebooks the README's index does not link, or lists without a Chinese title."""
    readme = (root / "README.md").read_text(encoding="utf-8")
    missing = []
    for path in lesson_paths(root):
        rows = [line for line in readme.splitlines() if f"notebooks/{path.name}" in line]
        if not rows or not CJK.search(rows[0]):
            missing.append(path.name)
    return missing


def report(root: Path = REPO) -> dict:
    return {
        "monolingual_cells": {
            p.name: c for p in lesson_paths(root) if (c := monolingual_cells(json.loads(p.read_text(encoding="utf-8"))))
        },
        "untranslated_labels": untranslated_labels(),
        "unknown_view_keys": unknown_view_keys(),
        "lessons_missing_from_readme": lessons_missing_from_readme(root),
    }


if __name__ == "__main__":
    result = report()
    print(json.dumps(result, ensure_ascii=False, indent=2))
    sys.exit(1 if any(result.values()) else 0)
