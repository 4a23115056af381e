"""Activation checkpointing: the same numbers as no recompute and as torch.utils.checkpoint, in less memory."""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from dtlab.config import MODEL_PRESETS
from dtlab.measure.memory import ActivationMeter
from dtlab.model import build_model
from dtlab.numerics.gradient_checkpointing import apply_recompute, recompute, remove_recompute
from dtlab.numerics.precision import apply_mixed_precision


def _cfg(n_layer: int, dropout: float = 0.0):
    return dataclasses.replace(MODEL_PRESETS["tiny"], n_layer=n_layer, dropout=dropout)


def _torch_checkpointed(model):
    """The same wrapping with PyTorch's own implementation."""
    for block in model.blocks:
        block.forward = (lambda plain: lambda *args: checkpoint(plain, *args, use_reentrant=False))(block.forward)
    return model


def _run(model, x):
    """Loss, gradients and peak activation bytes of one forward and backward."""
    meter = ActivationMeter(model)
    torch.manual_seed(1)  # the dropout masks
    with meter.track():
        loss = model(x, x)
        loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}, meter.peak


def test_same_loss_and_gradients_as_no_recompute_and_torch_checkpoint_with_less_memory():
    """With dropout on: the recomputation must replay the same random masks."""
    saved = {}
    for n_layer in (2, 4, 8):
        cfg = _cfg(n_layer, dropout=0.1)
        x = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len))  # (B, T)
        plain = _run(build_model(cfg, seed=0), x)
        ours = _run(apply_recompute(build_model(cfg, seed=0)), x)
        theirs = _run(_torch_checkpointed(build_model(cfg, seed=0)), x)
        for other in (ours, theirs):
            assert other[0] == plain[0]
            assert other[1].keys() == plain[1].keys()  # same parameter names
            for name in plain[1]:
                assert torch.equal(other[1][name], plain[1][name]), (n_layer, name)
        assert ours[2] < plain[2]
        saved[n_layer] = plain[2] - ours[2]
    # Without recompute every block's intermediates are held; with it, one
    # (B, T, C) input per block plus one block's intermediates: the saving grows with depth.
    assert saved[2] < saved[4] < saved[8]
    assert saved[8] - saved[4] > 1.5 * (saved[4] - saved[2])


def test_every_block_runs_its_forward_twice_and_remove_undoes_it():
    cfg = _cfg(4)
    model = apply_recompute(build_model(cfg, seed=0))
    calls = []
    for i, block in enumerate(model.blocks):
        block.mlp.register_forward_pre_hook(lambda module, args, i=i: calls.append(i))
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    loss = model(x, x)
    assert calls == [0, 1, 2, 3]
    loss.backward()
    assert calls == [0, 1, 2, 3, 3, 2, 1, 0]  # the extra forward, last block first
    with torch.no_grad():  # evaluation: no backward, nothing to redo
        model(x, x)
    copied = copy.deepcopy(model)  # a copy recomputes its own blocks
    assert copied.blocks[0].forward.__self__ is copied.blocks[0]
    remove_recompute(model)
    calls.clear()
    model(x, x).backward()
    assert calls == [0, 1, 2, 3]


def test_inputs_without_gradient_and_non_tensor_arguments():
    torch.manual_seed(0)
    linear = nn.Linear(3, 3)
    frozen = torch.randn(2, 3)  # needs no gradient
    live = torch.randn(2, 3, requires_grad=True)

    def function(a, b, factor):
        return torch.tanh(linear(a)) * b * factor

    function(frozen, live, 2.0).sum().backward()
    expected = (live.grad.clone(), linear.weight.grad.clone(), linear.bias.grad.clone())
    live.grad = None
    linear.zero_grad(set_to_none=True)
    out = recompute(function, frozen, live, 2.0, params=linear.parameters())
    out.sum().backward()
    assert torch.equal(live.grad, expected[0])
    assert torch.equal(linear.weight.grad, expected[1]) and torch.equal(linear.bias.grad, expected[2])
    # No input needs a gradient, but the parameters do: they still get theirs.
    linear.zero_grad(set_to_none=True)
    out = recompute(lambda a: linear(a), frozen, params=linear.parameters())
    assert out.requires_grad
    out.sum().backward()
    assert linear.weight.grad is not None and frozen.grad is None


def test_recompute_under_mixed_precision_recomputes_in_16_bits():
    cfg = _cfg(4)
    x = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len))
    plain = _run(apply_mixed_precision(build_model(cfg, seed=0), "bf16"), x)
    both = _run(apply_recompute(apply_mixed_precision(build_model(cfg, seed=0), "bf16")), x)
    assert both[0] == plain[0]
    for name in plain[1]:
        assert torch.equal(both[1][name], plain[1][name]), name
        assert both[1][name].dtype == torch.float32
