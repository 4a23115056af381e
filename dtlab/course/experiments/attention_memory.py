"""Lesson 13: what the attention keeps for backward, measured on real tensors (in the kernel or on a rank).

* :func:`attention_saved_bytes`: one attention kernel of dtlab's model
  (:data:`dtlab.model.ATTENTION_KERNELS`) run forward on real q, k, v; of the
  tensors autograd saves for backward, the bytes of the (B, nh, T, T) scores
  and of the per-query statistics (B, nh, T) a fused kernel keeps instead
  (FlashAttention's log-sum-exp), each storage counted once.
* :func:`activations_by_seq_len`: the small GPT's activation bytes over one
  forward and backward, from dtlab's accountant
  (:class:`dtlab.measure.memory.ActivationMeter`), at several sequence lengths.
"""

from __future__ import annotations

import dataclasses

import torch

from dtlab.config import MODEL_PRESETS
from dtlab.measure.memory import ActivationMeter
from dtlab.model import ATTENTION_KERNELS, build_model


def attention_saved_bytes(
    batch: int, heads: int, seq_len: int, dtype: torch.dtype = torch.float32, *, attention: str = "eager", head_size=8
) -> dict[str, int]:
    """Bytes the kernel ``attention`` saves for backward, by shape: ``scores`` (B, nh, T, T), ``per_query``
    (B, nh, T), ``all`` (everything saved but q, k and v themselves)."""
    B, nh, T = batch, heads, seq_len
    q, k, v = (torch.randn(B, nh, T, head_size, dtype=dtype, requires_grad=True) for _ in range(3))  # (B, nh, T, hs)
    inputs = {t.untyped_storage().data_ptr() for t in (q, k, v)}
    storages: dict[int, tuple[int, torch.Tensor]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in inputs:
            storages.setdefault(ptr, (t.untyped_storage().nbytes(), t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = ATTENTION_KERNELS[attention](q, k, v)  # (B, nh, T, hs)
    del y
    found = {"scores": 0, "per_query": 0, "all": 0}
    for nbytes, t in storages.values():
        found["all"] += nbytes
        if t.is_floating_point() and t.numel() == B * nh * T * T and tuple(t.shape[-2:]) == (T, T):
            found["scores"] += nbytes
        elif t.is_floating_point() and t.numel() == B * nh * T:
            found["per_query"] += nbytes
    return found


def activations_by_seq_len(seq_lens, *, attention: str, batch: int = 2, preset: str = "small") -> dict[int, int]:
    """T -> the peak activation bytes of one forward and backward of the ``preset`` GPT (fp32) at that T."""
    out = {}
    for T in seq_lens:
        cfg = dataclasses.replace(MODEL_PRESETS[preset], seq_len=T, attention=attention)
        model = build_model(cfg, seed=0)
        idx = torch.randint(0, cfg.vocab_size, (batch, T), generator=torch.Generator().manual_seed(0))  # (B, T)
        meter = ActivationMeter(exclude=model)
        with meter.track():
            model(idx, idx).backward()
        out[T] = meter.peak
    return out
