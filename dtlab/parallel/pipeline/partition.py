"""Cut the small GPT into pipeline stages: consecutive blocks on consecutive ranks.

::

    stage 0                 stage 1      ...   stage p-1
    tok_emb + pos_emb       blocks             blocks
    blocks[0 : n/p]         [n/p : 2n/p]       [.. : n]
                                               ln_f + head + loss
        --(B, T, C)-->          --(B, T, C)-->

Between stages travels one tensor per micro-batch, the residual stream
(B, T, C), forward as an activation and backward as its gradient: far less
than tensor parallelism's all-reduces, which is why pipeline stages may sit
on different machines. Blocks are spread as evenly as possible
(:func:`dtlab.parallel.pipeline.schedule.stage_layers`, torch-free, which the planner
uses too); the first and last stage also hold the embeddings and the head,
which is why real systems sometimes give them a block less.

Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2) cuts the model into
p x v *virtual stages* instead, and rank r holds v of them, r, r + p, ...::

    p = 2, v = 2, 4 blocks     rank 0: chunk 0 = virtual stage 0 (embeddings, block 0),
                                       chunk 1 = virtual stage 2 (block 2)
                               rank 1: chunk 0 = virtual stage 1 (block 1),
                                       chunk 1 = virtual stage 3 (block 3, head + loss)

The rank's :class:`GPTStage` holds all its chunks' blocks in one list, so
tensor parallelism, recompute and the rest split them as they split a plain
stage's; ``forward(x, chunk=c)`` runs only chunk c's blocks.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from dtlab.i18n import ConfigError
from dtlab.model import GPT, next_token_loss
from dtlab.parallel.pipeline.schedule import stage_layers


class GPTStage(nn.Module):
    """Stage ``stage`` of ``stages`` of a GPT: the blocks of :func:`stage_layers`, plus the
    embeddings on the first stage and the final LayerNorm and head on the last.

    With ``virtual_stages`` v > 1 (interleaved 1F1B) it holds v chunks: chunk c
    is virtual stage c x stages + stage of the model cut into stages x v
    (:func:`stage_layers`); the embeddings go with virtual stage 0 (chunk 0 of
    stage 0), the head with the last (chunk v - 1 of the last stage).
    ``layers`` lists the model's block of each of ``blocks`` (a range when v = 1),
    ``chunks`` the positions in ``blocks`` of each chunk's.

    Takes the modules of ``model`` itself (no copy): build the full model with
    the same seed on every rank, keep your stage, and the rest is freed.
    """

    def __init__(self, model: GPT, *, stage: int, stages: int, virtual_stages: int = 1):
        super().__init__()
        self.stage, self.stages, self.virtual_stages = stage, stages, virtual_stages
        self.is_first, self.is_last = stage == 0, stage == stages - 1
        self.d_model = model.cfg.d_model
        cut = stage_layers(len(model.blocks), stages * virtual_stages)
        mine = [cut[c * stages + stage] for c in range(virtual_stages)]  # chunk c's blocks in the model
        self.layers = mine[0] if virtual_stages == 1 else tuple(i for chunk in mine for i in chunk)
        bounds = [0]
        for chunk in mine:
            bounds.append(bounds[-1] + len(chunk))
        self.chunks = [range(bounds[c], bounds[c + 1]) for c in range(virtual_stages)]
        if self.is_first:
            self.tok_emb, self.pos_emb = model.tok_emb, model.pos_emb
        self.blocks = nn.ModuleList(model.blocks[i] for i in self.layers)
        if self.is_last:
            self.ln_f, self.head = model.ln_f, model.head

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None, *, chunk: int = 0) -> torch.Tensor:
        """First (virtual) stage: token ids (B, T); others: the residual stream (B, T, C).

        Runs chunk ``chunk``'s blocks (0 unless interleaved). Returns the
        residual stream (B, T, C) for the next stage; the last stage returns
        logits (B, T, V), or the mean cross-entropy with ``targets``.
        """
        if self.is_first and chunk == 0:
            T = x.shape[1]
            pos = torch.arange(T, device=x.device)
            x = self.tok_emb(x) + self.pos_emb(pos)  # (B, T, C)
        for i in self.chunks[chunk]:
            x = self.blocks[i](x)  # (B, T, C)
        if not (self.is_last and chunk == self.virtual_stages - 1):
            return x
        logits = self.head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits
        return next_token_loss(logits, targets)


def partition_gpt(model: GPT, *, stage: int, stages: int, virtual_stages: int = 1) -> GPTStage:
    """This rank's stage of ``model`` (``stage`` = its pipeline rank, ``stages`` = pp; ``virtual_stages``:
    chunks per rank, the interleaved schedule's v)."""
    if not 0 <= stage < stages:
        raise ConfigError(f"stage={stage} is outside 0 .. {stages - 1}", f"stage={stage} 不在 0 .. {stages - 1} 之内")
    return GPTStage(model, stage=stage, stages=stages, virtual_stages=virtual_stages)
