"""Loss spikes: a corrupted batch is detected at its step, and skip or rollback recovers."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from dtlab.config import MODEL_PRESETS, TrainConfig
from dtlab.data import global_batch
from dtlab.i18n import ConfigError
from dtlab.model import build_model
from dtlab.numerics.loss_spikes import SpikeDetector, SpikeGuard, corrupt_batch, global_loss
from dtlab.reference import make_optimizer
from tests.harness import run_ranks

SPIKE_AT, STEPS = 15, 20


def test_corrupt_batch_is_deterministic_garbage_of_the_same_shape():
    x, y = global_batch(3, batch_size=4, seq_len=16, seed=0)
    bad_x, bad_y = corrupt_batch(x, y, seed=7)
    again = corrupt_batch(x, y, seed=7)
    assert torch.equal(bad_x, again[0]) and torch.equal(bad_y, again[1])
    assert not torch.equal(bad_x, corrupt_batch(x, y, seed=8)[0])
    assert bad_x.shape == x.shape and bad_x.dtype == x.dtype and bad_y.dtype == y.dtype
    assert bad_x.min() >= 128 and bad_x.max() <= 255  # bytes the corpus never contains
    assert torch.equal(bad_x[:, 1:], bad_y[:, :-1])  # targets: the inputs shifted by one


def test_detector_flags_a_jump_but_not_noise_or_a_falling_loss():
    detector = SpikeDetector(window=10, k=3.0, min_spread=0.05, warmup=5)
    assert detector.observe(float("nan"))  # non-finite: a spike even in warmup
    falling = [5.5 - 0.1 * i + (0.03 if i % 2 else -0.03) for i in range(20)]
    assert not any(detector.observe(v) for v in falling)  # a falling loss is no spike
    flat = SpikeDetector(window=10, k=3.0, min_spread=0.05, warmup=5)
    assert not any(flat.observe(3.0 + (0.02 if i % 2 else -0.02)) for i in range(12))
    # median 3.0, MAD 0.02: the spread is floored at 0.05 x 3.0, so the threshold is 3.0 + 3 x 0.15
    assert not flat.observe(3.3)
    assert flat.threshold == pytest.approx(3.45)
    assert flat.observe(3.6)
    assert 3.6 not in flat.recent  # a spike does not move the median
    assert not flat.observe(3.0)
    restored = SpikeDetector()
    restored.load_state_dict(detector.state_dict())
    assert list(restored.recent) == list(detector.recent)
    with pytest.raises(ConfigError, match="window=2"):
        SpikeDetector(window=2)
    with pytest.raises(ConfigError, match="'explode'") as error:
        SpikeGuard("explode")
    assert "不合法" in str(error.value)


def _train_with_spike(policy: str):
    """The tiny GPT (lr 3e-2, so it learns fast) with one corrupted batch at SPIKE_AT."""
    cfg = MODEL_PRESETS["tiny"]
    model = build_model(cfg, seed=0)
    optimizer = make_optimizer(model.parameters(), TrainConfig(lr=3e-2))
    guard = SpikeGuard(policy, snapshot_every=10)
    events, weights_at_start = {}, {}
    for step in range(STEPS):
        weights_at_start[step] = copy.deepcopy(model.state_dict())
        x, y = global_batch(step, batch_size=8, seq_len=cfg.seq_len, seed=0)
        if step == SPIKE_AT:
            x, y = corrupt_batch(x, y, seed=step)
        optimizer.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        step_events = guard.check(step, global_loss(loss), model=model, optimizer=optimizer)
        if step_events:
            events[step] = step_events
            after_spike = copy.deepcopy(model.state_dict())
            adam_steps = optimizer.state_dict()["state"][0]["step"].item()
        else:
            optimizer.step()
    return events, weights_at_start, after_spike, adam_steps


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_skip_drops_the_update_of_the_bad_batch_only():
    events, weights, after, adam_steps = _train_with_spike("skip")
    assert list(events) == [SPIKE_AT]  # detected at its step, nowhere else
    spike = events[SPIKE_AT][0]
    assert spike["kind"] == "spike" and spike["rank"] is None and spike["action"] == "skip"
    assert spike["loss"] > spike["threshold"] and math.isfinite(spike["threshold"])
    assert _same(after, weights[SPIKE_AT])  # the weights before the bad batch
    assert _same(weights[SPIKE_AT + 1], weights[SPIKE_AT])
    assert adam_steps == SPIKE_AT  # and Adam never saw it


def test_rollback_returns_to_the_last_snapshot():
    events, weights, after, adam_steps = _train_with_spike("rollback")
    assert list(events) == [SPIKE_AT]
    spike, rollback = events[SPIKE_AT]
    assert spike["action"] == "rollback"
    assert rollback == {"kind": "rollback", "step": SPIKE_AT, "rank": None, "to_step": 10}
    assert _same(after, weights[10])  # snapshots at steps 0 and 10
    assert adam_steps == 10  # the optimizer state went back too


def _mean_loss(ctx) -> float:
    return global_loss(torch.tensor(float(ctx.rank + 1)))


def test_every_rank_sees_the_same_global_loss():
    assert run_ranks(_mean_loss, 2) == [1.5, 1.5]
    assert global_loss(torch.tensor(2.5)) == 2.5  # no process group: the loss itself


def test_a_lasting_jump_is_accepted_after_patience_instead_of_freezing_training():
    from dtlab.numerics.loss_spikes import SpikeDetector

    detector = SpikeDetector(window=10, warmup=5, patience=3)
    flags = [detector.observe(v) for v in [5.0, 5.0, 5.0, 5.0, 5.0, 9.0, 9.0, 9.0, 9.0, 9.1]]
    assert flags == [False] * 5 + [True, True, False, False, False]
    assert detector.accepted_new_level is False and list(detector.recent) == [9.0, 9.0, 9.1]
