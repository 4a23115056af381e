"""The Binder set-up, built the way repo2docker builds it, and lesson 00 run in it.

A fresh virtual environment (no system site-packages) gets exactly what
``binder/`` says: ``pip install -r binder/requirements.txt``, then
``binder/postBuild`` run from the repository root. Only then, as a test-only
addition that Binder does not get, nbval; lesson 00 runs under nbval with a
kernel from that environment (``--nbval-current-env``). The repository is
copied first, so the editable install of postBuild points at the copy and
leaves this checkout alone.

The environment is built once per test session, in a temporary folder.
Slow (minutes: torch is a large wheel); deselect locally with ``-m "not slow"``. CI builds it one day
in five, a day of the end-to-end rotation of its own (``tests/rotation.py``), so that
no day pays for it and the answer-filled lesson runs both; ``DTLAB_EVERY_LESSON=1`` builds it every time.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSON = "notebooks/00_first_distributed_run.ipynb"
STORED = "notebooks/stored_00_first_distributed_run.ipynb"
# Not part of what Binder sees: local state of this checkout.
NOT_COPIED = {
    ".venv",
    ".git",
    "__pycache__",
    ".pytest_cache",
    ".ipynb_checkpoints",
    "_artifacts",
    "build",
    "dist",
    "runs",
}

pytestmark = pytest.mark.slow


def _ignore(folder: str, names: list[str]) -> set[str]:
    return {n for n in names if n in NOT_COPIED or n.endswith(".egg-info")}


def _runtime_python() -> str:
    """The interpreter binder/runtime.txt asks for (``python-3.11``), else this one."""
    runtime = ROOT / "binder" / "runtime.txt"
    if runtime.exists():
        match = re.fullmatch(r"python-(\d+\.\d+)", runtime.read_text().strip())
        assert match, f"binder/runtime.txt should read like 'python-3.11', not {runtime.read_text()!r}"
        wanted = match.group(1)
        if f"{sys.version_info.major}.{sys.version_info.minor}" == wanted:
            return sys.executable
        found = shutil.which(f"python{wanted}")
        if found:
            return found
        pytest.skip(f"binder/runtime.txt asks for Python {wanted}, which this machine does not have")
    return sys.executable


class BinderEnv:
    def __init__(self, base: Path):
        self.repo = base / "repo"
        self.venv = base / "venv"
        self.python = str(self.venv / "bin" / "python")
        self.log = base / "build.log"
        self.timings: dict[str, float] = {}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "JUPYTER", "CONDA"))}
        env.update(
            PATH=f"{self.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            VIRTUAL_ENV=str(self.venv),
            PYTHONNOUSERSITE="1",
            IPYTHONDIR=str(base / "ipython"),
            JUPYTER_CONFIG_DIR=str(base / "jupyter-config"),
            JUPYTER_DATA_DIR=str(base / "jupyter-data"),
            JUPYTER_RUNTIME_DIR=str(base / "jupyter-runtime"),
            # Python compiles what it imports on first use; compiling every installed file up front is
            # most of pip's time on two cores, and changes nothing the test checks.
            PIP_NO_COMPILE="1",
        )
        self.env = env

    def run(self, step: str, cmd: list[str], timeout_s: float) -> str:
        started = time.monotonic()
        try:
            done = subprocess.run(
                cmd,
                cwd=self.repo,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{step}: still running after {timeout_s:.0f} s:\n{(exc.output or '')[-4000:]}")
        self.timings[step] = time.monotonic() - started
        with open(self.log, "a") as log:
            log.write(f"$ {' '.join(cmd)}  # {step}, {self.timings[step]:.0f} s, exit {done.returncode}\n")
            log.write(done.stdout)
        if done.returncode != 0:
            pytest.fail(f"{step} failed (exit {done.returncode}):\n{done.stdout[-6000:]}", pytrace=False)
        return done.stdout


@pytest.fixture(scope="session")
def binder_env(tmp_path_factory) -> BinderEnv:
    from tests.rotation import BINDER, skip_unless_today

    skip_unless_today(BINDER)
    env = BinderEnv(tmp_path_factory.mktemp("binder"))
    shutil.copytree(ROOT, env.repo, ignore=_ignore, symlinks=True)
    post_build = env.repo / "binder" / "postBuild"
    assert os.access(post_build, os.X_OK), "binder/postBuild must be executable (repo2docker runs it)"
    env.run("python -m venv", [_runtime_python(), "-m", "venv", str(env.venv)], 300)
    env.run(
        "pip install -r binder/requirements.txt",
        [env.python, "-m", "pip", "install", "-r", "binder/requirements.txt"],
        1200,
    )
    env.run("binder/postBuild", [str(post_build)], 1200)
    env.run("pip install nbval (test only)", [env.python, "-m", "pip", "install", "nbval>=0.11"], 600)
    # postBuild cleared the copy's outputs (a learner predicts before seeing them); nbval compares
    # against the stored ones, so lesson 00 runs from a copy of this checkout's notebook beside it.
    shutil.copy(ROOT / LESSON, env.repo / STORED)
    return env


def test_binder_environment_has_what_the_lessons_need(binder_env):
    out = binder_env.run(
        "imports",
        [
            binder_env.python,
            "-c",
            (
                "import dtlab, torch, jupyterlab, ipywidgets, plotly, anywidget, ipykernel, sys; "
                "print('dtlab', dtlab.__file__); print('torch', torch.__version__); print('python', sys.version)"
            ),
        ],
        300,
    )
    assert str(binder_env.repo / "dtlab") in out, f"dtlab should be the editable copy:\n{out}"
    torch_version = re.search(r"torch (\d+)\.(\d+)", out)
    assert torch_version and (2, 4) <= tuple(map(int, torch_version.groups())) < (2, 14), out
    extensions = binder_env.run(
        "jupyter labextension list", [binder_env.python, "-m", "jupyter", "labextension", "list"], 300
    )
    for needed in ("@jupyter-widgets/jupyterlab-manager", "anywidget"):
        assert needed in extensions, f"JupyterLab extension {needed} missing:\n{extensions}"
    print("\n" + "\n".join(f"{step}: {seconds:.0f} s" for step, seconds in binder_env.timings.items()))


def test_lesson00_passes_nbval_in_the_binder_environment(binder_env):
    out = binder_env.run(
        "nbval lesson 00",
        [
            binder_env.python,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "--nbval",
            "--nbval-current-env",
            "--nbval-cell-timeout=900",
            STORED,
        ],
        1500,
    )
    assert re.search(r"\b\d+ passed\b", out), out[-4000:]
    print("\n" + "\n".join(f"{step}: {seconds:.0f} s" for step, seconds in binder_env.timings.items()))


def test_postbuild_clears_the_lessons_outputs(binder_env):
    import nbformat

    lessons = sorted((binder_env.repo / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert len(lessons) >= 16
    for lesson in lessons:
        code = [c for c in nbformat.read(lesson, as_version=4).cells if c.cell_type == "code"]
        assert code and not any(c.outputs for c in code), f"{lesson.name} keeps outputs in Binder"
    stored = nbformat.read(ROOT / LESSON, as_version=4)
    assert any(c.get("outputs") for c in stored.cells), "the checkout's lesson 00 should be stored executed"
