"""The planner's mixture-of-experts terms: parameters, model states and the all-to-all.

Symbols: E experts, k experts per token (top-k), N = ep, h hidden size, b
micro-batch (sequences), s sequence length, l MoE layers on a rank, m
micro-batches.

* **Parameters.** Each MoE layer holds E experts (each the MLP it replaces)
  and a router (h x E); a token goes through k of them, so the parameters it
  *uses* (the active ones) grow only by (k - 1) MLPs and the router per layer
  (Switch Transformer, Fedus et al. 2021, Sec. 2; the Mixtral report quotes
  47B total and 13B active for E = 8, k = 2). The counts are
  :meth:`dtlab.planner.Architecture.param_count` and ``active_param_count``;
  FLOPs and MFU use the active weights.
* **Model states.** A rank holds its replicated parameters and E/N of each
  block's experts (:func:`dtlab.planner.params_per_rank`). ZeRO shards the
  first over the dp x cp x ep ranks that replicate them, the experts over dp,
  the ranks that hold the same experts; gradients are averaged likewise.
* **All-to-all.** Per MoE layer and micro-batch the dispatch sends each of
  the b s tokens' k choices (rows of h values) to their experts' ranks and the
  combine brings them back: 2 all-to-alls forward, 2 in backward (their
  gradients), 2 more forward with full recomputation. Routed evenly, each
  carries k b s h values per rank, (N-1)/N of them across the wire, on the
  link an EP group of ``tp * cp * ep`` GPUs spans. dtlab sends only the kept
  choices (at most min(1, capacity factor) of them); GShard-style fixed
  buffers always send capacity factor x that. The small all-to-all of the
  counts before each dispatch is left out.

``work`` below is the plan's summary of the model
(:class:`dtlab.planner.work.Work`): the parameters the fullest rank holds
(``held``, of which ``experts_held``), its blocks, the shape.
"""

from __future__ import annotations

from dtlab.i18n import ConfigError
from dtlab.planner.communication import all_to_all_time
from dtlab.planner.formulas import BYTES_PER_VALUE, model_states_bytes
from dtlab.planner.hardware import Link


def check_experts(arch, layout) -> None:
    """EP needs a model with experts it divides; a token cannot use more experts than there are."""
    experts, top_k = (arch.experts, arch.top_k) if arch is not None else (layout.experts, 1)
    if layout.ep > 1 and (arch is None or not experts or experts % layout.ep):
        allowed = [d for d in range(1, experts + 1) if experts % d == 0] if experts else [1]
        raise ConfigError(
            f"ep = {layout.ep} needs a model shape with experts that ep divides, got {experts} experts "
            f"(allowed: ep in {allowed})",
            f"ep = {layout.ep} 需要一个有专家且专家数能被 ep 整除的模型形状，当前专家数为 {experts}"
            f"（允许：ep 取 {allowed}）",
        )
    if experts and not 1 <= top_k <= experts:
        raise ConfigError(
            f"top_k = {top_k} must be from 1 to the {experts} experts",
            f"top_k = {top_k} 必须在 1 到专家数 {experts} 之间",
        )


def model_states(work, layout, count=model_states_bytes) -> dict[str, int]:
    """ZeRO's model states: the replicated parameters over dp x cp x ep ranks, the experts over dp.

    ``count`` splits them into categories: the paper's (:func:`model_states_bytes`)
    or dtlab's (:func:`dtlab.planner.formulas.dtlab_model_states_bytes`)."""
    dense = count(
        work.held - work.experts_held,
        dp=layout.zero_ranks,  # dp x cp x ep, or hybrid sharding's K
        zero=layout.zero,
        precision=layout.precision,
    )
    experts = count(work.experts_held, dp=layout.dp, zero=layout.zero, precision=layout.precision)
    return {kind: dense[kind] + experts[kind] for kind in dense}


def dispatch_bytes(
    *,
    micro_batch: int,
    seq_len: int,
    hidden: int,
    top_k: int,
    bytes_per_value: int,
    capacity_factor: float | None = None,
) -> float:
    """Bytes one rank feeds into one dispatch (or combine) all-to-all: k b s h values, fewer
    when the capacity factor is below 1 (dtlab sends only the kept choices)."""
    kept = 1.0 if capacity_factor is None else min(1.0, capacity_factor)
    return kept * top_k * micro_batch * seq_len * hidden * bytes_per_value


def all_to_all_calls(*, layers: int, micro_batches: int, recompute: str = "none") -> int:
    """All-to-alls of tokens per iteration on a rank: 2 forward, 2 backward (+2 recomputed) per
    MoE layer and micro-batch."""
    return (6 if recompute == "full" else 4) * layers * micro_batches


def expert_parallel_comm_time(
    nbytes: float, *, ep: int, layers: int, micro_batches: int, link: Link, recompute: str = "none"
) -> float:
    """Seconds of EP all-to-all per iteration on one rank (a prediction); ``nbytes`` is
    :func:`dispatch_bytes`."""
    if ep == 1:
        return 0.0
    calls = all_to_all_calls(layers=layers, micro_batches=micro_batches, recompute=recompute)
    return calls * all_to_all_time(nbytes, ep, link)


def all_to_all_bytes_sent(nbytes: float, *, ep: int, layers: int, micro_batches: int, recompute: str = "none") -> float:
    """Bytes one rank puts on the wire for EP per iteration: (N-1)/N of every all-to-all's input."""
    calls = all_to_all_calls(layers=layers, micro_batches=micro_batches, recompute=recompute)
    return calls * nbytes * (ep - 1) / ep


def _plan_dispatch_bytes(work, layout, micro_batch_size: int) -> float:
    return dispatch_bytes(
        micro_batch=micro_batch_size,
        seq_len=work.seq_len,
        hidden=work.hidden,
        top_k=work.arch.top_k,
        bytes_per_value=BYTES_PER_VALUE[layout.precision],
    )


def all_to_all_bytes(work, layout, micro_batch_size: int) -> int:
    """The plan's all-to-all volume: bytes on the wire per rank per iteration (0 without EP)."""
    if layout.ep == 1 or work.arch is None:
        return 0
    return round(
        all_to_all_bytes_sent(
            _plan_dispatch_bytes(work, layout, micro_batch_size),
            ep=layout.ep,
            layers=work.blocks,
            micro_batches=layout.micro_batches,
            recompute=layout.recompute,
        )
    )


def expert_parallel_time(work, layout, micro_batch_size: int, link: Link) -> float:
    """The plan's EP communication time per iteration on the fullest stage's ranks."""
    return expert_parallel_comm_time(
        _plan_dispatch_bytes(work, layout, micro_batch_size),
        ep=layout.ep,
        layers=work.blocks,
        micro_batches=layout.micro_batches,
        link=link,
        recompute=layout.recompute,
    )
