"""The learner's copy of the lessons: every notebook with its outputs cleared.

The notebooks in ``notebooks/`` are stored *executed*: nbval compares their
outputs in CI, and an instructor reads them as the lesson ran. A learner must
not see them: every measurement a prediction asks for is printed under the
cell that asks. ``dtlab lab`` therefore serves a workspace (``~/dtlab-lessons``
unless ``--workspace`` or ``DTLAB_WORKSPACE`` says otherwise) holding a copy of
each lesson with no outputs, made the first time and never overwritten after:
what the learner wrote there stays theirs. A lesson added to dtlab later is
copied in on the next launch; ``--reset LESSON`` copies one afresh.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat

from dtlab.config.safe_paths import check_name_lengths
from dtlab.i18n import ConfigError

DEFAULT = Path("~/dtlab-lessons")


def lessons_dir() -> Path:
    """The stored, executed lessons shipped with dtlab."""
    return Path(__file__).resolve().parent.parent.parent / "notebooks"


ENV = "DTLAB_WORKSPACE"


def workspace_dir(path: str | None = None) -> Path:
    """``path``, else ``$DTLAB_WORKSPACE``, else ``~/dtlab-lessons``, expanded. An empty ``--workspace`` is
    refused (an empty ``DTLAB_WORKSPACE`` is as good as unset)."""
    if path is not None and not path.strip():
        raise ConfigError(
            f"--workspace {path!r} is not allowed; expected a directory (created if missing)",
            f"--workspace {path!r} 不合法；应为一个目录（不存在时会创建）",
        )
    return Path(path or os.environ.get(ENV) or DEFAULT).expanduser()


def _named(workspace: Path) -> str:
    """How the user gave ``workspace``: ``DTLAB_WORKSPACE`` when it came from there, else ``--workspace``."""
    given = os.environ.get(ENV)
    return ENV if given and Path(given).expanduser() == workspace else "--workspace"


def cleared(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``notebook`` with every code cell's outputs and execution count removed (in place; returned)."""
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    notebook.metadata.pop("widgets", None)
    return notebook


def prepare(workspace: Path, *, source: Path | None = None, reset: tuple[str, ...] = ()) -> list[str]:
    """Copy into ``workspace`` each lesson of ``source`` it lacks (or names in ``reset``), outputs cleared.

    Returns the names of the notebooks written. A lesson already there is left
    as the learner left it. ``reset`` names lessons by file name or by number
    (``"04"``); an unknown name is refused before anything is written.
    """
    source = source or lessons_dir()
    lessons = sorted(source.glob("[0-9][0-9]_*.ipynb"))
    if not lessons:
        raise ConfigError(
            f"no lessons found in {str(source)!r}: run dtlab lab from a checkout of dtlab, or pass --notebooks DIR",
            f"在 {str(source)!r} 中没有找到课程：请在 dtlab 的源码目录中运行 dtlab lab，或用 --notebooks DIR 指定目录",
        )
    wanted = {name: [p for p in lessons if p.name == name or p.name.split("_")[0] == name] for name in reset}
    unknown = [name for name, found in wanted.items() if not found]
    if unknown:
        numbers = ", ".join(p.name.split("_")[0] for p in lessons)
        raise ConfigError(
            f"--reset {unknown[0]!r} is not a lesson; expected a lesson number ({numbers}) or a notebook's file name",
            f"--reset {unknown[0]!r} 不是一课；应为课程编号（{numbers}）或笔记本文件名",
        )
    name = _named(workspace)
    check_name_lengths(name, str(workspace))
    if workspace.exists() and not workspace.is_dir():
        raise ConfigError(
            f"{name} {str(workspace)!r} is not allowed: it is a file; expected a directory (created if missing)",
            f"{name} {str(workspace)!r} 不合法：它是一个文件；应为目录（不存在时会创建）",
        )
    try:
        return _copy_lessons(workspace, lessons, {p.name for found in wanted.values() for p in found})
    except OSError as error:  # read-only, full, /proc/...: refused, not a traceback
        raise ConfigError(
            f"{name} {str(workspace)!r} is not allowed: writing there fails ({error.strerror}); expected a "
            "directory this user can write in (--workspace DIR or DTLAB_WORKSPACE)",
            f"{name} {str(workspace)!r} 不合法：在那里写入失败（{error.strerror}）；应为当前用户可写的目录"
            "（--workspace DIR 或环境变量 DTLAB_WORKSPACE）",
        ) from None


def _copy_lessons(workspace: Path, lessons: list[Path], again: set[str]) -> list[str]:
    workspace.mkdir(parents=True, exist_ok=True)
    written = []
    for lesson in lessons:
        target = workspace / lesson.name
        if target.exists() and lesson.name not in again:
            continue
        notebook = cleared(nbformat.read(lesson, as_version=4))
        # a name of its own: two `dtlab lab` started together on one workspace never share a temporary file
        partial = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            nbformat.write(notebook, partial)
            os.replace(partial, target)  # a learner's notebook is never left half-written
        finally:
            partial.unlink(missing_ok=True)
        written.append(lesson.name)
    return written


def clear_in_place(directory: Path) -> list[str]:
    """Clear the outputs of every lesson in ``directory`` itself (Binder's copy of the repository, which
    no one shares); returns the names cleared. A directory with no lesson, or one that cannot be
    written, is refused in both languages."""
    lessons = sorted(Path(directory).glob("[0-9][0-9]_*.ipynb")) if Path(directory).is_dir() else []
    if not lessons:
        raise ConfigError(
            f"DIRECTORY {str(directory)!r} is not allowed; expected a directory holding the lessons (NN_name.ipynb)",
            f"DIRECTORY {str(directory)!r} 不合法；应为存放课程（NN_name.ipynb）的目录",
        )
    names = []
    for lesson in lessons:
        try:
            nbformat.write(cleared(nbformat.read(lesson, as_version=4)), lesson)
        except OSError as error:
            raise ConfigError(
                f"DIRECTORY {str(directory)!r} is not allowed: writing {lesson.name} fails ({error.strerror}); "
                "expected lessons this user can write",
                f"DIRECTORY {str(directory)!r} 不合法：写入 {lesson.name} 失败（{error.strerror}）；应为当前用户可写的课程",
            ) from None
        names.append(lesson.name)
    return names


def main(argv: list[str]) -> int:
    """``python -m dtlab.course.workspace DIRECTORY`` (binder/postBuild): clear the lessons there; 2 on a refusal."""
    import sys

    try:
        if len(argv) != 1:
            raise ConfigError(
                f"expected one argument, the lessons' DIRECTORY; got {len(argv)}",
                f"应有一个参数，即课程所在的 DIRECTORY；实际得到 {len(argv)} 个",
            )
        print(f"cleared the outputs of {len(clear_in_place(Path(argv[0])))} lessons / 已清除各课的输出")
    except ConfigError as error:
        print(f"dtlab: {error.en}\ndtlab: {error.zh}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # binder/postBuild: python -m dtlab.course.workspace notebooks
    import sys

    sys.exit(main(sys.argv[1:]))
