"""Step time on this machine: what dtlab's own runtime does per step, priced with the measured profile.

``dtlab plan --gpu local`` (or ``--gpu FILE.json``) predicts the step of a
layout of dtlab's small GPTs as dtlab's runtime runs it on local ranks, from
the :class:`~dtlab.planner.profile.MachineProfile` ``dtlab calibrate`` wrote:

* **compute**, per rank: each micro-batch's forward and backward of the
  rank's stage costs a fixed time per block plus its FLOPs over the FLOP/s
  one rank reached while as many ranks ran at once (4 ranks on 2 cores get
  about half a core each). FLOPs as Megatron-LM counts them (Narayanan et al.
  2021, Eq. 3): 2 per weight per token, plus 4bs^2h for attention, backward
  twice the forward; TP divides a block's by t (its heads and MLP columns)
  but not the LM head's, which dtlab's TP keeps whole on every rank. Then
  AdamW's step over the parameters the rank updates (its ZeRO shard).
* **pipeline**: the stage's m micro-batches stretched by the bubble,
  m / (1 - bubble) = m + p - 1 slots (GPipe, 1F1B) of the slowest stage.
  Interleaved (Narayanan et al. 2021, Sec. 2.2.2), as dtlab's runtime runs
  it: rank r holds v chunks, virtual stages r, r + p, ... of the model cut
  into p x v (the embeddings on virtual stage 0, the head on the last), so
  its slot is the sum over its chunks, and the bubble (p - 1)/(v m + p - 1)
  stretches m slots to m + (p - 1)/v;
* **communication**, the collectives each layout issues, as the tracer
  counts them (tests/expected_comm.py), each priced ``alpha + beta * n`` at
  its group's size: TP's two all-reduces forward and two backward per block
  and micro-batch (Megatron's g and f); a pipeline stage's sends and
  receives, one per micro-batch each way (interleaved, rank 0's v chunks
  send forward and receive backward, and all but the first also receive
  forward and send backward: 2v - 1 times as many); DP's all-reduce per gradient
  bucket; ZeRO-1's reduce-scatter and all-gather of the flat buffer, ZeRO-2's
  of each bucket of it (DeepSpeed's overlap_comm);
  ZeRO-3's per-unit all-gathers (forward and backward) and reduce-scatter per
  micro-batch; and every step's bookkeeping (the loss, the records gathered
  on rank 0). Nothing is assumed to overlap with compute: on a CPU the
  collectives' threads take the same cores the ranks compute on.
* **the step's own cost**: what the profile measured a real training step to
  take beyond all of the above at this world size (the trainer's bookkeeping:
  the memory ledger, the tracer, the records), once per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dtlab.config.layout import Layout
from dtlab.i18n import ConfigError
from dtlab.parallel.pipeline.schedule import FORWARD, peak_in_flight, schedule, stage_layers
from dtlab.planner.architectures import Architecture, params_per_rank
from dtlab.planner.communication import (
    pipeline_comm_time,
    ring_all_gather_time,
    ring_allreduce_time,
    ring_reduce_scatter_time,
)
from dtlab.planner.formulas import BYTES_PER_VALUE
from dtlab.planner.hardware import GPU, GPUS
from dtlab.planner.profile import MachineProfile, is_local, profile_for

DEFAULT_BUCKET_MB = 0.25
"""``dtlab train``'s default ``--bucket-mb`` (dtlab.config.TrainConfig.bucket_mb)."""
RECORD_BYTES = 1500
"""About what one rank's line of a step record pickles to (the records gathered on rank 0 each step)."""


@dataclass(frozen=True)
class LocalStep:
    """The predicted step on this machine, in seconds."""

    compute_s: float
    """The fullest rank's forward, backward and optimizer step, without waiting (the record's ``compute_s``)."""
    pipeline_s: float
    """The forward and backward of every micro-batch with the pipeline's bubble: m + p - 1 slots
    (interleaved: m + (p - 1)/v slots of a rank's v chunks)."""
    optimizer_s: float
    comm_s: dict[str, float]
    """By axis, as the plan's ``comm_time_s``, plus ``step``: the loss and the records, every step."""
    step_s: float
    peak_flop_s: float
    """One rank's matmul FLOP/s at this world size: MFU's denominator here."""


@dataclass(frozen=True, kw_only=True)
class LocalMachine(GPU):
    """This machine as the planner's GPU: its memory, one rank's matmul FLOP/s as its peak, and the
    profile that prices :meth:`step`."""

    profile: MachineProfile = field(repr=False, compare=False)

    def step(
        self,
        arch: Architecture | None,
        layout: Layout,
        micro_batch_size: int,
        bubble: float,
        bucket_mb: float | None,
        notes: tuple[str, ...],
    ):
        """:func:`local_step` as :func:`dtlab.planner.plan` uses it: compute, communication, links, step,
        peak and the notes (one more when the layout's precision is not the profile's)."""
        if layout.precision != self.profile.precision:
            notes += (
                f"the profile measured {self.profile.precision}; {layout.precision} is priced at its "
                f"FLOP/s / 配置文件测的是 {self.profile.precision}；{layout.precision} 按它的 FLOP/s 估算",
            )
        local = local_step(
            self.profile,
            arch,
            layout,
            micro_batch_size=micro_batch_size,
            bubble=bubble,
            **({"bucket_mb": bucket_mb} if bucket_mb is not None else {}),
        )
        return (
            local.compute_s,
            local.comm_s,
            {axis: "local" for axis in local.comm_s},
            local.step_s,
            local.peak_flop_s,
            notes,
        )


def rank_chunks(layers: int, layout: Layout, rank: int) -> list[tuple[int, range]]:
    """``(virtual stage, blocks)`` of each chunk pipeline rank ``rank`` holds, as
    :func:`dtlab.parallel.pipeline.partition_gpt` cuts the model: one stage (GPipe, 1F1B), or v chunks of the
    model cut into p x v (:func:`stage_layers`), chunk c being virtual stage c x p + rank."""
    p, v = layout.pp, layout.virtual_stages
    cut = stage_layers(layers, p * v)
    return [(c * p + rank, cut[c * p + rank]) for c in range(v)]


def saved_activation_bytes(arch: Architecture, layout: Layout, micro_batch_size: int) -> int | None:
    """What dtlab's activation meter counts at its peak on the fullest stage (fp32, no recompute): the
    tensors autograd saves for backward in dtlab's GPT (dtlab/model.py), per micro-batch of b sequences,
    times the micro-batches the stage holds at once (:func:`peak_in_flight`). Interleaved, a rank holds
    (chunk, micro-batch) pairs of chunks that differ (the embeddings on the first, the head on the last):
    its peak is found by walking its actions in the schedule's order, + a chunk's bytes at each forward,
    - at each backward. None where this count does not apply (another precision, recompute, another
    architecture): the plan keeps Korthikanti's formula.

    Per block, per sequence, in fp32 values: both LayerNorms' input and output (4sh) and their mean and
    1/std (4s); Q, K and V (3sh/t), the attention probabilities (a s^2 / t), the attention's output
    (sh/t), the MLP's first output and its GELU (2fs/t); and once per block the causal mask (s^2 bytes,
    bool). The first stage saves the token and position indices (int64); the last the final LayerNorm's
    input and output and statistics, the log-softmax (sV) and the targets, and the loss
    (:func:`activation_parts`).
    """
    parts = activation_parts(arch, layout, micro_batch_size)
    if parts is None:
        return None
    block, first, (loss, final_norm) = parts
    last_stage = layout.pp * layout.virtual_stages - 1

    def chunk_bytes(stage: int, blocks: range) -> int:  # one micro-batch's, on one (virtual) stage
        return len(blocks) * block + (first if stage == 0 else 0) + (loss + final_norm if stage == last_stage else 0)

    if layout.schedule != "interleaved":
        return max(
            peak_in_flight(layout.schedule, layout.pp, layout.micro_batches, i) * chunk_bytes(i, blocks)
            for i, blocks in enumerate(stage_layers(arch.layers, layout.pp))
        )
    actions = schedule("interleaved", layout.pp, layout.micro_batches, layout.virtual_stages)
    held = []
    for rank, mine in enumerate(actions):
        size = dict(rank_chunks(arch.layers, layout, rank))
        now = peak = 0
        for action in mine:
            now += (1 if action.kind == FORWARD else -1) * chunk_bytes(action.stage, size[action.stage])
            peak = max(peak, now)
        held.append(peak)
    return max(held)


def activation_parts(arch: Architecture, layout: Layout, micro_batch_size: int):
    """``(block, first, (loss, final_norm))``: the bytes :func:`saved_activation_bytes` counts per
    micro-batch for one block, the first stage's indices, and the last stage's two parts: what the loss
    saves (log-softmax, targets, the loss), freed first in backward, and the final LayerNorm's and the
    head's input, freed once their backward is done. None where that count does not apply."""
    if (
        layout.precision != "fp32"
        or layout.recompute != "none"
        or arch.mlp != "gelu"
        or arch.norm != "layernorm"
        or arch.experts
    ):
        return None
    b, s, h, t, V = micro_batch_size, arch.seq_len, arch.hidden, layout.tp, arch.vocab
    block = (
        4 * b * (4 * s * h + 4 * s + ((h + 2 * arch.kv_dim) * s + arch.heads * s * s + h * s + 2 * arch.ffn * s) // t)
        + s * s
    )
    return block, 8 * b * s + 8 * s, (4 * b * s * V + 8 * b * s + 4, 4 * b * (2 * s * h + 2 * s))


def device_for(gpu: str, layout: Layout) -> GPU:
    """What ``--gpu`` names: a preset GPU, or this machine as ``dtlab calibrate`` measured it (``local``,
    the default profile, or a profile ``FILE.json``); a bilingual ConfigError naming all three otherwise."""
    if is_local(gpu):
        return local_machine(gpu, layout)
    if gpu not in GPUS:
        known = ", ".join(GPUS)
        raise ConfigError(
            f"unknown GPU {gpu!r}; allowed: a known GPU ({known}), local (the profile "
            f"`dtlab calibrate` wrote) or FILE.json (a profile file)",
            f"未知的 GPU {gpu!r}；允许：已知的 GPU（{known}）、local（`dtlab calibrate` 写下的"
            f"配置文件）或 FILE.json（配置文件路径）",
        )
    return GPUS[gpu]


def local_machine(gpu: str, layout: Layout) -> LocalMachine:
    """``--gpu local`` (the default profile) or ``--gpu FILE.json`` as a :class:`LocalMachine`."""
    profile = profile_for(gpu)
    peak = profile.compute_at(layout.world_size).matmul_flop_s
    return LocalMachine(
        name="local",
        memory_bytes=int(profile.machine.get("memory_bytes") or 0),
        peak_flops={precision: peak for precision in BYTES_PER_VALUE},
        intra_node_link="ethernet",
        inter_node_link="ethernet",
        profile=profile,
    )


def local_step(
    profile: MachineProfile,
    arch: Architecture | None,
    layout: Layout,
    *,
    micro_batch_size: int,
    bubble: float,
    bucket_mb: float = DEFAULT_BUCKET_MB,
) -> LocalStep:
    """Predict one step of ``layout`` for ``arch`` on the machine ``profile`` measured (module docstring)."""
    if arch is None:
        raise ConfigError(
            "--gpu local predicts dtlab's own runs: it needs a model with a shape "
            "(--model or --layers ...), not only --params",
            "--gpu local 预测的是 dtlab 自己的运行：需要有形状的模型（--model 或 --layers ……），不能只给 --params",
        )
    if layout.cp > 1 or layout.ep > 1 or arch.experts:
        raise ConfigError(
            f"--gpu local does not model context or expert parallelism yet "
            f"(cp={layout.cp}, ep={layout.ep}, experts={arch.experts}); allowed: cp=1, ep=1, "
            f"no experts",
            f"--gpu local 暂不支持上下文并行或专家并行（cp={layout.cp}、"
            f"ep={layout.ep}、experts={arch.experts}）；允许：cp=1、ep=1、不使用专家",
        )
    dp, tp, pp, m = layout.dp, layout.tp, layout.pp, layout.micro_batches
    world = dp * tp * pp
    cost = profile.compute_at(world)
    b, s, h, V = micro_batch_size, arch.seq_len, arch.hidden, arch.vocab
    # Forward FLOPs of one micro-batch on one TP rank (Narayanan et al. 2021, Eq. 3's terms).
    attention = 4 * b * s * s * h
    layer = (2 * b * s * arch.layer_matmul_params() + attention) / tp
    head = 2 * b * s * h * V / (tp if arch.vocab_parallel else 1)
    again = {"full": layer, "selective": attention / tp}.get(layout.recompute, 0.0)
    last = pp * layout.virtual_stages - 1  # the (virtual) stage with the head
    slot = max(
        sum(
            len(blocks) * cost.overhead_s
            + (len(blocks) * (3 * layer + again) + (3 * head if stage == last else 0)) / cost.flop_s
            for stage, blocks in rank_chunks(arch.layers, layout, r)
        )
        for r in range(pp)
    )  # slowest rank, one micro-batch through all its chunks
    pipeline_s = m * slot / (1 - bubble)
    held = max(
        params_per_rank(arch, tp=tp, pp=pp, stage=i, virtual_stages=layout.virtual_stages).total for i in range(pp)
    )
    updated = -(-held // dp) if layout.zero else held  # ZeRO: this rank's shard
    optimizer_s = updated * cost.optimizer_s_per_param
    comm = _communication(profile, arch, layout, micro_batch_size=b, held=held, bucket_mb=bucket_mb)
    return LocalStep(
        compute_s=m * slot + optimizer_s,
        pipeline_s=pipeline_s,
        optimizer_s=optimizer_s,
        comm_s=comm,
        step_s=pipeline_s + optimizer_s + sum(comm.values()) + cost.step_s,
        peak_flop_s=cost.matmul_flop_s,
    )


def _communication(
    profile: MachineProfile, arch: Architecture, layout: Layout, *, micro_batch_size: int, held: int, bucket_mb: float
) -> dict[str, float]:
    """Seconds per step by axis, each collective the runtime issues priced at its group's size."""
    dp, tp, pp, m, zero = layout.dp, layout.tp, layout.pp, layout.micro_batches, layout.zero
    value = BYTES_PER_VALUE[layout.precision]
    boundary = micro_batch_size * arch.seq_len * arch.hidden * value  # one (b, s, h) tensor
    blocks = sum(len(chunk) for _, chunk in rank_chunks(arch.layers, layout, 0))  # rank 0's, the most
    comm = {"dp": 0.0, "tp": 0.0, "pp": 0.0}
    if tp > 1:  # Megatron's g (forward, again under full recompute) and f (backward), twice per block
        calls = 2 * blocks * m * (3 if layout.recompute == "full" else 2)
        comm["tp"] = calls * ring_allreduce_time(boundary, tp, profile.link("all_reduce", tp))
    if pp > 1:
        # Rank 0's calls: each chunk sends forward and receives backward once per micro-batch; its chunks
        # after the first (interleaved) also receive forward and send backward, from the last rank.
        v = layout.virtual_stages
        comm["pp"] = (2 * v - 1) * pipeline_comm_time(
            boundary, pp=pp, micro_batches=m, link=profile.link("send_recv", 2)
        )
    if dp > 1:
        if zero == 0:  # one all-reduce per bucket, in flight together during backward
            link = profile.link("all_reduce_buckets", dp)
            comm["dp"] = max(
                sum(
                    ring_allreduce_time(size, dp, link)
                    for size in gradient_buckets(
                        arch, tp=tp, pp=pp, stage=i, bucket_mb=bucket_mb, virtual_stages=layout.virtual_stages
                    )
                )
                for i in range(pp)
            )
        elif zero < 3:  # the flat buffer, padded to a multiple of dp: reduce-scatter, then all-gather;
            length = -(-held // dp) * dp  # ZeRO-2 (overlap_comm) in buckets of bucket_mb
            size = length if zero == 1 else -(-(-(-int(bucket_mb * 2**20) // 4)) // dp) * dp  # noqa: B002 - ceilings
            burst = "" if zero == 1 else "_buckets"  # ZeRO-2's buckets, issued as calibrate timed them
            scatter, gather = profile.link("reduce_scatter" + burst, dp), profile.link("all_gather" + burst, dp)
            comm["dp"] = sum(
                ring_reduce_scatter_time(4 * min(size, length - start), dp, scatter)
                + ring_all_gather_time(4 * min(size, length - start), dp, gather)
                for start in range(0, length, size)
            )
        else:  # per unit and micro-batch: all-gather forward and backward, reduce-scatter
            gather, scatter = profile.link("all_gather", dp), profile.link("reduce_scatter", dp)
            comm["dp"] = m * sum(
                2 * ring_all_gather_time(-(-u // dp) * dp * 4, dp, gather)
                + ring_reduce_scatter_time(-(-u // dp) * dp * 4, dp, scatter)
                for u in zero3_units(arch)
            )
    world = dp * tp * pp
    if world > 1:  # the loss all-reduced, every rank's record gathered (sizes, then data)
        comm["step"] = ring_allreduce_time(8, world, profile.link("all_reduce", world)) + 2 * ring_all_gather_time(
            RECORD_BYTES * world, world, profile.link("all_gather", world)
        )
    return comm


def gradient_tensors(arch: Architecture, *, tp: int, pp: int, stage: int, virtual_stages: int = 1) -> list[int]:
    """Elements of each parameter tensor of pipeline stage ``stage`` on one TP rank, in dtlab's GPT's order
    (dtlab/model.py: LayerNorm, QKV and MLP-up column-parallel, projections row-parallel, untied head);
    interleaved, the blocks of all its ``virtual_stages`` chunks, in the model's order."""
    first, block, last = tensor_groups(arch, tp=tp)
    tensors = first if stage == 0 else []
    tensors += block * sum(len(chunk) for chunk in stage_layers(arch.layers, pp * virtual_stages)[stage::pp])
    return tensors + (last if stage == pp - 1 else [])


def tensor_groups(arch: Architecture, *, tp: int) -> tuple[list[int], list[int], list[int]]:
    """Elements of the parameter tensors of the embeddings, of one block, and of the final norm and the
    untied head, on one TP rank, each in dtlab's GPT's order (:func:`gradient_tensors`)."""
    h, kv, f = arch.hidden, arch.kv_dim, arch.ffn
    norm = [h, h] if arch.norm == "layernorm" else [h]
    bias = arch.bias
    block = (
        norm
        + [(h + 2 * kv) * h // tp]
        + ([(h + 2 * kv) // tp] if bias else [])
        + [h * h // tp]
        + ([h] if bias else [])
        + norm
        + [f * h // tp]
        + ([f // tp] if bias else [])
        + [f * h // tp]
        + ([h] if bias else [])
    )
    first = [arch.vocab * h] + ([arch.seq_len * h] if arch.learned_positions else [])
    return first, block, norm + ([] if arch.tied_embeddings else [arch.vocab * h])


def gradient_buckets(
    arch: Architecture, *, tp: int, pp: int, stage: int, bucket_mb: float, virtual_stages: int = 1
) -> list[int]:
    """Bytes of each gradient bucket data parallelism all-reduces (dtlab/parallel/buckets.py): fp32 gradients in
    backward order, last tensor first, a bucket closed once it holds ``bucket_mb`` (DDP's rule)."""
    out: list[int] = []
    for numel in reversed(gradient_tensors(arch, tp=tp, pp=pp, stage=stage, virtual_stages=virtual_stages)):
        if not out or out[-1] >= bucket_mb * 2**20:
            out.append(0)
        out[-1] += numel * 4
    return out


def zero3_units(arch: Architecture) -> list[int]:
    """Parameters of each unit ZeRO-3 gathers at once in dtlab's GPT (dtlab/parallel/zero/units.py): the token
    and position tables, each block, the final LayerNorm, the head."""
    block = sum(arch.layer_params())
    units = [arch.vocab * arch.hidden] + ([arch.seq_len * arch.hidden] if arch.learned_positions else [])
    units += [block] * arch.layers + [arch.norm_params()]
    return units + ([] if arch.tied_embeddings else [arch.hidden * arch.vocab])
