"""Sequence parallelism (SP): what tensor parallelism leaves replicated, split along the sequence.

Under tensor parallelism (dtlab.parallel.tensor_parallel) every rank of a TP group
holds the *whole* (B, T, C) activations of the LayerNorms, dropouts and
residual adds between the TP blocks: identical copies, t times over.
Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", Sec. 4.2.2, Fig. 5) notice that these operations work
token by token, so each rank can hold T/t of the tokens instead. Megatron's
f and g change partner:

    TP:   f  = identity     / all-reduce          g  = all-reduce     / identity
    SP:   g  = all-gather   / reduce-scatter      g' = reduce-scatter / all-gather
          (forward / backward, along the sequence dimension T)

One block, with t ranks::

    x_r (B, T/t, C) -> LayerNorm -> g: all-gather -> (B, T, C) -> qkv (column) -> attention
        -> proj (row) -> partial sums (B, T, C) -> g': reduce-scatter -> (B, T/t, C) + bias + x_r

An all-reduce *is* a reduce-scatter followed by an all-gather, so the bytes on
the wire are those of TP; what changes is memory. The paper's activations per
layer (Table 2, 2-byte activations, s = T, b = B, h = C, a = heads):

    TP        sbh (10 + 24/t + 5as/(ht))
    TP + SP   sbh (34/t + 5as/(ht))            everything divided by t

For the "everything", the column-parallel layer keeps only its *slice* of the
input for backward and all-gathers it again there (Sec. 4.2.2, last
paragraph; ``all_gather.recompute`` in the meter): :class:`_GatherLinear`.

Parameters in the split region (LayerNorm weights and biases, the row-parallel
biases) are replicated, but each rank now sees only its T/t tokens, so its
gradient is a partial sum: an all-reduce over the TP group completes it in
backward (``all_reduce.sp_grads``, Megatron's layernorm-gradient all-reduce).
Embeddings and head stay as in TP: the embedding output is cut to this rank's
tokens before the first block (backward: all-gather), and the last block's
output is all-gathered (backward: keep my slice), so the final LayerNorm, head
and loss see the whole sequence on every rank. Dropout in the split region
would need different random streams per rank; the small GPT trains without.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from dtlab.comm import calls as comm
from dtlab.comm.collectives import CommMeter, group_size_and_rank
from dtlab.i18n import ConfigError
from dtlab.numerics.fp8 import linear
from dtlab.parallel.tensor_parallel import (
    _F,
    ColumnParallelLinear,
    ParallelMLP,
    ParallelSelfAttention,
    RowParallelLinear,
    apply_tensor_parallel,
)

GATHER_FORWARD, SCATTER_FORWARD = "all_gather.forward", "reduce_scatter.forward"
GATHER_BACKWARD, SCATTER_BACKWARD = "all_gather.backward", "reduce_scatter.backward"
REGATHER = "all_gather.recompute"
"""The column-parallel layer's input, gathered again in backward instead of being stored whole."""
PARAM_GRADS = "all_reduce.sp_grads"
"""Gradients of the replicated LayerNorm weights and biases in the split region, completed."""


# --------------------------------------------------------------------------- collectives along T


def gather_sequence(x: torch.Tensor, group, meter: CommMeter | None, kind: str) -> torch.Tensor:
    """Every rank's (B, T/t, ...) slice, laid end to end along T: (B, T, ...)."""
    n, _ = group_size_and_rank(group)
    out = x.new_empty(n * x.shape[0], *x.shape[1:])  # (t B, T/t, ...)
    if meter is not None:
        meter.record_call(kind, out)  # bytes of the output
    comm.all_gather_single(out, x.contiguous(), group=group, kind=kind)
    out = out.view(n, *x.shape).transpose(0, 1)  # (B, t, T/t, ...)
    return out.reshape(x.shape[0], n * x.shape[1], *x.shape[2:])  # (B, T, ...)


def scatter_sequence_sum(x: torch.Tensor, group, meter: CommMeter | None, kind: str) -> torch.Tensor:
    """Sum (B, T, ...) over the ranks and keep this rank's T/t tokens: (B, T/t, ...)."""
    n, _ = group_size_and_rank(group)
    if meter is not None:
        meter.record_call(kind, x)  # bytes of the input
    B, T = x.shape[:2]
    _check_tokens(T, n)
    chunks = x.reshape(B, n, T // n, *x.shape[2:]).transpose(0, 1)  # (t, B, T/t, ...)
    out = x.new_empty(B, T // n, *x.shape[2:])
    comm.reduce_scatter_single(out, chunks.reshape(n * B, *out.shape[1:]), group=group, kind=kind)
    return out


def my_tokens(x: torch.Tensor, group) -> torch.Tensor:
    """This rank's T/t consecutive tokens of (B, T, ...)."""
    n, rank = group_size_and_rank(group)
    _check_tokens(x.shape[1], n)
    return x.chunk(n, dim=1)[rank]


def _check_tokens(T: int, n: int) -> None:
    if T % n:
        raise ConfigError(
            f"sequence length {T} cannot be split over tp = {n} ranks for sequence "
            f"parallelism (allowed: a tp that divides {T})",
            f"序列长度 {T} 无法在序列并行中平均分到 tp = {n} 个 rank 上（允许：能整除 {T} 的 tp）",
        )


class _Scatter(torch.autograd.Function):
    """Enter the split region: keep my tokens (no communication); backward all-gathers."""

    @staticmethod
    def forward(ctx, x, group, meter):
        ctx.group, ctx.meter = group, meter
        return my_tokens(x, group).contiguous()

    @staticmethod
    def backward(ctx, grad):
        return gather_sequence(grad, ctx.group, ctx.meter, GATHER_BACKWARD), None, None


class _Gather(torch.autograd.Function):
    """Leave the split region for replicated work: all-gather; backward keeps my slice."""

    @staticmethod
    def forward(ctx, x, group, meter):
        ctx.group = group
        return gather_sequence(x, group, meter, GATHER_FORWARD)

    @staticmethod
    def backward(ctx, grad):
        return my_tokens(grad, ctx.group).contiguous(), None, None


class _ReduceScatter(torch.autograd.Function):
    """The paper's g': reduce-scatter forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, group, meter):
        ctx.group, ctx.meter = group, meter
        return scatter_sequence_sum(x, group, meter, SCATTER_FORWARD)

    @staticmethod
    def backward(ctx, grad):
        return gather_sequence(grad, ctx.group, ctx.meter, GATHER_BACKWARD), None, None


class _GatherLinear(torch.autograd.Function):
    """The paper's g, then a column-parallel linear: ``all_gather(x_r) @ W_r^T + b_r``.

    Saves only x_r (B, T/t, C), not the gathered (B, T, C), and gathers it again
    in backward to form the weight gradient. Backward's input gradient is a
    partial sum (each rank's slice of W saw the whole input): reduce-scatter.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, group, meter):
        ctx.group, ctx.meter, ctx.has_bias = group, meter, bias is not None
        ctx.save_for_backward(x, weight)
        full = gather_sequence(x, group, meter, GATHER_FORWARD)  # (B, T, C)
        return F.linear(full, weight, bias)  # (B, T, out/t)

    @staticmethod
    def backward(ctx, grad):  # grad (B, T, out/t)
        x, weight = ctx.saved_tensors
        full = gather_sequence(x, ctx.group, ctx.meter, REGATHER)  # (B, T, C), again
        grad_w = grad.flatten(0, 1).t() @ full.flatten(0, 1)  # (out/t, C)
        grad_b = grad.sum(dim=(0, 1)) if ctx.has_bias else None  # (out/t,)
        grad_full = grad @ weight  # (B, T, C), partial
        grad_x = scatter_sequence_sum(grad_full, ctx.group, ctx.meter, SCATTER_BACKWARD)
        return grad_x, grad_w, grad_b, None, None


class _GatherPartial(torch.autograd.Function):
    """The paper's g for a column-parallel linear whose matmul is not :class:`_GatherLinear`'s (fp8):
    all-gather forward; backward the input gradient is a partial sum, reduce-scattered."""

    @staticmethod
    def forward(ctx, x, group, meter):
        ctx.group, ctx.meter = group, meter
        return gather_sequence(x, group, meter, GATHER_FORWARD)  # (B, T, C)

    @staticmethod
    def backward(ctx, grad):  # grad (B, T, C), partial
        return scatter_sequence_sum(grad, ctx.group, ctx.meter, SCATTER_BACKWARD), None, None


def _complete_grad(p: torch.Tensor, group, meter) -> torch.Tensor:
    """``p`` in forward; in backward its gradient summed over the TP group (tokens split)."""
    return _F.apply(p, group, meter, PARAM_GRADS)


# --------------------------------------------------------------------------- the layers


class SequenceParallelColumnLinear(ColumnParallelLinear):
    """Column-parallel linear whose input holds T/t tokens: g (all-gather) replaces f."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, T/t, in)
        if self.fp8 is not None:  # fp8 saves its quantized (B, T, in), one byte a value: nothing to gather again
            full = _GatherPartial.apply(x, self.group, self.meter)  # (B, T, in)
            return linear(full, self.weight, self.bias, self.fp8)  # (B, T, out/t)
        return _GatherLinear.apply(x, self.weight, self.bias, self.group, self.meter)  # (B, T, out/t)


class SequenceParallelRowLinear(RowParallelLinear):
    """Row-parallel linear whose output holds T/t tokens: g' (reduce-scatter) replaces g."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, T, in/t)
        partial = linear(x, self.weight, None, self.fp8)  # (B, T, out), a partial sum
        y = _ReduceScatter.apply(partial, self.group, self.meter)  # (B, T/t, out), summed
        return y if self.bias is None else y + _complete_grad(self.bias, self.group, self.meter)


class SequenceParallelLayerNorm(nn.LayerNorm):
    """LayerNorm over T/t tokens; its weight and bias gradients are completed over the TP group."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(
            x,
            self.normalized_shape,
            _complete_grad(self.weight, self.group, self.meter),
            _complete_grad(self.bias, self.group, self.meter),
            self.eps,
        )


def _as(cls, layer: nn.Module, group, meter) -> nn.Module:
    """``layer`` re-made as ``cls`` with the same parameters (names and tensors unchanged)."""
    if isinstance(layer, nn.LayerNorm):
        new = cls(layer.normalized_shape, eps=layer.eps)
    else:
        new = cls(layer.weight.detach(), None if layer.bias is None else layer.bias.detach())
    new.weight, new.bias = layer.weight, layer.bias  # the very same Parameters
    new.group, new.meter = group, meter
    if isinstance(layer, ColumnParallelLinear):
        new.blocks = layer.blocks  # q, k, v stay three blocks
    return new


def _enter(module, args, *, group, meter):
    return (_Scatter.apply(args[0], group, meter), *args[1:])


def _leave(module, args, output, *, group, meter):
    return _Gather.apply(output, group, meter)


def apply_sequence_parallel(model: nn.Module, *, group=None, meter: CommMeter | None = None) -> nn.Module:
    """Tensor parallelism with the sequence split between the TP blocks, over ``group``, in place.

    Converts ``model.blocks`` to TP first if they are not yet, then swaps f/g
    for the sequence collectives and makes the split region's LayerNorms and
    biases complete their gradients. The first block cuts its input to this
    rank's tokens and the last gathers its output (forward hooks; each chunk's
    first and last of an interleaved stage), so the model (or pipeline stage)
    still takes and returns whole sequences. A TP
    group of one rank leaves the model as it is. Counted meter kinds: see the
    constants at the top of this module.
    """
    if group_size_and_rank(group)[0] == 1:
        return model
    if not isinstance(model.blocks[0].mlp, ParallelMLP):
        apply_tensor_parallel(model, group=group, meter=meter)
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        assert isinstance(attn, ParallelSelfAttention)
        attn.qkv = _as(SequenceParallelColumnLinear, attn.qkv, group, meter)
        mlp.fc = _as(SequenceParallelColumnLinear, mlp.fc, group, meter)
        attn.proj = _as(SequenceParallelRowLinear, attn.proj, group, meter)
        mlp.proj = _as(SequenceParallelRowLinear, mlp.proj, group, meter)
        block.ln1 = _as(SequenceParallelLayerNorm, block.ln1, group, meter)
        block.ln2 = _as(SequenceParallelLayerNorm, block.ln2, group, meter)
    hooks = dict(group=group, meter=meter)
    # Each chunk of an interleaved stage (dtlab/parallel/pipeline/partition.py) is entered and left on its own.
    for chunk in getattr(model, "chunks", None) or [range(len(model.blocks))]:
        model.blocks[chunk[0]].register_forward_pre_hook(lambda m, a: _enter(m, a, **hooks))
        model.blocks[chunk[-1]].register_forward_hook(lambda m, a, o: _leave(m, a, o, **hooks))
    return model
