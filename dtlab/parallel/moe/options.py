"""Which mixture-of-experts settings a training job may combine, checked before any rank starts.

Torch-free, so that :class:`dtlab.config.TrainConfig` (and the planner
behind it) can refuse a bad combination without importing the engine. Every
refusal names the value and what would be accepted, in English and Chinese.
"""

from __future__ import annotations

from dtlab.i18n import ConfigError


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_experts(config) -> None:
    """Refuse what does not combine: ``config`` is a :class:`dtlab.config.TrainConfig`."""
    E, k, ep = config.experts, config.top_k, config.ep
    if isinstance(E, bool) or not isinstance(E, int) or E < 0:
        raise ConfigError(
            f"experts={E!r} is not allowed; expected an integer >= 0 (0: a dense model)",
            f"experts={E!r} 不合法；应为 >= 0 的整数（0 表示稠密模型）",
        )
    if E == 0:
        _refuse_without_experts(config)
        return
    if k > E:
        raise ConfigError(
            f"top_k={k} is more than the {E} experts (allowed: 1 to {E})",
            f"top_k={k} 超过了专家数 {E}（允许：1 到 {E}）",
        )
    if E % ep:
        raise ConfigError(
            f"ep={ep} does not divide the {E} experts (allowed: {_divisors(E)})",
            f"ep={ep} 不能整除 {E} 个专家（允许：{_divisors(E)}）",
        )
    cf = config.capacity_factor
    if cf is not None and (isinstance(cf, bool) or not isinstance(cf, (int, float)) or not cf > 0):
        raise ConfigError(
            f"capacity_factor={cf!r} is not allowed; expected a number > 0, or None for no limit",
            f"capacity_factor={cf!r} 不合法；应为大于 0 的数，或 None 表示不限",
        )
    if not (isinstance(config.aux_loss_coef, (int, float)) and 0 <= config.aux_loss_coef <= 10):
        raise ConfigError(
            f"aux_loss_coef={config.aux_loss_coef!r} is not allowed; expected a number "
            f"from 0 to 10 (Switch Transformer uses 0.01)",
            f"aux_loss_coef={config.aux_loss_coef!r} 不合法；应为 0 到 10 之间的数（Switch Transformer 用 0.01）",
        )
    if ep > 1 and config.zero > 0:
        raise ConfigError(
            f"ep={ep} with zero={config.zero}: ZeRO shards over the data-parallel group, but under "
            f"expert parallelism the experts live on only some of its ranks (allowed: zero=0 with "
            f"ep > 1, or ep=1 with any ZeRO stage)",
            f"ep={ep} 与 zero={config.zero} 不能同时使用：ZeRO 在数据并行组内分片，而专家并行下专家只在"
            f"其中部分 rank 上（允许：ep > 1 时 zero=0，或 ep=1 时任意 ZeRO 阶段）",
        )
    if config.cp > 1:
        raise ConfigError(
            f"experts with cp={config.cp}: the router counts capacity per whole sequence, and context "
            f"parallelism splits sequences across ranks (allowed: cp=1 with experts)",
            f"experts 与 cp={config.cp} 不能同时使用：路由器按整条序列计算容量，而上下文并行会把序列切到多个"
            f" rank 上（有专家时只允许 cp=1）",
        )
    if config.sp:
        raise ConfigError(
            "experts with sp=True: the router counts capacity per whole sequence, and sequence "
            "parallelism splits sequences across ranks (allowed: sp=False with experts)",
            "experts 与 sp=True 不能同时使用：路由器按整条序列计算容量，而序列并行会把序列切到多个 rank 上"
            "（有专家时只允许 sp=False）",
        )


def _refuse_without_experts(config) -> None:
    """A dense model (experts=0) ignores every expert option: one set away from its default is refused
    (a default is not a choice), naming the option, its flag and what it needs."""
    defaults = type(config).__dataclass_fields__
    names = ("ep", "top_k", "capacity_factor", "aux_loss_coef")
    given = [name for name in names if getattr(config, name) != defaults[name].default]
    if given:
        shown = ", ".join(f"{name}={getattr(config, name)!r} (--{name.replace('_', '-')})" for name in given)
        shown_zh = "、".join(f"{name}={getattr(config, name)!r}（--{name.replace('_', '-')}）" for name in given)
        allowed = ", ".join(f"{name}={defaults[name].default!r}" for name in names)
        raise ConfigError(
            f"{shown} without experts: expert options need a mixture of experts, so set experts (--experts E) "
            f"too (allowed without it: their defaults, {allowed})",
            f"{shown_zh}，但未设置 experts：专家相关选项需要混合专家模型，请同时设置 experts（--experts E）"
            f"（不设置时只允许默认值：{allowed}）",
        )


def parse_capacity(text: str) -> float | None:
    """``"1.25"`` -> 1.25, ``"none"`` -> None: the ``--capacity-factor`` flag's value."""
    if text.strip().lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise ConfigError(
            f"--capacity-factor {text!r}: expected a number > 0 or 'none'",
            f"--capacity-factor {text!r}：应为大于 0 的数或 'none'",
        ) from None
