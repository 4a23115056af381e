"""A checkpoint's ``manifest.json`` read by schema: every field's type, its range, and where its files lie.

A manifest is the commit of a save (dtlab/state/checkpoint/files.py), and it
is also a file anyone can edit. Before a rank trusts it, :func:`read_manifest_file`
reads it as a regular file of bounded size (a pipe or ``/dev/zero`` in its
place is refused before reading), as JSON without duplicate keys or deep
nesting, and then checks it:

* ``step``: an integer (not NaN, not ``"abc"``), the one its folder's name
  says (a manifest edited to an earlier step is refused);
* ``world_size``: a positive integer; ``layout``: an object of numbers and
  booleans;
* ``files``: a list of exactly ``world_size`` entries, the i-th naming
  ``rankNNNNN.pt`` for rank i inside this folder (never ``../../etc/passwd``),
  with an integer ``bytes`` and a 64-digit hexadecimal ``sha256``.

Each refusal is a bilingual :class:`~dtlab.i18n.DtlabError` naming the key.
"""

from __future__ import annotations

import re
from pathlib import Path

from dtlab.config.safe_paths import read_regular_file, strict_json
from dtlab.i18n import DtlabError

MAX_MANIFEST_BYTES = 16 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")


def read_manifest_file(path: Path) -> dict:
    """The manifest at ``path`` (``DIR/stepNNNNNNNN/manifest.json``), read and checked by schema."""
    data = read_regular_file("manifest", str(path), MAX_MANIFEST_BYTES)
    manifest = strict_json("manifest", str(path), data)
    if not isinstance(manifest, dict):
        raise _bad(path, "(the whole file)", manifest, "a JSON object {...}", "JSON 对象 {...}")
    for key in ("step", "world_size", "files", "layout"):
        if key not in manifest:
            raise _bad(path, key, None, "present", "存在")
    step, world = manifest["step"], manifest["world_size"]
    if not _integer(step) or step < 0:
        raise _bad(path, "step", step, "a whole number >= 0", "大于等于 0 的整数")
    digits = path.parent.name[4:]
    if path.parent.name.startswith("step") and digits.isdigit() and int(digits) != step:
        raise _bad(
            path,
            "step",
            step,
            f"{int(digits)}, the step its folder is named for",
            f"{int(digits)}（其文件夹名所示的步数）",
        )
    if not _integer(world) or world < 1:
        raise _bad(path, "world_size", world, "a whole number >= 1", "大于等于 1 的整数")
    layout = manifest["layout"]
    if not isinstance(layout, dict) or not all(
        isinstance(k, str) and (_integer(v) or isinstance(v, bool)) for k, v in layout.items()
    ):
        raise _bad(path, "layout", layout, "an object of whole numbers and booleans", "由整数和布尔值组成的对象")
    _check_files(path, manifest["files"], world)
    return manifest


def _check_files(path: Path, files, world: int) -> None:
    if not isinstance(files, list) or len(files) != world:
        shown = f"{len(files)} entries" if isinstance(files, list) else type(files).__name__
        raise _bad(
            path,
            "files",
            shown,
            f"a list of world_size={world} entries, one per rank",
            f"长度为 world_size={world} 的列表，每个 rank 一项",
        )
    for rank, entry in enumerate(files):
        key = f"files[{rank}]"
        if not isinstance(entry, dict):
            raise _bad(path, key, entry, "an object {file, bytes, sha256}", "对象 {file, bytes, sha256}")
        if entry.get("file") != rank_file(rank):
            raise _bad(
                path,
                f"{key}.file",
                entry.get("file"),
                f"{rank_file(rank)!r}, rank {rank}'s file inside this checkpoint's folder",
                f"{rank_file(rank)!r}（rank {rank} 在本检查点文件夹内的文件）",
            )
        size = entry.get("bytes")
        if not _integer(size) or size < 0:
            raise _bad(path, f"{key}.bytes", size, "a whole number >= 0", "大于等于 0 的整数")
        digest = entry.get("sha256")
        if not (isinstance(digest, str) and _SHA256.fullmatch(digest)):
            raise _bad(path, f"{key}.sha256", digest, "64 hexadecimal digits", "64 位十六进制数字")


def rank_file(rank: int) -> str:
    return f"rank{rank:05d}.pt"


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bad(path: Path, key: str, value, expected_en: str, expected_zh: str) -> DtlabError:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return DtlabError(
        f"{path} is damaged or was edited: {key}={shown} is not allowed; expected {expected_en}",
        f"{path} 已损坏或被改动过：{key}={shown} 不合法；应为{expected_zh}",
    )
