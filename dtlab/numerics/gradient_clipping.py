"""Gradient clipping by the global norm, over every shard (Pascanu et al., 2013, "On the difficulty of
training recurrent neural networks", Sec. 3.2, Algorithm 1).

A bad batch can make one step's gradient g huge; a full step along it throws
the weights far from where training was. Clipping keeps the direction and
shortens the step: with the L2 norm over *all* parameters

    ||g|| = sqrt( sum over every element i of g_i^2 )

the gradient is multiplied by ``max_norm / (||g|| + 1e-6)`` when that is below 1
(exactly what ``torch.nn.utils.clip_grad_norm_`` does, epsilon included), and
left alone otherwise.

Distributed, no rank holds the whole g, so the norm needs a communication of
its own: each rank adds up the squares of the elements it *counts*, and one
all-reduce (SUM) of that single number over every rank gives ||g||^2. Every
element must be counted by exactly one rank:

    data parallelism   replicas hold the same averaged gradient: the DP group's
                       first rank counts it (context parallelism too: its
                       ranks average over dp x cp)
    ZeRO 1/2/3         disjoint shards: each rank counts its own
    tensor parallel    a split weight: each rank its piece; a replicated one
                       (LayerNorms, row-parallel biases, embeddings, the head):
                       only TP rank 0
    pipeline           disjoint stages: each stage its own parameters
    expert parallel    an expert's gradient is the same over its expert-data-
                       parallel group: that group's first rank counts it

The data-parallel part is the layout's answer
(:meth:`dtlab.parallel.dp_optimizer.DPOptimizer.gradients` flags what a rank counts);
the model-parallel part is the set of names this module is told to leave out
on TP ranks other than 0. Under fp16 the gradients still carry the loss scale
S when the norm is taken: ||S g|| / S is ||g||, exactly when S is a power of
two. The clip itself comes later: the loss scaler first divides the
gradients by S and checks them, then (only if the step is taken) the
unscaled gradients are multiplied by the clip coefficient, right before the
optimizer steps; a step that overflowed is skipped and clips nothing.
"""

from __future__ import annotations

import math

import torch

from dtlab.comm import calls as comm
from dtlab.comm.collectives import group_size_and_rank
from dtlab.parallel.dp_optimizer import GradPiece

EPS = 1e-6
"""Added to the norm before dividing, as ``torch.nn.utils.clip_grad_norm_`` does."""
KIND = "all_reduce.grad_norm"
"""The tracer's name for the norm's all-reduce (one fp32 number per rank per step)."""


def global_grad_norm(
    pieces: list[GradPiece],
    *,
    uncounted: frozenset[str] = frozenset(),
    loss_scale: float = 1.0,
    device="cpu",
    group=None,
) -> float:
    """||g|| over every rank of ``group`` (None: the world), each element counted once.

    ``pieces``: this rank's gradients (:meth:`~dtlab.parallel.dp_optimizer.DPOptimizer.gradients`);
    ``uncounted``: names another rank of the model-parallel group counts
    instead (a TP-replicated parameter on a TP rank other than 0);
    ``loss_scale``: S, by which the gradients are still multiplied. Every rank
    of ``group`` must call it (it all-reduces); a world of one does not
    communicate. Not finite if a gradient is not (an fp16 overflow).
    """
    squares = torch.zeros((), dtype=torch.float32, device=device)  # () one number per rank
    for piece in pieces:
        if piece.counted and piece.name not in uncounted:
            squares += torch.linalg.vector_norm(piece.grad, dtype=torch.float32).square()
    if group_size_and_rank(group)[0] > 1:
        comm.all_reduce(squares, group=group, kind=KIND)  # () sum over every rank
    return squares.sqrt().item() / loss_scale


@torch.no_grad()
def clip_to(pieces: list[GradPiece], max_norm: float, total_norm: float) -> bool:
    """Scale every gradient in ``pieces`` by ``max_norm / (total_norm + 1e-6)`` if that is below 1.

    Returns whether it scaled. ``total_norm`` is :func:`global_grad_norm`'s
    answer, the same on every rank, so every rank scales, or not, together.
    A norm that is not finite scales nothing (under fp16 the loss scaler
    skips that step).
    """
    if not math.isfinite(total_norm):
        return False
    # The coefficient in fp32, as clip_grad_norm_ computes it from its fp32 norm tensor.
    coefficient = torch.tensor(max_norm, dtype=torch.float32) / (torch.tensor(total_norm, dtype=torch.float32) + EPS)
    if coefficient >= 1:
        return False
    for piece in pieces:
        piece.grad.mul_(coefficient.to(piece.grad.device))
    return True
