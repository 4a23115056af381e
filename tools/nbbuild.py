"""Build a lesson notebook from a list of cells, execute it, and store it without widget state.

    python tools/nbbuild.py tools/lesson_sources/00_first_distributed_run.py

A lesson source is a Python file defining ``CELLS``: a list of ("md", text)
or ("code", source) pairs. Executing here stores the deterministic outputs
that nbval compares in CI.
"""
from __future__ import annotations

import os
import runpy
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def build(source: Path, *, execute: bool = True) -> Path:
    cells = runpy.run_path(str(source))["CELLS"]
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for kind, text in cells:
        text = text.strip("\n")
        nb.cells.append(nbformat.v4.new_markdown_cell(text) if kind == "md"
                        else nbformat.v4.new_code_cell(text))
    notebooks = Path(__file__).resolve().parent.parent / "notebooks"
    target = notebooks / (source.stem + ".ipynb")
    if execute:
        NotebookClient(nb, timeout=900, kernel_name="python3",
                       resources={"metadata": {"path": str(notebooks)}}).execute()
    nb.metadata.pop("widgets", None)  # widget state is megabytes and never deterministic
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            data.pop("application/vnd.jupyter.widget-view+json", None)
    nbformat.write(nb, target)
    return target


def _student_form() -> None:
    """Store lessons as a learner first sees them: no answer key filled in, no solutions shown,
    and the build's checks recorded in a throwaway progress file, not the builder's own."""
    os.environ.pop("DTLAB_SOLUTIONS", None)
    os.environ.pop("DTLAB_FILL_PREDICTIONS", None)
    os.environ["DTLAB_HOME"] = tempfile.mkdtemp(prefix="dtlab-build-")


if __name__ == "__main__":
    _student_form()
    for arg in sys.argv[1:]:
        print(build(Path(arg)))
