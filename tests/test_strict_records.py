"""fp16 on every layout reports an overflow as ``overflow``, never as a NaN loss; records are strict JSON."""

from __future__ import annotations

import json
import math

import pytest

import dtlab
from dtlab.config import TrainConfig
from dtlab.train.records import step_record, strict
from tests.harness import run_ranks, session_pool

FP16_LAYOUTS = [
    dict(dp=2),
    dict(tp=2),
    dict(pp=2, micro_batches=2),
    dict(dp=2, pp=2, micro_batches=2),
    dict(dp=2, zero=1),
    dict(dp=2, zero=2),
    dict(cp=2),
    dict(tp=2, sp=True),
]


def strict_loads(line: str):
    """json.loads that refuses NaN, Infinity and -Infinity (Python's parser accepts them by default)."""

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(line, parse_constant=refuse)


def _records(run) -> list[dict]:
    run.wait()
    return [*run.records, run.summary]


@pytest.mark.parametrize("layout", FP16_LAYOUTS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_fp16_overflow_is_reported_as_overflow_with_a_finite_loss(layout):
    """A loss scale of 1e30 overflows fp16's gradients every step: each step says so, none is a spike."""
    config = TrainConfig(model="tiny", steps=3, batch_size=4, precision="fp16", loss_scale="1e30", **layout)
    records = _records(dtlab.train(config, pool=session_pool()))
    for record in records:
        assert strict_loads(json.dumps(record)) == record
    steps = records[:-1]
    assert [r["step"] for r in steps] == [0, 1, 2]
    for record in steps:
        kinds = [e["kind"] for e in record["events"]]
        assert "overflow" in kinds and "spike" not in kinds, kinds
        assert record["skipped"] is True and math.isfinite(record["loss"])


def test_fp16_with_a_pipeline_trains_with_finite_losses():
    """The reported bug: fp16 with --pp 2 --micro-batches 2 gave a NaN loss at step 0, labelled spike."""
    config = TrainConfig(model="tiny", steps=3, batch_size=4, precision="fp16", pp=2, micro_batches=2)
    records = _records(dtlab.train(config, pool=session_pool()))
    assert all(math.isfinite(r["loss"]) and not r["events"] for r in records[:-1])
    assert math.isfinite(records[-1]["final_loss"])


def forward_overflow_events(ctx):
    """A loss that is NaN under fp16 (the forward overflowed), as the step's update sees it."""
    from dtlab.numerics.loss_spikes import SpikeGuard
    from dtlab.train.loop import _update
    from dtlab.train.rank import build_rank

    state = build_rank(ctx, TrainConfig(model="tiny", precision="fp16", batch_size=4))
    for p in state.model.parameters():
        p.grad = p.detach().clone().fill_(math.inf)  # what backward through an overflow leaves
    return _update(state, SpikeGuard("skip"), 0, math.nan)


def test_a_nan_loss_under_fp16_is_an_overflow_and_its_record_says_null():
    events, skipped, scale = run_ranks(forward_overflow_events, 1)[0]
    assert [e["kind"] for e in events] == ["overflow"] and skipped and scale == 2.0**16
    record = step_record(
        0, [{"rank": 0, "wall_s": 0.5}], 64, lr=1e-3, loss=math.nan, events=events, skipped=True, loss_scale=scale
    )
    assert record["loss"] is None
    assert strict_loads(json.dumps(record, allow_nan=False))["loss"] is None


def test_strict_replaces_every_non_finite_number_with_null():
    value = {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": (2, "x"), "e": None, "f": True}
    assert strict(value) == {"a": None, "b": [1.0, None, {"c": None}], "d": [2, "x"], "e": None, "f": True}
    with pytest.raises(ValueError):
        strict_loads('{"loss": NaN}')
