"""The plan: what one layout of one model needs per GPU, and how fast it might run.

:func:`plan` takes a model and a :class:`~dtlab.config.layout.Layout` (the same
value a :class:`~dtlab.config.TrainConfig` gives as ``config.layout``) and
returns a :class:`Plan`: memory per GPU, FLOPs, bubble, step time and MFU.
No processes and no torch: every number comes from a formula
(:mod:`dtlab.planner.formulas`, :mod:`dtlab.planner.communication`,
:mod:`dtlab.parallel.pipeline.schedule`), so the results are *predictions*. Memory
follows the papers' accounting (model states and stored activations; no
allocator fragmentation, no framework buffers), and the step time assumes
nothing overlaps, so read it as a rough upper bound.

Rank order: TP is innermost, then CP, DP, then PP (Megatron-LM's default), so
a TP group is neighbouring GPUs of one node, a CP group spans ``tp * cp``
GPUs and a DP group ``tp * cp * dp``. Gradients are averaged, and ZeRO
shards, over the dp x cp ranks (context-parallel ranks hold the same weights).

A mixture of experts (the model's ``experts``) adds expert parallelism
between CP and DP: an EP group spans ``tp * cp * ep`` GPUs, each keeping E/ep
experts; the batch is split over dp x ep, the replicated parameters are
averaged (and sharded) over dp x cp x ep ranks, the experts over dp, and
every MoE layer's tokens cross an all-to-all (dtlab/planner/experts.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dtlab.config import ModelConfig
from dtlab.config.layout import Layout, check_positive_int
from dtlab.i18n import ConfigError
from dtlab.parallel.pipeline.schedule import (
    bubble_over_ideal,
    ideal_bubble_fraction,
    peak_layers_in_flight,
    stage_layers,
)
from dtlab.planner.architectures import Architecture, as_architecture, params_per_rank, with_options
from dtlab.planner.checks import check_plan
from dtlab.planner.communication import (
    context_parallel_comm_time,
    data_parallel_comm_time,
    pipeline_comm_time,
    tensor_parallel_comm_time,
    vocab_parallel_comm_time,
)
from dtlab.planner.experts import all_to_all_bytes, expert_parallel_time, model_states
from dtlab.planner.formulas import (
    ACHIEVABLE_FRACTION,
    BYTES_PER_VALUE,
    activation_bytes_per_layer,
    dtlab_model_states_bytes,
    flops_per_iteration,
    model_flops_per_token,
    model_states_bytes,
)
from dtlab.planner.hardware import GPU, get_link
from dtlab.planner.local import LocalMachine, device_for, saved_activation_bytes
from dtlab.planner.step_memory import BUCKET_MB, needed_bytes, step_memory


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The planner's prediction for one layout. Memory is bytes per GPU.

    The layout's fields are repeated flat (``dp``, ``tp``, ...): this is the
    object ``dtlab plan --json`` prints (DESIGN.md's contract).
    """

    model: str
    params: int
    active_params: int
    """Parameters one token uses: ``params`` for a dense model, fewer with experts (k of E)."""
    params_per_gpu: int
    """Parameters held by the fullest (stage, TP rank), before ZeRO shards them."""
    gpu: str
    gpus: int
    dp: int
    tp: int
    pp: int
    cp: int
    """Context-parallel degree: ranks sharing each sequence (ring attention)."""
    ep: int = 1
    """Expert-parallel degree: ranks each MoE layer's experts are spread over."""
    tied_embeddings: bool | None = None
    """The LM head shares the token table (None: a bare parameter count, unknown)."""
    vocab_parallel: bool | None = None
    """TP splits the token table and head by vocabulary (Megatron-LM); False: whole on every TP rank."""
    experts: int = 0
    top_k: int = 1
    all_to_all_bytes: int = 0
    """Bytes one rank sends per iteration in expert parallelism's all-to-alls (even routing)."""
    micro_batches: int
    micro_batch_size: int
    batch_size: int
    seq_len: int
    tokens_per_iteration: int
    schedule: str
    virtual_stages: int = 1
    """Model chunks per pipeline rank (the interleaved schedule's v; 1 for GPipe and 1F1B)."""
    zero: int
    precision: str
    recompute: str
    sequence_parallel: bool
    memory: dict[str, int]
    """Bytes per GPU: ``params``, ``grads``, ``optimizer``, ``copies``, ``activations``, ``buffers``,
    ``logits`` and ``peak`` as dtlab's accountant counts them (:mod:`dtlab.planner.step_memory`), and
    ``total``, the papers' sum of model states, copies and activations."""
    gpu_memory: int
    fits: bool
    """``gpu_memory`` holds the larger of ``total`` and ``peak`` (buffers and logits can make ``peak`` larger)."""
    flops_per_iteration: int
    """What the hardware executes, recomputation included."""
    model_flops_per_iteration: int
    """Each matmul a token needs, once (no recomputation): the numerator of MFU, so MFU <= HFU."""
    bubble_fraction: float
    bubble_over_ideal: float
    compute_time_s: float
    comm_time_s: dict[str, float]
    """Non-overlapped communication per iteration, by axis: ``dp``, ``tp``, ``pp`` (and ``cp``, ``ep``
    when > 1)."""
    links: dict[str, str]
    step_time_s: float
    tokens_per_s: float
    mfu: float
    achievable_fraction: float
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["notes"] = list(self.notes)
        return d


@dataclass(frozen=True)
class _Work:
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


ASSUMED_SEQ_LEN = 2048
"""Tokens per sequence a plan from a bare parameter count assumes for FLOPs and step time when given none
(GPT-3's and Megatron-LM's context); its memory (model states only) does not depend on it."""

DEFAULT_MODEL = "small"
"""``dtlab train``'s default model, so that ``plan()`` predicts ``dtlab train``'s default job."""


def plan(
    model: str | Architecture | ModelConfig | int = DEFAULT_MODEL,
    layout: Layout = Layout(),  # noqa: B008 - a frozen value
    *,
    gpus: int | None = None,
    gpu: str = "H100",
    batch_size: int | None = None,
    seq_len: int | None = None,
    states: str = "dtlab",
    tied_embeddings: bool | None = None,
    vocab_parallel: bool | None = None,
    bucket_mb: float | None = None,
) -> Plan:
    """Predict memory per GPU, FLOPs, bubble, step time and MFU of ``layout`` for ``model``.

    ``states`` picks how model states are counted under mixed precision:
    ``"dtlab"`` in dtlab's categories, as its accountant measures a run
    (:func:`dtlab_model_states_bytes`: fp32 masters as ``params``, fp32
    ``grads``, ``optimizer`` moments, 16-bit ``copies``); ``"paper"`` as the
    ZeRO paper and Megatron-style trainers keep them, (2 + 2 + K)Ψ
    (:func:`model_states_bytes`, ``copies`` 0).

    ``model`` is a preset name (:data:`dtlab.planner.ARCHITECTURES`), an
    Architecture (:func:`dtlab.planner.by_shape` builds one from a shape), a
    ModelConfig, or a bare parameter count (an int, with ``seq_len``), in
    which case the activation, TP and PP terms are unknown and reported as 0
    (no ``seq_len``: FLOPs assume :data:`ASSUMED_SEQ_LEN`, a note says so).
    ``seq_len``, ``tied_embeddings``, ``vocab_parallel`` (:func:`with_options`)
    override the model's. ``gpu``: a preset, ``"local"`` or a ``*.json`` (:mod:`dtlab.planner.local`).
    ``gpus`` defaults to ``layout.world_size``; ``batch_size`` is the global batch in sequences
    (default: one sequence per micro-batch per DP rank; ``dtlab train``'s default is 8). ``bucket_mb``: DP's
    and ZeRO-2's gradient bucket (``dtlab train --bucket-mb``; None: its default). With the default model
    and Layout and ``batch_size=8``, the plan is ``dtlab train``'s default job.
    """
    layout.validate()
    arch = _architecture(model, seq_len, layout, tied_embeddings=tied_embeddings, vocab_parallel=vocab_parallel)
    device = device_for(gpu, layout)  # a preset, or local: dtlab calibrate's
    gpus, batch_size, flags = check_plan(arch, layout, gpus=gpus, batch_size=batch_size)
    b = batch_size // (layout.dp * layout.ep * layout.micro_batches)  # micro-batch size, sequences
    if arch is None:
        work = _work_from_params(model, seq_len, layout, batch_size)
    else:
        work = _work_from_architecture(arch, layout, batch_size, local=isinstance(device, LocalMachine))
    memory = _memory(
        work, layout, states=states, micro_batch=b, bucket_mb=BUCKET_MB if bucket_mb is None else bucket_mb
    )
    links, comm = _communication(device, layout, work, gpus=gpus, micro_batch_size=b)
    peak = device.peak_flops[layout.precision]
    pipeline = (layout.pp, layout.micro_batches, layout.virtual_stages)
    bubble = float(ideal_bubble_fraction(*pipeline))
    # Compute stretched by the bubble, plus communication assumed not to overlap with it.
    compute_s = work.flops / (gpus * peak * ACHIEVABLE_FRACTION) / (1 - bubble)
    step_s = compute_s + sum(comm.values())
    if isinstance(device, LocalMachine):  # this machine as measured: what dtlab's runtime does per step
        compute_s, comm, links, step_s, peak, flags = device.step(work.arch, layout, b, bubble, bucket_mb, flags)
    tokens = batch_size * work.seq_len
    return Plan(
        model=work.name,
        params=work.params,
        active_params=work.active or work.params,
        params_per_gpu=work.held,
        gpu=device.name,
        gpus=gpus,
        dp=layout.dp,
        tp=layout.tp,
        pp=layout.pp,
        cp=layout.cp,
        ep=layout.ep,
        experts=arch.experts if arch else 0,
        top_k=arch.top_k if arch else 1,
        **_embedding_fields(arch),
        all_to_all_bytes=all_to_all_bytes(work, layout, b),
        micro_batches=layout.micro_batches,
        micro_batch_size=b,
        batch_size=batch_size,
        seq_len=work.seq_len,
        tokens_per_iteration=tokens,
        schedule=layout.schedule,
        virtual_stages=layout.virtual_stages,
        zero=layout.zero,
        precision=layout.precision,
        recompute=layout.recompute,
        sequence_parallel=layout.sp,
        memory=memory,
        gpu_memory=device.memory_bytes,
        fits=needed_bytes(memory) <= device.memory_bytes,
        flops_per_iteration=work.flops,
        model_flops_per_iteration=work.model_flops,
        bubble_fraction=bubble,
        bubble_over_ideal=float(bubble_over_ideal(*pipeline)),
        compute_time_s=compute_s,
        comm_time_s=comm,
        links=links,
        step_time_s=step_s,
        tokens_per_s=tokens / step_s,
        mfu=work.model_flops / (step_s * gpus * peak),
        achievable_fraction=1.0 if isinstance(device, LocalMachine) else ACHIEVABLE_FRACTION,
        notes=work.notes + flags,
    )


def plan_for_config(config, *, gpus: int | None = None, gpu: str = "H100") -> Plan:
    """The planner's prediction for a :class:`dtlab.config.TrainConfig`: its model and ``config.layout``.

    With ``gpus``, the DP degree grows to fill that many GPUs and the global
    batch grows with it (the per-rank batch stays), as when a job moves to a
    bigger cluster. Gradient accumulation is folded into the micro-batches
    (the same micro-batch size and FLOPs; the bubble and the micro-batches in
    flight are then those of one long pipeline flush, a slight underestimate
    of the bubble when pp > 1).
    """
    layout = config.layout
    dp = layout.dp if gpus is None else max(1, gpus // (layout.tp * layout.pp * layout.cp * layout.ep))
    layout = dataclasses.replace(layout, dp=dp, micro_batches=layout.micro_batches * config.grad_accum)
    per_data_rank = config.batch_size // config.data_ranks
    return plan(
        config.model_config(), layout, gpu=gpu, batch_size=per_data_rank * dp * layout.ep, bucket_mb=config.bucket_mb
    )


# --- the parts of a plan ---------------------------------------------------------


def _memory(
    work: _Work, layout: Layout, *, states: str, micro_batch: int, bucket_mb: float = BUCKET_MB
) -> dict[str, int]:
    """Bytes per GPU by category (:func:`step_memory`), model states counted as ``states`` says, and ``total``."""
    if states not in ("dtlab", "paper"):
        raise ConfigError(
            f"states={states!r}: allowed 'dtlab' or 'paper'", f"states={states!r}：允许的取值为 'dtlab' 或 'paper'"
        )
    count = dtlab_model_states_bytes if states == "dtlab" else model_states_bytes
    memory = step_memory(
        model_states(work, layout, count=count),
        work.arch,
        layout,
        held=work.held,
        micro_batch=micro_batch,
        activations=work.activations,
        exact_copies=states == "dtlab",
        bucket_mb=bucket_mb,
    )
    memory["total"] = sum(memory[k] for k in ("params", "grads", "optimizer", "copies", "activations"))
    return memory


def _embedding_fields(arch: Architecture | None) -> dict[str, bool | None]:
    return {name: getattr(arch, name) if arch else None for name in ("tied_embeddings", "vocab_parallel")}


def _architecture(model, seq_len: int | None, layout: Layout, **options) -> Architecture | None:
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


def _work_from_params(params: int, seq_len: int | None, layout: Layout, batch_size: int) -> _Work:
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
    return _Work(
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


def _work_from_architecture(arch: Architecture, layout: Layout, batch_size: int, *, local: bool = False) -> _Work:
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
    return _Work(
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
        activations=activations,
        notes=notes,
    )


def _communication(
    device: GPU, layout: Layout, work: _Work, *, gpus: int, micro_batch_size: int
) -> tuple[dict[str, str], dict[str, float]]:
    """Which link each axis uses, and its seconds of communication per iteration.

    Under CP every per-token tensor a rank sends holds s/cp tokens; the data-
    parallel gradient average spans dp x cp (x ep) ranks, the experts' dp.
    """
    dp, tp, pp, m, cp, ep = layout.dp, layout.tp, layout.pp, layout.micro_batches, layout.cp, layout.ep
    value_bytes = BYTES_PER_VALUE[layout.precision]
    links = {
        "dp": device.link_for(tp * cp * ep * dp),
        "tp": device.link_for(tp),
        "cp": device.link_for(tp * cp),
        "pp": device.link_for(gpus),
    }
    tokens = micro_batch_size * work.seq_len // cp  # per rank
    boundary_bytes = tokens * work.hidden * value_bytes  # one (b, s/cp, h)
    kv_bytes = 2 * tokens * work.kv_dim // tp * value_bytes  # this rank's K and V
    comm = {
        "dp": data_parallel_comm_time(
            (work.held - work.experts_held) * value_bytes, dp=dp * cp * ep, zero=layout.zero, link=get_link(links["dp"])
        )
        + data_parallel_comm_time(work.experts_held * value_bytes, dp=dp, zero=layout.zero, link=get_link(links["dp"])),
        "tp": tensor_parallel_comm_time(
            boundary_bytes,
            tp=tp,
            layers=work.blocks,
            micro_batches=m,
            recompute=layout.recompute,
            link=get_link(links["tp"]),
            sequence_parallel=layout.sp,
        ),
        "pp": pipeline_comm_time(
            boundary_bytes, pp=pp, micro_batches=m, virtual_stages=layout.virtual_stages, link=get_link(links["pp"])
        )
        if work.hidden
        else 0.0,
    }
    if work.arch is not None and work.arch.vocab_parallel:
        comm["tp"] += vocab_parallel_comm_time(
            boundary_bytes, tokens, tp=tp, pp=pp, micro_batches=m, link=get_link(links["tp"])
        )
    if cp > 1:  # only then: a plan without CP keeps the keys it always had
        comm["cp"] = context_parallel_comm_time(
            kv_bytes, cp=cp, layers=work.blocks, micro_batches=m, recompute=layout.recompute, link=get_link(links["cp"])
        )
    else:
        del links["cp"]
    if ep > 1:
        links["ep"] = device.link_for(tp * cp * ep)
        comm["ep"] = expert_parallel_time(work, layout, micro_batch_size, get_link(links["ep"]))
    return links, comm
