"""The planner's formulas: model-state memory, activation memory and FLOPs, each from its paper.

Pure arithmetic on numbers (no torch, no processes); each docstring names the
paper and equation. Symbols, as in the papers: Ψ parameters, N_d (``dp``)
data-parallel degree, t (``tp``) tensor-parallel degree, p (``pp``) pipeline
stages, m micro-batches, b micro-batch size, B global batch (sequences), s
sequence length, h hidden size, a attention heads, l layers, V vocabulary.

The pipeline's own arithmetic (bubble, micro-batches in flight, blocks per
stage) is :mod:`dtlab.parallel.pipeline.schedule`'s; communication is
:mod:`dtlab.planner.communication`'s; :mod:`dtlab.planner.predict` puts them
together into a :class:`~dtlab.planner.predict.Plan`.
"""

from __future__ import annotations

from dtlab.planner.architectures import Architecture
from dtlab.planner.hardware import ACHIEVABLE_FRACTION  # noqa: F401 - its old home; the GPU presets' now

BYTES_PER_VALUE = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
"""Bytes of an activation, a 16-bit weight copy or a TP message per value. fp8 counts as bf16: only the
Linear layers' inputs are fp8, inside the matmul (dtlab/numerics/fp8.py); what flows between layers is bf16."""

# --- model states: ZeRO ------------------------------------------------------


def model_states_bytes(
    params: int, *, dp: int = 1, zero: int = 0, precision: str = "fp32", grad_bytes: int | None = None
) -> dict[str, int]:
    """Bytes per rank of parameters, gradients and optimizer state.

    ZeRO (Rajbhandari et al. 2019), Sec. 3.1 and Fig. 1: mixed-precision Adam
    keeps 2Ψ bytes of 16-bit parameters, 2Ψ of 16-bit gradients and KΨ of
    optimizer state, K = 12 (fp32 master weights, momentum and variance).
    Stage 1 (P_os) divides the KΨ by N_d, stage 2 (P_os+g) also the gradients,
    stage 3 (P_os+g+p) also the parameters. For fp32 training there is no
    master copy: 4Ψ + 4Ψ + 8Ψ (Adam's exp_avg and exp_avg_sq; the scalar step
    counters are not counted, as dtlab's memory accountant does not).
    ``grad_bytes`` under mixed precision: bytes of a gradient, 2 unless told
    (4 for Megatron-LM's fp32 gradients beside bf16 weights, ``--grad-dtype fp32``).

    A sharded category holds ceil(Ψ / N_d) elements per rank: the values are
    one flat buffer padded to a multiple of N_d, split into equal shards.
    """
    if precision == "fp32":
        bytes_per_param = {"params": 4, "grads": 4, "optimizer": 8}
    else:
        bytes_per_param = {"params": 2, "grads": grad_bytes or 2, "optimizer": 12}
    sharded_from_stage = {"optimizer": 1, "grads": 2, "params": 3}
    shard = -(-params // dp)  # ceil(Ψ / N_d)
    return {
        kind: size * (shard if zero >= sharded_from_stage[kind] else params) for kind, size in bytes_per_param.items()
    }


def dtlab_model_states_bytes(params: int, *, dp: int = 1, zero: int = 0, precision: str = "fp32") -> dict[str, int]:
    """Bytes per rank of model states in dtlab's categories (:mod:`dtlab.measure.memory`), as its accountant counts them.

    Under mixed precision dtlab keeps the model's own fp32 parameters as the
    master weights and casts each layer's weights to 16 bits as it runs
    (:mod:`dtlab.numerics.precision`). The paper's (2 + 2 + K)Ψ, K = 12, maps onto
    dtlab's categories so:

        paper                               dtlab
        2Ψ   16-bit parameters              ``copies``    2Ψ, the casts autograd saves for backward
        2Ψ   16-bit gradients               ``grads``     4Ψ: the gradient accumulates in fp32
        4Ψ   fp32 master weights (in K)     ``params``    4Ψ: the model's own parameters
        8Ψ   fp32 momentum and variance     ``optimizer`` 8Ψ

    So ``params`` is sharded from stage 3 (the paper shards the masters with
    the optimizer state from stage 1), and a rank holds 18Ψ at stage 0, not
    16Ψ. Under fp32 there are no copies: :func:`model_states_bytes`'s 4 + 4 + 8.
    ZeRO-3 gathers 16-bit units itself (memory's ``buffers``): no copies. The
    copies here are an upper bound: weights that no matmul saves (the
    embedding's) are cast but not kept. Knowing the model's shape, the plan
    counts them exactly (:func:`dtlab.planner.step_memory.copies_bytes`).
    """
    states = model_states_bytes(params, dp=dp, zero=zero, precision="fp32")
    copies = precision != "fp32" and zero < 3
    states["copies"] = BYTES_PER_VALUE[precision] * params if copies else 0
    return states


# --- activations: Korthikanti et al. 2022 ------------------------------------


def activation_bytes_per_layer(
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    cp: int = 1,
) -> float:
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

    Context parallelism (``cp`` ranks per sequence) gives each rank s/cp of
    the tokens everywhere, so every sbh term is divided by cp; and its ring
    attention (dtlab.parallel.ring_attention) keeps only each block's output and one
    log-sum-exp per query, never the a x s x s scores: the 5as/h term goes,
    as under selective recomputation (or FlashAttention).
    """
    s, b, h, a, t = seq_len / cp, micro_batch, hidden, heads, tp
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if sequence_parallel else 1)
    attention = 0.0 if recompute == "selective" or cp > 1 else 5 * a * s / h
    if sequence_parallel:
        return sbh / t * (34 + attention)
    return sbh * (10 + 24 / t + attention / t)


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
    B, s, h, l, V = batch_size, arch.seq_len, arch.hidden, arch.layers, arch.vocab  # noqa: E741 - the paper's symbols
    attention_core = 4 * B * s * s * h
    layer_forward = 2 * B * s * arch.layer_matmul_params() + attention_core
    logits_forward = 2 * B * s * h * V
    flops = 3 * (l * layer_forward + logits_forward)  # forward + backward (2x forward)
    if recompute == "full":
        flops += l * layer_forward
    elif recompute == "selective":
        flops += l * attention_core
    return flops


def attention_core_flops(arch: Architecture, *, batch_size: int, recompute: str = "none") -> int:
    """Of :func:`flops_per_iteration`, the attention core's: QK^T and attention over V, 4Bs^2h per
    layer forward (the terms with no weight, Narayanan et al. 2021, Eq. 3's s/(6h)), three times for
    forward and backward, once more when recomputed (full or selective recomputation both re-run it).

    The planner prices them at the GPU's ``attention_fraction`` of peak, the rest at its
    ``matmul_fraction`` (:mod:`dtlab.planner.hardware`).
    """
    core = arch.layers * 4 * batch_size * arch.seq_len * arch.seq_len * arch.hidden
    return core * (4 if recompute in ("full", "selective") else 3)


def model_flops_per_token(params: int, *, layers: int = 0, hidden: int = 0, seq_len: int = 0) -> int:
    """Model FLOPs per token, the numerator of MFU: 6Ψ + 12 l h s.

    Chowdhery et al. 2022 (PaLM), Appendix B: 6N for the forward and backward
    matmuls of N parameters, plus 12 L H Q T for self-attention (H Q = h,
    T = s). Recomputation is not counted: MFU measures the model, not the
    implementation. With only Ψ known, the attention term is left out. An
    approximation: 6N also counts weights that are looked up or added, not
    multiplied (embeddings, norms, biases); with the shape known, ``plan``
    counts the matmuls themselves (:func:`flops_per_iteration` without
    recomputation).
    """
    return 6 * params + 12 * layers * hidden * seq_len
