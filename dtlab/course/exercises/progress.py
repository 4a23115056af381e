"""A learner's progress: predictions made and right, exercises passed, in one local file.

Kept outside the notebooks (a notebook is shared, rerun, committed; progress
is the learner's own): ``$DTLAB_HOME/progress.json`` when ``DTLAB_HOME`` is
set, else ``$XDG_DATA_HOME/dtlab/progress.json`` (``~/.local/share/dtlab/``).
Tests and ``tools/execute_lessons.py`` point ``DTLAB_HOME`` at a temporary folder.

The file is small JSON, rewritten whole through a temporary file, ``fsync``
and ``os.replace`` (two notebooks writing at once lose at most one update, never
the file); one that cannot be read is kept aside as ``progress.json.damaged-TIME``
and reported, never overwritten::

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
import stat
import sys
import tempfile
import time
from pathlib import Path

from dtlab.config.safe_paths import check_output_target, read_regular_file
from dtlab.i18n import DtlabError

VERSION = 1
MAX_BYTES = 16 << 20
"""The largest progress file read (a learner's is a few KiB)."""
LOG_ENV = "DTLAB_CHECK_LOG"


def progress_path() -> Path:
    home = os.environ.get("DTLAB_HOME")
    if home:
        return Path(home) / "progress.json"
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "dtlab" / "progress.json"


def check_home() -> None:
    """Refuse, in both languages, a ``DTLAB_HOME`` the progress file could never be written in.

    Called before ``dtlab lab`` starts JupyterLab, so that a learner hears of it at once rather than at the
    first prediction. Missing folders are fine (they are created), so the nearest one that exists must be
    a directory this user can write in; nothing is created here.
    """
    home = os.environ.get("DTLAB_HOME")
    if not home:
        return
    from dtlab.config.safe_paths import check_name_lengths, kind_of, refuse

    check_name_lengths("DTLAB_HOME", home)
    folder = Path(home).expanduser()
    if os.path.lexists(folder) and not folder.is_dir():
        mode = os.lstat(folder).st_mode
        en, zh = ("a file", "一个文件") if stat.S_ISREG(mode) else kind_of(mode)
        raise refuse(
            "DTLAB_HOME",
            home,
            f"a directory this user can write in (created if missing), but it is {en}",
            f"当前用户可写的目录（不存在时会创建），但它是{zh}",
        )
    while not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent
    try:
        if not folder.is_dir():
            raise NotADirectoryError(20, "Not a directory")
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise refuse(
            "DTLAB_HOME",
            home,
            f"a directory this user can write in (created if missing), but writing in {str(folder)!r} fails: "
            f"{error.strerror}",
            f"当前用户可写的目录（不存在时会创建），但在 {str(folder)!r} 中写入失败：{error.strerror}",
        ) from None


def load(path: Path | None = None) -> dict:
    """The learner's record: an empty one if there is no file yet. A file that cannot be read as a record
    (damaged JSON, another version, not a regular file) is never silently taken as empty: it is kept aside
    under a new name, reported on stderr in both languages, and the record starts afresh."""
    path = path or progress_path()
    data = None
    if os.path.lexists(path):
        try:
            data = json.loads(read_regular_file("progress", str(path), MAX_BYTES))
        except (ValueError, OSError):  # ConfigError (a pipe, a device, too large) is a ValueError
            data = None
        if not _well_formed(data):
            _keep_aside(path)
            data = None
    data = data if isinstance(data, dict) else {"version": VERSION}
    data.setdefault("predictions", {})
    data.setdefault("exercises", {})
    return data


def _well_formed(data) -> bool:
    """A record by schema: this version, and predictions and exercises as objects of objects."""
    return (
        isinstance(data, dict)
        and data.get("version") == VERSION
        and all(
            isinstance(data.get(part, {}), dict) and all(isinstance(e, dict) for e in data.get(part, {}).values())
            for part in ("predictions", "exercises")
        )
    )


def _keep_aside(path: Path) -> Path:
    """Rename an unreadable progress file to ``progress.json.damaged-TIME``, and say so; refuse if it cannot be."""
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}")
    try:
        os.rename(path, aside)
    except OSError as error:
        raise DtlabError(
            f"{path} cannot be read as a progress record and cannot be kept aside ({error.strerror}): move it "
            "away yourself, or set DTLAB_HOME to a writable folder",
            f"{path} 无法作为进度记录读取，也无法移到一旁（{error.strerror}）：请自行移走它，或把 DTLAB_HOME 设为可写的文件夹",
        ) from None
    print(
        f"dtlab: {path} could not be read as a progress record; it is kept as {aside} and a new record starts\n"
        f"dtlab: 无法读取进度记录 {path}；原文件已保留为 {aside}，并开始新的记录",
        file=sys.stderr,
    )
    return aside


def _save(data: dict, path: Path) -> None:
    """Write the record atomically (a temporary file in the same folder, fsync, rename); a failure is a
    bilingual DtlabError naming the folder and leaves the old file and no temporary file behind."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".progress-", suffix=".json.tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True, ensure_ascii=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as error:
        raise _unwritable(path, error) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)


def _unwritable(path: Path, error: OSError) -> DtlabError:
    return DtlabError(
        f"the progress file {path} cannot be written ({error.strerror}); allowed: DTLAB_HOME set to a folder "
        "this user can write in",
        f"无法写入进度文件 {path}（{error.strerror}）；允许：把 DTLAB_HOME 设为当前用户可写的文件夹",
    )


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
    try:
        if os.path.lexists(path):
            path.unlink()
    except OSError as error:
        raise _unwritable(path, error) from None


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
    check_output_target(LOG_ENV, target)  # never a FIFO (the append would block) or a device
    try:
        with open(target, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError as error:
        raise DtlabError(
            f"{LOG_ENV}={target!r} cannot be written ({error.strerror}); expected a file in a writable folder",
            f"环境变量 {LOG_ENV}={target!r} 无法写入（{error.strerror}）；应为可写文件夹中的文件",
        ) from None
