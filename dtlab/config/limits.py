"""How large, and how finite, each number of a training job may be: refused before any rank starts.

Python reads ``nan``, ``inf`` and ``1e999`` as floats and a hundred digits as
an int, and a rank would meet such a number only when it is too late to say
which option it came from (a ``timedelta`` that overflows, a batch that
cannot be allocated, a seed torch refuses). So every number a
:class:`dtlab.config.TrainConfig` holds, in every field, is checked first:
it must be finite, and within the field's range below (a parallel degree's
ends at the most ranks the job may have), or within :data:`DEFAULT_RANGE`
for a field not listed (a new option is covered the moment it is written).
The field's own rules (``dp`` divides this, ``spike`` is before ``steps``)
come after, in ``TrainConfig.validate``.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing

from dtlab.i18n import ConfigError

POSITIVE = (
    "dp",
    "tp",
    "cp",
    "pp",
    "ep",
    "top_k",
    "micro_batches",
    "virtual_stages",
    "grad_accum",
    "steps",
    "batch_size",
)
"""Counts of something: integers from 1."""
PARALLEL = ("dp", "tp", "cp", "pp", "ep")
"""Parallel degrees: from 1 to the most ranks the job may have (their product is checked after)."""
RANGES: dict[str, tuple[float, float]] = {
    "seq_len": (2, 1024),
    "steps": (1, 1_000_000),
    "warmup": (0, 1_000_000),
    "batch_size": (1, 4096),
    "micro_batches": (1, 4096),
    "grad_accum": (1, 4096),
    "seed": (0, 2**32 - 1),
    "save_every": (1, 1_000_000),
    "timeout_s": (1, 86_400),  # from a second: shorter, an ordinary step already times out
    "spike": (0, 999_999),  # a step, before the last (steps <= 1,000,000)
    "experts": (0, 256),
    "top_k": (1, 256),  # at most the experts
    "capacity_factor": (0.001, 1000),
    "aux_loss_coef": (0, 10),
    "lr": (0, 10),
    "weight_decay": (0, 10),
    "eps": (0, 1),
    "clip_grad": (1e-6, 1_000_000),
    "bucket_mb": (0, 4096),
    "zero3_prefetch": (0, 64),
    "dp_shard": (1, 4096),  # a count of ranks, at most dp (checked after)
    "fp8_amax_history": (0, 1024),  # steps of amax history; 0: current scaling
}
"""Inclusive (lowest, highest) per field, where the default is not the right bound."""
LATER = ("straggler", "betas")
"""Checked for finiteness here; the range of each number in them depends on another field (the world
size) or is half-open, and ``TrainConfig.validate`` states it exactly."""
DEFAULT_RANGE = (-1_000_000, 1_000_000)
"""Any other number: no option of a run on one machine means more than a million of anything (and a
count, in POSITIVE, starts at 1)."""
LOSS_SCALE_MAX = 2.0**127
"""The largest fixed loss scale: fp32 (where the scaled loss lives) overflows near 2**128."""


def check_numbers(config, *, max_ranks: int, limit_reason: tuple[str, str]) -> None:
    """Refuse the first number of ``config`` (a TrainConfig) that is not of its type, finite and in range.

    ``max_ranks`` bounds each parallel degree; ``limit_reason`` says where it comes from (English, Chinese).
    """
    for name in POSITIVE:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(
                f"{name}={value!r} is not allowed; expected a positive integer (1, 2, 3, ...)",
                f"{name}={value!r} 不合法；应为正整数（1、2、3……）",
            )
        if name in PARALLEL and value > max_ranks:
            raise ConfigError(
                f"{name}={value!r} is not allowed; expected an integer from 1 to {max_ranks}: {limit_reason[0]}",
                f"{name}={value!r} 不合法；应为 1 到 {max_ranks} 之间的整数：{limit_reason[1]}",
            )
    hints = typing.get_type_hints(type(config))
    for option in dataclasses.fields(config):
        value = getattr(config, option.name)
        low, high = _range(option.name)
        if (
            _is_int(hints[option.name])
            and value is not None
            and (not isinstance(value, int) or isinstance(value, bool))
        ):
            raise _refuse(option.name, value, True, True, low, high)
        for number in value if isinstance(value, tuple) else (value,):
            if isinstance(number, bool) or not isinstance(number, (int, float)):
                continue
            if not (math.isfinite(number) and (option.name in LATER or low <= number <= high)):
                raise _refuse(
                    option.name,
                    value if isinstance(value, tuple) else number,
                    isinstance(number, int),
                    math.isfinite(number) or option.name in RANGES,
                    low,
                    high,
                )
    _check_loss_scale(config.loss_scale)


def _range(name: str) -> tuple[float, float]:
    """The inclusive range of field ``name``: its own, else a count's (from 1) or :data:`DEFAULT_RANGE`."""
    if name in RANGES:
        return RANGES[name]
    return (1, DEFAULT_RANGE[1]) if name in POSITIVE else DEFAULT_RANGE


def _is_int(hint) -> bool:
    """``int`` or ``int | None`` (a Literal of ints is a choice, checked as one)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return set(typing.get_args(hint)) == {int, type(None)}
    return hint is int


def _refuse(name: str, value, integer: bool, show_range: bool, low, high) -> ConfigError:
    """``name=value`` refused: a finite number expected, and its range where that is the problem."""
    kind_en, kind_zh = ("an integer", "整数") if integer else ("a number", "数")
    if show_range:
        return ConfigError(
            f"{name}={value!r} is not allowed; expected {kind_en} from {low} to {high}",
            f"{name}={value!r} 不合法；应为 {low} 到 {high} 之间的{kind_zh}",
        )
    return ConfigError(
        f"{name}={value!r} is not allowed; expected a finite number (not nan or inf)",
        f"{name}={value!r} 不合法；应为有限的数（不能是 nan 或 inf）",
    )


def _check_loss_scale(text) -> None:
    """``"dynamic"``, or a number: positive, finite, and at most :data:`LOSS_SCALE_MAX`."""
    if text == "dynamic":
        return
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= LOSS_SCALE_MAX):
        raise ConfigError(
            f"loss_scale={text!r} is not allowed; expected 'dynamic' or a number greater than 0 and at most 2**127",
            f"loss_scale={text!r} 不合法；应为 'dynamic' 或大于 0、不超过 2**127 的数",
        )
