"""Lesson 14 (FP8): the numbers behind the number lines, and what a run's fp8 records say.

The engine is :mod:`dtlab.numerics.fp8`; this module reads its formats and a
training run's step records (each rank's ``fp8``: per layer, per tensor, the
amax, the scale and the shares that saturated or flushed) into the plain
numbers the lesson prints and checks.
"""

from __future__ import annotations

import torch

from dtlab.numerics.fp8 import FORMATS, compute_scale, number_line, quantize, tensor_amax

ROLES = ("input", "weight", "grad")


def values_per_binade(fmt_name: str) -> dict[int, int]:
    """``{e: how many values of the format lie in [2^e, 2^(e+1))}``: the same count in every normal binade
    (2^mantissa_bits), fewer among the subnormals, so the gaps double from one binade to the next."""
    values = number_line(FORMATS[fmt_name])
    values = values[values > 0]
    exponents = torch.floor(torch.log2(values)).int()
    return {int(e): int((exponents == e).sum()) for e in exponents.unique()}


def gradient_like(n: int = 4096, *, std: float = 1e-5, seed: int = 0) -> torch.Tensor:
    """``n`` values drawn from N(0, std²), deterministic: the size of a small GPT's activation gradients."""
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) * std


def cast_report(values: torch.Tensor, fmt_name: str, scale: float | None = None) -> dict:
    """Shares of ``values`` saturated and flushed when cast to the format, unscaled (``scale`` None: 1)
    or with the given scale; ``"scaled"`` is :func:`compute_scale`'s for these values."""
    fmt = FORMATS[fmt_name]
    used = 1.0 if scale is None else scale
    _, stats = quantize(values, fmt, used)
    return {
        "scale": used,
        "saturated": stats["saturated"].item() / values.numel(),
        "flushed": stats["flushed"].item() / values.numel(),
        "scaled": compute_scale(tensor_amax(values), fmt).item(),
    }


def layer_stats(records: list[dict], rank: int = 0) -> list[dict]:
    """Per step, ``rank``'s fp8 stats: ``{layer: {role: {amax, scale, saturated, flushed}}}``."""
    return [record["ranks"][rank]["fp8"] for record in records]


def first_saturation(records: list[dict], rank: int = 0) -> tuple[int, str, str] | None:
    """(step, layer, tensor role) of the first value that saturated, or None; ties in module order."""
    for record, layers in zip(records, layer_stats(records, rank)):
        for layer, roles in layers.items():
            for role in ROLES:
                if roles[role] is not None and roles[role]["saturated"] > 0:
                    return record["step"], layer, role
    return None


def series(records: list[dict], layer: str, role: str, key: str, rank: int = 0) -> list[float]:
    """One number of one layer's tensor over the steps (``key``: amax, scale, saturated or flushed)."""
    return [layers[layer][role][key] for layers in layer_stats(records, rank)]


def saturated_per_layer(records: list[dict], rank: int = 0) -> dict[str, dict[str, float]]:
    """Per layer and role, the largest share that saturated in any step of the run."""
    out: dict[str, dict[str, float]] = {}
    for layers in layer_stats(records, rank):
        for layer, roles in layers.items():
            row = out.setdefault(layer, dict.fromkeys(ROLES, 0.0))
            for role in ROLES:
                if roles[role] is not None:
                    row[role] = max(row[role], roles[role]["saturated"])
    return out


def steps_scaled_by(records: list[dict], layer: str, role: str, step: int, rank: int = 0) -> int:
    """Consecutive steps after ``step`` whose scale for (layer, role) is the one ``step``'s own amax gives:
    how long one step's amax (a spike's) sets delayed scaling's scale (0 under current scaling)."""
    amaxes, scales = series(records, layer, role, "amax", rank), series(records, layer, role, "scale", rank)
    at = [record["step"] for record in records].index(step)
    fmt = FORMATS["e5m2" if role == "grad" else "e4m3"]
    expected = compute_scale(torch.tensor(amaxes[at]), fmt).item()
    count = 0
    for scale in scales[at + 1 :]:
        if abs(scale - expected) > 1e-6 * expected:
            break
        count += 1
    return count


def quantize_e4m3(x: torch.Tensor) -> tuple[float, torch.Tensor]:
    """The exercise's reference: the scale that puts ``x``'s amax at e4m3's 448, and ``x`` cast with it."""
    fmt = FORMATS["e4m3"]
    scale = compute_scale(tensor_amax(x), fmt)
    return scale.item(), quantize(x, fmt, scale)[0]
