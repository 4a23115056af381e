"""Each stored lesson notebook is the build of its source in tools/lesson_sources/.

nbval checks the stored outputs against a fresh run; this checks the other half:
that nobody edited a lesson source without rebuilding its notebook (or edited the
notebook by hand), so that what CI runs is what the source says.
"""
from __future__ import annotations

import runpy
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "tools" / "lesson_sources").glob("[0-9][0-9]_*.py"))


def test_every_source_has_a_notebook_and_back():
    built = {p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    assert built == {p.stem for p in SOURCES}


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_notebook_cells_equal_its_source(source):
    cells = runpy.run_path(str(source))["CELLS"]
    nb = nbformat.read(ROOT / "notebooks" / f"{source.stem}.ipynb", as_version=4)
    stored = [(c.cell_type, c.source) for c in nb.cells]
    expected = [("markdown" if kind == "md" else "code", text.strip("\n")) for kind, text in cells]
    assert len(stored) == len(expected), f"{source.stem}: rebuild with tools/nbbuild.py"
    for i, (got, want) in enumerate(zip(stored, expected)):
        assert got == want, f"{source.stem} cell {i} differs from its source: rebuild with tools/nbbuild.py"
