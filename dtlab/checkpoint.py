"""Training checkpoints: everything a run needs to continue exactly, written atomically and verified.

Not to be confused with activation checkpointing (:mod:`dtlab.gradient_checkpointing`).
A resumed run continues the *same* loss curve only if it restores all of it:
the weights, the optimizer state (Adam's moments and step count), the loss
scaler, the position in the data, and the random-number generators. The
learning rate needs no saving: it is a function of the step.

On disk, one folder per saved step::

    DIR/step00000040/rank00000.pt      one file per rank: its own shard of the state
    DIR/step00000040/rank00001.pt
    DIR/step00000040/manifest.json     layout, step, world size, sha256 and size of each rank file

Three rules make a crash or a damaged disk harmless (Mohan et al.,
"CheckFreq", 2021, Sec. 4; the same discipline as a database's commit):

1. **Atomic files.** Each file is written to a temporary name in the same
   folder, flushed and ``fsync``-ed, then ``os.replace``-d onto its real
   name. A rename within one filesystem is atomic: a reader sees the old
   file or the new one, never half of one. A failed write removes its
   temporary file.
2. **The manifest is the commit.** Rank 0 writes it last, after every rank
   has written its file; a folder without one is an interrupted save and
   :func:`latest_step` ignores it.
3. **Verify before use.** Loading checks each file's size and sha256 against
   the manifest and unpickles with ``torch.load(weights_only=True)``, which
   only rebuilds tensors and plain Python values, never runs code from the
   file. So RNG states are stored as tensors and plain values. If any rank's
   file is bad, *every* rank raises the same error and nothing is loaded.

A checkpoint belongs to a layout: with ZeRO or tensor parallelism each rank
holds a different shard, so it resumes only on the layout that wrote it, and
the error says which one that is.

Saving and loading communicate (``group=``; None is the whole world) and
assume every rank sees the same folder: one machine, or a shared filesystem.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import random
import uuid
from pathlib import Path

import torch

from dtlab import comm
from dtlab.collectives import group_size_and_rank
from dtlab.i18n import DtlabError

FORMAT = "dtlab-checkpoint/1"
MANIFEST = "manifest.json"


def rank_file(rank: int) -> str:
    return f"rank{rank:05d}.pt"


def step_folder(directory, step: int) -> Path:
    return Path(directory) / f"step{step:08d}"


# --------------------------------------------------------------------------- random-number generators

def capture_rng_state() -> dict:
    """Every generator a step may draw from, as tensors and plain values (``weights_only``-safe)."""
    version, internal, gauss_next = random.getstate()
    state = {"torch": torch.get_rng_state(),
             "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next}}
    try:
        import numpy as np
        _, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = {"keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                          "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    except ImportError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    """Put back what :func:`capture_rng_state` captured."""
    torch.set_rng_state(state["torch"])
    python = state["python"]
    random.setstate((python["version"], tuple(python["internal"]), python["gauss_next"]))
    if "numpy" in state:
        import numpy as np
        n = state["numpy"]
        np.random.set_state(("MT19937", n["keys"].numpy().astype("uint32"), n["pos"],
                             n["has_gauss"], n["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --------------------------------------------------------------------------- saving

def save_checkpoint(directory, *, step: int, layout: dict, model_state: dict, optimizer_state: dict,
                    scaler_state: dict | None = None, rng_state: dict | None = None,
                    data_position=None, extra: dict | None = None, group=None) -> Path:
    """Write this rank's state for ``step``; return once the whole checkpoint is committed.

    Every rank of ``group`` calls this with its own state. ``layout`` (for
    example ``{"dp": 2, "tp": 1, "pp": 1, "zero": 2}``) is what a resume must
    match. ``rng_state`` defaults to :func:`capture_rng_state` now.
    ``data_position`` is whatever tells the data where to continue (for dtlab,
    the next step). Every value must be a tensor or a plain Python value.
    """
    world, rank = group_size_and_rank(group)
    folder = step_folder(directory, step)
    folder.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        # Saving the same step again: un-commit first, so the old manifest can
        # never vouch for a mixture of old and new rank files.
        (folder / MANIFEST).unlink(missing_ok=True)
    _barrier(group)
    payload = {"format": FORMAT, "step": step, "rank": rank, "world_size": world, "layout": dict(layout),
               "model": model_state, "optimizer": optimizer_state, "scaler": scaler_state,
               "rng": capture_rng_state() if rng_state is None else rng_state,
               "data_position": data_position, "extra": extra}
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    _refuse_what_weights_only_would(data)
    name = rank_file(rank)
    _write_atomically(folder / name, data)
    entry = {"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    entries = _all_gather(entry, group)                       # every rank's file, in rank order
    if rank == 0:
        manifest = {"format": FORMAT, "step": step, "world_size": world, "layout": dict(layout),
                    "files": entries}
        _write_atomically(folder / MANIFEST, json.dumps(manifest, indent=1).encode())
    _barrier(group)                                           # no rank goes on before the commit
    return folder


def _write_atomically(path: Path, data: bytes) -> None:
    """``path`` holds the old content or ``data``, never a part of it, even after a crash."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")   # same folder, same filesystem
    try:
        with open(temporary, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())                              # the bytes are on disk ...
        os.replace(temporary, path)                           # ... before the name points at them
    finally:
        temporary.unlink(missing_ok=True)                     # a failed write leaves nothing behind
    _fsync_folder(path.parent)                                # and the rename itself is on disk


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:                                           # Windows cannot open a folder
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

def latest_step(directory) -> int | None:
    """The newest step in ``directory`` with a committed manifest; None if there is none."""
    steps = []
    for folder in Path(directory).glob("step*"):
        try:
            steps.append(int(json.loads((folder / MANIFEST).read_text())["step"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue                                          # interrupted or damaged: not a checkpoint
    return max(steps, default=None)


def load_checkpoint(directory, *, expected_layout: dict, step: int | None = None, group=None) -> dict:
    """This rank's state from the checkpoint of ``step`` (default: the latest), after verifying it.

    Returns a dict with ``step``, ``layout``, ``model``, ``optimizer``,
    ``scaler``, ``rng``, ``data_position`` and ``extra``. Raises
    :class:`~dtlab.i18n.DtlabError`, on every rank of ``group`` alike, if the
    checkpoint is missing, damaged, or was written by another layout.
    """
    world, rank = group_size_and_rank(group)
    state, failure = None, None
    try:
        state = _load_verified(directory, expected_layout, step, world, rank)
    except DtlabError as error:
        failure = (error.en, error.zh)
    failures = [f for f in _all_gather(failure, group) if f is not None]
    if failures:
        raise DtlabError(*failures[0])                        # the same error on every rank
    return state


def _load_verified(directory, expected_layout: dict, step, world: int, rank: int) -> dict:
    if step is None:
        step = latest_step(directory)
        if step is None:
            raise DtlabError(f"no complete checkpoint in {directory} (no step folder has a {MANIFEST})",
                             f"{directory} 中没有完整的检查点（没有哪个 step 文件夹含有 {MANIFEST}）")
    folder = step_folder(directory, step)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        saved_layout, saved_world = manifest["layout"], manifest["world_size"]
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DtlabError(f"{folder / MANIFEST} is missing or damaged ({error}): the save of step {step} "
                         "did not finish, or the file was changed",
                         f"{folder / MANIFEST} 不存在或已损坏（{error}）：第 {step} 步的保存没有完成，"
                         "或者文件被改动过") from None
    if saved_layout != dict(expected_layout) or saved_world != world:
        needed, ours = _describe(saved_layout), _describe(expected_layout)
        raise DtlabError(
            f"the checkpoint in {folder} was written by layout {needed} on {saved_world} ranks, "
            f"but this run is {ours} on {world} ranks; resume it with {needed}",
            f"{folder} 中的检查点是由布局 {needed}（{saved_world} 个 rank）写出的，"
            f"而本次运行是 {ours}（{world} 个 rank）；请用 {needed} 来恢复它",
        )
    entry = files[rank]
    path = folder / entry["file"]
    try:
        data = path.read_bytes()
    except OSError as error:
        raise DtlabError(f"{path} cannot be read ({error.strerror})",
                         f"无法读取 {path}（{error.strerror}）") from None
    if len(data) != entry["bytes"]:
        raise DtlabError(f"{path} is truncated or damaged: it has {len(data)} bytes, the manifest "
                         f"says {entry['bytes']}",
                         f"{path} 被截断或已损坏：它有 {len(data)} 字节，清单记录的是 {entry['bytes']} 字节")
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise DtlabError(f"{path} was altered: its sha256 is {digest[:16]}..., the manifest says "
                         f"{entry['sha256'][:16]}...",
                         f"{path} 被改动过：它的 sha256 是 {digest[:16]}...，清单记录的是 "
                         f"{entry['sha256'][:16]}...")
    try:
        payload = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:
        raise DtlabError(f"{path} cannot be loaded safely: {error}",
                         f"无法安全地加载 {path}：{error}") from None
    return {key: payload[key] for key in ("step", "layout", "model", "optimizer", "scaler", "rng",
                                          "data_position", "extra")}


def _describe(layout: dict) -> str:
    return " ".join(f"{key}={value}" for key, value in layout.items())


# --------------------------------------------------------------------------- communication

def _barrier(group) -> None:
    if group_size_and_rank(group)[0] > 1:
        comm.barrier(group=group, kind="barrier.checkpoint")


def _all_gather(value, group) -> list:
    """``value`` from every rank of ``group``, in rank order (just ``[value]`` for a world of one)."""
    world, _ = group_size_and_rank(group)
    if world == 1:
        return [value]
    gathered = [None] * world
    comm.all_gather_object(gathered, value, group=group, kind="all_gather_object.checkpoint")
    return gathered
