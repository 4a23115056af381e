"""Execute lesson sources and store them as notebooks without widget state.

    python tools/execute_lessons.py notebooks/00_first_distributed_run.py   (or: make notebooks)

A lesson's source is ``notebooks/NN_name.py`` in jupytext's percent format,
paired with ``notebooks/NN_name.ipynb`` by ``notebooks/jupytext.toml``. This
runs the source's cells in a fresh kernel, as a learner first would, and
writes the .ipynb: its outputs are the deterministic ones nbval compares in CI.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import jupytext
import nbformat
from jupytext.config import load_jupytext_config
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def read_source(source: Path) -> nbformat.NotebookNode:
    """The lesson's cells, read as the paired notebook reads them (the options in jupytext.toml)."""
    return jupytext.read(source, config=load_jupytext_config(str(source)))


def execute(source: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for cell in read_source(source).cells:
        nb.cells.append(
            nbformat.v4.new_markdown_cell(cell.source)
            if cell.cell_type == "markdown"
            else nbformat.v4.new_code_cell(cell.source)
        )
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    nb.metadata.pop("widgets", None)  # widget state is megabytes and never deterministic
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        for output in cell.get("outputs", []):
            output.get("data", {}).pop("application/vnd.jupyter.widget-view+json", None)
    target = source.with_suffix(".ipynb")
    nbformat.write(nb, target)
    return target


def _student_form() -> None:
    """Store lessons as a learner first sees them: no answer key filled in, no solutions shown,
    and the run's checks recorded in a throwaway progress file, not the builder's own."""
    os.environ.pop("DTLAB_SOLUTIONS", None)
    os.environ.pop("DTLAB_FILL_PREDICTIONS", None)
    os.environ["DTLAB_HOME"] = tempfile.mkdtemp(prefix="dtlab-build-")


if __name__ == "__main__":
    _student_form()
    for arg in sys.argv[1:]:
        print(execute(Path(arg).resolve()))
