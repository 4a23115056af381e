"""A mixture-of-experts layer: the router picks experts per token, the experts' outputs are combined.

It replaces a transformer block's MLP by E MLPs (the *experts*) of which each
token uses only k (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch
Transformer, Fedus et al. 2021): E times the parameters, about k/E of them
active per token. Per layer, with S tokens of width C::

    route     expert, gate, keep = router(x)       (S, k) each    dtlab/parallel/moe/router.py
    dispatch  rows = x[token of each kept choice], sorted by expert      (A, C)
              --all-to-all-->  the rows for my experts, from every rank  (R, C)
    compute   each of my experts on its rows                             (R, C)
    combine   --all-to-all-->  back to the rank the token came from      (A, C)
              y[token] += gate x row                                     (S, C)

With one rank the two all-to-alls are no-ops and this is the single-process
model; with *expert parallelism* (:func:`dtlab.parallel.moe.expert_parallel.apply_expert_parallel`)
each of N ranks keeps E/N experts and the all-to-alls move tokens to them
(GShard, Sec. 3.2). Both run this same code, which is why they agree.

The balancing loss is added to the training objective without changing what
the layer returns: :class:`AuxLoss` is the identity in forward, and in
backward also sends a gradient of ``aux_loss_coef x balance`` into the
router (Megatron-LM's MoEAuxLossAutoScaler does the same), so it works in a
pipeline stage that never sees the final loss. ``aux_grad_scale`` is the
factor the final loss is multiplied by before backward (1/m with m
micro-batches, times the fp16 loss scale); the trainer sets it with
:func:`dtlab.parallel.moe.set_aux_grad_scale`.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from dtlab.comm.all_to_all import all_to_all, all_to_all_single
from dtlab.parallel.moe.router import TopKRouter


class AuxLoss(torch.autograd.Function):
    """Identity on ``out``; in backward, d(objective)/d(aux) = ``scale``, so aux is part of the loss."""

    @staticmethod
    def forward(ctx, out, aux, scale):
        ctx.scale, ctx.dtype, ctx.device = scale, aux.dtype, aux.device
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, torch.tensor(ctx.scale, dtype=ctx.dtype, device=ctx.device), None


def sort_by_expert(expert: torch.Tensor, gate: torch.Tensor, keep: torch.Tensor):
    """The top-k dispatch: every kept choice as one row, the rows grouped by expert.

    ``expert``, ``gate``, ``keep`` are the router's (S, k). Returns ``token``,
    ``expert``, ``gate``, each (A,) for the A kept choices, ordered by expert
    (ties in token order): a token routed to two experts is two rows, a
    dropped choice is no row. Grouping by expert is what lets one all-to-all
    send each rank one contiguous piece, and each expert run once on a block.
    """
    S, k = expert.shape
    token = torch.arange(S, device=expert.device)[:, None].expand(S, k)[keep]  # (A,)
    expert, gate = expert[keep], gate[keep]  # (A,)
    order = torch.argsort(expert, stable=True)
    return token[order], expert[order], gate[order]


class MoE(nn.Module):
    """E experts behind a top-k router, for (B, T, C) activations; a drop-in for the block's MLP.

    ``experts`` are the E modules (C -> C), in global order. ``group`` is the
    expert-parallel group (``None``: all experts here). ``stats`` accumulates,
    until :meth:`take_stats`, what the router did in each forward that builds
    a graph (training, not ``torch.no_grad`` evaluation).
    """

    def __init__(
        self, d_model: int, experts: list[nn.Module], *, top_k: int, capacity_factor: float | None, aux_loss_coef: float
    ):
        super().__init__()
        self.n_experts, self.aux_loss_coef = len(experts), aux_loss_coef
        self.router = TopKRouter(d_model, len(experts), top_k=top_k, capacity_factor=capacity_factor)
        # Keyed by global expert index, so names (and checkpoints) do not depend on the layout.
        self.experts = nn.ModuleDict({str(i): e for i, e in enumerate(experts)})
        self.group, self.meter, self.aux_grad_scale = None, None, 1.0
        self.dispatch = sort_by_expert  # swappable: lesson 12's exercise plugs its own in
        self.count_stats = True
        self.reset_stats()

    @property
    def local_experts(self) -> list[int]:
        """Global indices of the experts on this rank, ascending (a contiguous range under EP)."""
        return sorted(int(i) for i in self.experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        flat = x.reshape(B * T, C)  # (S, C)
        route = self.router(flat, seq_len=T)
        token, expert, gate = self.dispatch(route.expert, route.gate, route.keep)  # (A,) each
        counts = torch.bincount(expert, minlength=self.n_experts)  # (E,) rows per expert
        rows = self._run_experts(flat[token], counts)  # (A, C), same order
        out = torch.zeros_like(flat).index_add(0, token, rows * gate[:, None])  # (S, C)
        if self.count_stats and torch.is_grad_enabled():
            # Counted once per training forward: a recomputed block's first pass runs without
            # a graph (dtlab/numerics/gradient_checkpointing.py) and is not counted, its recomputation is.
            self._record(route)
        aux = self.aux_loss_coef * route.balance
        if torch.is_grad_enabled() and aux.requires_grad:
            out = AuxLoss.apply(out, aux, self.aux_grad_scale)
        return out.view(B, T, C)

    def _run_experts(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Rows sorted by expert, (A, C) -> the experts' outputs for them, (A, C), wherever they live.

        The experts are spread over n = E / (experts here) ranks: 1 until
        :func:`~dtlab.parallel.moe.expert_parallel.apply_expert_parallel` kept only this
        rank's share, and then nothing is sent (whatever ``group`` is: in a
        data-parallel run without EP every rank has every expert).
        """
        L = len(self.experts)  # experts on this rank
        n = self.n_experts // L
        send_splits = counts.view(n, L).sum(dim=1).tolist()  # rows for rank j's experts
        # Everyone first learns how many rows it will get, from whom, for which expert.
        incoming = (
            counts
            if n == 1
            else all_to_all_single(torch.empty_like(counts), counts, group=self.group, meter=self.meter)
        )
        incoming = incoming.view(n, L)  # (src, local expert)
        recv_splits = incoming.sum(dim=1).tolist()
        mine = rows if n == 1 else all_to_all(rows, send_splits, recv_splits, group=self.group, meter=self.meter)
        # (R, C), by source rank then expert: regroup by expert to run each one once.
        local = torch.arange(L, device=rows.device).repeat(n).repeat_interleave(incoming.flatten())
        by_expert = torch.argsort(local, stable=True)  # (R,)
        sizes = incoming.sum(dim=0).tolist()  # (L,) rows per local expert
        chunks = mine[by_expert].split(sizes)
        done = torch.cat([self.experts[str(i)](chunk) for i, chunk in zip(self.local_experts, chunks)])
        done = done[torch.argsort(by_expert)]  # back to arrival order (R, C)
        if n == 1:
            return done
        return all_to_all(done, recv_splits, send_splits, group=self.group, meter=self.meter)

    # ----------------------------------------------------------------- what the router did

    def reset_stats(self) -> None:
        E = self.n_experts
        self.stats = {
            "routed": torch.zeros(E, dtype=torch.long),
            "kept": torch.zeros(E, dtype=torch.long),
            "balance": 0.0,
            "forwards": 0,
        }

    def _record(self, route) -> None:
        self.stats["routed"] += route.routed.cpu()
        self.stats["kept"] += route.kept.cpu()
        self.stats["balance"] += route.balance.item()
        self.stats["forwards"] += 1

    def take_stats(self) -> dict:
        """This rank's counts since the last call, as plain numbers; then start again from zero.

        ``routed``/``kept``: assignments per expert (of tokens this rank routed),
        ``dropped``: assignments over capacity, ``balance``: mean E x sum f P
        (1.0 = balanced), ``aux_loss``: what was added to the objective, mean per forward.
        """
        s = self.stats
        forwards = max(1, s["forwards"])
        taken = {
            "routed": s["routed"].tolist(),
            "kept": s["kept"].tolist(),
            "dropped": int((s["routed"] - s["kept"]).sum()),
            "balance": s["balance"] / forwards,
            "aux_loss": self.aux_loss_coef * s["balance"] / forwards,
        }
        self.reset_stats()
        return taken
