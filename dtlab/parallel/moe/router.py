"""The router of a mixture of experts: top-k softmax gating, capacity, and the balancing loss.

Each token's hidden vector x (C,) is scored against every expert by one
linear map, the *router* (Shazeer et al. 2017, "Outrageously Large Neural
Networks", Sec. 2.1)::

    p = softmax(x W_r)            W_r: (C, E)    p: (E,), sums to 1
    the token goes to its k experts of highest p; expert i's output is weighted by its gate

Gates: with k = 1 the gate is p_i itself (Switch Transformer, Fedus et al.
2021, Eq. 2), so the router learns from the language-model loss through it;
with k > 1 the k chosen probabilities are renormalised to sum to 1 (GShard,
Lepikhin et al. 2020, Algorithm 1; Mixtral does the same).

**Capacity.** An expert processes at most C_e = ceil(capacity_factor x T x k / E)
assignments per sequence of T tokens; the rest are *dropped*: that token gets
nothing from that expert (it keeps its other choices' outputs; with all k
dropped, only the residual connection carries it on: Switch Transformer,
Sec. 2.2). First choices claim places before second
choices, and within one choice earlier tokens before later ones (GShard's
order). ``capacity_factor=None`` drops nothing.

**Balancing loss.** Left alone, a router collapses onto a few experts: they
get all the tokens, train faster, and win even more tokens. Switch
Transformer (Eq. 4-6) adds ``alpha * E * sum_i f_i * P_i``, where f_i is the
fraction of assignments the router gave expert i and P_i the mean router
probability of expert i; it is smallest (alpha) when both are uniform, 1/E.

Both capacity and the balancing loss are counted *per sequence* here (the
DeepSeek-V3 report, Sec. 2.1.2, calls this a sequence-wise balance loss).
A sequence never spans ranks, so the router drops the same tokens and
computes the same loss whichever rank a sequence lands on: a run gives the
same result on every layout. (Systems that count per rank-local batch drop
differently when the layout changes.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Routing:
    """Where the router sends each of S = B x T tokens, k choices each."""

    expert: torch.Tensor
    """(S, k) int64: the chosen experts, best first."""
    gate: torch.Tensor
    """(S, k): each choice's weight in the combined output (differentiable)."""
    keep: torch.Tensor
    """(S, k) bool: False where the choice exceeded its expert's capacity and is dropped."""
    balance: torch.Tensor
    """(): E x sum_i f_i P_i, averaged over the sequences; 1.0 when perfectly balanced
    (differentiable through P)."""
    routed: torch.Tensor
    """(E,) int64: assignments the router gave each expert, before capacity."""
    kept: torch.Tensor
    """(E,) int64: assignments each expert actually receives."""


def capacity(seq_len: int, *, experts: int, top_k: int, capacity_factor: float | None) -> int | None:
    """C_e = ceil(capacity_factor x T x k / E): an expert's places per sequence (None: unlimited)."""
    if capacity_factor is None:
        return None
    return math.ceil(capacity_factor * seq_len * top_k / experts)


class TopKRouter(nn.Module):
    """Scores tokens against E experts and picks k per token (no noise: the same input, the same route)."""

    def __init__(self, d_model: int, experts: int, *, top_k: int, capacity_factor: float | None):
        super().__init__()
        self.experts, self.top_k, self.capacity_factor = experts, top_k, capacity_factor
        self.weight = nn.Linear(d_model, experts, bias=False)  # W_r: C -> E

    def forward(self, x: torch.Tensor, *, seq_len: int) -> Routing:
        """Route ``x`` (S, C), S = B x T tokens laid out sequence by sequence."""
        S, E, k = x.shape[0], self.experts, self.top_k
        B, T = S // seq_len, seq_len
        probs = self.weight(x).float().softmax(dim=-1)  # (S, E)
        top_p, expert = probs.topk(k, dim=-1)  # (S, k), (S, k)
        gate = top_p if k == 1 else top_p / top_p.sum(dim=-1, keepdim=True)
        chosen = F.one_hot(expert, E)  # (S, k, E) 0/1
        keep = self._within_capacity(chosen.view(B, T, k, E))  # (S, k)
        # Switch's balancing term, per sequence: f from the router's choices (counted,
        # no gradient), P from its probabilities (the gradient flows through P).
        f = chosen.view(B, T * k, E).sum(dim=1) / (T * k)  # (B, E)
        P = probs.view(B, T, E).mean(dim=1)  # (B, E)
        balance = E * (f * P).sum(dim=-1).mean()  # ()
        return Routing(
            expert=expert,
            gate=gate.to(x.dtype),
            keep=keep,
            balance=balance,
            routed=chosen.sum(dim=(0, 1)),
            kept=(chosen * keep[..., None]).sum(dim=(0, 1)),
        )

    def _within_capacity(self, chosen: torch.Tensor) -> torch.Tensor:
        """``chosen`` (B, T, k, E) one-hot -> (B*T, k) bool: the choice got a place at its expert."""
        B, T, k, E = chosen.shape
        limit = capacity(T, experts=E, top_k=k, capacity_factor=self.capacity_factor)
        if limit is None:
            return torch.ones(B * T, k, dtype=torch.bool, device=chosen.device)
        # Queue order within a sequence: all first choices by position, then all second choices...
        queue = chosen.transpose(1, 2).reshape(B, k * T, E)  # (B, k*T, E)
        place = (queue.cumsum(dim=1) - 1) * queue  # (B, k*T, E): 0-based place
        place = place.sum(dim=-1).view(B, k, T).transpose(1, 2)  # (B, T, k)
        return (place < limit).reshape(B * T, k)
