"""A DeepSpeed ``ds_config.json`` read as dotted keys, each value taken at the type DeepSpeed gives it.

:func:`_read` loads the file (a JSON object, UTF-8), :func:`_flatten` turns
its nested sections into whole dotted names (``zero_optimization.stage``),
and :func:`_get` returns one value at its type or refuses it, naming the key;
:func:`_refuse` words any other refusal the same way. What the values mean
for a TrainConfig is :mod:`dtlab.config.deepspeed`'s.

Every value read must have its type: an integer where DeepSpeed counts
(a float micro-batch is refused), true/false where it switches (the string
"false" would be true in Python), a number, a string, a list of two numbers
for betas. ``"auto"`` is refused with its explanation: it is a placeholder
that Hugging Face's Trainer (or Accelerate) replaces with its own arguments
before DeepSpeed sees the file; DeepSpeed itself, and dtlab, need the value.
"""

from __future__ import annotations

import math
from pathlib import Path

from dtlab.config.safe_paths import read_regular_file, strict_json
from dtlab.i18n import ConfigError

SECTIONS = (
    "zero_optimization",
    "zero_optimization.offload_optimizer",
    "fp16",
    "bf16",
    "optimizer",
    "optimizer.params",
    "scheduler",
    "scheduler.params",
)
"""Keys whose value must be a JSON object, when present."""

AUTO_EN = (
    ' ("auto" is a placeholder that Hugging Face\'s Trainer or Accelerate fills in from its own '
    "arguments before DeepSpeed reads the file; without them, write the value itself)"
)
AUTO_ZH = '（"auto" 是占位符，由 Hugging Face Trainer 或 Accelerate 在 DeepSpeed 读取前用自己的参数填入；没有它们时请直接写出数值）'


MAX_BYTES = 1 << 20
"""The largest DeepSpeed config read (DeepSpeed's own are a few KiB)."""


def _read(path: str | Path) -> dict:
    """The file: a regular file of at most :data:`MAX_BYTES`, JSON without duplicate keys or deep nesting."""
    try:
        tree = strict_json("deepspeed_config", str(path), read_regular_file("deepspeed_config", str(path), MAX_BYTES))
    except ConfigError as error:
        raise ConfigError(
            f"cannot read DeepSpeed config {path}: {error.en}", f"无法读取 DeepSpeed 配置文件 {path}：{error.zh}"
        ) from None
    if not isinstance(tree, dict):
        raise ConfigError(
            f"DeepSpeed config {path}: expected a JSON object {{...}} at the top, got {type(tree).__name__}",
            f"DeepSpeed 配置文件 {path}：顶层应为 JSON 对象 {{...}}，实际是 {type(tree).__name__}",
        )
    return tree


def _flatten(tree: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; a section of :data:`SECTIONS` must be an object."""
    flat = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if path in SECTIONS and not isinstance(value, dict):
            raise _refuse(path, value, "a JSON object {...}", "JSON 对象 {...}")
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


_KINDS = {
    int: ("an integer", "整数"),
    float: ("a number", "数"),
    bool: ("true or false", "true 或 false"),
    str: ("a string", "字符串"),
}


def _get(flat: dict, key: str, kind: type, default=None):
    """``flat[key]`` as ``kind``, or ``default`` when absent; a value of another type is refused.

    JSON's true/false are not integers here, an integer is a number, and a
    number must be finite (Python's json reads ``NaN`` and ``Infinity``).
    """
    if key not in flat:
        return default
    value = flat[key]
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if ok and kind is float and not math.isfinite(value):
        ok = False
    if not ok:
        en, zh = _KINDS[kind]
        auto = flat[key] == "auto"
        raise ConfigError(
            f"{key}={flat[key]!r} in the DeepSpeed config is not allowed; expected {en}" + (AUTO_EN if auto else ""),
            f"DeepSpeed 配置中的 {key}={flat[key]!r} 不合法；应为{zh}" + (AUTO_ZH if auto else ""),
        )
    return value


def _refuse(key: str, value, allowed_en: str, allowed_zh: str) -> ConfigError:
    return ConfigError(
        f"{key}={value!r} in the DeepSpeed config is not allowed; expected {allowed_en}",
        f"DeepSpeed 配置中的 {key}={value!r} 不合法；应为{allowed_zh}",
    )
