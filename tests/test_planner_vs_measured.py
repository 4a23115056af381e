"""Issue 7, part 5: the planner's model-state bytes equal what dtlab's accountant measures.

Parameters, gradients and optimizer state are exact counts on both sides, so
for every layout the components support they must agree to the byte (the
fullest rank). Activations and step time are estimates: the records carry the
prediction beside the measurement with the ratio.
"""
import pytest

import dtlab.train
from dtlab.config import TrainConfig
from dtlab.launch import RankPool
from dtlab.planner import plan_for_config

LAYOUTS = [dict(), dict(dp=4), dict(dp=2, zero=1), dict(dp=4, zero=2), dict(dp=4, zero=3),
           dict(tp=2), dict(tp=4), dict(pp=2, micro_batches=2), dict(pp=4, micro_batches=4),
           dict(dp=2, tp=2, pp=2, micro_batches=2), dict(dp=2, pp=2, zero=1, micro_batches=2),
           dict(dp=2, tp=2, zero=2), dict(precision="bf16"), dict(dp=2, zero=3, precision="bf16")]


@pytest.fixture(scope="module")
def pool():
    pool = RankPool(max_size=8)
    yield pool
    pool.close()


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()) or "single")
def test_planner_model_states_equal_the_accountant(layout, pool):
    config = TrainConfig(steps=1, **layout)
    run = dtlab.train(config, pool=pool).wait()
    predicted = plan_for_config(config).memory
    ranks = run.records[-1]["ranks"]
    for category in ("params", "grads", "optimizer"):
        assert max(r["mem"][category] for r in ranks) == predicted[category], category
    for r in ranks:   # peak: the highest total at one moment, between the categories' bounds
        mem = r["mem"]
        assert mem["peak"] <= sum(v for k, v in mem.items() if k != "peak"), (r["rank"], mem)
        for category in ("grads", "optimizer", "activations", "copies", "buffers", "logits"):
            assert mem["peak"] >= mem[category] + mem["params"], (r["rank"], category, mem)
    beside = run.summary["predicted"]
    assert beside["memory"] == predicted and beside["activations_ratio"] > 0
    assert beside["step_time_ratio"] > 0


@pytest.mark.parametrize("zero", [1, 2])
def test_zero_gradient_peak_in_backward_shows_in_peak(zero, pool):
    """With few activations, the peak is the moment ZeRO-1/2 flattens the whole gradients (Ψ, fp32)
    into the flat (L,) buffer: params + optimizer shard + Ψ + L, to the byte."""
    config = TrainConfig(steps=2, dp=2, zero=zero, batch_size=2, seq_len=8)
    run = dtlab.train(config, pool=pool).wait()
    for r in run.records[-1]["ranks"]:
        mem = r["mem"]
        whole = mem["params"]                          # ZeRO-1/2 keep the whole fp32 parameters
        flat = 4 * 2 * -(-whole // 4 // 2)             # (L,): padded to a multiple of dp
        assert mem["activations"] < whole
        assert mem["peak"] == mem["params"] + mem["optimizer"] + whole + flat, mem
