"""A learner's progress: predictions made and right, exercises passed, in one local file.

Kept outside the notebooks (a notebook is shared, rerun, committed; progress
is the learner's own): ``$DTLAB_HOME/progress.json`` when ``DTLAB_HOME`` is
set, else ``$XDG_DATA_HOME/dtlab/progress.json`` (``~/.local/share/dtlab/``).
Tests and ``tools/execute_lessons.py`` point ``DTLAB_HOME`` at a temporary folder.

The file is small JSON, rewritten whole through a temporary file and
``os.replace`` (two notebooks writing at once lose at most one update, never
the file)::

    {"version": 1,
     "predictions": {"03.stage1_bytes": {"lesson": 3, "made": true, "right": false, "tries": 2}},
     "exercises":   {"01.ring_step": {"lesson": 1, "passed": true, "tries": 3}}}

An answer filled in from the answer key, or a reference solution graded in
instructor mode, is not the learner's and is not recorded.

Separately, when ``DTLAB_CHECK_LOG`` names a file, every verdict (the
learner's, a filled-in answer's or a reference solution's) is appended to it
as one JSON line: the test that runs every lesson with its answers filled in
reads it (:func:`log_verdict`).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

VERSION = 1
LOG_ENV = "DTLAB_CHECK_LOG"


def progress_path() -> Path:
    home = os.environ.get("DTLAB_HOME")
    if home:
        return Path(home) / "progress.json"
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "dtlab" / "progress.json"


def load(path: Path | None = None) -> dict:
    """The learner's record (an empty one if there is no file yet, or it cannot be read)."""
    path = path or progress_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict) or data.get("version") != VERSION:
        data = {}
    data.setdefault("version", VERSION)
    data.setdefault("predictions", {})
    data.setdefault("exercises", {})
    return data


def _save(data: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".progress-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True, ensure_ascii=False)
    os.replace(tmp, path)


def record_prediction(key: str, lesson: int, *, right: bool, path: Path | None = None) -> None:
    """A prediction was made (and was right or not); ``right`` once stays right."""
    path = path or progress_path()
    data = load(path)
    entry = data["predictions"].setdefault(key, {"lesson": lesson, "made": True, "right": False, "tries": 0})
    entry.update(
        lesson=lesson, made=True, right=bool(entry.get("right")) or right, tries=int(entry.get("tries", 0)) + 1
    )
    _save(data, path)


def record_exercise(key: str, lesson: int, *, passed: bool, path: Path | None = None) -> None:
    """An exercise was graded (a stub counts as a try only once it is more than a stub)."""
    path = path or progress_path()
    data = load(path)
    entry = data["exercises"].setdefault(key, {"lesson": lesson, "passed": False, "tries": 0})
    entry.update(lesson=lesson, passed=bool(entry.get("passed")) or passed, tries=int(entry.get("tries", 0)) + 1)
    _save(data, path)


def reset(path: Path | None = None) -> None:
    path = path or progress_path()
    if path.exists():
        path.unlink()


def log_verdict(kind: str, key: str, lesson: int, status: str, *, by_key: bool) -> None:
    """Append one verdict to the file :data:`LOG_ENV` names, if it names one.

    ``kind`` is "prediction", "exercise" or "check" (a check the answer key does not
    list); ``status`` "right", "wrong" or "none" (an exercise: "not_done" for
    "none"); ``by_key`` says the answer came from the answer key or dtlab's solution."""
    target = os.environ.get(LOG_ENV)
    if not target:
        return
    line = json.dumps(
        {"kind": kind, "key": key, "lesson": lesson, "status": status, "by_key": by_key}, ensure_ascii=False
    )
    with open(target, "a", encoding="utf-8") as f:
        f.write(line + "\n")
