"""Read the common subset of a DeepSpeed ``ds_config.json`` into a TrainConfig.

Many learners meet ZeRO through DeepSpeed's JSON config first, so dtlab reads
the keys that map to its own options, and lists every key it ignores rather
than pretending to honour it. Key names follow DeepSpeed's configuration
documentation (deepspeed.ai/docs/config-json).

    train_micro_batch_size_per_gpu      sequences per rank per micro-step
    gradient_accumulation_steps         -> grad_accum
    train_batch_size                    checked: = micro x accumulation x dp
    zero_optimization.stage             -> zero
    zero_optimization.offload_optimizer.device   "cpu" -> offload
    fp16.enabled / bf16.enabled         -> precision
    fp16.loss_scale                     0 -> dynamic, else a static scale
    optimizer.params.lr                 -> lr
    zero_optimization.reduce_bucket_size  elements -> bucket_mb (x 4 bytes of fp32 gradient)
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from dtlab.config import TrainConfig
from dtlab.i18n import ConfigError

USED = {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
        "zero_optimization.stage", "zero_optimization.offload_optimizer.device",
        "fp16.enabled", "bf16.enabled", "fp16.loss_scale", "optimizer.params.lr", "optimizer.type",
        "zero_optimization.reduce_bucket_size"}


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def config_from_deepspeed(path: str | Path, base: TrainConfig) -> tuple[TrainConfig, list[str]]:
    """``base`` (layout, steps, seed from the command line) updated from the DeepSpeed file.

    Returns the new config and the sorted list of keys dtlab ignored. Each key
    dtlab reads must hold a value of its type (an integer, a number, true or
    false, a string); anything else, ``"auto"`` included (Hugging Face's
    Trainer fills those in; DeepSpeed itself needs numbers), is refused
    naming the key and the value.
    """
    try:
        tree = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:   # ValueError: bad JSON, or bytes that are not UTF-8
        raise ConfigError(f"cannot read DeepSpeed config {path}: {error}",
                          f"无法读取 DeepSpeed 配置文件 {path}：{error}") from error
    if not isinstance(tree, dict):
        raise ConfigError(f"DeepSpeed config {path}: expected a JSON object {{...}} at the top, "
                          f"got {type(tree).__name__}",
                          f"DeepSpeed 配置文件 {path}：顶层应为 JSON 对象 {{...}}，实际是 {type(tree).__name__}")
    flat = _flatten(tree)
    changes: dict = {}
    accum = _get(flat, "gradient_accumulation_steps", int, base.grad_accum)
    changes["grad_accum"] = accum
    if "train_micro_batch_size_per_gpu" in flat:
        changes["batch_size"] = _get(flat, "train_micro_batch_size_per_gpu", int) * accum * base.dp
    total = _get(flat, "train_batch_size", int)
    if total is not None and "batch_size" in changes and total != changes["batch_size"]:
        raise ConfigError(
            f"train_batch_size={total} but train_micro_batch_size_per_gpu x gradient_accumulation_steps "
            f"x dp = {changes['batch_size']} (allowed: equal values, as DeepSpeed requires)",
            f"train_batch_size={total}，但 train_micro_batch_size_per_gpu x gradient_accumulation_steps "
            f"x dp = {changes['batch_size']}（DeepSpeed 要求二者相等）")
    if total is not None and "batch_size" not in changes:
        changes["batch_size"] = total
    if "zero_optimization.stage" in flat:
        changes["zero"] = _get(flat, "zero_optimization.stage", int)
    device = _get(flat, "zero_optimization.offload_optimizer.device", str)
    if device not in (None, "none", "cpu"):
        raise ConfigError(f"zero_optimization.offload_optimizer.device={device!r}: dtlab offloads "
                          f"to 'cpu' only (allowed: 'cpu' or 'none')",
                          f"zero_optimization.offload_optimizer.device={device!r}：dtlab 只支持卸载到 'cpu'"
                          f"（允许：'cpu' 或 'none'）")
    changes["offload"] = device == "cpu"
    fp16, bf16 = _get(flat, "fp16.enabled", bool, False), _get(flat, "bf16.enabled", bool, False)
    if fp16 and bf16:
        raise ConfigError("fp16.enabled and bf16.enabled are both true (allowed: at most one)",
                          "fp16.enabled 与 bf16.enabled 同时为 true（最多只能开启一个）")
    if fp16:
        changes["precision"] = "fp16"
        scale = _get(flat, "fp16.loss_scale", float, 0)
        changes["loss_scale"] = "dynamic" if not scale else repr(scale)
    elif bf16:
        changes["precision"] = "bf16"
    if "zero_optimization.reduce_bucket_size" in flat:   # elements of fp32 gradient -> MiB
        changes["bucket_mb"] = _get(flat, "zero_optimization.reduce_bucket_size", float) * 4 / 2**20
    if "optimizer.params.lr" in flat:
        changes["lr"] = _get(flat, "optimizer.params.lr", float)
    optimizer = _get(flat, "optimizer.type", str, "AdamW")
    if optimizer not in ("Adam", "AdamW"):
        raise ConfigError(f"optimizer.type={optimizer!r}: dtlab trains with AdamW (allowed: 'Adam' or 'AdamW')",
                          f"optimizer.type={optimizer!r}：dtlab 使用 AdamW（允许：'Adam' 或 'AdamW'）")
    ignored = sorted(k for k in flat if k not in USED)
    return dataclasses.replace(base, **changes), ignored


_KINDS = {int: ("an integer", "整数"), float: ("a number", "数"), bool: ("true or false", "true 或 false"),
          str: ("a string", "字符串")}


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
        raise ConfigError(f"{key}={flat[key]!r} in the DeepSpeed config is not allowed; expected {en}"
                          + (" (\"auto\" is for Hugging Face's Trainer to fill in)" if flat[key] == "auto" else ""),
                          f"DeepSpeed 配置中的 {key}={flat[key]!r} 不合法；应为{zh}"
                          + ("（\"auto\" 需由 Hugging Face Trainer 填入）" if flat[key] == "auto" else ""))
    return value
