"""OffloadOptimizer in one process: the same updates as the optimizer it wraps, and what it moved.

With ZeRO (stages 1-3, offload on and off, 1, 2 and 4 ranks) it is checked
in tests/test_zero.py; here the host/device bookkeeping is checked alone.
"""

from __future__ import annotations

import copy
import warnings

import torch

from dtlab.config import MODEL_PRESETS
from dtlab.data import global_batch
from dtlab.model import build_model, count_params
from dtlab.parallel.zero import OffloadOptimizer

CFG = MODEL_PRESETS["tiny"]
OPT = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def _batch(step: int):
    return global_batch(step, batch_size=4, seq_len=CFG.seq_len, seed=0)


def _step(model, optimizer, step: int) -> float:
    optimizer.zero_grad()
    loss = model(*_batch(step))
    loss.backward()
    optimizer.step()
    return loss.item()


def test_offloaded_adamw_takes_the_same_steps_and_counts_what_moved():
    model = build_model(CFG, seed=0)
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(reference.parameters(), **OPT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optimizer = OffloadOptimizer(model.parameters(), torch.optim.AdamW, **OPT)
        for step in range(5):
            assert _step(model, optimizer, step) == _step(reference, ref_opt, step)
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.equal(ours, theirs)  # the same fp32 arithmetic, only elsewhere

    psi = count_params(model)
    # Device: parameters and (until zero_grad) gradients; host: master, gradient buffer, Adam's m and v.
    assert optimizer.memory_bytes() == {"params": 4 * psi, "grads": 4 * psi, "optimizer": 0}
    assert optimizer.host_memory_bytes() == {"params": 4 * psi, "grads": 4 * psi, "optimizer": 8 * psi}
    assert optimizer.transfer_bytes == {"d2h": 4 * psi, "h2d": 4 * psi}
    assert all(t["seconds"] >= 0 for t in optimizer.transfers.values())
    assert optimizer.state is optimizer.optimizer.state
    assert all(m.is_pinned() == torch.cuda.is_available() for m in optimizer.master)  # pinned with CUDA


def test_parameters_without_a_gradient_are_skipped_as_adamw_skips_them():
    model = build_model(CFG, seed=0)
    optimizer = OffloadOptimizer(model.parameters(), torch.optim.AdamW, **OPT)
    before = model.head.weight.detach().clone()
    optimizer.zero_grad()
    model(*_batch(0)).backward()
    model.head.weight.grad = None
    optimizer.step()
    assert torch.equal(model.head.weight, before)
    psi, head = count_params(model), model.head.weight.numel()
    assert optimizer.transfer_bytes == {"d2h": 4 * (psi - head), "h2d": 4 * (psi - head)}


def test_low_precision_device_parameters_keep_an_fp32_master_on_the_host():
    model = build_model(CFG, seed=0).to(torch.bfloat16)
    optimizer = OffloadOptimizer(model.parameters(), torch.optim.AdamW, **OPT)
    _step(model, optimizer, 0)
    psi = count_params(model)
    assert all(m.dtype == torch.float32 for m in optimizer.master)
    assert optimizer.transfer_bytes == {"d2h": 2 * psi, "h2d": 2 * psi}  # bf16 both ways
    for p, m in zip(model.parameters(), optimizer.master):
        assert torch.equal(p, m.to(torch.bfloat16))


def test_state_dict_round_trip_continues_identically():
    model = build_model(CFG, seed=0)
    optimizer = OffloadOptimizer(model.parameters(), torch.optim.AdamW, **OPT)
    for step in range(2):
        _step(model, optimizer, step)
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    losses = [_step(model, optimizer, step) for step in range(2, 4)]

    fresh = build_model(CFG, seed=1)
    fresh.load_state_dict(saved_model)
    restored = OffloadOptimizer(fresh.parameters(), torch.optim.AdamW, **OPT)
    restored.load_state_dict(saved_opt)
    assert [_step(fresh, restored, step) for step in range(2, 4)] == losses
    for ours, theirs in zip(fresh.parameters(), model.parameters()):
        assert torch.equal(ours, theirs)
