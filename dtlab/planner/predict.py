"""The plan: what one layout of one model needs per GPU, and how fast it might run.

:func:`plan` takes a model and a :class:`~dtlab.config.layout.Layout` (the same
value a :class:`~dtlab.config.TrainConfig` gives as ``config.layout``) and
returns a :class:`Plan`: memory per GPU, FLOPs, bubble, step time and MFU.
No processes and no torch: every number comes from a formula
(:mod:`dtlab.planner.formulas`, :mod:`dtlab.planner.communication`,
:mod:`dtlab.parallel.pipeline.schedule`), so the results are *predictions*. Memory
follows the papers' accounting (model states and stored activations; no
allocator fragmentation), and the step time assumes nothing overlaps, so read it
as a rough upper bound. Whose layout of the model states is counted is the
plan's memory model (:mod:`dtlab.planner.memory_models`: dtlab's runtime by
default, or DeepSpeed's or Megatron-LM's), and the plan says which it assumed.
What the model holds and computes under the layout
(:class:`~dtlab.planner.work.Work`) is :mod:`dtlab.planner.work`'s;
:mod:`~dtlab.planner.plan_memory` and :mod:`~dtlab.planner.timing` turn it into
memory and time, and this module into a :class:`Plan`.

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
from dtlab.planner.architectures import Architecture
from dtlab.planner.checks import check_plan
from dtlab.planner.experts import all_to_all_bytes
from dtlab.planner.local import LocalMachine, device_for
from dtlab.planner.memory_models import MemoryModel, memory_model_for
from dtlab.planner.plan_memory import memory_notes, plan_memory
from dtlab.planner.step_memory import BUCKET_MB, needed_bytes
from dtlab.planner.timing import timing
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
    dp_shard: int | None = None
    """Hybrid sharding's K (ZeRO within groups of K DP ranks, replicated across them); None: plain ZeRO."""
    precision: str
    recompute: str
    sequence_parallel: bool
    memory: dict[str, int]
    """Bytes per GPU: ``params``, ``grads``, ``optimizer``, ``copies``, ``activations``, ``buffers``,
    ``logits`` and ``peak`` as ``memory_model`` counts them (:mod:`dtlab.planner.plan_memory`; dtlab's
    accountant's categories for ``runtime``), and ``total``, the papers' sum of model states, copies
    and activations."""
    memory_model: str = "runtime"
    """Whose layout of the model states the plan assumes: ``runtime`` (what dtlab's runtime allocates
    for the flags), ``deepspeed`` (its estimators) or ``megatron`` (its bytes per parameter)."""
    master_weights: str | None = None
    """Where the fp32 master weights are: ``model`` (the fp32 module, 16-bit casts) or ``optimizer``
    (sharded with it: ZeRO's (2 + 2 + K)Ψ); None in fp32, which has no master copy."""
    grad_dtype: str = "fp32"
    """The dtype the gradients are kept in."""
    offload: bool = False
    """DeepSpeed's optimizer offload (``offload_optimizer: cpu``), counted by its estimators."""
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
    when > 1; with ``dp_shard``, ``dp_shard`` and ``dp_replicate`` in place of ``dp``, each on its link)."""
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
    memory_model: str = "runtime",
    master_weights: str | None = None,
    grad_dtype: str | None = None,
    offload: bool = False,
    states: str | None = None,
    tied_embeddings: bool | None = None,
    vocab_parallel: bool | None = None,
    bucket_mb: float | None = None,
) -> Plan:
    """Predict memory per GPU, FLOPs, bubble, step time and MFU of ``layout`` for ``model``.

    ``memory_model``, ``master_weights``, ``grad_dtype``, ``offload``: whose layout of the model
    states is counted (:func:`dtlab.planner.memory_models.memory_model_for`): ``"runtime"`` (dtlab's,
    the master weights in the fp32 ``"model"`` or the ``"optimizer"``: ZeRO's (2 + 2 + K)Ψ),
    ``"deepspeed"`` or ``"megatron"``. ``states``, their older name: ``"dtlab"`` is
    ``master_weights="model"``, ``"paper"`` is ``"optimizer"``.

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
    states_model = memory_model_for(
        memory_model, layout, master_weights=master_weights, grad_dtype=grad_dtype, offload=offload, states=states
    )
    arch = architecture_for(model, seq_len, layout, tied_embeddings=tied_embeddings, vocab_parallel=vocab_parallel)
    device = device_for(gpu, layout)  # a preset, or local: dtlab calibrate's
    _check_local(device, states_model.name)
    gpus, batch_size, flags = check_plan(
        arch, layout, gpus=gpus, batch_size=batch_size, master_weights=states_model.master_weights
    )
    flags = flags if states_model.name == "runtime" else ()  # dtlab train's refusals concern its runtime
    b = batch_size // (layout.dp * layout.ep * layout.micro_batches)  # micro-batch size, sequences
    if arch is None:
        work = work_from_params(model, seq_len, layout, batch_size)
    else:
        work = work_from_architecture(arch, layout, batch_size, local=isinstance(device, LocalMachine))
    memory = plan_memory(
        work, layout, states_model, micro_batch=b, bucket_mb=BUCKET_MB if bucket_mb is None else bucket_mb
    )
    times, flags = timing(
        device, layout, work, states_model, gpus=gpus, micro_batch_size=b, bucket_mb=bucket_mb, flags=flags
    )
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
        **_memory_model_fields(states_model),
        gpu_memory=device.memory_bytes,
        fits=needed_bytes(memory) <= device.memory_bytes,
        flops_per_iteration=work.flops,
        model_flops_per_iteration=work.model_flops,
        **times,
        tokens_per_s=tokens / times["step_time_s"],
        notes=work.notes + memory_notes(states_model, work, layout) + flags,
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
        config.model_config(),
        layout,
        gpu=gpu,
        batch_size=per_data_rank * dp * layout.ep,
        bucket_mb=config.bucket_mb,
        master_weights=config.masters if layout.precision in ("fp16", "bf16") else None,
    )


# --- the parts of a plan ---------------------------------------------------------


def _memory_model_fields(memory_model: MemoryModel) -> dict:
    """The plan's fields that say which memory model it assumed (:class:`MemoryModel`'s, flat)."""
    return {
        "memory_model": memory_model.name,
        "master_weights": memory_model.master_weights,
        "grad_dtype": memory_model.grad_dtype,
        "offload": memory_model.offload,
    }


def _check_local(device, memory_model: str) -> None:
    """This machine runs dtlab's runtime: ``--gpu local`` plans only the ``runtime`` memory model."""
    if isinstance(device, LocalMachine) and memory_model != "runtime":
        raise ConfigError(
            f"memory_model={memory_model!r} with gpu='local': this machine runs dtlab's own runtime "
            "(allowed: memory_model='runtime', or a GPU preset)",
            f"memory_model={memory_model!r} 不能与 gpu='local' 同时使用：本机运行的是 dtlab 自己的运行时"
            "（允许：memory_model='runtime'，或某个 GPU 预设）",
        )


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
        "dp_shard",
        "precision",
        "recompute",
    )
    return {**{name: getattr(layout, name) for name in names}, "sequence_parallel": layout.sp}


def _embedding_fields(arch: Architecture | None) -> dict[str, bool | None]:
    return {name: getattr(arch, name) if arch else None for name in ("tied_embeddings", "vocab_parallel")}
