"""Context parallelism (CP): every sequence split along its length across the ranks of a CP group.

Sequence parallelism (dtlab.parallel.sequence_parallel) splits the sequence only
between the tensor-parallel blocks; inside them every TP rank still sees all
T tokens. Context parallelism splits it *everywhere*: each of N ranks holds
T/N tokens of every sequence through the whole model, so every activation
(attention's included) is divided by N, and a sequence N times longer fits.
The weights are replicated, as under data parallelism.

Almost nothing has to change, because a transformer works token by token:
embeddings, LayerNorms, the MLP, the projections, the residual stream and
the loss all act on each token alone. The one exception is attention, which
becomes :func:`dtlab.parallel.ring_attention.ring_attention`. Three things follow:

* **the data**: rank r takes its tokens of each sequence (and their targets),
  :func:`shard_sequence`; with zigzag these are two chunks, r and 2N-1-r;
* **the positions**: a token's position embedding is that of its place in the
  whole sequence, not in the rank's slice (:class:`ShardedPositions`);
* **the gradients**: each rank's loss is the mean over its own tokens, so the
  gradient of the whole sequence's mean loss is the *average* over the CP
  ranks, exactly as for data-parallel replicas. Megatron-LM therefore
  averages gradients over the data- and context-parallel ranks together; so
  does dtlab's trainer (the CP group is folded into the gradient-averaging
  group), and :func:`average_over` does it by hand.

::

    model = apply_context_parallel(build_model(cfg, seed=0), group=cp_group)
    idx, targets = (shard_sequence(t, group=cp_group) for t in (idx, targets))   # (B, T/N)
    model(idx, targets).backward(); average_over(model.parameters(), group=cp_group)

Ring attention has no dropout on its weights: CP refuses a model with dropout.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from dtlab.comm import calls as comm
from dtlab.comm.collectives import CommMeter, group_size_and_rank
from dtlab.i18n import ConfigError
from dtlab.parallel.ring_attention import RingAttention, positions


def shard_sequence(x: torch.Tensor, *, group=None, zigzag: bool = True, dim: int = 1) -> torch.Tensor:
    """This rank's tokens of ``x`` along ``dim`` (the sequence), in the order ring attention expects.

    (B, T, ...) -> (B, T/N, ...); with zigzag, chunks r and 2N-1-r of 2N.
    """
    size, rank = group_size_and_rank(group)
    if size == 1:
        return x
    mine = positions(x.shape[dim], rank=rank, size=size, zigzag=zigzag).to(x.device)
    return x.index_select(dim, mine)


class ShardedPositions(nn.Embedding):
    """The position table, looked up at this rank's places in the whole sequence.

    The model numbers its T/N local tokens 0 .. T/N-1 (``torch.arange``); this
    maps each to its position in the sequence of T = N x T/N tokens. The weight
    is the same Parameter as the dense table's (same name, same values).
    """

    def __init__(self, table: nn.Embedding, *, rank: int, size: int, zigzag: bool):
        super().__init__(table.num_embeddings, table.embedding_dim)
        self.weight = table.weight
        self.rank, self.size, self.zigzag = rank, size, zigzag

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        whole = positions(pos.numel() * self.size, rank=self.rank, size=self.size, zigzag=self.zigzag).to(
            pos.device
        )  # (T/N,) places in T
        return F.embedding(whole[pos], self.weight)  # (T/N, C)


def apply_context_parallel(
    model: nn.Module, *, group=None, zigzag: bool = True, meter: CommMeter | None = None
) -> nn.Module:
    """Make ``model`` (the small GPT or a pipeline stage) work on this rank's tokens, in place.

    Every attention layer's core becomes ring attention over ``group`` (also
    after tensor parallelism: then each TP rank rings its own heads), and the
    position table, where the model has one, looks up whole-sequence
    positions. Parameters are unchanged. A group of one rank leaves the model
    as it is. ``meter`` counts ring attention's sends (``send_recv.kv``,
    ``send_recv.kv_grad``).
    """
    size, rank = group_size_and_rank(group)
    if size == 1:
        return model
    for block in model.blocks:
        if block.attn.dropout.p > 0:
            raise ConfigError(
                f"context parallelism needs dropout = 0, got {block.attn.dropout.p} "
                "(ring attention has no dropout on its weights)",
                f"上下文并行要求 dropout = 0，收到 {block.attn.dropout.p}（环形注意力不对注意力权重做 dropout）",
            )
        block.attn.core = RingAttention(group=group, zigzag=zigzag, meter=meter)
    table = getattr(model, "pos_emb", None)
    if table is not None:
        model.pos_emb = ShardedPositions(table, rank=rank, size=size, zigzag=zigzag)
    return model


def average_over(params, *, group=None) -> None:
    """Average each parameter's gradient over ``group`` in place (what DP does; here for CP by hand)."""
    size, _ = group_size_and_rank(group)
    if size == 1:
        return
    for p in params:
        if p.grad is not None:
            comm.all_reduce(p.grad, group=group, kind="all_reduce.cp_grads")
            p.grad.div_(size)
