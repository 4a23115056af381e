"""Checkpoint files: one per rank and a manifest, written atomically, verified before use.

On disk, one folder per saved step::

    DIR/step00000040/rank00000.pt      one file per rank: what it holds of the state
    DIR/step00000040/rank00001.pt
    DIR/step00000040/manifest.json     step, layout, the run, and the size and sha256 of each rank file

Three rules make a crash or a damaged disk harmless (Mohan et al.,
"CheckFreq", 2021, Sec. 4; the same discipline as a database's commit):

1. **Atomic files.** Each file is written to a temporary name in the same
   folder, flushed and ``fsync``-ed, then ``os.replace``-d onto its real
   name. A rename within one filesystem is atomic: a reader sees the old
   file or the new one, never half of one. A failed write removes its
   temporary file.
2. **The manifest is the commit.** Rank 0 writes it last, after every rank
   has written its file; a folder without one is an interrupted save, which
   :func:`latest_step` passes over. A manifest that exists but cannot be read
   is damage, and is reported: never skipped for an older save.
3. **Verify before use.** Loading checks each file's size and sha256 against
   the manifest and unpickles with ``torch.load(weights_only=True)``, which
   only rebuilds tensors and plain Python values, never runs code from the
   file. So RNG states are stored as tensors and plain values. If any rank's
   file is bad, *every* rank raises the same error and nothing is loaded.

Saving and loading communicate (``group=``; None is the whole world) and
assume every rank sees the same folder: one machine, or a shared filesystem.
What goes into the files is the caller's (``dtlab/state/checkpoint/__init__.py``
describes the trainer's).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import torch

from dtlab.comm import calls as comm
from dtlab.comm.collectives import group_size_and_rank
from dtlab.config.safe_paths import read_regular_file
from dtlab.i18n import DtlabError
from dtlab.state.checkpoint.manifest import rank_file, read_manifest_file
from dtlab.state.checkpoint.rng import capture_rng_state

FORMAT = "dtlab-checkpoint/2"
MANIFEST = "manifest.json"


def step_folder(directory, step: int) -> Path:
    return Path(directory) / f"step{step:08d}"


# --------------------------------------------------------------------------- saving


def save_checkpoint(directory, *, step: int, layout: dict, state: dict, meta: dict | None = None, group=None) -> Path:
    """Write this rank's ``state`` for ``step``; return once the whole checkpoint is committed.

    Every rank of ``group`` calls this with its own ``state`` (tensors and
    plain Python values; ``"rng"`` defaults to :func:`capture_rng_state` now).
    ``layout`` (for example ``{"dp": 2, "tp": 1, "pp": 1, "zero": 2}``) says
    who wrote it; ``meta`` (JSON values, rank 0's) goes into the manifest.
    """
    world, rank = group_size_and_rank(group)
    folder = step_folder(directory, step)
    folder.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        # Saving the same step again: un-commit first, so the old manifest can
        # never vouch for a mixture of old and new rank files.
        (folder / MANIFEST).unlink(missing_ok=True)
        sweep_unfinished(Path(directory), folder)
    _barrier(group)
    payload = {
        "format": FORMAT,
        "step": step,
        "rank": rank,
        "world_size": world,
        "layout": dict(layout),
        "rng": capture_rng_state(),
        **state,
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    _refuse_what_weights_only_would(data)
    name = rank_file(rank)
    failure = _written(folder / name, data, directory, step)
    entry = {"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    entries = gather_objects((entry, failure), group)  # every rank's file, in rank order, or why it is not
    failure = next((f for _, f in entries if f is not None), None)
    if rank == 0 and failure is None:
        manifest = {
            "format": FORMAT,
            "step": step,
            "world_size": world,
            "layout": dict(layout),
            **(meta or {}),
            "files": [e for e, _ in entries],
        }
        failure = _written(folder / MANIFEST, json.dumps(manifest, indent=1).encode(), directory, step)
    failures = [f for f in gather_objects(failure if rank == 0 else None, group) if f is not None]
    if failures:  # every rank raises the same error; the save is not committed, the newest commit stays
        raise DtlabError(*failures[0])
    return folder


def _written(path: Path, data: bytes, directory, step: int) -> tuple[str, str] | None:
    """None once ``data`` is in ``path``; else why not (a full disk), in English and Chinese."""
    try:
        _write_atomically(path, data)
    except OSError as error:
        newest = latest_step(directory)
        kept = f"step {newest}" if newest is not None else "none"
        return (
            f"saving step {step} to {directory} failed writing {path.name} ({error.strerror}); the save is not "
            f"committed, and the newest committed checkpoint ({kept}) is intact",
            f"把第 {step} 步保存到 {directory} 时写入 {path.name} 失败（{error.strerror}）；本次保存未提交，"
            f"最新的已提交检查点（{'第 ' + str(newest) + ' 步' if newest is not None else '无'}）完好",
        )
    return None


def sweep_unfinished(directory: Path, keep: Path) -> None:
    """Remove what interrupted saves left in ``directory``: temporary files, and step folders other than
    ``keep`` never committed (no manifest) that hold nothing but rank files. Rank 0 calls it before any rank
    writes."""
    for folder in directory.glob("step*"):
        if not folder.is_dir():
            continue
        unfinished = folder != keep and not (folder / MANIFEST).exists()
        for leftover in folder.iterdir():
            if leftover.name.endswith(".tmp") or (unfinished and leftover.name.startswith("rank")):
                if leftover.is_file():
                    leftover.unlink(missing_ok=True)
        if unfinished:
            try:
                folder.rmdir()  # only if nothing else is in it
            except OSError:
                pass


def atomic_save(data: bytes, path) -> None:
    """``path`` holds its old content or ``data``, never a part of it, even after a crash; a failed write
    leaves nothing behind. Uses only ``os`` and ``open``: lesson 11's exercise ships this very source to its
    ranks as the reference solution (dtlab/course/exercises/lesson11.py)."""
    path = os.fspath(path)
    temporary = os.path.join(
        os.path.dirname(path),  # same folder, same filesystem
        f".{os.path.basename(path)}.{os.urandom(8).hex()}.tmp",
    )
    try:
        with open(temporary, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk ...
        os.replace(temporary, path)  # ... before the name points at them
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)  # a failed write leaves nothing behind


def _write_atomically(path: Path, data: bytes) -> None:
    """:func:`atomic_save`, then the rename itself made durable."""
    atomic_save(data, path)
    _fsync_folder(path.parent)  # and the rename itself is on disk


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # Windows cannot open a folder
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _refuse_what_weights_only_would(data: bytes) -> None:
    """A checkpoint that cannot be loaded back is refused when saved, not discovered at resume."""
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:
        raise DtlabError(
            f"this state cannot be saved: torch.load(weights_only=True) would refuse it ({error}); "
            "store only tensors and plain Python values (dict, list, int, float, str, bool, None)",
            f"这个状态无法保存：torch.load(weights_only=True) 会拒绝加载它（{error}）；"
            "只能存张量和普通 Python 值（dict、list、int、float、str、bool、None）",
        ) from None


# --------------------------------------------------------------------------- loading


def committed_steps(directory) -> list[int]:
    """The steps in ``directory`` whose save was committed (their folder has a manifest), in order."""
    return sorted(
        int(folder.name[4:])
        for folder in Path(directory).glob("step*")
        if folder.name[4:].isdigit() and (folder / MANIFEST).is_file()
    )


def latest_step(directory) -> int | None:
    """The newest step in ``directory`` whose save was committed; None if none."""
    return max(committed_steps(directory), default=None)


def read_manifest(directory, step: int | None = None) -> tuple[Path, dict]:
    """The folder and manifest of ``step`` (default: the newest committed save) in ``directory``.

    ``directory`` may also be one step folder itself. Raises a bilingual
    :class:`~dtlab.i18n.DtlabError` if there is none, or if it is damaged or
    of another format (the newest save is never passed over for an older one).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise DtlabError(
            f"{directory} does not exist or is not a folder: there is no checkpoint to resume",
            f"{directory} 不存在或不是文件夹：没有可以恢复的检查点",
        )
    if step is None and (directory / MANIFEST).is_file():
        folder = directory  # a step folder named directly
    else:
        step = latest_step(directory) if step is None else step
        if step is None:
            raise DtlabError(
                f"no complete checkpoint in {directory} (no step folder has a {MANIFEST})",
                f"{directory} 中没有完整的检查点（没有哪个 step 文件夹含有 {MANIFEST}）",
            )
        folder = step_folder(directory, step)
    try:
        manifest = read_manifest_file(folder / MANIFEST)  # by schema: types, the step, files inside the folder
    except DtlabError as error:
        raise DtlabError(
            f"{folder / MANIFEST} is missing or damaged ({error.en}): the save did not finish, or the file was changed",
            f"{folder / MANIFEST} 不存在或已损坏（{error.zh}）：保存没有完成，或者文件被改动过",
        ) from None
    if manifest.get("format") != FORMAT:
        raise DtlabError(
            f"{folder} holds a checkpoint of format {manifest.get('format')!r}; this dtlab "
            f"reads {FORMAT!r} (save it again with this version)",
            f"{folder} 中的检查点格式是 {manifest.get('format')!r}；当前 dtlab 只能读取 "
            f"{FORMAT!r}（请用当前版本重新保存）",
        )
    return folder, manifest


def read_rank_file(folder: Path, entry: dict) -> dict:
    """One rank's file, after checking its size and sha256 against the manifest's ``entry``."""
    path = folder / entry["file"]
    try:
        data = read_regular_file("checkpoint file", str(path), entry["bytes"] + 1)  # never a pipe or a device
    except OSError as error:
        raise DtlabError(f"{path} cannot be read ({error.strerror})", f"无法读取 {path}（{error.strerror}）") from None
    if len(data) != entry["bytes"]:
        raise DtlabError(
            f"{path} is truncated or damaged: it has {len(data)} bytes, the manifest says {entry['bytes']}",
            f"{path} 被截断或已损坏：它有 {len(data)} 字节，清单记录的是 {entry['bytes']} 字节",
        )
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise DtlabError(
            f"{path} was altered: its sha256 is {digest[:16]}..., the manifest says {entry['sha256'][:16]}...",
            f"{path} 被改动过：它的 sha256 是 {digest[:16]}...，清单记录的是 {entry['sha256'][:16]}...",
        )
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:
        raise DtlabError(f"{path} cannot be loaded safely: {error}", f"无法安全地加载 {path}：{error}") from None


def verify(directory, step: int | None = None) -> tuple[Path, dict]:
    """:func:`read_manifest`, then every rank file checked (size, sha256, ``weights_only``); nothing kept."""
    folder, manifest = read_manifest(directory, step)
    for entry in manifest["files"]:
        read_rank_file(folder, entry)
    return folder, manifest


def load_checkpoint(directory, *, expected_layout: dict | None = None, step: int | None = None, group=None) -> dict:
    """This rank's own file of the checkpoint of ``step`` (default: the newest), verified.

    With ``expected_layout``, a checkpoint written by another layout or world
    size is refused (to read any layout's, see :func:`load_all`). Every rank of
    ``group`` raises the same :class:`~dtlab.i18n.DtlabError`, or none does.
    """
    world, rank = group_size_and_rank(group)

    def mine():
        folder, manifest = read_manifest(directory, step)
        if expected_layout is not None and (
            manifest["layout"] != dict(expected_layout) or manifest["world_size"] != world
        ):
            needed, ours = _describe(manifest["layout"]), _describe(expected_layout)
            raise DtlabError(
                f"the checkpoint in {folder} was written by layout {needed} on {manifest['world_size']} "
                f"ranks, but this run is {ours} on {world} ranks; resume it with {needed}",
                f"{folder} 中的检查点是由布局 {needed}（{manifest['world_size']} 个 rank）写出的，"
                f"而本次运行是 {ours}（{world} 个 rank）；请用 {needed} 来恢复它",
            )
        return read_rank_file(folder, manifest["files"][rank])

    return _same_outcome(mine, group)


def load_all(directory, *, step: int | None = None, group=None) -> tuple[dict, list[dict]]:
    """The manifest and every rank's file (verified), whatever layout wrote them: for resharding."""

    def everything():
        folder, manifest = read_manifest(directory, step)
        return manifest, [read_rank_file(folder, entry) for entry in manifest["files"]]

    return _same_outcome(everything, group)


def _same_outcome(load, group):
    """``load()`` on every rank; if it failed on any, every rank raises that rank's error."""
    result, failure = None, None
    try:
        result = load()
    except DtlabError as error:
        failure = (error.en, error.zh)
    failures = [f for f in gather_objects(failure, group) if f is not None]
    if failures:
        raise DtlabError(*failures[0])
    return result


def _describe(layout: dict) -> str:
    return " ".join(f"{key}={value}" for key, value in layout.items())


# --------------------------------------------------------------------------- communication


def _barrier(group) -> None:
    if group_size_and_rank(group)[0] > 1:
        comm.barrier(group=group, kind="barrier.checkpoint")


def gather_objects(value, group=None) -> list:
    """``value`` from every rank of ``group``, in rank order (just ``[value]`` for a world of one)."""
    world, _ = group_size_and_rank(group)
    if world == 1:
        return [value]
    gathered = [None] * world
    comm.all_gather_object(gathered, value, group=group, kind="all_gather_object.checkpoint")
    return gathered
