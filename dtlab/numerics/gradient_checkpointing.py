"""Activation (gradient) checkpointing: trade compute for memory by recomputing in backward.

Backward needs the activations of forward: every matmul keeps its input,
every softmax its output. For a stack of L transformer blocks that is L
blocks' worth of intermediates held at once, the largest part of a training
rank's memory (ZeRO's "residual states"). Chen et al., "Training Deep Nets
with Sublinear Memory Cost" (2016), keep only some of them, the
*checkpoints*, and recompute the rest during backward:

    forward   block i runs under no_grad: nothing inside it is kept,
              only its input x_i (one (B, T, C) tensor)
    backward  when the gradient reaches block i, run block i's forward again
              from x_i with autograd on, then backpropagate through that
              fresh graph, and free it before moving to block i-1

Memory: L inputs of (B, T, C) plus one block's intermediates at a time,
instead of L blocks' intermediates. Cost: every block's forward runs twice,
about one extra forward pass per step (a third more compute, since backward
costs about two forwards). Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models" (2022), call this *full*
recomputation, and show that recomputing only the attention core (the (B, nh,
T, T) scores: large to store, cheap to compute), *selective* recomputation,
saves most of the memory for a few percent of compute. dtlab does full
recomputation per block; ``dtlab plan --recompute selective`` models the other.

Randomness must repeat: a recomputed dropout must drop the same units as the
first forward, or the gradient belongs to another network. So the forward
saves the random-number generators' state and the recomputation restores it
(CPU, and the CUDA devices of the inputs), as ``torch.utils.checkpoint`` does.

    apply_recompute(model)       # every model.blocks[i] now runs through recompute()
"""

from __future__ import annotations

import functools
import types

import torch
import torch.nn as nn


class _Recompute(torch.autograd.Function):
    """``function(*args)`` keeping only ``args`` for backward; the parameters after them get gradients.

    The parameters are passed in as inputs too, so autograd knows the output
    depends on them: their gradients are returned by :meth:`backward` and
    accumulated like any other (gradient hooks, data parallelism, fp32
    accumulation see nothing unusual), and the output requires a gradient
    even when no input does (say, a frozen embedding below the first block).
    """

    @staticmethod
    def forward(ctx, function, n_args: int, *args_and_params):
        args, ctx.params = args_and_params[:n_args], args_and_params[n_args:]
        ctx.function, ctx.n_args = function, n_args
        ctx.devices = sorted({a.device.index for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"})
        ctx.cpu_rng = torch.get_rng_state()
        ctx.cuda_rng = [torch.cuda.get_rng_state(d) for d in ctx.devices]
        # Keep the inputs (the checkpoints) and nothing else; non-tensor
        # arguments are remembered as they are.
        ctx.tensor_at = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ctx.others = {i: a for i, a in enumerate(args) if not isinstance(a, torch.Tensor)}
        ctx.save_for_backward(*(args[i] for i in ctx.tensor_at))
        with torch.no_grad():
            return function(*args)  # no graph: intermediates are freed

    @staticmethod
    def backward(ctx, *grad_outputs):
        args = [ctx.others.get(i) for i in range(ctx.n_args)]
        for i, t in zip(ctx.tensor_at, ctx.saved_tensors):
            # A fresh leaf: the recomputed graph starts here, and ends at the
            # inputs' gradients, which autograd then passes on to block i-1.
            args[i] = t.detach().requires_grad_(t.requires_grad)
        with torch.random.fork_rng(devices=ctx.devices):  # puts today's RNG state back afterwards
            torch.set_rng_state(ctx.cpu_rng)  # ... but recomputes with forward's
            for device, state in zip(ctx.devices, ctx.cuda_rng):
                torch.cuda.set_rng_state(state, device)
            with torch.enable_grad():
                outputs = ctx.function(*args)  # block i's forward again, with a graph
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        # Backpropagate through the recomputed graph to the inputs that want a
        # gradient and to the parameters; the graph is freed when this returns.
        inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if isinstance(o, torch.Tensor) and o.requires_grad]
        grads = iter(
            torch.autograd.grad([o for o, _ in pairs], [*inputs, *ctx.params], [g for _, g in pairs], allow_unused=True)
            if pairs
            else [None] * (len(inputs) + len(ctx.params))
        )
        arg_grads = [next(grads) if isinstance(a, torch.Tensor) and a.requires_grad else None for a in args]
        return (None, None, *arg_grads, *grads)  # function, n_args, args, params


def recompute(function, *args, params=()):
    """``function(*args)``, keeping only ``args`` for backward and recomputing the rest there.

    ``params`` are the parameters ``function`` uses (for a module:
    ``module.parameters()``); they get their gradients as usual.
    """
    params = tuple(p for p in params if p.requires_grad)
    if not torch.is_grad_enabled():
        return function(*args)  # no backward will come: nothing to save
    return _Recompute.apply(function, len(args), *args, *params)


def _recomputed_forward(self: nn.Module, *args):
    """This module's own forward, run through :func:`recompute`."""
    plain = functools.partial(type(self).forward, self)  # the class's forward, not ours
    return recompute(plain, *args, params=self.parameters())


def apply_recompute(model: nn.Module) -> nn.Module:
    """Checkpoint every transformer block of ``model`` (``model.blocks``), in place.

    Each block stays the same module, with the same parameter names (so
    checkpoints, optimizers and comparisons do not care whether recompute is
    on); only its ``forward`` now goes through :func:`recompute`.
    """
    for block in model.blocks:
        block.forward = types.MethodType(_recomputed_forward, block)  # shadows the class's forward
    return model


def remove_recompute(model: nn.Module) -> nn.Module:
    """Undo :func:`apply_recompute`: blocks keep their activations again."""
    for block in model.blocks:
        block.__dict__.pop("forward", None)
    return model
