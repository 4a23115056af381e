"""Memory of one rank during a step, in dtlab's accountant's categories (:mod:`dtlab.measure.memory`).

The model states (``params``, ``grads``, ``optimizer``) are ZeRO's
(:mod:`dtlab.planner.formulas`); this module adds what dtlab's accountant
measures beside them, for a model whose shape is known:

* ``copies``: under bf16/fp16 (below ZeRO-3) the 16-bit casts of the weights
  that matmuls save for backward: every Linear weight the rank holds, its
  TP share; not the embeddings' or norms' (cast or not, nothing saves them).
* ``buffers``: data parallelism's gradient buckets (a whole fp32 gradient,
  also at dp = 1, where dtlab still wraps the model); ZeRO-1's whole
  gradients during backward; ZeRO-2's buckets (DeepSpeed's ``overlap_comm``,
  :mod:`dtlab.parallel.zero.stage2_buckets`: the padded flat gradient in windows of
  ``bucket_mb``, at most two alive, one in flight and one filling: the
  smaller of 2 windows and the whole padded gradient, plus the largest
  parameter's gradient, alive until its hook has copied it into them, or,
  when micro-batches accumulate them, the whole gradients); ZeRO-3's largest
  gathered unit (a block, an embedding table or the head) in its compute
  dtype, or with ``zero3_prefetch`` = p its largest p + 1 consecutive units;
  with pp > 1 the pipeline's send
  and receive buffers, counted as every micro-batch's boundary tensor still
  being sent, forward and backward, plus one gradient received (a bound: a
  send the next stage has already received is let go). ``buffers`` is the
  largest over the stages.
* ``logits``: one micro-batch's (b, s, V) logits on the last stage, in fp32
  (the loss is taken in fp32) except under ZeRO-3's bf16, which computes the
  head in bf16 itself. A vocabulary-parallel model (the published presets)
  holds only its (b, s, ceil(V/t)) slice: Megatron's parallel cross-entropy
  never gathers the whole logits.
* ``peak``: the highest total at one moment, as the accountant defines it:
  params + optimizer + the larger of the loss moment (activations, copies,
  logits beside the buffers that stay) and the gradient moment (the whole
  gradients with what holds them: buckets, the flat gradient, a gathered
  unit; ZeRO-2's shard, two buckets and the gradient being staged, beside
  the activations backward has not freed yet, walked gradient by gradient
  where :mod:`dtlab.planner.zero2_backward` applies and otherwise bounded
  by all of them, and the whole gradients only when several micro-batches
  accumulate them). Other layouts' moments in between, when backward has
  freed part of the activations and produced part of the gradients, are
  not modelled.
"""

from __future__ import annotations

from dtlab.parallel.pipeline.schedule import peak_in_flight, stage_layers
from dtlab.planner.architectures import Architecture, params_per_rank
from dtlab.planner.zero2_backward import backward_high, window_elements

FP32 = 4
BUCKET_MB = 0.25
"""``dtlab train``'s default ``--bucket-mb`` (TrainConfig.bucket_mb): ZeRO-2's bucket unless told."""


def compute_bytes(precision: str, zero: int, *, module_16bit: bool = False) -> int:
    """Bytes of one value the layers compute in: 16-bit under bf16/fp16 (ZeRO-3: bf16 only, unless the
    module itself is 16-bit, ``module_16bit``: the master weights in the optimizer), else 4."""
    if zero == 3 and not module_16bit:
        return 2 if precision == "bf16" else FP32
    return 2 if precision in ("bf16", "fp16") else FP32


def in_flight(layout, stage: int) -> int:
    """Micro-batches stage ``stage`` holds at once (one without a pipeline: each backward follows its forward;
    interleaved: its (chunk, micro-batch) pairs over v, rounded up, as micro-batches of a whole stage)."""
    if layout.pp == 1:
        return 1
    v = layout.virtual_stages
    return -(-peak_in_flight(layout.schedule, layout.pp, layout.micro_batches, stage, v) // v)


def copies_bytes(arch: Architecture, layout) -> int:
    """The 16-bit Linear weights saved for backward on the rank that holds the most of them.

    Each micro-batch's forward casts them anew, so a pipeline stage holds one
    set per micro-batch in flight.
    """
    if layout.precision == "fp32" or layout.zero == 3:
        return 0
    stages = stage_layers(arch.layers, layout.pp)
    head = 0 if arch.tied_embeddings else arch.hidden * arch.vocab_rows(layout.tp)
    per_stage = [
        in_flight(layout, i)
        * (len(blocks) * arch.layer_matmul_params() // layout.tp + (head if i == len(stages) - 1 else 0))
        for i, blocks in enumerate(stages)
    ]
    return 2 * max(per_stage)


def norm_copies_bytes(arch: Architecture, layout) -> int:
    """With 16-bit parameters (the master weights in the optimizer): the norms' fp32 copies saved for backward.

    The norms compute in fp32 (their mean and variance are reductions), so each micro-batch's forward
    casts their 16-bit weights up, 4 bytes per element, on the rank that holds the most of them (every
    TP rank holds the norms whole). ZeRO-3 casts the gathered unit instead: counted with its buffers.
    """
    if layout.precision not in ("fp16", "bf16") or layout.zero == 3:
        return 0
    stages = stage_layers(arch.layers, layout.pp)
    per_stage = [
        in_flight(layout, i)
        * (len(blocks) * 2 * arch.norm_params() + (arch.norm_params() if i == len(stages) - 1 else 0))
        for i, blocks in enumerate(stages)
    ]
    return 4 * max(per_stage)


def gathered_unit_bytes(arch: Architecture, layout, *, module_16bit: bool = False) -> int:
    """ZeRO-3's gathered parameters at most at once, each unit padded to a multiple of dp.

    Without prefetch, the largest unit (a block, the token or position table,
    the final norm with the head); with ``layout.zero3_prefetch`` = p, the
    largest p + 1 units that run one after another (token table, position
    table, the blocks, the final norm, the head: dtlab's units, in their
    order), which backward gathers in reverse, the same windows.
    """
    split, replicated = arch.layer_params()
    table = arch.vocab_rows(layout.tp) * arch.hidden  # this TP rank's token table
    block = split // layout.tp + replicated + arch.expert_layer_params() // layout.ep
    positions = arch.seq_len * arch.hidden if arch.learned_positions else 0
    head = 0 if arch.tied_embeddings else table
    dp = layout.zero_ranks  # the units are sharded (padded) over dp x cp x ep, or hybrid sharding's K
    prefetch = getattr(layout, "zero3_prefetch", 0)
    value = compute_bytes(layout.precision, 3, module_16bit=module_16bit)
    if not prefetch:
        units = [block, table, positions, arch.norm_params() + head]
        return max(-(-n // dp) * dp for n in units) * value
    order = [-(-n // dp) * dp for n in (table, positions, *[block] * arch.layers, arch.norm_params(), head) if n]
    return max(sum(order[i : i + prefetch + 1]) for i in range(len(order))) * value


def boundary_bytes(arch: Architecture, layout, micro_batch: int, *, module_16bit: bool = False) -> int:
    """One (b, s/cp, h) tensor a pipeline stage sends on, in the dtype the layers compute in."""
    value = compute_bytes(layout.precision, layout.zero, module_16bit=module_16bit)
    return micro_batch * arch.seq_len // layout.cp * arch.hidden * value


def pipeline_buffer_bytes(arch: Architecture, layout, micro_batch: int, stage: int) -> int:
    """Every (b, s/cp, h) boundary tensor stage ``stage`` may still be sending (each micro-batch's
    activation forward, its gradient backward) and one gradient received."""
    if layout.pp == 1:
        return 0
    boundary = boundary_bytes(arch, layout, micro_batch)
    last, m = stage == layout.pp - 1, layout.micro_batches
    if layout.virtual_stages > 1:  # interleaved: every rank sends both ways, once per chunk
        return (2 * m * layout.virtual_stages + 1) * boundary
    return ((0 if last else m + 1) + (0 if stage == 0 else m)) * boundary


def zero2_bucket_bytes(params: int, dp: int, bucket_mb: float = BUCKET_MB, grad_bytes: int = FP32) -> int:
    """ZeRO-2's buckets alive at once for ``params`` gradients of ``grad_bytes`` (fp32 unless told) over
    ``dp`` ranks.

    The flat gradient, padded to L = ceil(Ψ/dp) dp elements, is cut in windows
    of C = ``bucket_mb`` MiB rounded up to a multiple of dp, sent last first;
    one window is in flight while the next fills, so min(L, 2C) elements.
    """
    length = -(-params // dp) * dp
    return grad_bytes * min(length, 2 * window_elements(bucket_mb, dp, grad_bytes))


def largest_parameter(arch: Architecture, layout, stage: int) -> int:
    """Elements of the largest parameter tensor stage ``stage`` holds on one TP rank, in dtlab's GPT
    (Q, K and V one matrix; the token table, position table and untied head whole unless vocab-parallel)."""
    h, f, t = arch.hidden, arch.ffn, layout.tp
    stages = stage_layers(arch.layers, layout.pp)
    tensors = [h * (h + 2 * arch.kv_dim) // t, h * h // t] if stages[stage] else []
    if stages[stage]:
        tensors.append(h * f if arch.experts else h * f // t)  # an expert is whole on its rank
    if stage == 0:
        tensors += [arch.vocab_rows(t) * h, arch.seq_len * h if arch.learned_positions else 0]
    if stage == len(stages) - 1 and not arch.tied_embeddings:
        tensors.append(arch.vocab_rows(t) * h)
    return max(tensors)


def _gradient_buffers(
    params: int, layout, bucket_mb: float = BUCKET_MB, largest: int = 0, grad_bytes: int = FP32
) -> int:
    """DP's buckets, or ZeRO-1's whole gradients, or ZeRO-2's buckets and the largest gradient being
    staged (``largest`` elements) or, when micro-batches accumulate, the whole ones, for ``params``
    gradients of ``grad_bytes`` (fp32 unless told)."""
    dp, whole = layout.zero_ranks, grad_bytes * params
    if layout.zero == 2:
        staged = grad_bytes * largest if layout.micro_batches == 1 else whole
        return zero2_bucket_bytes(params, dp, bucket_mb, grad_bytes) + staged
    return {0: whole, 1: whole, 3: 0}[layout.zero]


def step_memory(
    states: dict[str, int],
    arch: Architecture | None,
    layout,
    *,
    held: int,
    micro_batch: int,
    activations: int,
    exact_copies: bool = True,
    bucket_mb: float = BUCKET_MB,
    grad_bytes: int = FP32,
) -> dict[str, int]:
    """``states`` (params, grads, optimizer, copies) completed with activations, buffers, logits and peak.

    ``held``: parameters on the fullest rank before ZeRO. Without a shape
    (``arch`` None) copies stay ``states``' bound and logits, the pipeline's
    buffers and ZeRO-3's units are 0; copies stay too with ``exact_copies``
    False (the master weights in the optimizer: the module is 16-bit itself,
    ``params``, and ZeRO-3 gathers it in 16 bits in fp16 too). ``grad_bytes``:
    the gradients' dtype, which the buckets and ZeRO-1's whole gradients share
    (fp32 with the master in the model).
    """
    memory = {"copies": 0, **states}
    zero, module_16bit = layout.zero, not exact_copies
    buffers, logits = _gradient_buffers(held, layout, bucket_mb, grad_bytes=grad_bytes), 0
    if arch is not None:
        memory["copies"] = copies_bytes(arch, layout) if exact_copies else norm_copies_bytes(arch, layout)
        buffers = max(
            _gradient_buffers(
                params_per_rank(arch, tp=layout.tp, pp=layout.pp, stage=i, ep=layout.ep).total,
                layout,
                bucket_mb,
                largest_parameter(arch, layout, i),
                grad_bytes,
            )
            + pipeline_buffer_bytes(arch, layout, micro_batch, i)
            for i in range(layout.pp)
        )
        buffers += gathered_unit_bytes(arch, layout, module_16bit=module_16bit) if zero == 3 else 0
        logits = logits_bytes(arch, layout, micro_batch, masters_in_module=exact_copies)
    memory.update(activations=activations, buffers=buffers, logits=logits)
    whole = grad_bytes * held if zero in (1, 2) else None
    memory["peak"] = layout_peak(
        memory, layout, arch=arch, micro_batch=micro_batch, bucket_mb=bucket_mb, whole_grads=whole
    )
    return memory


def logits_bytes(arch: Architecture, layout, micro_batch: int, *, masters_in_module: bool = True) -> int:
    """One micro-batch's (b, s/cp, V) logits, or this TP rank's ceil(V/t) of them when vocabulary-parallel,
    in fp32 (the loss is taken in fp32) but under ZeRO-3's bf16 with the master weights in the module,
    which computes the head in bf16 (with them in the optimizer the head returns fp32 logits, as elsewhere)."""
    value = 2 if layout.zero == 3 and layout.precision == "bf16" and masters_in_module else FP32
    return micro_batch * arch.seq_len // layout.cp * arch.vocab_rows(layout.tp) * value


def layout_peak(
    memory: dict[str, int],
    layout,
    *,
    arch: Architecture | None = None,
    micro_batch: int = 0,
    bucket_mb: float = BUCKET_MB,
    whole_grads: int | None = None,
) -> int:
    """:func:`peak_bytes` of ``memory``'s categories for ``layout`` (ZeRO-1/2's whole gradients,
    ``whole_grads``, are by default as large as its whole fp32 parameters; ZeRO-2 holds them only while
    micro-batches accumulate). With ``arch`` (``micro_batch`` sequences), ZeRO-2's backward is walked
    where it can be (:mod:`dtlab.planner.zero2_backward`)."""
    zero = layout.zero
    whole = memory["grads"] if zero in (0, 3) else memory["params"] if whole_grads is None else whole_grads
    if zero == 2 and layout.micro_batches == 1:
        whole = 0  # each gradient is freed once its hook has put it in a bucket
    walked = (
        None
        if arch is None
        else backward_high(
            arch, layout, activations=memory["activations"], micro_batch=micro_batch, bucket_mb=bucket_mb
        )
    )
    return peak_bytes(
        memory,
        zero=zero,
        whole_grads=whole,
        in_flight=max(in_flight(layout, i) for i in range(layout.pp)),
        micro_batches=layout.micro_batches,
        zero2_backward=walked,
    )


def peak_bytes(
    memory: dict[str, int],
    *,
    zero: int,
    whole_grads: int,
    in_flight: int = 1,
    micro_batches: int = 1,
    zero2_backward: int | None = None,
) -> int:
    """The highest total at one moment from the categories: params + optimizer + the largest moment.

    * The loss moment: the activations, copies and logits beside the buffers
      that stay through the step (DP's buckets; ZeRO-3's unit, gathered
      around the loss), and the gradients of earlier micro-batches when a
      stage runs more micro-batches than it holds at once (1F1B's steady
      state, gradient accumulation).
    * With several micro-batches in flight, the end of the first backward:
      the whole gradients beside the other micro-batches' activations.
    * The gradient moment: the buffers with the gradients.
    * ZeRO-2 instead (DeepSpeed's ``overlap_comm``): its buckets and its
      shard come while backward is still freeing the activations, so its
      gradient moment is bounded by the activations and copies beside its
      ``buffers`` (two buckets, the gradient being staged or the whole
      gradients its micro-batches accumulated) and its shard.

    ``whole_grads``: bytes of the gradients during backward (ZeRO-1: whole,
    not the shard; ZeRO-2: whole while accumulating, else 0).
    ``zero2_backward``: ZeRO-2's gradient moment walked gradient by gradient
    (:func:`dtlab.planner.zero2_backward.backward_high`), in place of that bound.
    """
    kept = memory["buffers"] if zero in (0, 3) else 0
    forward = memory["activations"] + memory["copies"] + memory["logits"]
    loss = kept + forward + (whole_grads if micro_batches > in_flight else 0)
    first_backward = kept + whole_grads + forward * (in_flight - 1) // in_flight
    gradients = memory["buffers"] + memory["grads"]
    if zero == 2:
        gradients = (
            zero2_backward if zero2_backward is not None else gradients + memory["activations"] + memory["copies"]
        )
    return memory["params"] + memory["optimizer"] + max(loss, first_backward, gradients)


def needed_bytes(memory: dict[str, int]) -> int:
    """What a GPU must hold for a plan's ``memory``: its ``total``, or its ``peak`` where that is higher."""
    return max(memory["total"], memory.get("peak", 0))
