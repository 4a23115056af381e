"""Every stored lesson notebook is its jupytext source, executed.

A lesson is a pair in notebooks/: NN_name.py (jupytext's percent format, what
authors edit) and NN_name.ipynb (stored executed by tools/execute_lessons.py).
nbval checks the stored outputs against a fresh run; this checks the other half:
that nobody edited a source without re-executing its notebook (or edited the
notebook without saving its source), so that what CI runs is what the source says.
"""

from __future__ import annotations

from pathlib import Path

import jupytext
import nbformat
import pytest
from jupytext.config import load_jupytext_config

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SOURCES = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
STORED = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def test_every_source_has_a_notebook_and_back():
    assert SOURCES
    assert {p.stem for p in STORED} == {p.stem for p in SOURCES}


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_notebook_cells_equal_its_source(source):
    nb = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    stored = [(c.cell_type, c.source) for c in nb.cells]
    # Read as JupyterLab reads it, with the options of notebooks/jupytext.toml.
    cells = jupytext.read(source, config=load_jupytext_config(str(source))).cells
    expected = [(c.cell_type, c.source) for c in cells]
    hint = f"re-execute it: python tools/execute_lessons.py notebooks/{source.name}"
    assert len(stored) == len(expected), f"{source.stem}: {len(stored)} cells stored, {len(expected)} in source; {hint}"
    for i, (got, want) in enumerate(zip(stored, expected)):
        assert got == want, f"{source.stem} cell {i} differs from its source; {hint}"


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.stem)
def test_stored_notebook_holds_no_widget_state(path):
    nb = nbformat.read(path, as_version=4)
    assert "widgets" not in nb.metadata
    for i, cell in enumerate(nb.cells):
        assert "execution" not in cell.metadata, f"{path.stem} cell {i}: execution timings stored"
        for output in cell.get("outputs", []):
            assert WIDGET_VIEW not in output.get("data", {}), f"{path.stem} cell {i}: widget view stored"
