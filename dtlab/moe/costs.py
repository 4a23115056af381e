"""What a mixture of experts costs, by formula: parameters total and active, memory under EP,
all-to-all volume and time, FLOPs per token. Torch-free: the planner's arithmetic.

Symbols: E experts, k experts per token (top-k), N expert-parallel degree,
h hidden size, b micro-batch (sequences), s sequence length, l MoE layers on
a rank, P_e one expert's parameters (the MLP it replaces), m micro-batches.

* **Parameters.** Each MoE layer holds E experts and a router (h x E): the
  model grows by l (E - 1) P_e + l h E. A token runs through k experts, so
  the parameters it *uses* (the active ones) grow only by l (k - 1) P_e + l h E
  (Switch Transformer, Fedus et al. 2021, Sec. 2; the Mixtral report quotes
  47B total and 13B active for E = 8, k = 2).
* **Memory per rank under EP.** A rank keeps E/N experts per layer; everything
  else as without EP.
* **All-to-all.** Per MoE layer and micro-batch, the dispatch sends each of the
  b s tokens' k choices (rows of h values) to the experts' ranks and the
  combine brings them back: 2 all-to-alls forward, 2 in backward (their
  gradients), 2 more forward with full recomputation. With the router spread
  evenly, each carries k b s h values per rank, (N-1)/N of them across the
  wire. dtlab sends only kept choices (at most min(1, capacity factor) of
  them); GShard-style fixed buffers always send capacity factor x that.
* **FLOPs per token.** 2 per active matmul weight forward, 6 for training
  (Kaplan et al. 2020, Sec. 2.1): computed from the active weights, not the
  total, which is the point of a mixture of experts.
"""
from __future__ import annotations

from dtlab.planner.communication import all_to_all_time
from dtlab.planner.hardware import Link


def moe_params(dense_params: int, *, expert_params: int, hidden: int, layers: int,
               experts: int, top_k: int) -> dict[str, int]:
    """``{"total", "active"}`` parameters of a model whose ``layers`` MLPs (``expert_params`` each)
    become ``experts`` experts with a router; ``dense_params`` is the dense model's count."""
    router = hidden * experts
    return {"total": dense_params + layers * ((experts - 1) * expert_params + router),
            "active": dense_params + layers * ((top_k - 1) * expert_params + router)}


def expert_params_per_rank(*, expert_params: int, layers: int, experts: int, ep: int) -> int:
    """Parameters of the experts one rank keeps: E/N of each of its ``layers`` MoE layers."""
    return layers * (experts // ep) * expert_params


def dispatch_bytes(*, micro_batch: int, seq_len: int, hidden: int, top_k: int, bytes_per_value: int,
                   capacity_factor: float | None = None) -> float:
    """Bytes one rank feeds into one dispatch (or combine) all-to-all: k b s h values, fewer
    when the capacity factor is below 1 (dtlab sends only the kept choices)."""
    kept = 1.0 if capacity_factor is None else min(1.0, capacity_factor)
    return kept * top_k * micro_batch * seq_len * hidden * bytes_per_value


def all_to_all_calls_per_layer(recompute: str = "none") -> int:
    """All-to-alls of tokens per MoE layer and micro-batch: 2 forward, 2 backward, +2 recomputed."""
    return 6 if recompute == "full" else 4


def expert_parallel_comm_time(nbytes: float, *, ep: int, layers: int, micro_batches: int,
                              link: Link, recompute: str = "none") -> float:
    """Seconds of EP all-to-all per iteration on one rank (a prediction): ``nbytes`` is
    :func:`dispatch_bytes`; the small all-to-all of the counts before each dispatch is left out."""
    if ep == 1:
        return 0.0
    calls = all_to_all_calls_per_layer(recompute) * layers * micro_batches
    return calls * all_to_all_time(nbytes, ep, link)


def all_to_all_bytes_sent(nbytes: float, *, ep: int, layers: int, micro_batches: int,
                          recompute: str = "none") -> float:
    """Bytes one rank puts on the wire for EP per iteration: (N-1)/N of every all-to-all's input."""
    calls = all_to_all_calls_per_layer(recompute) * layers * micro_batches
    return calls * nbytes * (ep - 1) / ep


def active_matmul_weights(*, attention: int, expert_matmul: int, hidden: int, experts: int,
                          top_k: int) -> int:
    """Matmul weights a token goes through in one MoE block: attention, k experts, the router."""
    return attention + top_k * expert_matmul + hidden * experts


def training_flops_per_token(active_weights: int) -> int:
    """6 FLOPs per active weight per token for forward and backward (Kaplan et al. 2020);
    attention's score and value matmuls are extra, as for a dense model."""
    return 6 * active_weights
