"""The analytical planner: what a training layout needs and how fast it might run.

No processes and no torch: every number comes from a formula, and each
formula's docstring names the paper and equation it comes from. The results
are *predictions*. Memory follows the papers' accounting (model states and
stored activations; no allocator fragmentation, no framework buffers), and the
step time assumes nothing overlaps, so read it as a rough upper bound.

Symbols, as in the papers: Ψ parameters, N_d (``dp``) data-parallel degree,
t (``tp``) tensor-parallel degree, p (``pp``) pipeline stages, m micro-batches,
b micro-batch size, B global batch (sequences), s sequence length, h hidden
size, a attention heads, l layers, V vocabulary.

Rank order: TP is innermost, then DP, then PP (Megatron-LM's default), so a TP
group is neighbouring GPUs of one node and a DP group spans ``tp * dp`` GPUs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dtlab.config import PRECISIONS, SCHEDULES, ZERO_STAGES, ModelConfig
from dtlab.i18n import ConfigError
from dtlab.interconnect import (data_parallel_comm_time, get_link, pipeline_comm_time,
                                tensor_parallel_comm_time)
from dtlab.planner_presets import (GPU, Architecture, check_choice, check_model_parallel,
                                   check_positive_int, get_gpu, params_per_rank, resolve_model,
                                   stage_layers)

RECOMPUTE = ("none", "selective", "full")
BYTES_PER_VALUE = {"fp32": 4, "bf16": 2, "fp16": 2}

ACHIEVABLE_FRACTION = 0.5
"""Share of the GPU's peak FLOP/s that the matmuls are assumed to reach. Large
well-tuned runs report 40-55% MFU (Narayanan et al. 2021 reach 52% of an A100's
peak), so 0.5 is an optimistic but not absurd guess."""


# --- model states: ZeRO ------------------------------------------------------

def model_states_bytes(params: int, *, dp: int = 1, zero: int = 0,
                       precision: str = "fp32") -> dict[str, int]:
    """Bytes per rank of parameters, gradients and optimizer state.

    ZeRO (Rajbhandari et al. 2019), Sec. 3.1 and Fig. 1: mixed-precision Adam
    keeps 2Ψ bytes of 16-bit parameters, 2Ψ of 16-bit gradients and KΨ of
    optimizer state, K = 12 (fp32 master weights, momentum and variance).
    Stage 1 (P_os) divides the KΨ by N_d, stage 2 (P_os+g) also the gradients,
    stage 3 (P_os+g+p) also the parameters. For fp32 training there is no
    master copy: 4Ψ + 4Ψ + 8Ψ (Adam's exp_avg and exp_avg_sq; the scalar step
    counters are not counted, as dtlab's memory accountant does not).

    A sharded category holds ceil(Ψ / N_d) elements per rank: the values are
    one flat buffer padded to a multiple of N_d, split into equal shards.
    """
    if precision == "fp32":
        bytes_per_param = {"params": 4, "grads": 4, "optimizer": 8}
    else:
        bytes_per_param = {"params": 2, "grads": 2, "optimizer": 12}
    sharded_from_stage = {"optimizer": 1, "grads": 2, "params": 3}
    shard = -(-params // dp)  # ceil(Ψ / N_d)
    return {kind: size * (shard if zero >= sharded_from_stage[kind] else params)
            for kind, size in bytes_per_param.items()}


# --- activations: Korthikanti et al. 2022 ------------------------------------

def activation_bytes_per_layer(*, seq_len: int, micro_batch: int, hidden: int, heads: int,
                               tp: int = 1, sequence_parallel: bool = False,
                               recompute: str = "none") -> float:
    """Bytes one transformer layer stores for backward, for one micro-batch.

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
    Transformer Models", Eq. (1)-(3) and Table 2, with 16-bit activations and
    1-byte dropout masks:

        no parallelism         sbh (34 + 5as/h)                          Eq. (1)
        tensor parallel        sbh (10 + 24/t + 5as/(ht))                Eq. (2)
        TP + sequence parallel sbh/t (34 + 5as/h)                        Eq. (3)
        selective recompute    the same without the 5as/h attention term
        full recompute         2sbh: only the layer's input (/t with SP)

    The 34 counts the layer's sbh-sized tensors (inputs of QKV, attention
    output, MLP and norms; Q, K, V; the 4h MLP tensors; dropout masks); 5as/h
    is the a x s x s softmax output, its dropout mask and dropout output.
    Without SP, 10 of the 34 (norms, dropouts, block inputs) are not split by t.
    """
    s, b, h, a, t = seq_len, micro_batch, hidden, heads, tp
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if sequence_parallel else 1)
    attention = 0.0 if recompute == "selective" else 5 * a * s / h
    if sequence_parallel:
        return sbh / t * (34 + attention)
    return sbh * (10 + 24 / t + attention / t)


def microbatches_in_flight(*, schedule: str, pp: int, micro_batches: int, stage: int = 0) -> int:
    """How many micro-batches' activations a stage holds at its peak.

    GPipe (Huang et al. 2018) runs all m forwards before any backward, so every
    stage holds m. 1F1B (Narayanan et al. 2021, Sec. 2.2.1, PipeDream-Flush)
    starts backwards as soon as possible: stage i holds at most p - i, so
    stage 0 holds min(p, m).
    """
    if schedule == "gpipe":
        return micro_batches
    return min(pp - stage, micro_batches)


# --- FLOPs: Narayanan et al. 2021 and PaLM -----------------------------------

def flops_per_iteration(arch: Architecture, *, batch_size: int, recompute: str = "none") -> int:
    """FLOPs the hardware executes in one iteration (recomputation included).

    Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
    GPU Clusters Using Megatron-LM", Eq. (3) (derived in the paper's appendix
    on floating-point operations): a layer's forward costs
    2 FLOPs per token per matmul weight (24Bsh^2 for the GPT layout) plus
    4Bs^2h for QK^T and attention over V; the logit layer costs 2BshV. The
    backward pass costs twice the forward. Full recomputation runs each
    layer's forward once more, which gives the paper's

        F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))

    Without recomputation it is 72 B s l h^2 (1 + s/(6h) + V/(12 l h)); the
    selective kind (Korthikanti et al. 2022, Sec. 5) re-runs only the
    attention core, 4Bs^2h per layer. Other layouts (SwiGLU, GQA) use their
    own matmul weights in place of 12h^2.
    """
    B, s, h, l, V = batch_size, arch.seq_len, arch.hidden, arch.layers, arch.vocab
    attention_core = 4 * B * s * s * h
    layer_forward = 2 * B * s * arch.layer_matmul_params() + attention_core
    logits_forward = 2 * B * s * h * V
    flops = 3 * (l * layer_forward + logits_forward)  # forward + backward (2x forward)
    if recompute == "full":
        flops += l * layer_forward
    elif recompute == "selective":
        flops += l * attention_core
    return flops


def model_flops_per_token(params: int, *, layers: int = 0, hidden: int = 0, seq_len: int = 0) -> int:
    """Model FLOPs per token, the numerator of MFU: 6Ψ + 12 l h s.

    Chowdhery et al. 2022 (PaLM), Appendix B: 6N for the forward and backward
    matmuls of N parameters, plus 12 L H Q T for self-attention (H Q = h,
    T = s). Recomputation is not counted: MFU measures the model, not the
    implementation. With only Ψ known, the attention term is left out.
    """
    return 6 * params + 12 * layers * hidden * seq_len


# --- pipeline bubble ----------------------------------------------------------

def bubble_fraction(*, pp: int, micro_batches: int) -> float:
    """Share of a pipelined iteration each stage sits idle: (p-1)/(m+p-1).

    GPipe (Huang et al. 2018, Sec. 2.2 and Fig. 2c, with K = p stages and
    M = m micro-batches): an iteration lasts m + p - 1 micro-batch slots, of
    which each stage is busy for m. 1F1B reorders the work but keeps the same
    bubble (Narayanan et al. 2021, Sec. 2.2.1).
    """
    return (pp - 1) / (micro_batches + pp - 1)


def bubble_over_ideal(*, pp: int, micro_batches: int) -> float:
    """Idle time relative to the ideal (bubble-free) time: (p-1)/m.

    Narayanan et al. 2021, Sec. 2.2.1 define the bubble this way; it is the
    other definition's (p-1)/(m+p-1) with the bubble left out of the total.
    """
    return (pp - 1) / micro_batches


# --- which link each group uses -----------------------------------------------

def _link_name(gpu: GPU, group_span: int) -> str:
    """NVLink if a group of ``group_span`` neighbouring GPUs fits in one node."""
    return gpu.intra_node_link if group_span <= gpu.gpus_per_node else gpu.inter_node_link


# --- the plan ------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Plan:
    """The planner's prediction for one layout. Memory is bytes per GPU."""

    model: str
    params: int
    params_per_gpu: int
    """Parameters held by the fullest (stage, TP rank), before ZeRO shards them."""
    gpu: str
    gpus: int
    dp: int
    tp: int
    pp: int
    micro_batches: int
    micro_batch_size: int
    batch_size: int
    seq_len: int
    tokens_per_iteration: int
    schedule: str
    zero: int
    precision: str
    recompute: str
    sequence_parallel: bool
    memory: dict[str, int]
    """``params``, ``grads``, ``optimizer``, ``activations`` and ``total``, bytes per GPU."""
    gpu_memory: int
    fits: bool
    flops_per_iteration: int
    """What the hardware executes, recomputation included."""
    model_flops_per_iteration: int
    """6Ψ + attention per token, no recomputation: the numerator of MFU."""
    bubble_fraction: float
    bubble_over_ideal: float
    compute_time_s: float
    comm_time_s: dict[str, float]
    """Non-overlapped communication per iteration, by axis: ``dp``, ``tp``, ``pp``."""
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


def plan(*, model: str | Architecture | ModelConfig | None = None,
         layers: int | None = None, hidden: int | None = None, heads: int | None = None,
         vocab: int | None = None, seq_len: int | None = None, params: int | None = None,
         gpus: int | None = None, dp: int = 1, tp: int = 1, pp: int = 1,
         micro_batches: int = 1, schedule: str = "1f1b", zero: int = 0,
         precision: str = "fp32", recompute: str = "none", sequence_parallel: bool = False,
         gpu: str = "H100", batch_size: int | None = None) -> Plan:
    """Predict memory per GPU, FLOPs, bubble, step time and MFU of a layout.

    The model is a preset name (default ``"small"``), an Architecture or a
    ModelConfig; or its shape (``layers, hidden, heads, vocab, seq_len``, GPT-2
    layout as dtlab's own model); or only a parameter count ``params`` (with
    ``seq_len``), in which case the activation, TP and PP terms are unknown
    and reported as 0. ``batch_size`` is the global batch in sequences
    (default: one sequence per micro-batch per DP rank). The defaults are
    ``dtlab train``'s, so the same flags mean the same layout in both.
    """
    arch = resolve_model(model, layers=layers, hidden=hidden, heads=heads, vocab=vocab,
                         seq_len=seq_len, params=params)
    device = get_gpu(gpu)
    gpus, batch_size = _check_layout(
        arch, gpus=gpus, dp=dp, tp=tp, pp=pp, micro_batches=micro_batches, schedule=schedule,
        zero=zero, precision=precision, recompute=recompute,
        sequence_parallel=sequence_parallel, batch_size=batch_size)
    b = batch_size // (dp * micro_batches)  # micro-batch size, sequences
    value_bytes = BYTES_PER_VALUE[precision]
    notes: list[str] = []

    # Parameters on the fullest rank, FLOPs, and activations held for backward.
    if arch is None:
        s, total_params, hidden, blocks = seq_len, params, 0, 0
        held = -(-params // (tp * pp))  # assume TP and PP split Ψ evenly
        hardware_flops = batch_size * s * 2 * params * (4 if recompute == "full" else 3)
        model_flops = batch_size * s * model_flops_per_token(params)
        activations = 0
        notes.append("model given by params only: activations, TP and PP communication "
                     "need the shape and are left at 0 / 只给了参数量：激活、TP 与 PP 通信需要"
                     "模型形状，记为 0")
    else:
        s, total_params, hidden = arch.seq_len, arch.param_count(), arch.hidden
        blocks = len(stage_layers(arch.layers, pp=pp, stage=0))  # stage 0 has the most
        held = max(params_per_rank(arch, tp=tp, pp=pp, stage=i).total for i in range(pp))
        hardware_flops = flops_per_iteration(arch, batch_size=batch_size, recompute=recompute)
        model_flops = batch_size * s * model_flops_per_token(
            total_params, layers=arch.layers, hidden=hidden, seq_len=s)
        per_layer = activation_bytes_per_layer(
            seq_len=s, micro_batch=b, hidden=hidden, heads=arch.heads, tp=tp,
            sequence_parallel=sequence_parallel, recompute=recompute)
        layer_microbatches = max(  # (layer, micro-batch) pairs the fullest stage holds
            microbatches_in_flight(schedule=schedule, pp=pp, micro_batches=micro_batches, stage=i)
            * len(stage_layers(arch.layers, pp=pp, stage=i)) for i in range(pp))
        # Korthikanti's constants assume 2-byte values; fp32 doubles them (the
        # 1-byte masks too: a slight overestimate).
        activations = round(value_bytes / 2 * per_layer * layer_microbatches)
        if arch.mlp != "gelu" or arch.kv_dim != arch.hidden:
            notes.append("activation memory uses Korthikanti et al.'s GPT-layout formula "
                         "/ 激活内存使用 Korthikanti 等人针对 GPT 结构的公式（近似）")

    memory = model_states_bytes(held, dp=dp, zero=zero, precision=precision)
    memory["activations"] = activations
    memory["total"] = sum(memory.values())

    # Time: compute stretched by the bubble, plus communication that is assumed
    # not to overlap with it.
    links = {"dp": _link_name(device, tp * dp), "tp": _link_name(device, tp),
             "pp": _link_name(device, gpus)}
    boundary_bytes = b * s * hidden * value_bytes  # one (b, s, h) activation
    comm = {
        "dp": data_parallel_comm_time(held * value_bytes, dp=dp, zero=zero,
                                      link=get_link(links["dp"])),
        "tp": tensor_parallel_comm_time(boundary_bytes, tp=tp, layers=blocks,
                                        micro_batches=micro_batches, recompute=recompute,
                                        link=get_link(links["tp"])),
        "pp": pipeline_comm_time(boundary_bytes, pp=pp, micro_batches=micro_batches,
                                 link=get_link(links["pp"])) if arch else 0.0,
    }
    peak = device.peak_flops[precision]
    bubble = bubble_fraction(pp=pp, micro_batches=micro_batches)
    compute_s = hardware_flops / (gpus * peak * ACHIEVABLE_FRACTION) / (1 - bubble)
    step_s = compute_s + sum(comm.values())
    tokens = batch_size * s
    return Plan(
        model=arch.name if arch else "custom", params=total_params, params_per_gpu=held,
        gpu=device.name, gpus=gpus, dp=dp, tp=tp, pp=pp, micro_batches=micro_batches,
        micro_batch_size=b, batch_size=batch_size, seq_len=s, tokens_per_iteration=tokens,
        schedule=schedule, zero=zero, precision=precision, recompute=recompute,
        sequence_parallel=sequence_parallel, memory=memory, gpu_memory=device.memory_bytes,
        fits=memory["total"] <= device.memory_bytes, flops_per_iteration=hardware_flops,
        model_flops_per_iteration=model_flops, bubble_fraction=bubble,
        bubble_over_ideal=bubble_over_ideal(pp=pp, micro_batches=micro_batches),
        compute_time_s=compute_s, comm_time_s=comm, links=links, step_time_s=step_s,
        tokens_per_s=tokens / step_s, mfu=model_flops / (step_s * gpus * peak),
        achievable_fraction=ACHIEVABLE_FRACTION, notes=tuple(notes))


def _check_layout(arch: Architecture | None, *, gpus, dp, tp, pp, micro_batches, schedule,
                  zero, precision, recompute, sequence_parallel, batch_size) -> tuple[int, int]:
    """Every check of plan()'s inputs, before any arithmetic; returns (gpus, batch_size)."""
    for name, value in dict(dp=dp, tp=tp, pp=pp, micro_batches=micro_batches).items():
        check_positive_int(name, value)
    check_choice("schedule", schedule, SCHEDULES)
    check_choice("zero", zero, ZERO_STAGES)
    check_choice("precision", precision, PRECISIONS)
    check_choice("recompute", recompute, RECOMPUTE)
    check_choice("sequence_parallel", sequence_parallel, (False, True))
    gpus = dp * tp * pp if gpus is None else gpus
    check_positive_int("gpus", gpus)
    if dp * tp * pp != gpus:
        raise ConfigError(
            f"dp*tp*pp = {dp}*{tp}*{pp} = {dp * tp * pp} must equal gpus = {gpus}",
            f"dp*tp*pp = {dp}*{tp}*{pp} = {dp * tp * pp} 必须等于 gpus = {gpus}")
    if arch is not None:
        check_model_parallel(arch, tp=tp, pp=pp)
    batch_size = dp * micro_batches if batch_size is None else batch_size
    check_positive_int("batch_size", batch_size)
    if batch_size % (dp * micro_batches):
        raise ConfigError(
            f"batch_size = {batch_size} must split evenly into dp = {dp} ranks x "
            f"micro_batches = {micro_batches}: use a multiple of {dp * micro_batches}",
            f"batch_size = {batch_size} 必须能均分给 dp = {dp} 个 rank x "
            f"micro_batches = {micro_batches} 个微批次：请用 {dp * micro_batches} 的倍数")
    return gpus, batch_size


# --- the ``dtlab plan`` command (dtlab/plan_cli.py; imported late, it imports plan) ---

def add_plan_arguments(parser) -> None:
    """Add ``dtlab plan``'s flags (DESIGN.md) to an argparse parser."""
    from dtlab import plan_cli
    plan_cli.add_plan_arguments(parser)


def run_plan(args) -> int:
    """Run ``dtlab plan`` on parsed arguments; a bad value raises a bilingual ConfigError."""
    from dtlab import plan_cli
    return plan_cli.run_plan(args)


def plan_for_config(config, *, gpus: int | None = None, gpu: str = "H100") -> Plan:
    """The planner's prediction for a :class:`dtlab.config.TrainConfig` (the same layout).

    With ``gpus``, the DP degree grows to fill that many GPUs and the global
    batch grows with it (the per-rank batch stays), as when a job moves to a
    bigger cluster. Gradient accumulation is folded into the micro-batches.
    """
    dp = config.dp if gpus is None else max(1, gpus // (config.tp * config.pp))
    per_dp_rank = config.batch_size // config.dp
    return plan(model=config.model_config(), dp=dp, tp=config.tp, pp=config.pp,
                micro_batches=config.micro_batches * config.grad_accum, schedule=config.schedule,
                zero=config.zero, precision=config.precision,
                recompute="full" if config.recompute else "none", gpu=gpu,
                batch_size=per_dp_rank * dp)
