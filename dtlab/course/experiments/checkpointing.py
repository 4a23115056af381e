"""Lesson 11: what activation recomputation saves, measured in one process.

The trainer reports one number per step, the peak of activations
(:class:`dtlab.measure.memory.ActivationMeter`). Here the same meter is read at every
block boundary of one forward and backward, so a lesson can draw how the
bytes held for backward rise through the forward pass and fall through the
backward pass, with and without :func:`dtlab.numerics.gradient_checkpointing.apply_recompute`
(Chen et al., 2016), for models of any depth. Nothing here communicates, so
it runs in the notebook's own process.

Phases, for a model of L blocks::

    F0 .. F{L-1}   after block i's forward
    loss           after the head and the loss
    B{L-1} .. B0   just before block i's backward starts (its output's gradient has arrived)
    end            after the whole backward

``held`` is what is kept at that moment; ``peak`` is the most held at any
moment since the previous phase (so a recomputed block's own intermediates,
which live only inside its backward, show up in the next phase's ``peak``).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from dtlab.config import MODEL_PRESETS, ModelConfig
from dtlab.data import global_batch
from dtlab.measure.memory import ActivationMeter
from dtlab.model import build_model
from dtlab.numerics.gradient_checkpointing import apply_recompute


def _model_and_batch(cfg: ModelConfig, *, recompute: bool, batch_size: int, seed: int):
    model = build_model(cfg, seed=seed)
    if recompute:
        apply_recompute(model)
    x, y = global_batch(0, batch_size=batch_size, seq_len=cfg.seq_len, seed=seed)  # (B, T) each
    # Own copies, as the trainer makes: a slice would share (and count) the whole batch's storage.
    return model, x.clone(), y.clone()


def activation_trace(cfg: ModelConfig, *, recompute: bool, batch_size: int = 8, seed: int = 0) -> dict:
    """One forward and backward of ``cfg``'s GPT; bytes held for backward at each phase.

    Returns ``{"peak": bytes, "loss": float, "phases": [{"phase", "held", "peak"}, ...]}``;
    ``peak`` at the top is the step's peak, the number the trainer reports.
    """
    model, x, y = _model_and_batch(cfg, recompute=recompute, batch_size=batch_size, seed=seed)
    meter = ActivationMeter(model)
    phases: list[dict] = []

    def mark(name: str) -> None:
        phases.append({"phase": name, "held": meter.current, "peak": meter.peak})
        meter.reset_peak()  # the next phase's peak starts from here

    def after_forward(i):
        # Fires once per block in the forward pass. A recomputation in backward calls the
        # block's own forward directly, not the module, so it does not fire again.
        def hook(module, args, output):
            mark(f"F{i}")
            if output.requires_grad:
                # Fires when the gradient of this block's output is ready: block i's backward begins.
                output.register_hook(lambda grad: mark(f"B{i}"))

        return hook

    handles = [block.register_forward_hook(after_forward(i)) for i, block in enumerate(model.blocks)]
    try:
        with meter.track():
            loss = model(x, y)
            mark("loss")
            loss.backward()
            mark("end")
    finally:
        for handle in handles:
            handle.remove()
    return {"peak": max(p["peak"] for p in phases), "loss": loss.item(), "phases": phases}


def activation_peak(cfg: ModelConfig, *, recompute: bool, batch_size: int = 8, seed: int = 0) -> int:
    """Peak bytes held for backward in one training step (forward and backward)."""
    return activation_trace(cfg, recompute=recompute, batch_size=batch_size, seed=seed)["peak"]


def depth_sweep(layers=(1, 2, 4, 8), *, base: str = "small", batch_size: int = 8, seed: int = 0) -> list[dict]:
    """Peak activation bytes without and with recompute for ``base`` at each depth in ``layers``."""
    rows = []
    for n in layers:
        cfg = dataclasses.replace(MODEL_PRESETS[base], n_layer=n)
        plain = activation_peak(cfg, recompute=False, batch_size=batch_size, seed=seed)
        recomputed = activation_peak(cfg, recompute=True, batch_size=batch_size, seed=seed)
        rows.append({"layers": n, "plain": plain, "recompute": recomputed, "saved": plain - recomputed})
    return rows


def same_gradients(cfg: ModelConfig, *, batch_size: int = 8, seed: int = 0) -> bool:
    """True if recomputation gives exactly the gradients of the plain step (no dropout: same numbers)."""
    grads = []
    for recompute in (False, True):
        model, x, y = _model_and_batch(cfg, recompute=recompute, batch_size=batch_size, seed=seed)
        model(x, y).backward()
        grads.append([p.grad for p in model.parameters()])
    return all(torch.equal(a, b) for a, b in zip(*grads))


def step_seconds(cfg: ModelConfig, *, recompute: bool, batch_size: int = 8, seed: int = 0, repeats: int = 3) -> float:
    """The fastest of ``repeats`` forward-and-backward passes, in seconds (a timing: it varies)."""
    model, x, y = _model_and_batch(cfg, recompute=recompute, batch_size=batch_size, seed=seed)
    best = float("inf")
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        model(x, y).backward()
        best = min(best, time.perf_counter() - start)
    return best


def forward_passes(cfg: ModelConfig, *, recompute: bool, batch_size: int = 8, seed: int = 0) -> int:
    """How many block forwards one forward-and-backward step runs (deterministic, unlike its time).

    Counted with a forward hook on each block's first LayerNorm (a recomputed
    block runs its class's forward directly, so a hook on the block itself would
    see only the first pass): with recompute, backward runs every block's forward
    once more, just before that block's backward.
    """
    model, x, y = _model_and_batch(cfg, recompute=recompute, batch_size=batch_size, seed=seed)
    count = [0]
    for block in model.blocks:
        block.ln1.register_forward_hook(lambda module, args, output: count.__setitem__(0, count[0] + 1))
    model(x, y).backward()
    return count[0]
