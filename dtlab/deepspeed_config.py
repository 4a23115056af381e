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
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from dtlab.config import TrainConfig
from dtlab.i18n import ConfigError

USED = {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
        "zero_optimization.stage", "zero_optimization.offload_optimizer.device",
        "fp16.enabled", "bf16.enabled", "fp16.loss_scale", "optimizer.params.lr", "optimizer.type"}


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

    Returns the new config and the sorted list of keys dtlab ignored.
    """
    try:
        tree = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"cannot read DeepSpeed config {path}: {error}",
                          f"无法读取 DeepSpeed 配置文件 {path}：{error}") from error
    flat = _flatten(tree)
    changes: dict = {}
    accum = int(flat.get("gradient_accumulation_steps", base.grad_accum))
    changes["grad_accum"] = accum
    if "train_micro_batch_size_per_gpu" in flat:
        changes["batch_size"] = int(flat["train_micro_batch_size_per_gpu"]) * accum * base.dp
    total = flat.get("train_batch_size")
    if total is not None and "batch_size" in changes and int(total) != changes["batch_size"]:
        raise ConfigError(
            f"train_batch_size={total} but train_micro_batch_size_per_gpu x gradient_accumulation_steps "
            f"x dp = {changes['batch_size']} (allowed: equal values, as DeepSpeed requires)",
            f"train_batch_size={total}，但 train_micro_batch_size_per_gpu x gradient_accumulation_steps "
            f"x dp = {changes['batch_size']}（DeepSpeed 要求二者相等）")
    if total is not None and "batch_size" not in changes:
        changes["batch_size"] = int(total)
    if "zero_optimization.stage" in flat:
        changes["zero"] = int(flat["zero_optimization.stage"])
    device = flat.get("zero_optimization.offload_optimizer.device")
    if device not in (None, "none", "cpu"):
        raise ConfigError(f"zero_optimization.offload_optimizer.device={device!r}: dtlab offloads "
                          f"to 'cpu' only (allowed: 'cpu' or 'none')",
                          f"zero_optimization.offload_optimizer.device={device!r}：dtlab 只支持卸载到 'cpu'"
                          f"（允许：'cpu' 或 'none'）")
    changes["offload"] = device == "cpu"
    if flat.get("fp16.enabled") and flat.get("bf16.enabled"):
        raise ConfigError("fp16.enabled and bf16.enabled are both true (allowed: at most one)",
                          "fp16.enabled 与 bf16.enabled 同时为 true（最多只能开启一个）")
    if flat.get("fp16.enabled"):
        changes["precision"] = "fp16"
        scale = flat.get("fp16.loss_scale", 0)
        changes["loss_scale"] = "dynamic" if not scale else str(scale)
    elif flat.get("bf16.enabled"):
        changes["precision"] = "bf16"
    if "optimizer.params.lr" in flat:
        changes["lr"] = float(flat["optimizer.params.lr"])
    if flat.get("optimizer.type", "AdamW") not in ("Adam", "AdamW"):
        raise ConfigError(f"optimizer.type={flat['optimizer.type']!r}: dtlab trains with AdamW "
                          f"(allowed: 'Adam' or 'AdamW')",
                          f"optimizer.type={flat['optimizer.type']!r}：dtlab 使用 AdamW（允许：'Adam' 或 'AdamW'）")
    ignored = sorted(k for k in flat if k not in USED)
    return dataclasses.replace(base, **changes), ignored
