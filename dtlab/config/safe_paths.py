"""Every path a user names, checked before it is touched: its names' lengths, its kind, its size.

* :func:`check_name_lengths`: a component longer than the filesystem allows
  (``os.pathconf(..., "PC_NAME_MAX")``, 255 on most) is refused with the limit,
  instead of an ``OSError`` traceback from deep inside a save.
* :func:`check_output_target`: an output is a regular file or a new name in a
  directory. A device (``/dev/null``, ``/dev/full``), a FIFO or a socket is
  refused: a temporary file renamed onto it would replace the device, and
  writing into a FIFO blocks until someone reads.
* :func:`read_regular_file`: an input is a regular file within a size bound.
  It is opened with ``O_NONBLOCK`` (a FIFO then does not block the open) and
  its kind checked on the open descriptor with ``fstat``, before one byte is
  read: a pipe would block forever, ``/dev/zero`` would fill the memory.
* :func:`strict_json`: JSON with no duplicate key (Python keeps the last one
  silently), no nesting deeper than :data:`MAX_DEPTH` (200,000 ``[`` would
  overflow the parser's recursion).

Each refusal is a bilingual :class:`~dtlab.i18n.ConfigError` naming the
option, the value and what is allowed.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from dtlab.i18n import ConfigError

MAX_DEPTH = 32
"""The deepest nesting of objects and lists a structured input (manifest, DeepSpeed config, profile) may have."""

DEFAULT_NAME_MAX = 255

_KIND = {
    stat.S_IFCHR: ("a character device", "字符设备"),
    stat.S_IFBLK: ("a block device", "块设备"),
    stat.S_IFIFO: ("a FIFO (named pipe)", "FIFO（命名管道）"),
    stat.S_IFSOCK: ("a socket", "套接字"),
    stat.S_IFDIR: ("a directory", "目录"),
}


def refuse(name: str, value, expected_en: str, expected_zh: str) -> ConfigError:
    return ConfigError(
        f"{name}={value!r} is not allowed; expected {expected_en}", f"{name}={value!r} 不合法；应为{expected_zh}"
    )


def kind_of(mode: int) -> tuple[str, str]:
    return _KIND.get(stat.S_IFMT(mode), ("not a regular file", "不是普通文件"))


def name_max(path: Path) -> int:
    """The longest name a component may have in the nearest existing folder above ``path``."""
    folder = path
    while not os.path.isdir(folder) and folder != folder.parent:  # os.path: no OSError on a long name
        folder = folder.parent
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return DEFAULT_NAME_MAX


def check_name_lengths(name: str, value) -> None:
    """Refuse a path with a component longer than its filesystem allows (in bytes, as the kernel counts)."""
    path = Path(os.path.expanduser(value))
    limit = name_max(path)
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > limit:
            shown = part[:24] + "..."
            raise refuse(
                name,
                value,
                f"names of at most {limit} bytes each (this filesystem's NAME_MAX), but {shown!r} has {size}",
                f"每一级名字最多 {limit} 字节（本文件系统的 NAME_MAX），但 {shown!r} 有 {size} 字节",
            )


def check_output_target(name: str, value) -> None:
    """An output: a path whose names fit, which is a regular file if it exists (never a device, FIFO, socket)."""
    check_name_lengths(name, value)
    path = Path(os.path.expanduser(value))
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as error:
        raise refuse(name, value, "a path this user can reach", f"当前用户可访问的路径（{error.strerror}）") from None
    if not stat.S_ISREG(mode):
        en, zh = kind_of(mode)
        raise refuse(
            name,
            value,
            f"a regular file or a new name in a writable directory, but it is {en}",
            f"普通文件或可写目录中的新文件名，但它是{zh}",
        )


def read_regular_file(name: str, value, max_bytes: int) -> bytes:
    """The bytes of ``value``, a regular file of at most ``max_bytes``; anything else refused before reading."""
    check_name_lengths(name, value)
    path = os.path.expanduser(os.fspath(value))
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as error:
        raise refuse(name, value, f"a readable file ({error.strerror})", f"可读取的文件（{error.strerror}）") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            en, zh = kind_of(info.st_mode)
            raise refuse(name, value, f"a regular file, but it is {en}", f"普通文件，但它是{zh}")
        if info.st_size > max_bytes:
            raise refuse(
                name,
                value,
                f"a file of at most {max_bytes:,} bytes, but it has {info.st_size:,}",
                f"最多 {max_bytes:,} 字节的文件，但它有 {info.st_size:,} 字节",
            )
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as error:
        raise refuse(name, value, f"a readable file ({error.strerror})", f"可读取的文件（{error.strerror}）") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew while we read
        raise refuse(name, value, f"a file of at most {max_bytes:,} bytes", f"最多 {max_bytes:,} 字节的文件")
    return data


def _no_duplicates(name: str, value):
    def hook(pairs: list) -> dict:
        seen = {}
        for key, item in pairs:
            if key in seen:
                raise refuse(
                    name,
                    value,
                    f"JSON without duplicate keys, but {key!r} appears twice in one object",
                    f"没有重复键的 JSON，但键 {key!r} 在同一个对象中出现了两次",
                )
            seen[key] = item
        return seen

    return hook


def depth(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` in JSON ``text``, outside strings (no recursion)."""
    deepest = level = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            level += 1
            deepest = max(deepest, level)
        elif char in "]}":
            level -= 1
    return deepest


def strict_json(name: str, value, data: bytes, max_depth: int = MAX_DEPTH):
    """``data`` (UTF-8 JSON) parsed: duplicate keys and nesting deeper than ``max_depth`` refused, by name."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise refuse(name, value, f"UTF-8 text ({error})", f"UTF-8 文本（{error}）") from None
    deepest = depth(text)
    if deepest > max_depth:
        raise refuse(
            name,
            value,
            f"JSON nested at most {max_depth} deep, but it is nested {deepest:,} deep",
            f"嵌套最多 {max_depth} 层的 JSON，但它嵌套了 {deepest:,} 层",
        )
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates(name, value))
    except ConfigError:
        raise
    except (ValueError, RecursionError) as error:
        raise refuse(name, value, f"valid JSON ({error})", f"合法的 JSON（{error}）") from None


def check_existing_input(name: str, value, max_bytes: int) -> None:
    """If ``value`` exists, it must be a regular file of at most ``max_bytes`` (a missing one is the caller's
    to report): for readers that read it themselves, so that a pipe or ``/dev/zero`` never reaches them."""
    check_name_lengths(name, value)
    try:
        info = os.stat(os.path.expanduser(os.fspath(value)))
    except OSError:
        return
    if not stat.S_ISREG(info.st_mode):
        en, zh = kind_of(info.st_mode)
        raise refuse(name, str(value), f"a regular file, but it is {en}", f"普通文件，但它是{zh}")
    if info.st_size > max_bytes:
        raise refuse(
            name,
            str(value),
            f"a file of at most {max_bytes:,} bytes, but it has {info.st_size:,}",
            f"最多 {max_bytes:,} 字节的文件，但它有 {info.st_size:,} 字节",
        )
