"""The learner's copy of the lessons (dtlab/course/workspace.py): outputs cleared, the learner's work kept."""

from __future__ import annotations

import nbformat
import pytest

from dtlab.course import workspace
from dtlab.i18n import ConfigError


def _code(path):
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def test_every_lesson_is_copied_with_the_same_cells_and_no_outputs(tmp_path):
    stored = sorted(workspace.lessons_dir().glob("[0-9][0-9]_*.ipynb"))
    written = workspace.prepare(tmp_path)
    assert written == [p.name for p in stored] and len(written) >= 16
    for lesson in stored:
        original = nbformat.read(lesson, as_version=4)
        copy = nbformat.read(tmp_path / lesson.name, as_version=4)
        assert [c.source for c in copy.cells] == [c.source for c in original.cells]
        assert any(c.get("outputs") for c in original.cells), f"{lesson.name} should be stored executed"
        assert not any(c.outputs or c.execution_count for c in _code(tmp_path / lesson.name))
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_learners_work_is_kept_and_a_reset_copies_one_lesson_afresh(tmp_path):
    workspace.prepare(tmp_path)
    mine = tmp_path / "04_zero.ipynb"
    other = tmp_path / "02_data_parallelism.ipynb"
    for path in (mine, other):
        notebook = nbformat.read(path, as_version=4)
        notebook.cells[0].source = "my notes"
        nbformat.write(notebook, path)
    (tmp_path / "06_tensor_parallelism.ipynb").unlink()

    assert workspace.prepare(tmp_path) == ["06_tensor_parallelism.ipynb"]  # only what is missing
    assert nbformat.read(mine, as_version=4).cells[0].source == "my notes"

    assert workspace.prepare(tmp_path, reset=("04",)) == ["04_zero.ipynb"]
    assert nbformat.read(mine, as_version=4).cells[0].source != "my notes"
    assert nbformat.read(other, as_version=4).cells[0].source == "my notes"


def test_bad_workspace_arguments_are_refused_in_both_languages_before_writing(tmp_path):
    with pytest.raises(ConfigError) as unknown:
        workspace.prepare(tmp_path / "new", reset=("99",))
    assert "'99'" in str(unknown.value) and "课程编号" in str(unknown.value)
    assert not (tmp_path / "new").exists()
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="a_file"):
        workspace.prepare(a_file)
    with pytest.raises(ConfigError, match="no lessons"):
        workspace.prepare(tmp_path / "w", source=tmp_path / "empty")


def test_the_workspace_is_chosen_by_flag_then_environment_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("DTLAB_WORKSPACE", str(tmp_path / "env"))
    assert workspace.workspace_dir(str(tmp_path / "flag")) == tmp_path / "flag"
    assert workspace.workspace_dir() == tmp_path / "env"
    monkeypatch.delenv("DTLAB_WORKSPACE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert workspace.workspace_dir() == tmp_path / "home" / "dtlab-lessons"


def test_clearing_in_place_leaves_only_sources(tmp_path):
    for lesson in sorted(workspace.lessons_dir().glob("0[01]_*.ipynb")):
        (tmp_path / lesson.name).write_bytes(lesson.read_bytes())
    assert workspace.clear_in_place(tmp_path) == ["00_first_distributed_run.ipynb", "01_all_reduce.ipynb"]
    assert not any(c.outputs for p in tmp_path.glob("*.ipynb") for c in _code(p))


def test_lab_warns_before_serving_beyond_loopback(monkeypatch, tmp_path, capsys):
    import subprocess

    from dtlab.cli import build_parser, run_lab

    monkeypatch.setattr(subprocess, "call", lambda cmd, env: 0)  # JupyterLab itself is not started
    for ip, warned in (("0.0.0.0", True), ("127.0.0.1", False), ("localhost", False)):
        run_lab(build_parser().parse_args(["lab", "--ip", ip, "--workspace", str(tmp_path)]))
        out = capsys.readouterr().out
        assert ("beyond this machine" in out and "本机以外" in out) == warned, (ip, out)
