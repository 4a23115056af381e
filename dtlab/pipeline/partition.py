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
(:func:`dtlab.pipeline.schedule.stage_layers`, torch-free, which the planner
uses too); the first and last stage also hold the embeddings and the head,
which is why real systems sometimes give them a block less.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from dtlab.i18n import ConfigError
from dtlab.model import GPT, next_token_loss
from dtlab.pipeline.schedule import stage_layers


class GPTStage(nn.Module):
    """Stage ``stage`` of ``stages`` of a GPT: the blocks of :func:`stage_layers`, plus the
    embeddings on the first stage and the final LayerNorm and head on the last.

    Takes the modules of ``model`` itself (no copy): build the full model with
    the same seed on every rank, keep your stage, and the rest is freed.
    """

    def __init__(self, model: GPT, *, stage: int, stages: int):
        super().__init__()
        self.stage, self.stages = stage, stages
        self.is_first, self.is_last = stage == 0, stage == stages - 1
        self.d_model = model.cfg.d_model
        self.layers = stage_layers(len(model.blocks), stages)[stage]
        if self.is_first:
            self.tok_emb, self.pos_emb = model.tok_emb, model.pos_emb
        self.blocks = nn.ModuleList(model.blocks[i] for i in self.layers)
        if self.is_last:
            self.ln_f, self.head = model.ln_f, model.head

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """First stage: token ids (B, T); others: the residual stream (B, T, C).

        Returns the residual stream (B, T, C) for the next stage; the last
        stage returns logits (B, T, V), or the mean cross-entropy with ``targets``.
        """
        if self.is_first:
            T = x.shape[1]
            pos = torch.arange(T, device=x.device)
            x = self.tok_emb(x) + self.pos_emb(pos)                      # (B, T, C)
        for block in self.blocks:
            x = block(x)                                                 # (B, T, C)
        if not self.is_last:
            return x
        logits = self.head(self.ln_f(x))                                 # (B, T, V)
        if targets is None:
            return logits
        return next_token_loss(logits, targets)


def partition_gpt(model: GPT, *, stage: int, stages: int) -> GPTStage:
    """This rank's stage of ``model`` (``stage`` = its pipeline rank, ``stages`` = pp)."""
    if not 0 <= stage < stages:
        raise ConfigError(f"stage={stage} is outside 0 .. {stages - 1}",
                          f"stage={stage} 不在 0 .. {stages - 1} 之内")
    return GPTStage(model, stage=stage, stages=stages)
