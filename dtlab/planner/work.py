"""What a plan is computed from: the model, summed up as the fullest rank sees it.

:class:`Work` holds what :func:`dtlab.planner.predict.plan` needs of the model
under one layout: the parameters the fullest (stage, TP rank) holds, the
FLOPs of one iteration, and the activations the fullest stage keeps for
backward. :func:`work_from_architecture` computes it from a shape
(:mod:`dtlab.planner.architectures`, Korthikanti et al.'s activations);
:func:`work_from_params` from a bare parameter count, when only model-state
memory and 2Ψ FLOPs per token are known. :func:`architecture_for` turns what
``plan()`` was given into the Architecture (or None for a count).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dtlab.config.layout import Layout, check_positive_int
from dtlab.i18n import ConfigError
from dtlab.parallel.pipeline.schedule import peak_layers_in_flight, stage_layers
from dtlab.planner.architectures import Architecture, as_architecture, params_per_rank, with_options
from dtlab.planner.formulas import (
    BYTES_PER_VALUE,
    activation_bytes_per_layer,
    attention_core_flops,
    flops_per_iteration,
    model_flops_per_token,
)
from dtlab.planner.local import saved_activation_bytes


@dataclass(frozen=True)
class Work:
    """What the fullest rank holds and what the whole iteration computes."""

    name: str
    params: int
    held: int  # parameters on the fullest (stage, TP rank), its experts included
    experts_held: int  # of which experts (averaged over dp only, not dp x ep)
    seq_len: int
    hidden: int  # 0 when only a parameter count is known
    kv_dim: int  # width of K (and of V): hidden, or less with grouped-query attention
    blocks: int  # blocks on stage 0, the fullest
    flops: int  # hardware FLOPs, recomputation included
    model_flops: int  # MFU's numerator
    activations: int  # bytes held for backward on the fullest stage
    notes: tuple[str, ...] = ()
    active: int = 0  # parameters a token uses (0: as params)
    arch: Architecture | None = None
    attention_flops: int = 0  # of flops, the attention core's (QK^T, attention over V); 0 without a shape


ASSUMED_SEQ_LEN = 2048
"""Tokens per sequence a plan from a bare parameter count assumes for FLOPs and step time when given none
(GPT-3's and Megatron-LM's context); its memory (model states only) does not depend on it."""


def architecture_for(model, seq_len: int | None, layout: Layout, **options) -> Architecture | None:
    """The model as an Architecture with ``options`` and the layout's experts (they win) applied;
    None for a bare parameter count (checked, with seq_len)."""
    if isinstance(model, Layout):
        raise ConfigError(
            "plan()'s first argument is the model, its second the layout: dtlab.plan('small', "
            "config.layout), or layout=config.layout",
            "plan() 的第一个参数是模型，第二个才是布局："
            "dtlab.plan('small', config.layout)，或写成 layout=config.layout",
        )
    if isinstance(model, int) and not isinstance(model, bool):
        check_positive_int("params", model)
        if seq_len is not None:
            check_positive_int("seq_len", seq_len)
        return with_options(None, **options)
    arch = with_options(as_architecture(model, seq_len=seq_len), **options)
    if layout.experts and layout.experts != arch.experts:
        arch = dataclasses.replace(arch, experts=layout.experts)
    return arch


def work_from_params(params: int, seq_len: int | None, layout: Layout, batch_size: int) -> Work:
    """Only Ψ is known: TP and PP assumed to split it evenly, 2Ψ FLOPs per token forward."""
    notes = (
        "model given by params only: activations, TP and PP communication need the "
        "shape and are left at 0 / 只给了参数量：激活、TP 与 PP 通信需要模型形状，记为 0",
    )
    if seq_len is None:
        seq_len = ASSUMED_SEQ_LEN
        notes += (
            f"no seq_len given: FLOPs, step time and tokens/s assume {seq_len} tokens per sequence; "
            f"memory does not depend on it / 未给 seq_len：FLOPs、单步时间与每秒 token 数按每条序列 "
            f"{seq_len} 个 token 估算；显存与它无关",
        )
    passes = 4 if layout.recompute == "full" else 3  # forward + backward (2x), + forward again
    return Work(
        name="custom",
        params=params,
        held=-(-params // (layout.tp * layout.pp)),
        experts_held=0,
        seq_len=seq_len,
        hidden=0,
        kv_dim=0,
        blocks=0,
        flops=batch_size * seq_len * 2 * params * passes,
        model_flops=batch_size * seq_len * model_flops_per_token(params),
        activations=0,
        notes=notes,
    )


def work_from_architecture(arch: Architecture, layout: Layout, batch_size: int, *, local: bool = False) -> Work:
    """Parameters on the fullest rank, FLOPs, and the activations the fullest stage holds (``local``: as
    dtlab's meter counts them on this machine, where :func:`saved_activation_bytes` applies)."""
    s, pp, m = arch.seq_len, layout.pp, layout.micro_batches
    stages = stage_layers(arch.layers, pp)
    per_layer = activation_bytes_per_layer(
        seq_len=s,
        micro_batch=batch_size // (layout.dp * layout.ep * m),
        hidden=arch.hidden,
        heads=arch.heads,
        tp=layout.tp,
        sequence_parallel=layout.sp,
        recompute=layout.recompute,
        cp=layout.cp,
    )
    layer_microbatches = peak_layers_in_flight(  # (layer, micro-batch) pairs the fullest stage holds
        arch.layers, layout.schedule, pp, m, layout.virtual_stages
    )
    # Korthikanti's constants assume 2-byte values; fp32 doubles them (the
    # 1-byte masks too: a slight overestimate).
    activations = round(BYTES_PER_VALUE[layout.precision] / 2 * per_layer * layer_microbatches)
    if local:
        activations = saved_activation_bytes(arch, layout, batch_size // (layout.dp * layout.ep * m)) or activations
    notes = ()
    if arch.mlp != "gelu" or arch.kv_dim != arch.hidden:
        notes = (
            "activation memory uses Korthikanti et al.'s GPT-layout formula "
            "/ 激活内存使用 Korthikanti 等人针对 GPT 结构的公式（近似）",
        )
    total, active = arch.param_count(), arch.active_param_count()
    fullest = max(
        (
            params_per_rank(arch, tp=layout.tp, pp=pp, stage=i, ep=layout.ep, virtual_stages=layout.virtual_stages)
            for i in range(pp)
        ),
        key=lambda rank: rank.total,
    )
    return Work(
        name=arch.name,
        params=total,
        active=active,
        arch=arch,
        seq_len=s,
        hidden=arch.hidden,
        kv_dim=arch.kv_dim,
        blocks=len(stages[0]),
        held=fullest.total,
        experts_held=fullest.experts,
        flops=flops_per_iteration(arch, batch_size=batch_size, recompute=layout.recompute),
        # MFU's numerator: each matmul a token needs, once (no recomputation); PaLM's 6N + 12lhs also
        # counts weights looked up or added, not multiplied (embeddings, norms, biases): +10% for "small".
        model_flops=flops_per_iteration(arch, batch_size=batch_size, recompute="none"),
        attention_flops=attention_core_flops(arch, batch_size=batch_size, recompute=layout.recompute),
        activations=activations,
        notes=notes,
    )
