"""Lesson 07: sequence parallelism and ring attention on real ranks, and the online-softmax exercise.

* :func:`activations_per_rank` (on ranks): the activation bytes one training
  step holds for backward on each rank of a TP group, with and without
  sequence parallelism, beside the dense model's, and whether the losses agree.
* :func:`ring_attention_run` (on ranks): ring attention over the world against
  full causal attention (values and gradients), the K/V passes counted, the
  tiles each rank computed; :func:`ring_versus_full` is the same with the
  tensors, and a merge of the caller's choosing (the exercise's check,
  :mod:`dtlab.course.exercises.lesson07`, plugs in the learner's).
"""

from __future__ import annotations

import copy

import torch

from dtlab.comm.collectives import CommMeter, group_size_and_rank
from dtlab.config import ModelConfig
from dtlab.measure.memory import ActivationMeter
from dtlab.model import build_model, causal_attention
from dtlab.parallel.ring_attention import KV, KV_GRAD, merge, positions, ring_attention, ring_schedule
from dtlab.parallel.sequence_parallel import apply_sequence_parallel
from dtlab.parallel.tensor_parallel import apply_tensor_parallel


def _step_activations(model, idx, tgt) -> tuple[float, int]:
    """One forward and backward: the loss and the peak bytes held for backward."""
    meter = ActivationMeter(exclude=model)
    with meter.track():
        loss = model(idx, tgt)
        loss.backward()
    return loss.item(), meter.peak


def activations_per_rank(
    ctx, *, seq_len: int = 256, d_model: int = 64, n_head: int = 4, n_layer: int = 2, batch: int = 2
) -> dict:
    """Activation peak on this rank: dense, TP over the world, TP + SP over the world."""
    size, rank = group_size_and_rank(None)
    cfg = ModelConfig(vocab_size=256, seq_len=seq_len, n_layer=n_layer, n_head=n_head, d_model=d_model)
    g = torch.Generator().manual_seed(1)
    idx, tgt = (torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=g) for _ in range(2))
    dense = build_model(cfg, seed=0)
    out = {"rank": rank, "ranks": size, "sbh_bytes": batch * seq_len * d_model * 4, "layers": n_layer}
    for name, apply in (("dense", None), ("tp", apply_tensor_parallel), ("tp_sp", apply_sequence_parallel)):
        model = copy.deepcopy(dense)
        if apply is not None:
            apply(model, group=None)
        out[f"{name}_loss"], out[name] = _step_activations(model, idx, tgt)
    out["losses_agree"] = abs(out["tp_sp_loss"] - out["dense_loss"]) < 1e-5 * abs(out["dense_loss"])
    return out


def _qkv(seq_len: int, batch: int = 2, heads: int = 2, head_size: int = 8):
    """The same full q, k, v (B, nh, T, hs) on every rank, with gradients wanted."""
    g = torch.Generator().manual_seed(7)
    return [torch.randn(batch, heads, seq_len, head_size, generator=g).requires_grad_() for _ in range(3)]


def ring_versus_full(seq_len: int, zigzag: bool, combine=merge) -> dict:
    """This rank's ring attention (merging blocks with ``combine``) and full causal attention at its
    positions: outputs, q/k/v gradients, the K/V passes counted and whether it followed the schedule."""
    size, rank = group_size_and_rank(None)
    full = _qkv(seq_len)
    w = torch.randn(full[0].shape, generator=torch.Generator().manual_seed(8))  # weights the outputs
    (causal_attention(*full) * w).sum().backward()
    mine = positions(seq_len, rank=rank, size=size, zigzag=zigzag)
    local = [t.detach()[:, :, mine].clone().requires_grad_() for t in full]
    meter, trace = CommMeter(), []
    out = ring_attention(*local, zigzag=zigzag, meter=meter, trace=trace, combine=combine)
    passes_forward = meter.calls[KV]
    (out * w[:, :, mine]).sum().backward()
    return {
        "rank": rank,
        "out": out.detach(),
        "expected": causal_attention(*[t.detach() for t in full])[:, :, mine],
        "grads": [t.grad for t in local],
        "expected_grads": [t.grad[:, :, mine] for t in full],
        "kv_passes_forward": passes_forward,
        "kv_passes_backward": meter.calls[KV_GRAD],
        "tiles": sum(len(s.tiles) for s in trace),
        "trace_is_schedule": trace == [s for s in ring_schedule(size, zigzag=zigzag) if s.rank == rank],
    }


def ring_attention_run(ctx, *, seq_len: int = 64, zigzag: bool = True) -> dict:
    """Ring attention over all ranks against full causal attention on the whole sequence (plain numbers)."""
    r = ring_versus_full(seq_len, zigzag)
    max_diff = (r["out"] - r["expected"]).abs().max().item()
    max_grad_diff = max((a - b).abs().max().item() for a, b in zip(r["grads"], r["expected_grads"]))
    return {
        "rank": r["rank"],
        "max_diff": max_diff,
        "max_grad_diff": max_grad_diff,
        "kv_passes_forward": r["kv_passes_forward"],
        "kv_passes_backward": r["kv_passes_backward"],
        "tiles": r["tiles"],
        "trace_is_schedule": r["trace_is_schedule"],
        "equal": max_diff < 1e-5 and max_grad_diff < 1e-5,
    }
