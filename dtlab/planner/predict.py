"""The plan: what one layout of one model needs per GPU, and how fast it might run.

:func:`plan` takes a model and a :class:`~dtlab.config.layout.Layout` (the same
value a :class:`~dtlab.config.TrainConfig` gives as ``config.layout``) and
returns a :class:`Plan`: memory per GPU, FLOPs, bubble, step time and MFU.
No processes and no torch: every number comes from a formula
(:mod:`dtlab.planner.formulas`, :mod:`dtlab.planner.communication`,
:mod:`dtlab.parallel.pipeline.schedule`), so the results are *predictions*. Memory
follows the papers' accounting (model states and stored activations; no
allocator fragmentation, no framework buffers), and the step time assumes
nothing overlaps, so read it as a rough upper bound. What the model holds and
computes under the layout (:class:`~dtlab.planner.work.Work`) is
:mod:`dtlab.planner.work`'s; this module turns it into memory and time.

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
from dtlab.config.layout import Layout
from dtlab.i18n import ConfigError
from dtlab.parallel.pipeline.schedule import bubble_over_ideal, ideal_bubble_fraction
from dtlab.planner.architectures import Architecture
from dtlab.planner.checks import check_plan
from dtlab.planner.communication import (
    context_parallel_comm_time,
    data_parallel_comm_time,
    pipeline_comm_time,
    tensor_parallel_comm_time,
    vocab_parallel_comm_time,
)
from dtlab.planner.experts import all_to_all_bytes, expert_parallel_time, model_states
from dtlab.planner.formulas import ACHIEVABLE_FRACTION, BYTES_PER_VALUE, dtlab_model_states_bytes, model_states_bytes
from dtlab.planner.hardware import GPU, get_link
from dtlab.planner.local import LocalMachine, device_for
from dtlab.planner.step_memory import BUCKET_MB, needed_bytes, step_memory
from dtlab.planner.work import Work, architecture_for, work_from_architecture, work_from_params


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
    (no ``seq_len``: FLOPs assume :data:`dtlab.planner.work.ASSUMED_SEQ_LEN`, a note says so).
    ``seq_len``, ``tied_embeddings``, ``vocab_parallel`` (:func:`~dtlab.planner.architectures.with_options`)
    override the model's. ``gpu``: a preset, ``"local"`` or a ``*.json`` (:mod:`dtlab.planner.local`).
    ``gpus`` defaults to ``layout.world_size``; ``batch_size`` is the global batch in sequences
    (default: one sequence per micro-batch per DP rank; ``dtlab train``'s default is 8). ``bucket_mb``: DP's
    and ZeRO-2's gradient bucket (``dtlab train --bucket-mb``; None: its default). With the default model
    and Layout and ``batch_size=8``, the plan is ``dtlab train``'s default job.
    """
    layout.validate()
    arch = architecture_for(model, seq_len, layout, tied_embeddings=tied_embeddings, vocab_parallel=vocab_parallel)
    device = device_for(gpu, layout)  # a preset, or local: dtlab calibrate's
    gpus, batch_size, flags = check_plan(arch, layout, gpus=gpus, batch_size=batch_size)
    b = batch_size // (layout.dp * layout.ep * layout.micro_batches)  # micro-batch size, sequences
    if arch is None:
        work = work_from_params(model, seq_len, layout, batch_size)
    else:
        work = work_from_architecture(arch, layout, batch_size, local=isinstance(device, LocalMachine))
    memory = _memory(
        work, layout, states=states, micro_batch=b, bucket_mb=BUCKET_MB if bucket_mb is None else bucket_mb
    )
    timing, flags = _timing(device, layout, work, gpus=gpus, micro_batch_size=b, bucket_mb=bucket_mb, flags=flags)
    tokens = batch_size * work.seq_len
    return Plan(
        **_model_fields(work, arch),
        **_layout_fields(layout),
        gpu=device.name,
        gpus=gpus,
        all_to_all_bytes=all_to_all_bytes(work, layout, b),
        micro_batch_size=b,
        batch_size=batch_size,
        seq_len=work.seq_len,
        tokens_per_iteration=tokens,
        memory=memory,
        gpu_memory=device.memory_bytes,
        fits=needed_bytes(memory) <= device.memory_bytes,
        flops_per_iteration=work.flops,
        model_flops_per_iteration=work.model_flops,
        **timing,
        tokens_per_s=tokens / timing["step_time_s"],
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
    work: Work, layout: Layout, *, states: str, micro_batch: int, bucket_mb: float = BUCKET_MB
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


def _model_fields(work: Work, arch: Architecture | None) -> dict:
    """The plan's fields that describe the model: its name, its parameters, its experts, its embeddings."""
    return {
        "model": work.name,
        "params": work.params,
        "active_params": work.active or work.params,
        "params_per_gpu": work.held,
        "experts": arch.experts if arch else 0,
        "top_k": arch.top_k if arch else 1,
        **_embedding_fields(arch),
    }


def _layout_fields(layout: Layout) -> dict:
    """The layout's fields, repeated flat in the plan (``sp`` as ``sequence_parallel``)."""
    names = (
        "dp",
        "tp",
        "pp",
        "cp",
        "ep",
        "micro_batches",
        "schedule",
        "virtual_stages",
        "zero",
        "precision",
        "recompute",
    )
    return {**{name: getattr(layout, name) for name in names}, "sequence_parallel": layout.sp}


def _timing(
    device: GPU,
    layout: Layout,
    work: Work,
    *,
    gpus: int,
    micro_batch_size: int,
    bucket_mb: float | None,
    flags: tuple[str, ...],
) -> tuple[dict, tuple[str, ...]]:
    """The plan's time fields (bubble, compute, communication, step time, MFU), and ``flags`` with any a
    measured machine adds.

    Compute is stretched by the bubble, plus communication assumed not to overlap with it; on this machine as
    measured (``gpu="local"``), what dtlab's runtime does per step (:meth:`LocalMachine.step`).
    """
    links, comm = _communication(device, layout, work, gpus=gpus, micro_batch_size=micro_batch_size)
    peak = device.peak_flops[layout.precision]
    pipeline = (layout.pp, layout.micro_batches, layout.virtual_stages)
    bubble = float(ideal_bubble_fraction(*pipeline))
    compute_s = work.flops / (gpus * peak * ACHIEVABLE_FRACTION) / (1 - bubble)
    step_s = compute_s + sum(comm.values())
    local = isinstance(device, LocalMachine)
    if local:
        compute_s, comm, links, step_s, peak, flags = device.step(
            work.arch, layout, micro_batch_size, bubble, bucket_mb, flags
        )
    timing = {
        "bubble_fraction": bubble,
        "bubble_over_ideal": float(bubble_over_ideal(*pipeline)),
        "compute_time_s": compute_s,
        "comm_time_s": comm,
        "links": links,
        "step_time_s": step_s,
        "mfu": work.model_flops / (step_s * gpus * peak),
        "achievable_fraction": 1.0 if local else ACHIEVABLE_FRACTION,
    }
    return timing, flags


def _embedding_fields(arch: Architecture | None) -> dict[str, bool | None]:
    return {name: getattr(arch, name) if arch else None for name in ("tied_embeddings", "vocab_parallel")}


def _communication(
    device: GPU, layout: Layout, work: Work, *, gpus: int, micro_batch_size: int
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
