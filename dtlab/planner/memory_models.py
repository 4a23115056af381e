"""Memory models: the model states of a plan as dtlab's runtime, DeepSpeed or Megatron-LM lay them out.

The same layout costs different bytes in different trainers. ``dtlab plan --memory-model`` names
whose layout a plan counts, and the plan says which it assumed (its ``memory_model``,
``master_weights`` and ``grad_dtype`` fields). Bytes per parameter Ψ on one rank, N ZeRO ranks,
under 16-bit mixed precision with Adam:

===========================  ==========================  ===============================================
model                        where the fp32 master is    states per rank
===========================  ==========================  ===============================================
runtime, master in model     the fp32 module itself      4Ψ params + 4Ψ grads + 8Ψ moments + 2Ψ 16-bit
                             (PyTorch AMP, FSDP's         copies per micro-batch in flight; the params
                             MixedPrecision)              sharded from stage 3 only
runtime, master in the       in the optimizer,           ZeRO's Figure 1: (2 + 2 + K)Ψ, K = 12; stage 1
optimizer                    sharded from stage 1        shards the K, stage 2 the gradients, stage 3
                                                         the 16-bit parameters
deepspeed                    in the optimizer            its estimators: ZeRO-2 2Ψ + 18Ψ/N, ZeRO-3 18Ψ/N
                                                         + 4 bytes x the largest layer
megatron                     in the optimizer            20 (fp16), 18 (bf16, fp32 grads), 16 (fp32);
                                                         with its distributed optimizer (``--zero 1``)
                                                         4 + 16/d, 6 + 12/d, 8 + 8/d
===========================  ==========================  ===============================================

``runtime`` (the default) is what dtlab's runtime allocates for the flags: with the master weights
in the optimizer (``master_weights="optimizer"``, the paper's split, what ``dtlab train`` runs for fp16
and bf16 unless told otherwise) or in the model (``"model"``, ``dtlab train --master-weights model``);
``dtlab plan --gpu local`` predicts this machine's runs either way.
``--grad-dtype`` sets the gradients' bytes where a layout keeps 16-bit or fp32 gradients.

DeepSpeed's and Megatron-LM's are their own formulas, exactly as their sources state them, for the
parameters one rank holds after TP and PP split them (``work.held``) over its ZeRO (data-parallel)
group; ``dtlab plan --json`` then counts what those trainers keep beside the model states that the plan
models: the activations (Korthikanti et al.), the logits and, for Megatron-LM, its pipeline's boundary
tensors. Their communication buckets are configurable and not counted (their estimators don't either).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from dtlab.config.layout import Layout, check_choice, default_master_weights
from dtlab.i18n import ConfigError
from dtlab.planner.architectures import Architecture
from dtlab.planner.formulas import BYTES_PER_VALUE, dtlab_model_states_bytes, model_states_bytes

MemoryModelName = Literal["runtime", "deepspeed", "megatron"]
MasterWeights = Literal["optimizer", "model"]
GradDtype = Literal["fp16", "bf16", "fp32"]
MEMORY_MODELS: tuple[str, ...] = get_args(MemoryModelName)
MASTER_WEIGHTS: tuple[str, ...] = get_args(MasterWeights)
GRAD_DTYPES: tuple[str, ...] = get_args(GradDtype)

DEFAULT_MASTER_WEIGHTS = "optimizer"
"""Where ``dtlab train`` keeps the fp32 master weights of fp16 and bf16 unless told, so the runtime memory
model's default: in the optimizer (but in the module with expert parallelism, as
:func:`dtlab.config.layout.default_master_weights` says for both)."""

STATES = {"dtlab": "model", "paper": "optimizer"}
"""``plan(states=...)``, the older name of the runtime's two layouts: -> ``master_weights``."""

GPT3_VOCAB, GPT3_WIDTH_PER_LAYER = 50_257, 128
"""The shape DeepSpeed's ZeRO-3 estimate assumes for a bare parameter count: GPT-3's vocabulary and
its width, h = 128 l, which GPT-3's models keep from 6.7B up (Brown et al. 2020, Table 2.1)."""


class FrameworkRefusal(ConfigError):
    """A layout the memory model's trainer does not run (DeepSpeed's ZeRO-2 with a pipeline, ...)."""


@dataclass(frozen=True, kw_only=True)
class MemoryModel:
    """Whose layout a plan counts, resolved and checked (:func:`memory_model_for`)."""

    name: str = "runtime"
    """``"runtime"``, ``"deepspeed"`` or ``"megatron"`` (:data:`MEMORY_MODELS`)."""
    master_weights: str | None = DEFAULT_MASTER_WEIGHTS
    """``"model"`` or ``"optimizer"``; None under fp32, where there is no master copy."""
    grad_dtype: str = "fp32"
    """The dtype gradients are kept (and, but for ``master_weights="model"``, communicated) in."""
    offload: bool = False
    """DeepSpeed's ``offload_optimizer: cpu``: its optimizer states (and fp32 partitions) off the GPU."""

    @property
    def grad_bytes(self) -> int:
        return BYTES_PER_VALUE[self.grad_dtype]

    def states(self, params: int, *, dp: int, zero: int, precision: str) -> dict[str, int]:
        """Bytes of ``params`` parameters' states on a rank of ``dp`` ZeRO ranks: params, grads, optimizer,
        copies (DeepSpeed's ZeRO-3 largest layer aside: :func:`deepspeed_largest_layer_bytes`)."""
        if self.name == "deepspeed":
            return deepspeed_states(params, dp=dp, zero=zero, offload=self.offload)
        if self.name == "megatron":
            return megatron_states(
                params, dp=dp, zero=zero, param_bytes=BYTES_PER_VALUE[precision], grad_bytes=self.grad_bytes
            )
        if self.master_weights == "model":
            return dtlab_model_states_bytes(params, dp=dp, zero=zero, precision=precision)
        states = model_states_bytes(params, dp=dp, zero=zero, precision=precision, grad_bytes=self.grad_bytes)
        return {**states, "copies": 0}


def memory_model_for(
    name: str = "runtime",
    layout: Layout = Layout(),  # noqa: B008 - a frozen value
    *,
    master_weights: str | None = None,
    grad_dtype: str | None = None,
    offload: bool = False,
    states: str | None = None,
) -> MemoryModel:
    """The memory model ``name`` for ``layout``; a bilingual ConfigError naming what is allowed otherwise
    (a :class:`FrameworkRefusal` for a layout its trainer does not run)."""
    check_choice("memory_model", name, MEMORY_MODELS)
    for option, value, allowed in (
        ("master_weights", master_weights, MASTER_WEIGHTS),
        ("grad_dtype", grad_dtype, GRAD_DTYPES),
    ):
        if value is not None:
            check_choice(option, value, allowed)
    check_choice("offload", offload, (False, True))
    if states is not None:
        check_choice("states", states, tuple(STATES))
        if name != "runtime" or master_weights not in (None, STATES[states]):
            raise ConfigError(
                f"states={states!r} is master_weights={STATES[states]!r} of the runtime memory model; got "
                f"memory_model={name!r}, master_weights={master_weights!r} (allowed: one of the two)",
                f"states={states!r} 即运行时显存模型的 master_weights={STATES[states]!r}；收到的是 "
                f"memory_model={name!r}、master_weights={master_weights!r}（允许：只用其中一种写法）",
            )
        master_weights = STATES[states]
    precision, mixed = layout.precision, layout.precision != "fp32"
    if name == "runtime":
        master_weights = master_weights or default_master_weights(precision, ep=layout.ep) or "model"
        grads = ("fp32",) if master_weights == "model" or not mixed else (precision, "fp32")
        _refuse_offload(name, offload)
    else:
        if master_weights not in (None, "optimizer"):
            raise ConfigError(
                f"master_weights={master_weights!r} with memory_model={name!r}: its optimizer keeps the fp32 "
                "master weights (allowed: 'optimizer', or leave it out)",
                f"master_weights={master_weights!r} 与 memory_model={name!r} 不能同时使用：它的优化器保存 fp32 "
                "主权重（允许：'optimizer'，或不给）",
            )
        master_weights = "optimizer"
        grads = _check_framework(name, layout, offload)
    if grad_dtype is not None and grad_dtype not in grads:
        raise ConfigError(
            f"grad_dtype={grad_dtype!r} with memory_model={name!r}, master_weights={master_weights!r}, "
            f"precision={precision!r} (allowed: {', '.join(map(repr, grads))})",
            f"grad_dtype={grad_dtype!r} 不适用于 memory_model={name!r}、master_weights={master_weights!r}、"
            f"precision={precision!r}（允许：{', '.join(map(repr, grads))}）",
        )
    return MemoryModel(
        name=name,
        master_weights=master_weights if mixed else None,
        grad_dtype=grad_dtype or grads[0],
        offload=offload,
    )


def _refuse_offload(name: str, offload: bool) -> None:
    if offload:
        raise ConfigError(
            f"offload=True with memory_model={name!r}: only DeepSpeed's estimators count offloading here "
            "(allowed: memory_model='deepspeed', or offload=False)",
            f"offload=True 与 memory_model={name!r} 不能同时使用：这里只有 DeepSpeed 的估算公式计入卸载"
            "（允许：memory_model='deepspeed'，或 offload=False）",
        )


def _check_framework(name: str, layout: Layout, offload: bool) -> tuple[str, ...]:
    """What DeepSpeed's estimators or Megatron-LM's table cover; the gradient dtypes allowed, default first."""
    precision, zero = layout.precision, layout.zero
    if name == "megatron":
        _refuse_offload(name, offload)
        if zero not in (0, 1):
            raise FrameworkRefusal(
                f"memory_model='megatron' with zero={zero}: Megatron-LM's optimizer is whole (zero=0) or "
                "its distributed optimizer, which shards the optimizer states like ZeRO-1 (zero=1) (allowed: 0, 1)",
                f"memory_model='megatron' 与 zero={zero} 不能同时使用：Megatron-LM 的优化器要么不切分（zero=0），"
                "要么是它的分布式优化器，像 ZeRO-1 一样切分优化器状态（zero=1）（允许：0、1）",
            )
        return ("fp32", "bf16") if precision == "bf16" else (precision, "fp32") if precision == "fp16" else ("fp32",)
    if precision == "fp32" or zero not in (2, 3):
        raise FrameworkRefusal(
            f"memory_model='deepspeed' with precision={precision!r}, zero={zero}: DeepSpeed's estimators "
            "(estimate_zero2_model_states_mem_needs, estimate_zero3_...) cover 16-bit weights with an fp32 "
            "master at ZeRO-2 and ZeRO-3 (allowed: precision 'bf16' or 'fp16', zero 2 or 3)",
            f"memory_model='deepspeed' 不适用于 precision={precision!r}、zero={zero}：DeepSpeed 的估算公式"
            "（estimate_zero2_model_states_mem_needs、estimate_zero3_...）针对 16 位权重加 fp32 主权重、"
            "ZeRO-2 与 ZeRO-3（允许：precision 为 'bf16' 或 'fp16'，zero 为 2 或 3）",
        )
    if layout.pp > 1:
        raise FrameworkRefusal(
            f"memory_model='deepspeed' with pp={layout.pp}, zero={zero}: DeepSpeed's pipeline engine "
            'refuses it ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism") (allowed: pp=1)',
            f"memory_model='deepspeed' 与 pp={layout.pp}、zero={zero} 不能同时使用：DeepSpeed 的流水线引擎"
            "拒绝它（“ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism”）（允许：pp=1）",
        )
    return (precision,)


# --- the frameworks' formulas ----------------------------------------------------------------


def deepspeed_states(params: int, *, dp: int, zero: int, offload: bool = False) -> dict[str, int]:
    """Bytes per GPU as DeepSpeed's estimators count them, Ψ = ``params``, N = ``dp`` (their total_gpus).

    ``deepspeed/runtime/zero/stage_1_and_2.py``, ``estimate_zero2_model_states_mem_needs``: without
    offload ``2 * total_params + int(18 * total_params / total_gpus)``, "2 = params_16bit, 18 =
    2_grads_16bit + 4_grads_32bit + 4_params_32bit + 8_optimizer_states_32bit"; with
    ``offload_optimizer`` ``2 * total_params``. ``stage3.py``, ``estimate_zero3_model_states_mem_needs``:
    ``largest_layer_memory + int(18 * total_params / total_gpus)`` without offload, ``largest_layer_memory
    + int(2 * total_params / total_gpus)`` with the optimizer offloaded and the parameters kept (the
    largest layer is :func:`deepspeed_largest_layer_bytes`, added by the caller). Python's float
    division and ``int`` as DeepSpeed writes them, so the sum is its own to the byte.

    In dtlab's categories: ``params`` the 16-bit weights (ZeRO-3: their 2Ψ/N shard), ``grads`` the
    16-bit and fp32 gradient partitions (ZeRO-3: the fp32 one, 4Ψ/N, reading its 18 as 2 + 4 + 4 + 8:
    DeepSpeed's documentation counts the 16-bit gradients only in the largest layer), ``optimizer``
    the fp32 master and Adam's moments, 12Ψ/N. Beyond the paper DeepSpeed keeps the fp32 gradient
    partition.
    """
    psi, n = params, dp
    if zero == 2:
        if offload:
            return {"params": 2 * psi, "grads": 0, "optimizer": 0, "copies": 0}
        grads = int(6 * psi / n)
        return {"params": 2 * psi, "grads": grads, "optimizer": int(18 * psi / n) - grads, "copies": 0}
    shard = int(2 * psi / n)
    if offload:
        return {"params": shard, "grads": 0, "optimizer": 0, "copies": 0}
    grads = int(6 * psi / n) - shard
    return {"params": shard, "grads": grads, "optimizer": int(18 * psi / n) - shard - grads, "copies": 0}


def deepspeed_largest_layer_bytes(largest_layer_params: int) -> dict[str, int]:
    """DeepSpeed's ZeRO-3 ``largest_layer_memory = 4 * largest_layer_params``: "2 bytes fp16 params are
    gathered and 2 bytes fp16 grads are computed" (its documentation, "Memory requirements")."""
    return {"params": 2 * largest_layer_params, "grads": 2 * largest_layer_params}


def megatron_states(params: int, *, dp: int, zero: int, param_bytes: int, grad_bytes: int) -> dict[str, int]:
    """Megatron-LM's bytes per parameter, without (zero 0) and with (zero 1) its distributed optimizer.

    Megatron-LM's documentation (``docs/source/api-guide/dist_optimizer.md``), d the data-parallel size:

    ==========================  ===========  =============
    params, grads               whole        distributed
    ==========================  ===========  =============
    fp16, fp16                  20           4 + 16/d
    bf16, fp32                  18           6 + 12/d
    fp32, fp32                  16           8 + 8/d
    ==========================  ===========  =============

    Every row is the same rule: the model's parameters and gradient buffer stay whole (p + g); the
    optimizer keeps fp32 main parameters (4, unless the model's are fp32), fp32 main gradients (4,
    unless the model's gradients are fp32 already) and Adam's two moments (8), which the distributed
    optimizer shards. In dtlab's categories the main gradients are ``grads``, the main parameters and
    moments ``optimizer``. A shard is ceil(Ψ/d) elements: the buffer padded to a multiple of d.
    """
    shard = -(-params // dp) if zero == 1 else params
    main_params, main_grads = (0 if param_bytes == 4 else 4), (0 if grad_bytes == 4 else 4)
    return {
        "params": param_bytes * params,
        "grads": grad_bytes * params + main_grads * shard,
        "optimizer": (main_params + 8) * shard,
        "copies": 0,
    }


def largest_layer(arch: Architecture, tp: int = 1) -> int:
    """Parameters of the largest module on one TP rank, each module's own weight and bias, as DeepSpeed's
    ``model_to_params`` counts them (``sum(p.numel() for p in m.parameters(recurse=False))``), in
    dtlab's GPT layout: the token table (ceil(V/t) rows when vocabulary-parallel), the position table,
    Q/K/V as one Linear, the attention output, each MLP matrix, a norm, an untied head; an expert whole.
    For GPT-3 175B it is the token table, V x h = 617.6M parameters.
    """
    h, kv, f, t, b = arch.hidden, arch.kv_dim, arch.ffn, tp, arch.bias
    split = 1 if arch.experts else t
    modules = [
        arch.vocab_rows(t) * h,
        arch.seq_len * h if arch.learned_positions else 0,
        (h * (h + 2 * kv) + (h + 2 * kv if b else 0)) // t,
        h * h // t + (h if b else 0),
        (h * f + (f if b else 0)) // split,
        f * h // split + (h if b else 0),
        arch.norm_params(),
    ]
    return max(modules)


def assumed_largest_layer(params: int) -> int:
    """DeepSpeed's largest layer for a bare parameter count: the token table of a GPT-3-shaped model,
    :data:`GPT3_VOCAB` x h with h = round((32Ψ/3)^(1/3)), from Ψ = 12 l h^2 and h = 128 l (or its
    MLP's first matrix and bias, 4h^2 + 4h, if that were larger). 7.5B: h = 4,309; 175B: h = 12,311."""
    h = round((32 * params / 3) ** (1 / 3))
    return max(GPT3_VOCAB * h, 4 * h * h + 4 * h)
