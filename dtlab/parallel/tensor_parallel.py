"""Tensor parallelism (TP): one layer's matrices split across the ranks of a TP group.

Megatron-LM (Shoeybi et al. 2019, Sec. 3, Fig. 3) splits a transformer block
so that it needs only two all-reduces in the forward pass and two in the
backward. Two linear layers in a row, ``Y = act(X A)`` then ``Z = Y B``:

* split ``A`` by **columns** (output features): each rank computes its own
  slice of ``Y`` from the whole ``X``, with no communication, and the
  elementwise ``act`` works on slices;
* split ``B`` by **rows** (input features): each rank multiplies its slice of
  ``Y`` by its rows of ``B``, which gives a *partial sum* of ``Z``; one
  all-reduce adds the partial sums.

The paper names the two communication points as a conjugate pair of operators:

    f: forward identity,   backward all-reduce  (where the replicated X enters)
    g: forward all-reduce, backward identity    (where the partial sums leave)

``f``'s backward all-reduce exists because every rank's slice of ``Y``
depended on the whole ``X``: the gradient of ``X`` is the sum of what each
rank's slice contributes. The MLP is ``f -> fc (column) -> GELU -> proj (row)
-> g``; attention is ``f -> qkv (column, by heads) -> attention per head ->
proj (row) -> g``. One block: two g's forward, two f's backward.

Everything outside the blocks (embeddings, LayerNorms, the head) is
replicated: its inputs and gradients are identical on every TP rank (``f``
made them so), so the replicated parameters' gradients agree without any
extra communication. Dropout inside a block would need its random streams
coordinated across TP ranks (Megatron forks the RNG); the small GPT trains
with dropout 0.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from dtlab.comm import calls as comm
from dtlab.comm.collectives import CommMeter, group_size_and_rank
from dtlab.i18n import ConfigError
from dtlab.model import MLP, CausalSelfAttention, attend
from dtlab.numerics.fp8 import Fp8Capable, linear

FORWARD, BACKWARD = "all_reduce.forward", "all_reduce.backward"
"""CommMeter kinds: g's all-reduces (forward pass) and f's (backward pass)."""


# --------------------------------------------------------------------------- f and g


def _all_reduce(x: torch.Tensor, group, meter: CommMeter | None, kind: str) -> torch.Tensor:
    x = x.clone(memory_format=torch.contiguous_format)  # never reduce a tensor autograd still holds
    if meter is not None:
        meter.record_call(kind, x)
    comm.all_reduce(x, group=group, kind=kind)
    return x


class _F(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce backward (counted as ``kind``)."""

    @staticmethod
    def forward(ctx, x, group, meter, kind=BACKWARD):
        ctx.group, ctx.meter, ctx.kind = group, meter, kind
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group, ctx.meter, ctx.kind), None, None, None


class _G(torch.autograd.Function):
    """Megatron's g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group, meter):
        return _all_reduce(x, group, meter, FORWARD)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def f(x: torch.Tensor, *, group=None, meter: CommMeter | None = None) -> torch.Tensor:
    """Megatron's f (enter a TP region): forward identity, backward all-reduce over ``group``."""
    return x if group_size_and_rank(group)[0] == 1 else _F.apply(x, group, meter)


def g(x: torch.Tensor, *, group=None, meter: CommMeter | None = None) -> torch.Tensor:
    """Megatron's g (leave a TP region): forward all-reduce over ``group``, backward identity."""
    return x if group_size_and_rank(group)[0] == 1 else _G.apply(x, group, meter)


# --------------------------------------------------------------------------- the splits


def column_shard(t: torch.Tensor, *, rank: int, size: int, blocks: int = 1) -> torch.Tensor:
    """Rank ``rank``'s rows of a weight (out, in) or bias (out,) split by output feature.

    ``blocks`` > 1 when the output stacks several matrices, like attention's
    [q; k; v] (blocks=3): each block is split on its own and the rank keeps
    its slice of every block, so q, k and v of the same heads stay together::

        dense (3C, C)        rank 0 of 2 (3C/2, C)
        [ q heads 0-1 ]      [ q heads 0-1 ]
        [ q heads 2-3 ]      [ k heads 0-1 ]
        [ k heads 0-1 ]  ->  [ v heads 0-1 ]
        [ k heads 2-3 ]
        [ v heads 0-1 ]
        [ v heads 2-3 ]
    """
    out = t.shape[0]
    per_block = t.reshape(blocks, out // blocks, *t.shape[1:])  # (blocks, out/blocks, ...)
    mine = per_block.chunk(size, dim=1)[rank]  # (blocks, out/blocks/size, ...)
    return mine.reshape(out // size, *t.shape[1:]).clone()  # (out/size, ...)


def row_shard(weight: torch.Tensor, *, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s columns of a weight (out, in) split by input feature: (out, in/size)."""
    return weight.chunk(size, dim=1)[rank].clone()


def _check_divisible(what: str, n: int, size: int) -> None:
    if n % size:
        raise ConfigError(
            f"{what} = {n} cannot be split over tp = {size} ranks (allowed: a tp that divides {n})",
            f"{what} = {n} 无法平均分到 tp = {size} 个 rank 上（允许：能整除 {n} 的 tp）",
        )


class ColumnParallelLinear(Fp8Capable, nn.Module):
    """``y = x A^T + b`` with A split by output features: each rank computes its slice of y.

    ::

        x (B, T, in)  --f-->  x @ A_r^T + b_r  ->  y_r (B, T, out/tp)
                             A = [A_0; A_1; ...], rows split, bias split the same way

    The input is replicated on every rank and enters through ``f``; the output
    stays split (it feeds a row-parallel layer, or attention heads).
    ``blocks``: how many matrices the output stacks (see :func:`column_shard`),
    which says where this rank's rows sit in the dense weight (checkpoints).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        group=None,
        meter: CommMeter | None = None,
        blocks: int = 1,
    ):
        super().__init__()
        self.weight = nn.Parameter(weight)  # (out/tp, in)
        self.bias = None if bias is None else nn.Parameter(bias)  # (out/tp,)
        self.group, self.meter, self.blocks = group, meter, blocks

    @classmethod
    def from_dense(
        cls, linear: nn.Linear, *, group=None, meter: CommMeter | None = None, blocks: int = 1
    ) -> "ColumnParallelLinear":
        """This rank's slice of ``linear``'s weights (see :func:`column_shard` for ``blocks``)."""
        size, rank = group_size_and_rank(group)
        _check_divisible("output features per block", linear.out_features // blocks, size)
        cut = dict(rank=rank, size=size, blocks=blocks)
        weight = column_shard(linear.weight.detach(), **cut)
        bias = None if linear.bias is None else column_shard(linear.bias.detach(), **cut)
        return cls(weight, bias, group=group, meter=meter, blocks=blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = f(x, group=self.group, meter=self.meter)  # (B, T, in), replicated
        return linear(x, self.weight, self.bias, self.fp8)  # (B, T, out/tp); fp8 under --precision fp8


class RowParallelLinear(Fp8Capable, nn.Module):
    """``y = x A^T + b`` with A split by input features: partial sums, added by ``g``.

    ::

        x_r (B, T, in/tp) -> x_r @ A_r^T -> partial (B, T, out) --g--> + b -> y (B, T, out)
                             A = [A_0 | A_1 | ...], columns split

    The bias is added once, *after* the all-reduce: added on every rank before
    it, the sum would hold it tp times.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, group=None, meter: CommMeter | None = None):
        super().__init__()
        self.weight = nn.Parameter(weight)  # (out, in/tp)
        self.bias = None if bias is None else nn.Parameter(bias)  # (out,), replicated
        self.group, self.meter = group, meter

    @classmethod
    def from_dense(cls, linear: nn.Linear, *, group=None, meter: CommMeter | None = None) -> "RowParallelLinear":
        size, rank = group_size_and_rank(group)
        _check_divisible("input features", linear.in_features, size)
        weight = row_shard(linear.weight.detach(), rank=rank, size=size)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(weight, bias, group=group, meter=meter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = linear(x, self.weight, None, self.fp8)  # (B, T, out), a partial sum
        y = g(partial, group=self.group, meter=self.meter)  # (B, T, out), the full sum
        return y if self.bias is None else y + self.bias


# --------------------------------------------------------------------------- the block's halves


class ParallelSelfAttention(nn.Module):
    """Causal self-attention split by heads: rank r computes nh/tp whole heads.

    Heads are independent until the output projection, so a head needs no
    communication as long as its q, k and v rows live on one rank (QKV is
    column-parallel with blocks=3); the projection is row-parallel.
    """

    def __init__(self, dense: CausalSelfAttention, *, group=None, meter: CommMeter | None = None):
        super().__init__()
        size, _ = group_size_and_rank(group)
        _check_divisible("attention heads (n_head)", dense.n_head, size)
        self.n_head = dense.n_head // size  # heads on this rank
        self.qkv = ColumnParallelLinear.from_dense(dense.qkv, group=group, meter=meter, blocks=3)
        self.proj = RowParallelLinear.from_dense(dense.proj, group=group, meter=meter)
        self.dropout = dense.dropout
        self.attention = dense.attention  # the kernel, eager or sdpa: per head, as in the dense layer
        self.core = dense.core  # ring attention, when context parallelism came first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)  # (B, T, 3C/tp); T is the whole sequence even when
        B, T, _ = qkv.shape  # x holds a slice of it (sequence parallelism)
        q, k, v = qkv.chunk(3, dim=2)  # 3 x (B, T, C/tp)
        c = q.shape[2]
        hs = c // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh/tp, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh/tp, T, hs)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh/tp, T, hs)
        y = attend(self, q, k, v)  # (B, nh/tp, T, hs)
        y = y.transpose(1, 2).reshape(B, T, c)  # (B, T, C/tp)
        return self.proj(y)  # (B, T, C), after g


class ParallelMLP(nn.Module):
    """The MLP, column-then-row: ``f -> fc (C -> 4C/tp) -> GELU -> proj (4C/tp -> C) -> g``."""

    def __init__(self, dense: MLP, *, group=None, meter: CommMeter | None = None):
        super().__init__()
        self.fc = ColumnParallelLinear.from_dense(dense.fc, group=group, meter=meter)
        self.proj = RowParallelLinear.from_dense(dense.proj, group=group, meter=meter)
        self.dropout = dense.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc(x))  # (B, T, 4C/tp)
        return self.dropout(self.proj(h))  # (B, T, C)


def apply_tensor_parallel(model: nn.Module, *, group=None, meter: CommMeter | None = None) -> nn.Module:
    """Turn every block of ``model`` into its TP version over ``group``, in place, same weights.

    ``model`` is the small GPT or anything with its ``blocks`` (a pipeline
    stage). Each block's attention and MLP are replaced by their parallel
    versions built from the dense weights; everything else stays replicated.
    With one rank in ``group`` the model is left as it is. Pass a
    :class:`~dtlab.comm.meter.CommMeter` as ``meter`` to count f's and g's
    all-reduces (kinds ``all_reduce.backward`` and ``all_reduce.forward``).
    """
    if group_size_and_rank(group)[0] == 1:
        return model
    for block in model.blocks:
        block.attn = ParallelSelfAttention(block.attn, group=group, meter=meter)
        if isinstance(block.mlp, MLP):  # a mixture of experts stays whole: EP splits it instead
            block.mlp = ParallelMLP(block.mlp, group=group, meter=meter)
    return model
