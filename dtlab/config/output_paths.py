"""Where a run writes (``--save``, ``--trace``): checked before step 0, not when it is too late.

A save target that cannot work (a file, a directory under one that does not
exist, a read-only or a full disk) would otherwise be found only at the first
save, after the steps before it had trained, and that work would be lost. So
``TrainConfig.validate`` asks :func:`check_save_target` first: the target is
a directory or can be created as one (its parent exists), a file can be
written there, and the disk has room for one checkpoint. A disk that fills
up later, during the run, is still possible; the save then fails on that
rank, and the newest complete checkpoint stays as it was (dtlab/state/checkpoint).
A trace file (:func:`check_output_file`) is written after the last step: its
folder must exist and be writable, and the name must not be a folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from dtlab.config.safe_paths import check_name_lengths, check_output_target, kind_of
from dtlab.i18n import ConfigError


def checkpoint_bytes(params: int) -> int:
    """A generous size of one checkpoint: fp32 weights and AdamW's two moments, plus 1 MiB of the rest."""
    return params * 4 * 3 + 2**20


def check_save_target(path: str, *, needed_bytes: int, resume: str | None = None) -> None:
    """Refuse, in both languages, a save target that cannot hold a checkpoint of ``needed_bytes``, or that
    holds another run's checkpoints (see :func:`_check_no_earlier_run`; ``resume``: where this run resumes)."""
    if not isinstance(path, str) or not path.strip() or "\0" in path:
        raise _refuse(path, "a directory path", "一个目录路径")
    check_name_lengths("save", path)
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        en, zh = ("a file", "一个文件") if target.is_file() else kind_of(target.stat().st_mode)
        raise _refuse(path, f"a directory, but it is {en}", f"一个目录，但它是{zh}")
    folder = target if target.is_dir() else target.parent
    if not folder.is_dir():
        raise _refuse(
            path, *_missing(folder, "a directory whose parent is an existing directory", "父目录是已存在目录的目录")
        )
    _check_writable(path, folder, "save")
    if target.is_dir():
        _check_no_earlier_run(path, target, resume)
    free = shutil.disk_usage(folder).free
    if free < needed_bytes:
        raise _refuse(
            path,
            f"room for one checkpoint ({needed_bytes:,} bytes), but the disk has {free:,} bytes free",
            f"能放下一个检查点的空间（{needed_bytes:,} 字节），但磁盘只剩 {free:,} 字节",
        )


def _check_no_earlier_run(path, target: Path, resume: str | None) -> None:
    """A folder holding committed checkpoints takes this run's saves only when this run continues them.

    ``--resume DIR`` picks the newest committed step in DIR. A fresh run saving
    into a folder that holds an earlier run's step 20 would write its step 10
    beside it, and a later resume would silently continue the earlier run from
    step 20. So a run may save there only when it resumes from that folder (or
    one of its step folders): then its saves carry the same run on.
    """
    from dtlab.state.checkpoint.files import committed_steps  # torch-heavy; only when a folder exists

    steps = committed_steps(target)
    if not steps:
        return
    if resume is not None:
        source = Path(resume).expanduser().resolve()
        if target.resolve() in (source, source.parent):
            _check_nothing_later(path, steps, source)
            return
    shown, shown_zh = (
        sep.join(str(s) for s in steps[-3:]) + (" ..." if len(steps) > 3 else "") for sep in (", ", "、")
    )
    raise _refuse(
        path,
        f"a directory without another run's checkpoints, but it holds checkpoints of steps {shown}, and "
        f"--resume {path} would pick the newest of them, not this run's (allowed: a new or empty "
        f"directory; remove those step folders; or continue that run with --resume {path})",
        f"不含其他运行检查点的目录，但它里面已有第 {shown_zh} 步的检查点，之后 --resume {path} 会选中其中最新的那个，"
        f"而不是本次运行的（允许：新目录或空目录；删除那些 step 文件夹；或用 --resume {path} 接着那次运行训练）",
    )


def _check_nothing_later(path, steps: list[int], source: Path) -> None:
    """Resuming from an earlier step folder into the same directory would overwrite its later commits."""
    digits = source.name[4:]
    if not (source.name.startswith("step") and digits.isdigit()):
        return  # the directory itself: the newest step is resumed, nothing is later
    later = [s for s in steps if s > int(digits)]
    if later:
        shown = ", ".join(str(s) for s in later[:5]) + (" ..." if len(later) > 5 else "")
        raise _refuse(
            path,
            f"a directory where this run's saves overwrite nothing, but it resumes from step {int(digits)} and "
            f"holds committed later steps {shown}, which its saves would replace (allowed: --save a new "
            f"directory to branch off, or --resume {path} to continue from the newest)",
            f"本次运行的保存不会覆盖任何内容的目录，但本次从第 {int(digits)} 步恢复，而目录里已有之后已提交的第 {shown} 步，"
            f"会被本次保存替换（允许：--save 到一个新目录另起分支，或用 --resume {path} 从最新一步继续）",
        )


def check_output_file(name: str, path: str, *, create_folders: bool = False) -> None:
    """Refuse, in both languages, a file the run could not write at its end (``name`` is the option).

    ``create_folders``: the writer creates missing folders, so the nearest existing one must do."""
    if not isinstance(path, str) or not path.strip() or "\0" in path:
        raise _refuse(path, "a file path", "一个文件路径", name)
    check_output_target(name, path)  # never a device, a FIFO or a socket; names that fit
    target = Path(path).expanduser()
    if target.is_dir():
        raise _refuse(path, "a file, but it is a directory", "一个文件，但它是一个目录", name)
    folder = target.parent
    while create_folders and not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise _refuse(path, *_missing(folder, "a file in an existing directory", "位于已存在目录中的文件"), name)
    _check_writable(path, folder, name)


def _missing(folder: Path, expected_en: str, expected_zh: str) -> tuple[str, str]:
    """What was expected, and why ``folder`` (a parent that is not a directory) is not it: a file, or missing."""
    if folder.exists():
        return (
            f"{expected_en}, but {str(folder)!r} is a file, not a directory",
            f"{expected_zh}，但 {str(folder)!r} 是文件，不是目录",
        )
    return f"{expected_en}, but {str(folder)!r} does not exist", f"{expected_zh}，但 {str(folder)!r} 不存在"


def _check_writable(path, folder: Path, name: str) -> None:
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise _refuse(
            path,
            f"a directory this user can write in, but writing in {str(folder)!r} fails: {error.strerror}",
            f"当前用户可写的目录，但在 {str(folder)!r} 中写入失败：{error.strerror}",
            name,
        ) from None


def _refuse(path, expected_en: str, expected_zh: str, name: str = "save") -> ConfigError:
    return ConfigError(
        f"{name}={path!r} is not allowed; expected {expected_en}", f"{name}={path!r} 不合法；应为{expected_zh}"
    )
