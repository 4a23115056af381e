"""Lesson 06: tensor parallelism on real ranks (the world is one TP group).

Each function runs on every rank of a TP group, builds the small GPT with the
same seed everywhere, cuts it with :mod:`dtlab.parallel.tensor_parallel`, and returns
plain numbers: the shapes this rank holds, how far its outputs are from the
dense layer's, and what Megatron-LM's f and g operators communicated
(Shoeybi et al. 2019, Sec. 3). The notebook prints only shapes, counts, bytes
and booleans, so its output is the same on every machine.
"""

from __future__ import annotations

import copy

import torch

from dtlab.comm.collectives import CommMeter, group_size_and_rank
from dtlab.config import MODEL_PRESETS, ModelConfig
from dtlab.data import global_batch
from dtlab.model import build_model
from dtlab.parallel.tensor_parallel import (
    BACKWARD,
    FORWARD,
    ParallelMLP,
    ParallelSelfAttention,
    apply_tensor_parallel,
    column_shard,
    row_shard,
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
    x = _inputs(seed + 1, batch, cfg.seq_len, cfg.d_model)  # (B, T, C), replicated
    with torch.no_grad():
        mine = mlp.fc(x)  # (B, T, 4C/tp)
        dense_slice = dense.mlp.fc(x).chunk(size, dim=-1)[rank]  # the same columns
        mlp_out, dense_mlp_out = mlp(x), dense.mlp(x)  # (B, T, C) after g
        attn_out, dense_attn_out = attn(x), dense.attn(x)  # (B, T, C) after g
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


def dense_shard(name: str, tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """The part of the dense parameter (or gradient) named ``name`` that TP rank ``rank`` holds.

    ``qkv`` is cut by heads (q, k and v of a head stay together), ``fc`` by
    output columns, a row-parallel ``proj`` weight by input rows; anything
    else (layer norms, embeddings, ``proj``'s bias) is replicated.
    """
    if name.endswith(("qkv.weight", "qkv.bias")):
        return column_shard(tensor, rank=rank, size=size, blocks=3)
    if name.endswith(("fc.weight", "fc.bias")):
        return column_shard(tensor, rank=rank, size=size)
    if name.endswith("proj.weight"):
        return row_shard(tensor, rank=rank, size=size)
    return tensor


def _grad_diff(tp_module: torch.nn.Module, dense: torch.nn.Module, rank: int, size: int) -> float:
    """Largest difference between each gradient of ``tp_module`` and its shard of the dense one."""
    dense_params = dict(dense.named_parameters())
    return max(
        _max_abs_diff(p.grad, dense_shard(name, dense_params[name].grad, rank, size))
        for name, p in tp_module.named_parameters()
    )


def block_versus_dense(cfg: ModelConfig, *, batch: int = 2, seed: int = 0, group=None) -> dict:
    """Block 0 of the GPT cut by TP on this rank against the dense block with the same weights.

    Counts f's and g's all-reduces forward and backward (Megatron-LM: two
    each) and measures the largest differences: the output, the input's
    gradient, and every parameter's gradient against its shard of the dense
    gradient. Lesson 06 prints these; tests/test_tensor_parallel.py asserts them.
    """
    size, rank = group_size_and_rank(group)
    dense = build_model(cfg, seed=seed).blocks[0]
    block, meter = copy.deepcopy(dense), CommMeter()
    block.attn = ParallelSelfAttention(block.attn, group=group, meter=meter)
    block.mlp = ParallelMLP(block.mlp, group=group, meter=meter)
    x = _inputs(seed + 1, batch, cfg.seq_len, cfg.d_model).requires_grad_()  # (B, T, C)
    w = _inputs(seed + 2, batch, cfg.seq_len, cfg.d_model)  # weights a loss
    dense_out = dense(x)
    (dense_out * w).sum().backward()
    dense_grad, x.grad = x.grad, None
    out = block(x)  # (B, T, C)
    forward_calls = meter.calls[FORWARD]
    (out * w).sum().backward()
    return {
        "forward": forward_calls,
        "backward": meter.calls[BACKWARD],
        "bytes_per_all_reduce": meter.nbytes[FORWARD] // max(forward_calls, 1),
        "output_diff": _max_abs_diff(out, dense_out),
        "input_grad_diff": _max_abs_diff(x.grad, dense_grad),
        "grad_diff": _grad_diff(block, dense, rank, size),
    }


def model_versus_dense(cfg: ModelConfig, *, batch: int = 2, seed: int = 0, group=None) -> dict:
    """The whole GPT converted by :func:`apply_tensor_parallel` against the dense model, one step.

    Counts the all-reduces (two per block each way) and measures the loss
    difference and the largest gradient difference, for every parameter
    (against its shard) and for the replicated token embedding, which only
    comes out right if every block's backward all-reduce ran.
    """
    size, rank = group_size_and_rank(group)
    dense = build_model(cfg, seed=seed)
    meter = CommMeter()
    tp_model = apply_tensor_parallel(copy.deepcopy(dense), group=group, meter=meter)
    idx, tgt = global_batch(0, batch_size=batch, seq_len=cfg.seq_len, seed=seed)  # (B, T) each
    dense_loss = dense(idx, tgt)
    dense_loss.backward()
    loss = tp_model(idx, tgt)
    loss.backward()
    return {
        "blocks": cfg.n_layer,
        "forward": meter.calls[FORWARD],
        "backward": meter.calls[BACKWARD],
        "loss_diff": abs(loss.item() - dense_loss.item()),
        "embedding_grad_diff": _max_abs_diff(tp_model.tok_emb.weight.grad, dense.tok_emb.weight.grad),
        "grad_diff": _grad_diff(tp_model, dense, rank, size),
    }


def block_communication(ctx, model: str = "small", batch: int = 2, seed: int = 0) -> dict:
    """Count f's and g's all-reduces for one block and for the whole GPT, forward and backward,
    and check that both compute what the dense ones do (:func:`block_versus_dense`,
    :func:`model_versus_dense`; the world is one TP group)."""
    cfg = MODEL_PRESETS[model]
    size, rank = group_size_and_rank(None)
    return {
        "rank": rank,
        "tp": size,
        "block": block_versus_dense(cfg, batch=batch, seed=seed),
        "model": model_versus_dense(cfg, batch=batch, seed=seed),
    }
