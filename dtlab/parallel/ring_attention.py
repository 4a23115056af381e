"""Ring attention: exact causal attention over a sequence split across the ranks of a ring.

Context parallelism (dtlab.parallel.context_parallel) gives each of N ranks T/N of a
sequence's tokens. Everything in a transformer works token by token except
attention, where every query needs the keys and values of all earlier
tokens. Ring attention (Liu, Zaharia and Abbeel 2023, "Ring Attention with
Blockwise Transformers") never gathers them: each rank keeps its queries and
passes its block of keys and values (K/V) to the next rank, N-1 times, while
it computes attention against the block it holds::

    step 0: rank r attends to its own K/V    step s: to rank (r - s)'s K/V
    rank 0 --K/V--> rank 1 --K/V--> ... --K/V--> rank N-1 --K/V--+
      ^------------------------------------------------------------+

**The online softmax.** Attention over a row of scores s is a weighted sum
with weights exp(s_j) / sum_j exp(s_j). Computed block by block, each block b
gives its own normalised output o_b and the log of its normaliser,
lse_b = log sum_{j in b} exp(s_j). Two blocks merge exactly (Milakov and
Gimelshein 2018; the log-sum-exp form of FlashAttention, Dao et al. 2022)::

    lse = log(exp(lse_a) + exp(lse_b))
    o   = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b          (:func:`merge`)

so the order the blocks arrive in does not matter, and no rank ever holds a
(T, T) score matrix: only (T/N, T/N) blocks.

**The causal mask and zigzag.** Cut the sequence into chunks. A query chunk
sees earlier key chunks whole, its own chunk under a triangular mask, and
later chunks not at all (those blocks are skipped). With one contiguous
chunk per rank, rank 0 has almost nothing to compute and rank N-1 everything;
*zigzag* cuts the sequence into 2N chunks and gives rank r chunks r and
2N-1-r, an early one and a late one, so every rank computes the same number
of tiles: 3 at the first step, 2 at every later one (the Llama 3 paper,
Grattafiori et al. 2024, Sec. 3.3.2, balances its context parallelism this way). :func:`ring_schedule` is the
whole algorithm as data, for tests and for the lesson's Step view.

**Backward** goes round the ring once more: each rank keeps its queries and
output, and a block of K/V travels together with the gradient accumulating
for it (dK, dV); after N steps the gradients come home to their owner.
Counted meter kinds: ``send_recv.kv`` (forward, N-1 passes of K/V) and
``send_recv.kv_grad`` (backward, N-1 passes of K/V with dK/dV, then dK/dV).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn as nn

from dtlab.comm import calls as comm
from dtlab.comm.collectives import CommMeter, global_rank, group_size_and_rank
from dtlab.i18n import ConfigError
from dtlab.model import causal_attention

KV, KV_GRAD = "send_recv.kv", "send_recv.kv_grad"
FULL, DIAGONAL = "full", "diagonal"


# --------------------------------------------------------------------------- the layout, as data


def chunks_of(rank: int, size: int, *, zigzag: bool = True) -> tuple[int, ...]:
    """Which chunks of the sequence ``rank`` holds, in its local order.

    zigzag: 2N chunks, rank r holds chunks r and 2N-1-r. Otherwise N chunks, rank r holds chunk r.
    """
    return (rank, 2 * size - 1 - rank) if zigzag else (rank,)


def positions(seq_len: int, *, rank: int, size: int, zigzag: bool = True) -> torch.Tensor:
    """The positions in the whole sequence of ``rank``'s T/N tokens, in local order: (T/N,)."""
    n_chunks = 2 * size if zigzag else size
    check_sequence(seq_len, n_chunks, size)
    c = seq_len // n_chunks
    return torch.cat([torch.arange(i * c, (i + 1) * c) for i in chunks_of(rank, size, zigzag=zigzag)])


def check_sequence(seq_len: int, n_chunks: int, size: int) -> None:
    if seq_len % n_chunks:
        raise ConfigError(
            f"sequence length {seq_len} cannot be cut into {n_chunks} equal chunks for cp = {size} "
            f"(allowed: a multiple of {n_chunks}; zigzag gives each rank 2 chunks)",
            f"序列长度 {seq_len} 无法为 cp = {size} 切成 {n_chunks} 个等长的块"
            f"（允许：{n_chunks} 的倍数；zigzag 让每个 rank 持有 2 块）",
        )


class Tile(NamedTuple):
    """One tile of the attention matrix (a query chunk against a key chunk) a rank computes."""

    q_chunk: int
    """The query chunk (this rank's)."""
    k_chunk: int
    """The key/value chunk (the rank that K/V came from)."""
    kind: str
    """``"full"`` (every key is earlier) or ``"diagonal"`` (the same chunk, causal mask)."""


class RingStep(NamedTuple):
    step: int
    rank: int
    kv_from: int
    """Whose K/V this rank holds at this step: rank (r - step) mod N."""
    tiles: tuple[Tile, ...]
    """The tiles it computes; a later key chunk is skipped (the causal mask hides it all)."""


def ring_schedule(size: int, *, zigzag: bool = True) -> tuple[RingStep, ...]:
    """Every rank's steps of ring attention over ``size`` ranks: N steps of N ranks, in order."""
    steps = []
    for step in range(size):
        for rank in range(size):
            src = (rank - step) % size
            tiles = tuple(
                Tile(q, k, DIAGONAL if k == q else FULL)
                for q in chunks_of(rank, size, zigzag=zigzag)
                for k in chunks_of(src, size, zigzag=zigzag)
                if k <= q
            )
            steps.append(RingStep(step, rank, src, tiles))
    return tuple(steps)


# --------------------------------------------------------------------------- one block, and the merge


def attention_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool):
    """Attention of a query block to one key/value block: its output and log-sum-exp.

    q (B, nh, Tq, hs), k and v (B, nh, Tk, hs) -> o (B, nh, Tq, hs), lse (B, nh, Tq).
    ``causal``: q and k are the same chunk, each query sees itself and earlier keys.
    """
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, nh, Tq, Tk)
    if causal:
        s = s.masked_fill(~_lower(s), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (B, nh, Tq)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse  # (B, nh, Tq, hs)


def merge(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor):
    """The online-softmax merge of two attention blocks over the same queries: (o, lse).

    o_* (B, nh, Tq, hs) each normalised over its own keys; lse_* (B, nh, Tq).
    Exact: the result is attention over the union of both blocks' keys.
    """
    lse = torch.logaddexp(lse_a, lse_b)  # (B, nh, Tq)
    o = torch.exp(lse_a - lse).unsqueeze(-1) * o_a + torch.exp(lse_b - lse).unsqueeze(-1) * o_b
    return o, lse


def _lower(s: torch.Tensor) -> torch.Tensor:
    return torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()


# --------------------------------------------------------------------------- passing blocks round the ring


class _Pass:
    """Send ``tensor`` to the next rank and receive the previous rank's into a new buffer.

    Both are posted at once, as one batch (a ring of blocking sends would
    deadlock; see :func:`dtlab.comm.calls.exchange`), and waited for later, so the
    forward pass computes while its next block travels.
    """

    def __init__(self, tensor: torch.Tensor, *, group, meter: CommMeter | None, kind: str):
        n, rank = group_size_and_rank(group)
        tensor = tensor.contiguous()
        self.received = torch.empty_like(tensor)
        if meter is not None:
            meter.record_call(kind, tensor)
            meter.record_sent(kind, tensor.numel() * tensor.element_size())
        self.work = comm.exchange(
            tensor,
            global_rank(group, (rank + 1) % n),
            self.received,
            global_rank(group, (rank - 1) % n),
            group=group,
            kind=kind,
        )

    def wait(self) -> torch.Tensor:
        self.work.wait()
        return self.received


def _my_steps(group, zigzag: bool) -> list[RingStep]:
    n, rank = group_size_and_rank(group)
    return [s for s in ring_schedule(n, zigzag=zigzag) if s.rank == rank]


def _forward(q, k, v, *, group, zigzag: bool, meter, trace: list | None, combine=merge):
    """This rank's queries against every rank's K/V, round the ring: (out, lse).

    ``combine`` is the online-softmax merge (:func:`merge`; lesson 07's exercise plugs in the learner's).
    """
    n, rank = group_size_and_rank(group)
    mine = chunks_of(rank, n, zigzag=zigzag)
    q_at = dict(zip(mine, q.chunk(len(mine), dim=2)))  # chunk -> (B, nh, c, hs)
    acc: dict[int, tuple] = {}  # chunk -> (o, lse) so far
    kv = torch.stack([k, v])  # (2, B, nh, T/N, hs)
    for step in _my_steps(group, zigzag):
        ahead = _Pass(kv, group=group, meter=meter, kind=KV) if step.step < n - 1 else None
        theirs = chunks_of(step.kv_from, n, zigzag=zigzag)
        k_at = dict(zip(theirs, kv[0].chunk(len(theirs), dim=2)))
        v_at = dict(zip(theirs, kv[1].chunk(len(theirs), dim=2)))
        for b in step.tiles:
            o, lse = attention_block(q_at[b.q_chunk], k_at[b.k_chunk], v_at[b.k_chunk], causal=b.kind == DIAGONAL)
            acc[b.q_chunk] = (o, lse) if b.q_chunk not in acc else combine(*acc[b.q_chunk], o, lse)
        if trace is not None:
            trace.append(step)
        if ahead is not None:
            kv = ahead.wait()  # the previous rank's K/V
    out = torch.cat([acc[c][0] for c in mine], dim=2)  # (B, nh, T/N, hs)
    return out, torch.cat([acc[c][1] for c in mine], dim=2)  # (B, nh, T/N)


def _backward(dout, q, k, v, out, lse, *, group, zigzag: bool, meter):
    """Gradients of q, k, v: K/V and their accumulating dK/dV travel the ring together."""
    n, rank = group_size_and_rank(group)
    mine = chunks_of(rank, n, zigzag=zigzag)
    split = lambda t: dict(zip(mine, t.chunk(len(mine), dim=2)))  # noqa: E731
    q_at, do_at, lse_at = split(q), split(dout), split(lse)
    delta_at = split((dout * out).sum(-1))  # (B, nh, T/N): rowsum(dO * O)
    dq = torch.zeros_like(q)
    dq_at = split(dq)
    scale = 1.0 / math.sqrt(q.shape[-1])
    buf = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])  # (4, B, nh, T/N, hs)
    for step in _my_steps(group, zigzag):
        theirs = chunks_of(step.kv_from, n, zigzag=zigzag)
        k_at, v_at, dk_at, dv_at = (dict(zip(theirs, t.chunk(len(theirs), dim=2))) for t in buf)
        for b in step.tiles:
            qc, kc = b.q_chunk, b.k_chunk
            s = (q_at[qc] @ k_at[kc].transpose(-2, -1)) * scale  # (B, nh, c, c)
            if b.kind == DIAGONAL:
                s = s.masked_fill(~_lower(s), float("-inf"))
            p = torch.exp(s - lse_at[qc].unsqueeze(-1))  # the final softmax weights
            dv_at[kc].add_(p.transpose(-2, -1) @ do_at[qc])  # views into buf: in place
            ds = p * (do_at[qc] @ v_at[kc].transpose(-2, -1) - delta_at[qc].unsqueeze(-1))
            dq_at[qc].add_(ds @ k_at[kc] * scale)
            dk_at[kc].add_(ds.transpose(-2, -1) @ q_at[qc] * scale)
        # Pass on K/V with their gradients so far; the last pass sends only dK/dV, home.
        last = step.step == n - 1
        received = _Pass(buf[2:] if last else buf, group=group, meter=meter, kind=KV_GRAD).wait()
        buf = received if not last else None
    return dq, received[0], received[1]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, zigzag, meter, trace, combine):
        dtype = q.dtype  # fp32 inside, as softmax wants
        q, k, v = (t.float() for t in (q, k, v))
        out, lse = _forward(q, k, v, group=group, zigzag=zigzag, meter=meter, trace=trace, combine=combine)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.zigzag, ctx.meter, ctx.dtype = group, zigzag, meter, dtype
        return out.to(dtype)

    @staticmethod
    def backward(ctx, dout):
        grads = _backward(dout.float(), *ctx.saved_tensors, group=ctx.group, zigzag=ctx.zigzag, meter=ctx.meter)
        return (*(g.to(ctx.dtype) for g in grads), None, None, None, None, None)


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group=None,
    zigzag: bool = True,
    meter: CommMeter | None = None,
    trace: list | None = None,
    combine=merge,
) -> torch.Tensor:
    """Causal attention of this rank's tokens to every earlier token of the sequence, over ``group``.

    q, k, v: (B, nh, T/N, hs), this rank's tokens in the order of
    :func:`positions`; returns (B, nh, T/N, hs), exactly what full causal
    attention gives at those positions. Differentiable. ``trace`` receives this
    rank's :class:`RingStep` s as it executes them; ``combine`` replaces :func:`merge`
    (backward needs only the final log-sum-exp, so a wrong merge shows in both
    values and gradients). With one rank: plain causal attention.
    """
    if group_size_and_rank(group)[0] == 1:
        return causal_attention(q, k, v)
    return _RingAttention.apply(q, k, v, group, zigzag, meter, trace, combine)


class RingAttention(nn.Module):
    """:func:`ring_attention` as a module for an attention layer's ``core`` (no parameters)."""

    def __init__(self, *, group=None, zigzag: bool = True, meter: CommMeter | None = None):
        super().__init__()
        self.group, self.zigzag, self.meter = group, zigzag, meter

    def forward(self, q, k, v):
        return ring_attention(q, k, v, group=self.group, zigzag=self.zigzag, meter=self.meter)
