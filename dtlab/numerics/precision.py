"""Mixed-precision training: fp16/bf16 compute, fp32 master weights (Micikevicius et al., 2017).

Mixed Precision Training (Micikevicius et al., ICLR 2018, arXiv 2017), Fig. 1,
has three ingredients, and this module is the first two (the third is
:mod:`dtlab.numerics.loss_scaling`):

1. **fp32 master weights** (Sec. 3.1). The optimizer updates fp32 weights.
   An update is often 2^-11 times smaller than its weight or less; added in
   fp16 (10 mantissa bits) it would round away to nothing. The master can
   live in the optimizer (``--master-weights optimizer``, the trainer's
   default for fp16 and bf16: the parameters are 16-bit,
   :mod:`dtlab.numerics.master_weights`) or be the model's own fp32
   parameters (``--master-weights model``, this module alone: the casts
   below make each layer compute in 16 bits).
2. **Low-precision compute, fp32 accumulation** (Sec. 3.3). Each layer casts
   its weights to fp16/bf16 as it runs ("float2half" in Fig. 1) and computes
   in that format, so activations, and the gradients flowing back through
   them, are 16-bit: half the bytes, and tensor-core speed on a GPU. The
   cast is differentiable: its backward turns each weight's 16-bit gradient
   into fp32, which autograd *adds* into the fp32 ``.grad``, so gradient
   accumulation over micro-steps happens in fp32. Reductions stay in fp32:
   LayerNorm's mean and variance, and the softmax and cross-entropy of the
   loss (the head's logits are returned in fp32).
3. **Loss scaling** (Sec. 3.2) for fp16 only: see :mod:`dtlab.numerics.loss_scaling`.
   bf16 has fp32's 8 exponent bits, so it underflows where fp32 does and
   needs no scaling; it pays with 7 mantissa bits instead of fp16's 10.

A training step::

    mp = MixedPrecision("fp16", loss_scale="dynamic")        # or "bf16", "fp32"
    model = mp.apply(build_model(cfg, seed=0))              # same parameters, still fp32
    optimizer = make_optimizer(model.parameters(), config)  # steps the fp32 masters
    ...
    optimizer.zero_grad(set_to_none=True)
    mp.backward(model(x, y))                  # (S x loss).backward(); fp32 grads accumulate
    skipped, loss_scale = mp.step(optimizer)  # unscale, check, step unless overflow, update S

The format explorer at the end (:func:`format_table`, :func:`underflows_in`)
shows why: the range and precision of each format, and which gradient values
fp16 flushes to zero with and without a scale.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn as nn

from dtlab.i18n import ConfigError
from dtlab.numerics.fp8 import Fp8Capable
from dtlab.numerics.loss_scaling import LossScaler, make_loss_scaler
from dtlab.numerics.master_weights import MasterWeights
from dtlab.parallel.dp_optimizer import DPOptimizer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
"""``--precision`` -> the dtype layers compute in. Under fp8 that is bf16 for every layer but the
blocks' Linear layers, whose matmuls take fp8 inputs (:mod:`dtlab.numerics.fp8`)."""


# --------------------------------------------------------------------------- cast on forward


def _cast_floats(values: tuple, dtype: torch.dtype) -> tuple:
    return tuple(v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in values)


class _CastOnForward:
    """Forward hooks on one module: run it on 16-bit copies of its fp32 parameters and inputs.

    Before the module's forward, each fp32 parameter is swapped for ``p.to(dtype)``
    (its gradient flows back through the cast to the fp32 parameter); after it,
    the fp32 parameters are put back, even if the forward raised. The hooks fire
    on every call, so a block recomputed during backward
    (:mod:`dtlab.numerics.gradient_checkpointing`) casts again and still computes in 16 bits.
    """

    def __init__(self, dtype: torch.dtype, fp32_output: bool):
        self.dtype, self.fp32_output = dtype, fp32_output
        self.masters: dict = {}

    def before(self, module: nn.Module, args: tuple) -> tuple:
        self.masters = dict(module._parameters)  # the fp32 nn.Parameters
        for name, p in self.masters.items():
            if p is not None and p.dtype != self.dtype:
                module._parameters[name] = p.to(self.dtype)  # float2half, differentiable
        return _cast_floats(args, self.dtype)

    def after(self, module: nn.Module, args: tuple, output):
        module._parameters.update(self.masters)  # outside forward: fp32 again
        self.masters = {}
        if self.fp32_output and isinstance(output, torch.Tensor):
            return output.float()
        return None


def apply_mixed_precision(
    model: nn.Module,
    precision: str,
    *,
    fp32_modules: tuple[type, ...] = (nn.LayerNorm,),
    fp32_outputs: tuple[str, ...] = ("head",),
) -> nn.Module:
    """Make every layer of ``model`` compute in ``precision``, in place; parameters stay fp32.

    Each module that owns parameters (a Linear, an Embedding, a LayerNorm)
    gets the cast-on-forward hooks. ``fp32_modules`` compute in fp32 instead
    (their inputs are cast up): LayerNorm's statistics are reductions. The
    modules named in ``fp32_outputs`` return fp32, so what follows them (for
    the GPT, the softmax and cross-entropy on the logits) runs in fp32.
    Parameter names, dtypes and the optimizer are unchanged. ``"fp32"`` returns
    the model untouched; otherwise the model is marked (``model.dtlab_precision``)
    and a second call refuses, since stacked casts would not restore cleanly.
    """
    dtype = _dtype(precision)
    if dtype == torch.float32:
        return model
    if getattr(model, "dtlab_precision", None) is not None:
        raise ConfigError(
            f"this model already computes in {model.dtlab_precision}; apply precision once",
            f"这个模型已经在用 {model.dtlab_precision} 计算；精度只能设置一次",
        )
    model.dtlab_precision = precision
    for name, module in model.named_modules():
        if not any(p is not None for p in module._parameters.values()):
            continue  # no weights of its own: nothing to cast
        if isinstance(module, Fp8Capable) and module.fp8 is not None:
            continue  # quantizes its fp32 weights to fp8 itself (dtlab/numerics/fp8.py): no bf16 copy first
        compute = torch.float32 if isinstance(module, fp32_modules) else dtype
        # Matched on the name's end, so "head" is found inside a wrapper too ("module.head").
        fp32_output = any(name == out or name.endswith("." + out) for out in fp32_outputs)
        hooks = _CastOnForward(compute, fp32_output=fp32_output)
        module.register_forward_pre_hook(hooks.before)
        module.register_forward_hook(hooks.after, always_call=True)
    return model


def _dtype(precision: str) -> torch.dtype:
    if precision not in DTYPES:
        raise ConfigError(
            f"precision={precision!r} is not allowed; expected one of {list(DTYPES)}",
            f"precision={precision!r} 不合法；应为 {list(DTYPES)} 之一",
        )
    return DTYPES[precision]


# --------------------------------------------------------------------------- the training step


class StepResult(NamedTuple):
    skipped: bool
    """True when a gradient overflowed: the optimizer did not step."""
    loss_scale: float | None
    """The loss scale this step's backward used; None unless fp16."""


class MixedPrecision:
    """What a training loop needs for ``--precision`` and ``--loss-scale``.

    ``scaler`` is a :class:`~dtlab.numerics.loss_scaling.LossScaler` for fp16 and None
    for bf16 and fp32. ``group=`` is the process group whose ranks must skip
    an overflowing step together (None: the whole world).
    """

    def __init__(self, precision: str = "fp32", *, loss_scale: str | float = "dynamic", group=None):
        self.precision = precision
        self.dtype = _dtype(precision)
        self.scaler: LossScaler | None = make_loss_scaler(loss_scale, group=group) if precision == "fp16" else None

    def apply(self, model: nn.Module) -> nn.Module:
        """The model, computing in this precision (see :func:`apply_mixed_precision`)."""
        return apply_mixed_precision(model, self.precision)

    @property
    def loss_scale(self) -> float | None:
        """The scale the next backward will use; None unless fp16."""
        return None if self.scaler is None else self.scaler.loss_scale

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, with the loss multiplied by S first under fp16."""
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def step(self, optimizer: torch.optim.Optimizer, before_step=None) -> StepResult:
        """Unscale and check the gradients, step the fp32 masters unless one overflowed, update S.

        A skipped step calls no ``optimizer.step()``: the weights, Adam's
        moments and its step count stay exactly as they were. Gradients are
        left for the caller's ``zero_grad``. ``before_step`` (no arguments),
        if given, is called right before ``optimizer.step()``, and only if the
        step is taken (the trainer's gradient clipping).
        """
        if self.scaler is None:
            if before_step is not None:
                before_step()
            optimizer.step()
            return StepResult(False, None)
        used = self.scaler.loss_scale
        if isinstance(optimizer, MasterWeights):  # unscaled in fp32, on the masters' gradients
            optimizer.take_gradients()
            grads = [m.grad for m in optimizer.masters if m.grad is not None]
        elif isinstance(optimizer, DPOptimizer):
            # The gradients its step uses: an offloaded optimizer's param_groups are its host
            # copies, which get no gradient before step() (checking them would miss an overflow).
            grads = [piece.grad for piece in optimizer.gradients()]
        else:
            grads = [p for group in optimizer.param_groups for p in group["params"]]
        found_inf = self.scaler.unscale_and_check(grads)
        if not found_inf:
            if before_step is not None:
                before_step()
            optimizer.step()
        self.scaler.update(found_inf)
        return StepResult(found_inf, used)

    def state_dict(self) -> dict:
        return {"precision": self.precision, "scaler": None if self.scaler is None else self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state["precision"] != self.precision:
            raise ConfigError(
                f"this state was saved with precision={state['precision']!r}, "
                f"but this run uses precision={self.precision!r}",
                f"该状态保存时 precision={state['precision']!r}，而本次运行是 precision={self.precision!r}",
            )
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])


# --------------------------------------------------------------------------- format explorer


def format_table() -> list[dict]:
    """fp32, fp16 and bf16 side by side, read from ``torch.finfo``.

    A float is sign x 2^exponent x 1.mantissa. The exponent bits set the
    range (``max``, ``smallest_normal``); below the smallest normal,
    subnormals trade precision for range down to ``smallest_subnormal``,
    and anything smaller becomes 0. The mantissa bits set the precision:
    ``epsilon`` = 2^-mantissa_bits is the gap between 1 and the next number.
    """
    rows = []
    for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        info = torch.finfo(dtype)
        mantissa = round(-math.log2(info.eps))
        rows.append(
            {
                "format": name,
                "bits": info.bits,
                "exponent_bits": info.bits - 1 - mantissa,
                "mantissa_bits": mantissa,
                "max": info.max,
                "smallest_normal": info.smallest_normal,
                "smallest_subnormal": info.smallest_normal * info.eps,
                "epsilon": info.eps,
            }
        )
    return rows


def describe_formats() -> str:
    """:func:`format_table` as aligned text, for printing in a lesson."""
    columns = (
        "format",
        "bits",
        "exponent_bits",
        "mantissa_bits",
        "max",
        "smallest_normal",
        "smallest_subnormal",
        "epsilon",
    )
    lines = ["  ".join(f"{c:>18}" for c in columns)]
    for row in format_table():
        lines.append("  ".join(f"{row[c]:>18.6g}" if isinstance(row[c], float) else f"{row[c]:>18}" for c in columns))
    return "\n".join(lines)


def underflows_in(values, dtype: torch.dtype = torch.float16, *, scale: float = 1.0) -> torch.Tensor:
    """True where a non-zero ``value * scale`` becomes 0 when stored in ``dtype``.

    ``underflows_in(grads)`` shows which gradients fp16 loses without loss
    scaling; ``underflows_in(grads, scale=2**16)`` shows which survive a scale.
    """
    exact = torch.as_tensor(values, dtype=torch.float64)
    stored = (exact * scale).to(dtype)
    return (exact != 0) & (stored == 0)


def overflows_in(values, dtype: torch.dtype = torch.float16, *, scale: float = 1.0) -> torch.Tensor:
    """True where a finite ``value * scale`` becomes inf in ``dtype``: the scale is too large."""
    exact = torch.as_tensor(values, dtype=torch.float64)
    stored = (exact * scale).to(dtype)
    return torch.isfinite(exact) & torch.isinf(stored)
