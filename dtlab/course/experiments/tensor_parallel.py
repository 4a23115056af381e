"""Lesson 05: tensor parallelism on real ranks (the world is one TP group).

Each function runs on every rank of a TP group, builds the small GPT with the
same seed everywhere, cuts it with :mod:`dtlab.tensor_parallel`, and returns
plain numbers: the shapes this rank holds, how far its outputs are from the
dense layer's, and what Megatron-LM's f and g operators communicated
(Shoeybi et al. 2019, Sec. 3). The notebook prints only shapes, counts, bytes
and booleans, so its output is the same on every machine.
"""
from __future__ import annotations

import copy

import torch

from dtlab.collectives import CommMeter, group_size_and_rank
from dtlab.config import MODEL_PRESETS
from dtlab.data import global_batch
from dtlab.model import build_model
from dtlab.tensor_parallel import (
    BACKWARD, FORWARD, ParallelMLP, ParallelSelfAttention, apply_tensor_parallel,
)


def _inputs(seed: int, *shape) -> torch.Tensor:
    """The same random tensor on every rank (a private generator, not the global one)."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def split_one_layer(ctx, model: str = "small", batch: int = 2, seed: int = 0) -> dict:
    """What this rank holds of block 0, and whether its outputs agree with the dense block.

    The MLP is column-parallel ``fc`` (C -> 4C/tp) then row-parallel ``proj``
    (4C/tp -> C); attention is column-parallel ``qkv`` (split by heads) then
    row-parallel ``proj``. Shapes are PyTorch's ``(out_features, in_features)``.
    """
    cfg = MODEL_PRESETS[model]
    size, rank = group_size_and_rank(None)
    dense = build_model(cfg, seed=seed).blocks[0]
    mlp = ParallelMLP(copy.deepcopy(dense.mlp), group=None)
    attn = ParallelSelfAttention(copy.deepcopy(dense.attn), group=None)
    x = _inputs(seed + 1, batch, cfg.seq_len, cfg.d_model)               # (B, T, C), replicated
    with torch.no_grad():
        mine = mlp.fc(x)                                                  # (B, T, 4C/tp)
        dense_slice = dense.mlp.fc(x).chunk(size, dim=-1)[rank]           # the same columns
        mlp_out, dense_mlp_out = mlp(x), dense.mlp(x)                     # (B, T, C) after g
        attn_out, dense_attn_out = attn(x), dense.attn(x)                 # (B, T, C) after g
    return {
        "rank": rank,
        "tp": size,
        "shapes": {
            "mlp.fc.weight": list(mlp.fc.weight.shape),
            "mlp.fc.bias": list(mlp.fc.bias.shape),
            "mlp.proj.weight": list(mlp.proj.weight.shape),
            "mlp.proj.bias": list(mlp.proj.bias.shape),
            "attn.qkv.weight": list(attn.qkv.weight.shape),
            "attn.proj.weight": list(attn.proj.weight.shape),
        },
        "heads": attn.n_head,
        "fc_output": list(mine.shape),
        "column_slice_diff": _max_abs_diff(mine, dense_slice),
        "mlp_diff": _max_abs_diff(mlp_out, dense_mlp_out),
        "attention_diff": _max_abs_diff(attn_out, dense_attn_out),
    }


def block_communication(ctx, model: str = "small", batch: int = 2, seed: int = 0) -> dict:
    """Count f's and g's all-reduces for one block and for the whole GPT, forward and backward.

    Also checks that the TP block and the TP model compute what the dense ones
    do: the block's output and its input gradient, and the model's loss and
    the token-embedding gradient (replicated, it only comes out right if every
    block's backward all-reduce ran).
    """
    cfg = MODEL_PRESETS[model]
    size, rank = group_size_and_rank(None)
    full = build_model(cfg, seed=seed)

    # One block.
    dense = full.blocks[0]
    block, meter = copy.deepcopy(dense), CommMeter()
    block.attn = ParallelSelfAttention(block.attn, group=None, meter=meter)
    block.mlp = ParallelMLP(block.mlp, group=None, meter=meter)
    x = _inputs(seed + 1, batch, cfg.seq_len, cfg.d_model).requires_grad_()   # (B, T, C)
    w = _inputs(seed + 2, batch, cfg.seq_len, cfg.d_model)                    # weights a loss
    dense_out = dense(x)
    (dense_out * w).sum().backward()
    dense_grad, x.grad = x.grad, None
    out = block(x)                                                            # (B, T, C)
    forward_calls = meter.calls[FORWARD]
    (out * w).sum().backward()
    block_result = {
        "forward": forward_calls,
        "backward": meter.calls[BACKWARD],
        "bytes_per_all_reduce": meter.nbytes[FORWARD] // max(forward_calls, 1),
        "output_diff": _max_abs_diff(out, dense_out),
        "input_grad_diff": _max_abs_diff(x.grad, dense_grad),
    }

    # The whole small GPT, converted in place from the same weights.
    meter = CommMeter()
    tp_model = apply_tensor_parallel(copy.deepcopy(full), group=None, meter=meter)
    idx, tgt = global_batch(0, batch_size=batch, seq_len=cfg.seq_len, seed=seed)   # (B, T) each
    dense_loss = full(idx, tgt)
    dense_loss.backward()
    loss = tp_model(idx, tgt)
    loss.backward()
    return {
        "rank": rank,
        "tp": size,
        "block": block_result,
        "model": {
            "blocks": cfg.n_layer,
            "forward": meter.calls[FORWARD],
            "backward": meter.calls[BACKWARD],
            "loss_diff": abs(loss.item() - dense_loss.item()),
            "embedding_grad_diff": _max_abs_diff(tp_model.tok_emb.weight.grad,
                                                 full.tok_emb.weight.grad),
        },
    }
