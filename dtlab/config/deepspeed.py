"""Read a DeepSpeed ``ds_config.json`` into a TrainConfig, faithfully or not at all.

Many learners meet ZeRO through DeepSpeed's JSON config first, so dtlab reads
the keys that map to its own options, and lists every key it ignores (by its
whole dotted name) rather than pretending to honour it. Key names and
meanings follow DeepSpeed's configuration documentation
(deepspeed.ai/docs/config-json) and its ``deepspeed/runtime/config.py``:

    train_batch_size, train_micro_batch_size_per_gpu,   -> batch_size, grad_accum; with two of the
    gradient_accumulation_steps                            three DeepSpeed derives the third, and
                                                           without --dp, dp = train_batch_size /
                                                           (micro x accumulation), the ranks DeepSpeed
                                                           would be launched on
    zero_optimization.stage                              -> zero
    zero_optimization.offload_optimizer.device           "cpu" -> offload
    fp16.enabled, bf16.enabled                           -> precision
    fp16.loss_scale                                      0 -> dynamic, else a static scale
    optimizer.type                                       Adam or AdamW (dtlab trains with AdamW)
    optimizer.params.lr, .betas, .eps, .weight_decay     -> lr, betas, eps, weight_decay
    optimizer.params.adam_w_mode                         false (Adam's L2 decay) refused with decay
    gradient_clipping                                    -> clip_grad (0: off, DeepSpeed's default)
    scheduler.type, scheduler.params                     WarmupLR, WarmupDecayLR, WarmupCosineLR ->
                                                           lr_schedule (dtlab/numerics/lr_schedule.py); no
                                                           scheduler: a constant rate, as DeepSpeed

Every value read must have its type, and ``"auto"`` is refused with its
explanation: the file is read, flattened to dotted keys and typed in
:mod:`dtlab.config.deepspeed_json`; this module maps those keys to TrainConfig.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from dtlab.config import TrainConfig
from dtlab.config.deepspeed_json import _flatten, _get, _read, _refuse
from dtlab.config.rank_limit import local_rank_limit
from dtlab.i18n import ConfigError
from dtlab.numerics.lr_schedule import DeepSpeedSchedule

SCHEDULER_PARAMS = {
    "WarmupLR": {
        "warmup_min_lr": float,
        "warmup_max_lr": float,
        "warmup_num_steps": int,
        "warmup_type": str,
        "last_batch_iteration": int,
    },
    "WarmupDecayLR": {
        "total_num_steps": int,
        "warmup_min_lr": float,
        "warmup_max_lr": float,
        "warmup_num_steps": int,
        "warmup_type": str,
        "last_batch_iteration": int,
    },
    "WarmupCosineLR": {
        "total_num_steps": int,
        "warmup_min_ratio": float,
        "warmup_num_steps": int,
        "cos_min_ratio": float,
        "warmup_type": str,
        "last_batch_iteration": int,
    },
}
"""The keyword arguments of each DeepSpeed scheduler's constructor (any other is DeepSpeed's TypeError)."""
USED = {
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "train_batch_size",
    "zero_optimization.stage",
    "zero_optimization.offload_optimizer.device",
    "fp16.enabled",
    "bf16.enabled",
    "fp16.loss_scale",
    "optimizer.type",
    "optimizer.params.lr",
    "optimizer.params.betas",
    "optimizer.params.eps",
    "optimizer.params.weight_decay",
    "optimizer.params.adam_w_mode",
    "gradient_clipping",
    "scheduler.type",
    "zero_optimization.reduce_bucket_size",
}


SOURCES = {
    "batch_size": "train_batch_size",
    "grad_accum": "gradient_accumulation_steps",
    "zero": "zero_optimization.stage",
    "bucket_mb": "zero_optimization.reduce_bucket_size",
    "offload": "zero_optimization.offload_optimizer.device",
    "precision": "fp16.enabled/bf16.enabled",
    "loss_scale": "fp16.loss_scale",
    "lr": "optimizer.params.lr/scheduler.params.warmup_max_lr",
    "eps": "optimizer.params.eps",
    "betas": "optimizer.params.betas",
    "clip_grad": "gradient_clipping",
}
"""The DeepSpeed keys each TrainConfig field is read from (named when a typed flag disagrees)."""


def config_from_deepspeed(
    path: str | Path,
    base: TrainConfig,
    *,
    dp_given: bool = True,
    max_ranks: int | None = None,
    given: frozenset[str] = frozenset(),
) -> tuple[TrainConfig, list[str]]:
    """``base`` (the command line's config) updated from the DeepSpeed file at ``path``.

    Returns the new config and the sorted whole names of the keys dtlab does
    not act on. Only what the file says changes: a key it lacks leaves the
    command line's value (a file without a scheduler keeps the optimizer's
    rate, as DeepSpeed does, unless ``--warmup`` was typed). ``given``: the
    fields whose flag was typed (:func:`dtlab.config.flags.given_options`);
    where the file says otherwise, both are named and refused.
    ``dp_given=False`` (no ``--dp``): the data-parallel degree is
    inferred from the batch keys, and refused if the local pool cannot start
    that many ranks (``max_ranks``: torchrun's world size; None: the local pool's
    limit, ``DTLAB_MAX_RANKS``). Any value of the wrong type, a file that is not a JSON
    object, or not UTF-8, is refused naming the key or the file.
    """
    flat = _flatten(_read(path))
    changes = _batch(flat, base, dp_given, max_ranks or local_rank_limit())
    changes.update(_zero_and_precision(flat))
    changes.update(_optimizer(flat))
    if "gradient_clipping" in flat:
        clip = _get(flat, "gradient_clipping", float)
        if clip < 0:
            raise _refuse(
                "gradient_clipping", clip, "a number >= 0 (0: no clipping)", "大于等于 0 的数（0 表示不裁剪）"
            )
        changes["clip_grad"] = clip or None
    changes.update(_file_schedule(flat, base, changes, given))
    kind = changes["lr_schedule"].kind if "lr_schedule" in changes else None
    used = USED | {f"scheduler.params.{k}" for k in SCHEDULER_PARAMS.get(kind, ())}
    # reduce_bucket_size, elements of fp32 gradient -> MiB: DP's buckets and ZeRO-2's (bucket_mb) at
    # stages 0 and 2; dtlab's ZeRO-1 (the whole flat gradient at once) and ZeRO-3 (unit by unit) use
    # no bucket: ignored there
    if changes.get("zero", base.zero) in (1, 3):
        used = used - {"zero_optimization.reduce_bucket_size"}
    elif "zero_optimization.reduce_bucket_size" in flat:
        changes["bucket_mb"] = _get(flat, "zero_optimization.reduce_bucket_size", float) * 4 / 2**20
    _refuse_disagreements(base, changes, given)
    ignored = sorted(k for k in flat if k not in used)
    return dataclasses.replace(base, **changes), ignored


def _file_schedule(flat: dict, base: TrainConfig, changes: dict, given: frozenset[str]) -> dict:
    """``lr_schedule`` (and the peak ``lr`` of WarmupLR and WarmupDecayLR) as the file and the flags say.

    No scheduler in the file: DeepSpeed's constant rate, unless ``--warmup``
    was typed (then dtlab's warmup and cosine decay, as typed). A scheduler in
    the file and ``--warmup`` typed: refused, both named. WarmupLR's and
    WarmupDecayLR's peak is the file's ``warmup_max_lr``; without it, the
    typed ``--lr``, else DeepSpeed's default (0.001).
    """
    if "scheduler.type" not in flat:
        return {} if "warmup" in given else {"lr_schedule": DeepSpeedSchedule("constant")}
    if "warmup" in given:
        kind = flat["scheduler.type"]
        raise ConfigError(
            f"--warmup {base.warmup} and the DeepSpeed config's scheduler.type={kind!r} both set the "
            f"learning-rate schedule (allowed: one of them; drop --warmup or the file's scheduler)",
            f"--warmup {base.warmup} 与 DeepSpeed 配置中的 scheduler.type={kind!r} 都在设定学习率调度"
            f"（只能二选一：去掉 --warmup 或文件中的 scheduler）",
        )
    peak = base.lr if "lr" in given else DeepSpeedSchedule("WarmupLR").warmup_max_lr
    schedule = _schedule(flat, changes.get("lr", base.lr), peak)
    found = {"lr_schedule": schedule}
    if schedule.kind in ("WarmupLR", "WarmupDecayLR"):
        found["lr"] = schedule.warmup_max_lr  # the peak, as the record's lr reaches it
    return found


def _refuse_disagreements(base: TrainConfig, changes: dict, given: frozenset[str]) -> None:
    """A typed flag the file contradicts is refused, naming the flag, its value and the file's key."""
    for name, value in changes.items():
        typed = getattr(base, name)
        if name not in given or name not in SOURCES or _same(typed, value):
            continue
        flag = "--" + name.replace("_", "-")
        raise ConfigError(
            f"{flag} {typed} disagrees with the DeepSpeed config's {SOURCES[name]}, which gives "
            f"{name}={value!r} (allowed: the same value in both, or only one of them)",
            f"{flag} {typed} 与 DeepSpeed 配置中的 {SOURCES[name]} 不一致，后者给出 {name}={value!r}"
            f"（两处的值须相同，或只保留其一）",
        )


def _same(a, b) -> bool:
    """Equal values, a typed number and the file's compared as numbers ('1024' and 1024.0 alike)."""
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return a == b


def _batch(flat: dict, base: TrainConfig, dp_given: bool, limit: int) -> dict:
    """batch_size, grad_accum (and dp if not given), by DeepSpeed's rules for the three batch keys.

    DeepSpeed needs train_batch_size = micro x accumulation x data-parallel
    ranks; given two of the first three it derives the third, given one it
    takes accumulation 1 (``DeepSpeedConfig._set_batch_related_parameters``).
    """
    total = _get(flat, "train_batch_size", int)
    micro = _get(flat, "train_micro_batch_size_per_gpu", int)
    accum = _get(flat, "gradient_accumulation_steps", int)
    for key, value in (
        ("train_batch_size", total),
        ("train_micro_batch_size_per_gpu", micro),
        ("gradient_accumulation_steps", accum),
    ):
        if value is not None and value < 1:
            raise _refuse(key, value, "an integer >= 1", "大于等于 1 的整数")
    if total is None and micro is None:
        return {} if accum is None else {"grad_accum": accum}
    dp = base.dp
    if not dp_given and total is not None and micro is not None:
        per_rank = micro * (accum or 1)
        if total % per_rank:
            raise ConfigError(
                f"train_batch_size={total} is not a multiple of train_micro_batch_size_per_gpu x "
                f"gradient_accumulation_steps = {per_rank}: no number of data-parallel ranks gives it",
                f"train_batch_size={total} 不是 train_micro_batch_size_per_gpu x gradient_accumulation_steps"
                f" = {per_rank} 的倍数：没有哪个数据并行 rank 数能得到它",
            )
        dp, others = total // per_rank, base.world_size // base.dp
        if dp * others > limit:
            raise ConfigError(
                f"the DeepSpeed config implies dp = train_batch_size / (micro x accumulation) = {total} / "
                f"{per_rank} = {dp} data-parallel ranks (x {others} = {dp * others}), but at most {limit} "
                f"can run here (the local pool's DTLAB_MAX_RANKS, or torchrun's processes); pass --dp N "
                f"and dtlab keeps the global batch, or lower train_batch_size",
                f"DeepSpeed 配置意味着 dp = train_batch_size / (micro x accumulation) = {total} / {per_rank} = "
                f"{dp} 个数据并行 rank（x {others} = {dp * others}），但这里最多只能运行 {limit} 个（本地进程池的 "
                f"DTLAB_MAX_RANKS，或 torchrun 启动的进程数）；请用 --dp N 指定（dtlab 保持全局 batch 不变），"
                f"或调小 train_batch_size",
            )
    if total is not None and micro is not None and accum is None:
        accum = max(1, total // micro // dp)
    elif total is not None and micro is None:
        accum = accum or 1
        micro = total // dp // accum
    elif total is None:
        accum = accum or 1
        total = micro * accum * dp
    if total != micro * accum * dp or micro < 1:
        raise ConfigError(
            f"train_batch_size={total} but train_micro_batch_size_per_gpu x gradient_accumulation_steps "
            f"x dp = {micro} x {accum} x {dp} = {micro * accum * dp} (allowed: equal values, as DeepSpeed "
            f"requires)",
            f"train_batch_size={total}，但 train_micro_batch_size_per_gpu x gradient_accumulation_steps "
            f"x dp = {micro} x {accum} x {dp} = {micro * accum * dp}（DeepSpeed 要求二者相等）",
        )
    return {"dp": dp, "batch_size": total, "grad_accum": accum}


def _zero_and_precision(flat: dict) -> dict:
    changes = {}
    if "zero_optimization.stage" in flat:
        changes["zero"] = _get(flat, "zero_optimization.stage", int)
    device = _get(flat, "zero_optimization.offload_optimizer.device", str)
    if device not in (None, "none", "cpu"):
        raise _refuse(
            "zero_optimization.offload_optimizer.device",
            device,
            "'cpu' or 'none' (dtlab offloads to 'cpu' only)",
            "'cpu' 或 'none'（dtlab 只支持卸载到 'cpu'）",
        )
    if device is not None:
        changes["offload"] = device == "cpu"
    fp16, bf16 = _get(flat, "fp16.enabled", bool, False), _get(flat, "bf16.enabled", bool, False)
    if fp16 and bf16:
        raise ConfigError(
            "fp16.enabled and bf16.enabled are both true (allowed: at most one)",
            "fp16.enabled 与 bf16.enabled 同时为 true（最多只能开启一个）",
        )
    if fp16:
        scale = _get(flat, "fp16.loss_scale", float, 0)
        changes.update(precision="fp16", loss_scale="dynamic" if not scale else repr(scale))
    elif bf16:
        changes["precision"] = "bf16"
    return changes


def _optimizer(flat: dict) -> dict:
    kind = _get(flat, "optimizer.type", str, "AdamW")
    if kind.lower() not in ("adam", "adamw"):  # DeepSpeed compares the name in lower case
        raise _refuse(
            "optimizer.type",
            kind,
            "'Adam' or 'AdamW' (dtlab trains with AdamW)",
            "'Adam' 或 'AdamW'（dtlab 使用 AdamW）",
        )
    changes = {
        name: _get(flat, f"optimizer.params.{name}", float)
        for name in ("lr", "eps", "weight_decay")
        if f"optimizer.params.{name}" in flat
    }
    betas = flat.get("optimizer.params.betas")
    if betas is not None:
        if not (
            isinstance(betas, list)
            and len(betas) == 2
            and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in betas)
        ):
            raise _refuse(
                "optimizer.params.betas", betas, "a list of two numbers [beta1, beta2]", "两个数的列表 [beta1, beta2]"
            )
        changes["betas"] = (float(betas[0]), float(betas[1]))
    # DeepSpeed's Adam is AdamW unless adam_w_mode is false: then weight decay is Adam's L2 term.
    if (
        kind.lower() == "adam"
        and not _get(flat, "optimizer.params.adam_w_mode", bool, True)
        and changes.get("weight_decay")
    ):
        raise ConfigError(
            "optimizer.params.adam_w_mode=false with weight_decay: that is Adam with L2 "
            "regularisation, and dtlab trains with AdamW's decoupled decay (allowed: "
            "adam_w_mode true, or weight_decay 0)",
            "optimizer.params.adam_w_mode=false 且设置了 weight_decay：那是带 L2 正则的 Adam，"
            "而 dtlab 使用 AdamW 的解耦权重衰减（允许：adam_w_mode 为 true，或 weight_decay 为 0）",
        )
    return changes


def _schedule(flat: dict, base_lr: float, peak: float) -> DeepSpeedSchedule:
    """The file's scheduler as a :class:`~dtlab.numerics.lr_schedule.DeepSpeedSchedule`.

    ``peak``: WarmupLR's and WarmupDecayLR's ``warmup_max_lr`` when the file has none.
    """
    kind = _get(flat, "scheduler.type", str)
    if kind not in SCHEDULER_PARAMS:
        raise _refuse("scheduler.type", kind, f"one of {sorted(SCHEDULER_PARAMS)}", f"{sorted(SCHEDULER_PARAMS)} 之一")
    allowed = SCHEDULER_PARAMS[kind]
    given = {k.removeprefix("scheduler.params."): v for k, v in flat.items() if k.startswith("scheduler.params.")}
    for key in given:
        if key not in allowed:  # DeepSpeed passes the params to the constructor: a TypeError there
            raise _refuse(
                f"scheduler.params.{key}",
                given[key],
                f"a parameter of {kind}: {sorted(allowed)}",
                f"{kind} 的参数之一：{sorted(allowed)}",
            )
    params = {k: _get(flat, f"scheduler.params.{k}", kind_) for k, kind_ in allowed.items() if k in given}
    if params.pop("last_batch_iteration", -1) != -1:
        raise _refuse(
            "scheduler.params.last_batch_iteration",
            given["last_batch_iteration"],
            "-1 (a fresh run; dtlab resumes with --resume)",
            "-1（全新运行；dtlab 用 --resume 续训）",
        )
    if params.get("warmup_type", "log") not in ("log", "linear"):
        raise _refuse("scheduler.params.warmup_type", params["warmup_type"], "'log' or 'linear'", "'log' 或 'linear'")
    if "total_num_steps" in allowed and "total_num_steps" not in params:
        raise ConfigError(
            f"scheduler {kind} needs scheduler.params.total_num_steps (DeepSpeed requires it)",
            f"调度器 {kind} 需要 scheduler.params.total_num_steps（DeepSpeed 要求提供）",
        )
    if kind != "WarmupCosineLR":
        params.setdefault("warmup_max_lr", peak)
    schedule = DeepSpeedSchedule(kind, **params)
    if not all(math.isfinite(schedule.lr(step, base_lr)) for step in range(3)):
        raise ConfigError(
            f"scheduler {kind}: its parameters give no finite learning rate", f"调度器 {kind}：其参数得不到有限的学习率"
        )
    return schedule
