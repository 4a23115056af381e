"""FP8 training: matmuls on 8-bit floats with a scale per tensor (Micikevicius et al., 2022).

"FP8 Formats for Deep Learning" (Micikevicius et al., 2022, Table 1) defines two
8-bit formats, a sign bit and seven bits shared between exponent and mantissa:

    e4m3  4 exponent, 3 mantissa bits   max 448     smallest subnormal 2^-9   (more precision)
    e5m2  5 exponent, 2 mantissa bits   max 57344   smallest subnormal 2^-16  (more range)

The paper's recipe (Sec. 4), which this module follows: weights and activations
in e4m3 in the forward pass, gradients in e5m2 in the backward pass, the
product of two fp8 tensors accumulated in higher precision, and the master
weights, the optimizer and everything that is not a matmul as in bf16 training
(:mod:`dtlab.numerics.precision`).

Eight bits cover a narrow band of magnitudes, so a tensor is multiplied by a
**scale** s before the cast and the product divided by it after. The scale
puts the tensor's largest magnitude, its **amax**, just under the format's max
(Sec. 4.3; "margin": a power of two of headroom):

    s = max_fp8 / amax / 2^margin        x_fp8 = cast(clamp(x * s, -max_fp8, max_fp8))
    y = (x_fp8 @ w_fp8^T) / (s_x * s_w)                  (torch._scaled_mm: both divisions in one)

A value whose ``|x * s|`` lies beyond max_fp8 (by more than rounding) **saturates** (it is clamped to max);
a non-zero value smaller than half the smallest subnormal **flushes** to zero.
:class:`TensorScaling` counts both, per tensor and step.

Which amax? **Current scaling** takes this tensor's own (one more pass over
it before the cast). **Delayed scaling** (Transformer Engine's recipe) takes
the largest amax of the last N steps' tensors in the same place, so the scale
is known before the tensor is: after a spike, that spike's amax keeps the scale
small for N steps, and values that are now ordinary flush toward zero. Here
``history=0`` is current scaling; ``history=N >= 1`` delayed scaling over the
last N steps (N = 1: the previous step's amax), current scaling until the first
step has ended.

A training step::

    apply_fp8(model, history=0)          # the blocks' Linear layers compute in fp8
    loss = model(x, y); loss.backward()  # fp8 forward (e4m3) and backward (e5m2)
    stats = take_fp8_stats(model)        # per layer: amax, scale, saturated, flushed
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from dtlab.i18n import ConfigError

# --------------------------------------------------------------------------- the formats


@dataclass(frozen=True)
class Fp8Format:
    """One 8-bit float format, its numbers read from ``torch.finfo``."""

    name: str
    dtype: torch.dtype
    exponent_bits: int
    mantissa_bits: int

    @property
    def max(self) -> float:
        """The largest finite value (e4m3: 448; e5m2: 57344)."""
        return float(torch.finfo(self.dtype).max)

    @property
    def saturates_above(self) -> float:
        """max plus half the gap below it: a scaled value beyond this would round past max, so clamping
        it to max changes it (448.00003 rounds to 448 anyway: not saturated). e4m3: 464; e5m2: 61440."""
        gap = 2.0 ** (math.floor(math.log2(self.max)) - self.mantissa_bits)
        return self.max + gap / 2

    @property
    def smallest_normal(self) -> float:
        return float(torch.finfo(self.dtype).smallest_normal)

    @property
    def smallest_subnormal(self) -> float:
        """Below half of it a value rounds to 0: it flushes."""
        return self.smallest_normal * 2.0**-self.mantissa_bits

    @property
    def epsilon(self) -> float:
        """The gap between 1 and the next value, 2^-mantissa_bits: the precision."""
        return 2.0**-self.mantissa_bits


E4M3 = Fp8Format("e4m3", torch.float8_e4m3fn, 4, 3)
E5M2 = Fp8Format("e5m2", torch.float8_e5m2, 5, 2)
FORMATS = {"e4m3": E4M3, "e5m2": E5M2}
"""The two formats of the OCP FP8 specification, by name."""


def format_table() -> list[dict]:
    """e4m3 and e5m2 side by side: range (max, smallest normal and subnormal) and precision (epsilon)."""
    return [
        {
            "format": f.name,
            "exponent_bits": f.exponent_bits,
            "mantissa_bits": f.mantissa_bits,
            "max": f.max,
            "smallest_normal": f.smallest_normal,
            "smallest_subnormal": f.smallest_subnormal,
            "epsilon": f.epsilon,
            "decades": round(math.log10(f.max / f.smallest_subnormal), 1),
        }
        for f in FORMATS.values()
    ]


def number_line(fmt: Fp8Format) -> torch.Tensor:
    """Every non-negative finite value ``fmt`` holds, ascending (e4m3: 127 of them, e5m2: 124)."""
    values = torch.arange(256, dtype=torch.uint8).view(fmt.dtype).float()
    return values[torch.isfinite(values) & (values >= 0)].unique()


# --------------------------------------------------------------------------- scale and quantize


def compute_scale(amax: torch.Tensor, fmt: Fp8Format, margin: int = 0) -> torch.Tensor:
    """``max_fp8 / amax / 2^margin`` as an fp32 scalar tensor; 1 where amax is 0 or not finite.

    A tensor of zeros needs no scale, and an amax of inf or NaN (an overflow
    upstream) would give a scale of 0 or NaN that wipes the whole tensor out.
    """
    amax = torch.as_tensor(amax, dtype=torch.float32)
    usable = torch.isfinite(amax) & (amax > 0)
    scale = fmt.max / torch.where(usable, amax, torch.ones_like(amax)) / 2.0**margin
    return torch.where(usable, scale, torch.ones_like(scale))


def quantize(tensor: torch.Tensor, fmt: Fp8Format, scale, *, amax: torch.Tensor | None = None) -> tuple:
    """``tensor * scale`` cast to ``fmt`` (saturating), and what the cast did.

    Returns the fp8 tensor and its stats, each a scalar tensor (no device sync):
    ``amax`` (of ``tensor``, before scaling), ``saturated`` (values with
    ``|x * scale| > fmt.saturates_above``, clamped to max), ``flushed`` (non-zero values that
    became 0) and ``numel``. Dequantize with ``q.float() / scale``. ``amax``: the tensor's, if known.
    """
    scale = torch.as_tensor(scale, dtype=torch.float32, device=tensor.device)
    scaled = tensor.float() * scale
    q = scaled.clamp(-fmt.max, fmt.max).to(fmt.dtype)  # torch's cast alone would give NaN or inf
    stats = {
        "amax": tensor_amax(tensor) if amax is None else amax,
        "saturated": (scaled.abs() > fmt.saturates_above).sum(),
        "flushed": ((tensor != 0) & (q.float() == 0)).sum(),
        "numel": tensor.numel(),
    }
    return q, stats


def tensor_amax(tensor: torch.Tensor) -> torch.Tensor:
    """The largest magnitude in ``tensor`` (0 for an empty one), an fp32 scalar tensor."""
    if not tensor.numel():
        return torch.zeros((), device=tensor.device)
    return tensor.detach().abs().amax().float()


class TensorScaling:
    """The scale of one tensor in one place (a layer's input, weight or gradient), and its step's stats.

    ``history`` = 0: current scaling, from the tensor's own amax. ``history`` = N:
    delayed scaling, from the largest amax of the last N ended steps (current
    scaling until one has ended). Each step's quantizations add to its stats;
    :meth:`end_step` closes the step: its amax joins the history.
    """

    def __init__(self, fmt: Fp8Format, *, history: int = 0, margin: int = 0):
        self.fmt, self.history_len, self.margin = fmt, history, margin
        self.history: deque = deque(maxlen=max(history, 1))
        self._reset()

    def _reset(self) -> None:
        self.amax = self.saturated = self.flushed = None
        self.numel, self.scale = 0, None

    def scale_for(self, amax: torch.Tensor) -> torch.Tensor:
        """The scale a tensor of this ``amax`` is quantized with (see the class docstring)."""
        if self.history_len and self.history:
            amax = torch.stack(list(self.history)).amax()
        return compute_scale(amax, self.fmt, self.margin)

    def quantize(self, tensor: torch.Tensor, *, count: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """``tensor`` in fp8 and its scale; with ``count``, the step's stats include it (:func:`fp8_linear`
        does not count a forward that autograd does not record, such as a recomputed block's first pass)."""
        amax = tensor_amax(tensor)
        scale = self.scale_for(amax)
        q, stats = quantize(tensor, self.fmt, scale, amax=amax)
        if count:
            self.scale = scale
            self.amax = stats["amax"] if self.amax is None else torch.maximum(self.amax, stats["amax"])
            self.saturated = stats["saturated"] + (0 if self.saturated is None else self.saturated)
            self.flushed = stats["flushed"] + (0 if self.flushed is None else self.flushed)
            self.numel += stats["numel"]
        return q, scale

    def end_step(self) -> dict | None:
        """This step's ``amax``, ``scale`` (the last used), ``saturated`` and ``flushed`` (shares of the
        values quantized), as Python numbers (None where not finite); the amax joins the history."""
        if not self.numel:
            return None
        amax = self.amax.detach().float()  # stays on the device, where the next scales are computed
        if self.history_len and bool(torch.isfinite(amax)):
            self.history.append(amax)
        out = {
            "format": self.fmt.name,
            "amax": _finite(amax),
            "scale": _finite(self.scale),
            "saturated": int(self.saturated) / self.numel,
            "flushed": int(self.flushed) / self.numel,
        }
        self._reset()
        return out


def _finite(value: torch.Tensor) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None  # records are strict JSON


class Fp8State:
    """One layer's three scalings: its input and weight (e4m3) and its output's gradient (e5m2)."""

    def __init__(self, name: str, *, history: int = 0, margin: int = 0, out_dtype=torch.bfloat16):
        self.name, self.out_dtype = name, out_dtype
        self.input = TensorScaling(E4M3, history=history, margin=margin)
        self.weight = TensorScaling(E4M3, history=history, margin=margin)
        self.grad = TensorScaling(E5M2, history=history, margin=margin)

    def end_step(self) -> dict:
        return {role: getattr(self, role).end_step() for role in ("input", "weight", "grad")}


# --------------------------------------------------------------------------- the matmul


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a, scale_b, out_dtype: torch.dtype) -> torch.Tensor:
    """``(a / scale_a) @ (b / scale_b)`` for fp8 ``a`` (M, K) and ``b`` (K, N), accumulated in fp32.

    ``torch._scaled_mm`` takes the dequantizing factors 1/scale, ``a`` row-major
    and ``b`` column-major. On CUDA its kernels need K and N to be multiples of
    16; a smaller matrix (the tiny model's) is dequantized and multiplied in
    fp32 instead: the same products of the same fp8 values.
    """
    inv_a, inv_b = 1.0 / scale_a, 1.0 / scale_b
    if a.is_cuda and (a.shape[1] % 16 or b.shape[1] % 16):
        return ((a.float() * inv_a) @ (b.float() * inv_b)).to(out_dtype)
    return torch._scaled_mm(a, b, scale_a=inv_a.float(), scale_b=inv_b.float(), out_dtype=out_dtype)


class _Fp8Linear(torch.autograd.Function):
    """``y = x W^T + b`` with x and W in e4m3; backward with the output's gradient in e5m2.

    ::

        forward   y  (M, N) = x_e4m3 (M, K) @ W_e4m3^T (K, N)              M = B*T tokens
        backward  dx (M, K) = g_e5m2 (M, N) @ W_e4m3   (N, K)
                  dW (N, K) = g_e5m2^T (N, M) @ x_e4m3 (M, K)               fp32, into the master's .grad
                  db (N,)   = sum of g over tokens (not quantized)

    Saves the fp8 x and W for backward: one byte a value.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, state: Fp8State, count: bool):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # (M, K)
        xq, sx = state.input.quantize(x2, count=count)  # (M, K) e4m3
        wq, sw = state.weight.quantize(weight, count=count)  # (N, K) e4m3
        y = scaled_mm(xq, wq.t(), sx, sw, state.out_dtype)  # (M, N); wq.t() is column-major
        if bias is not None:
            y = y + bias.to(state.out_dtype)
        ctx.save_for_backward(xq, wq, sx, sw)
        ctx.state, ctx.x_dtype, ctx.w_dtype, ctx.has_bias = state, x.dtype, weight.dtype, bias is not None
        return y.view(*shape[:-1], y.shape[-1])  # (..., N)

    @staticmethod
    def backward(ctx, grad):
        xq, wq, sx, sw = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])  # (M, N)
        gq, sg = ctx.state.grad.quantize(g2)  # (M, N) e5m2
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            w_cols = wq.t().contiguous().t()  # (N, K), column-major
            grad_x = scaled_mm(gq, w_cols, sg, sw, ctx.x_dtype).view(*grad.shape[:-1], wq.shape[1])
        if ctx.needs_input_grad[1]:
            x_cols = xq.t().contiguous().t()  # (M, K), column-major
            grad_w = scaled_mm(gq.t().contiguous(), x_cols, sg, sx, torch.float32).to(ctx.w_dtype)  # (N, K)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g2.float().sum(0)  # (N,)
        return grad_x, grad_w, grad_b, None, None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, state: Fp8State) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed in fp8 with ``state``'s scales (see :class:`_Fp8Linear`)."""
    # A custom Function's forward runs with grad mode off: whether autograd records this call is asked here.
    return _Fp8Linear.apply(x, weight, bias, state, torch.is_grad_enabled())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, fp8: Fp8State | None = None):
    """The matmul of every :class:`Fp8Capable` layer: ``F.linear``, or :func:`fp8_linear` once it has a state."""
    return F.linear(x, weight, bias) if fp8 is None else fp8_linear(x, weight, bias, fp8)


# --------------------------------------------------------------------------- the layers


class Fp8Capable:
    """A layer whose matmul runs through :func:`linear`: ``fp8`` is its :class:`Fp8State`, None
    (the default) while it computes as before. The tensor-parallel layers
    (dtlab/parallel/tensor_parallel.py, sequence_parallel.py) and :class:`Fp8Linear` are."""

    fp8: Fp8State | None = None


class Fp8Linear(Fp8Capable, nn.Linear):
    """``nn.Linear`` whose matmul is :func:`linear`: what :func:`apply_fp8` puts in a dense block."""

    @classmethod
    def from_linear(cls, dense: nn.Linear) -> "Fp8Linear":
        """The same Parameters (names, optimizer and hooks see no change), in an :class:`Fp8Linear`."""
        new = cls(dense.in_features, dense.out_features, bias=dense.bias is not None, device="meta")
        new.weight, new.bias = dense.weight, dense.bias
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.fp8)


def apply_fp8(
    model: nn.Module, *, history: int = 0, margin: int = 0, layers=None, keep: tuple[str, ...] = ("router",)
) -> nn.Module:
    """Make the Linear layers of ``model``'s blocks compute in fp8, in place; returns ``model``.

    Dense ``nn.Linear`` layers become :class:`Fp8Linear` (same Parameters);
    :class:`Fp8Capable` layers (tensor-parallel) get a state. The embeddings, the
    LayerNorms, attention's softmax, the head and any layer named in ``keep``
    (a mixture of experts' router) stay as they were: DeepSeek-V3's report
    (2024, Sec. 3.3.1) keeps the same ones in higher precision. ``layers``: the
    whole model's index of each of ``model.blocks`` (a pipeline stage's
    ``layers``), for the layers' names in the records. Apply mixed precision
    afterwards: it leaves these layers to quantize their fp32 weights themselves.
    """
    if not (isinstance(history, int) and 0 <= history <= 1024):
        raise ConfigError(
            f"fp8 amax history={history!r} is not allowed; expected an integer from 0 (current scaling) to 1024",
            f"fp8 的 amax 历史长度={history!r} 不合法；应为 0（即时缩放）到 1024 之间的整数",
        )
    layers = range(len(model.blocks)) if layers is None else layers
    for layer, block in zip(layers, model.blocks):
        for name, module in list(block.named_modules()):
            parent_name, _, attr = name.rpartition(".")
            if any(part in keep for part in name.split(".")):
                continue
            if isinstance(module, nn.Linear) and not isinstance(module, Fp8Capable):
                module = Fp8Linear.from_linear(module)
                setattr(block.get_submodule(parent_name), attr, module)
            if isinstance(module, Fp8Capable):
                module.fp8 = Fp8State(f"blocks.{layer}.{name}", history=history, margin=margin)
    return model


def fp8_layers(model: nn.Module) -> list[Fp8Capable]:
    """The layers of ``model`` that compute in fp8, in module order."""
    return [m for m in model.modules() if isinstance(m, Fp8Capable) and m.fp8 is not None]


def take_fp8_stats(model: nn.Module) -> dict[str, dict]:
    """End the step of every fp8 layer: ``{layer name: {"input" | "weight" | "grad": stats}}`` (see
    :meth:`TensorScaling.end_step`; a role not quantized this step is None). Call it once every step, records
    or not: the step's amax joins delayed scaling's history here, and without it delayed scaling stays current."""
    return {layer.fp8.name: layer.fp8.end_step() for layer in fp8_layers(model)}
