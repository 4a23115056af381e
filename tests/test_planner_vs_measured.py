"""The planner predicts memory in the accountant's categories, and they agree with a run's.

Parameters, gradients, optimizer state and the 16-bit copies are exact counts
on both sides, so for every layout the components support they agree to the
byte (the largest over ranks, category by category), and so do the logits.
Tolerances, and why:

* ``buffers``: exact, except a pipeline's sends. The planner counts every
  micro-batch's boundary tensor still being sent, forward and backward (a
  bound); a send the next stage has already received is let go, so a run may
  hold up to 2m of them less.
* ``peak``: its activations are Korthikanti et al.'s formula, not dtlab's
  count (their ratio is reported, not asserted). On this machine
  (``gpu="local"`` or a profile file) the planner counts what dtlab's meter
  counts instead, and in fp32 without recompute it agrees to the byte. With the measured activations
  put in its place, the planner's peak is at least the measured peak and
  exceeds it by at most the buffers it counts alive at the loss moment (a
  pipeline's sends bound, a ZeRO-3 unit the runtime may have let go by then).
  ZeRO-2 sends its buckets during backward (DeepSpeed's ``overlap_comm``),
  while backward frees the activations: in fp32 the planner walks backward
  gradient by gradient (dtlab/planner/zero2_backward.py) and must land at or
  above the measured peak and within 10% of it, one bucket or several; where
  it cannot walk, it counts the buckets and shard beside all the activations,
  a bound that may exceed the measured peak by its buffers and shard (``grads``).
"""

import pytest

import dtlab.train
from dtlab.config import TrainConfig
from dtlab.planner import plan_for_config
from dtlab.planner.profile import save_profile
from dtlab.planner.step_memory import layout_peak
from tests.harness import session_pool

LAYOUTS = [
    dict(),
    dict(dp=4),
    dict(dp=2, zero=1),
    dict(dp=4, zero=2),
    dict(dp=4, zero=3),
    dict(tp=2),
    dict(tp=4),
    dict(pp=2, micro_batches=2),
    dict(pp=4, micro_batches=4),
    dict(dp=2, tp=2, pp=2, micro_batches=2),
    dict(dp=2, pp=2, zero=1, micro_batches=2),
    dict(dp=2, tp=2, zero=2),
    dict(dp=2, zero=2, bucket_mb=8, batch_size=2, seq_len=8),
    dict(precision="bf16"),
    dict(dp=2, zero=3, precision="bf16"),
    dict(dp=2, zero=2, precision="bf16"),
    dict(pp=2, micro_batches=4, precision="bf16"),
    dict(dp=4, zero=3, zero3_prefetch=1),
    dict(dp=2, zero=3, zero3_prefetch=2, precision="bf16"),
    dict(pp=2, micro_batches=4, schedule="interleaved", virtual_stages=2),
]


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """A machine profile written here (its figures do not matter to memory), for ``gpu=`` a file."""
    from tests.test_calibrate import synthetic_profile

    return save_profile(synthetic_profile(), tmp_path_factory.mktemp("profile") / "machine.json")


@pytest.fixture(scope="module")
def pool():
    return session_pool()  # warm ranks shared with the rest of the suite (tests/harness.py)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()) or "single")
def test_planner_memory_agrees_with_the_accountant(layout, pool, profile):
    config = TrainConfig(steps=1, **layout)
    run = dtlab.train(config, pool=pool).wait()
    predicted = plan_for_config(config).memory
    ranks = run.records[-1]["ranks"]
    measured = {k: max(r["mem"][k] for r in ranks) for k in predicted if k != "total"}
    if config.masters == "optimizer":  # the planner counts the paper's K: the fp32 master with Adam's moments
        measured["optimizer"] = max(r["mem"]["optimizer"] + r["mem"]["master"] for r in ranks)
    for category in ("params", "grads", "optimizer", "copies", "logits"):
        assert measured[category] == predicted[category], (category, measured, predicted)
    m, cfg = config.micro_batches, config.model_config()
    boundary = (
        0
        if config.pp == 1
        else (
            config.batch_size
            // config.data_ranks
            // m
            * cfg.seq_len
            * cfg.d_model
            * (2 if config.precision != "fp32" else 4)
        )
    )  # one (b, s, h) tensor
    assert predicted["buffers"] - 2 * m * boundary <= measured["buffers"] <= predicted["buffers"], (measured, predicted)
    peak = layout_peak({**predicted, "activations": measured["activations"]}, config.layout)
    slack = predicted["buffers"] + (predicted["grads"] if config.zero == 2 else 0)
    assert measured["peak"] <= peak <= measured["peak"] + slack, (peak, measured, predicted)
    for r in ranks:  # peak: the highest total at one moment, between the categories' bounds
        mem = r["mem"]
        assert mem["peak"] <= sum(v for k, v in mem.items() if k != "peak"), (r["rank"], mem)
        for category in ("grads", "optimizer", "activations", "copies", "buffers", "logits"):
            assert mem["peak"] >= mem[category] + mem["params"], (r["rank"], category, mem)
    beside = run.summary["predicted"]
    assert beside["memory"] == predicted and beside["activations_ratio"] > 0
    assert beside["step_time_ratio"] > 0
    # On this machine (--gpu local) the planner counts what dtlab's meter counts: in fp32, to the byte.
    local = plan_for_config(config, gpu=str(profile)).memory
    if config.precision == "fp32" and not config.recompute:
        assert local["activations"] == measured["activations"], (local, measured)
        slack = local["buffers"] + (local["grads"] if config.zero == 2 else 0)  # ZeRO-2: as above
        assert measured["peak"] <= local["peak"] <= measured["peak"] + slack, (measured, local)
        if config.zero == 2:  # backward walked gradient by gradient (planner/zero2_backward.py)
            assert local["peak"] < layout_peak(local, config.layout), local  # below the bound
            assert local["peak"] <= 1.1 * measured["peak"], (measured, local)
    assert {k: v for k, v in local.items() if k not in ("activations", "peak", "total")} == {
        k: v for k, v in predicted.items() if k not in ("activations", "peak", "total")
    }


@pytest.mark.parametrize("zero", [1, 2])
def test_zero_gradient_peak_in_backward_shows_in_peak(zero, pool):
    """With few activations, ZeRO-1's peak is the moment it flattens the whole gradients (Ψ, fp32)
    into the flat (L,) buffer: params + optimizer shard + Ψ + L, to the byte, and so the planner
    predicts. ZeRO-2 never holds them (its buckets go during backward): its peak is the shard, two
    buckets and the gradient being staged, beside part of the activations, well below ZeRO-1's."""
    config = TrainConfig(steps=2, dp=2, zero=zero, batch_size=2, seq_len=8)
    run = dtlab.train(config, pool=pool).wait()
    plan = plan_for_config(config).memory
    predicted = plan["peak"]
    measured = max(r["mem"]["peak"] for r in run.records[-1]["ranks"])
    for r in run.records[-1]["ranks"]:
        mem = r["mem"]
        whole = mem["params"]  # ZeRO-1/2 keep the whole fp32 parameters
        flat = 4 * 2 * -(-whole // 4 // 2)  # (L,): padded to a multiple of dp
        assert mem["activations"] < whole
        if zero == 1:
            assert predicted == measured
            assert mem["peak"] == mem["params"] + mem["optimizer"] + whole + flat, mem
        else:
            base = mem["params"] + mem["optimizer"] + mem["grads"] + mem["buffers"]  # shard, buckets, staged
            assert base <= mem["peak"] <= base + mem["activations"], mem
            assert mem["peak"] < mem["params"] + mem["optimizer"] + (whole + flat) * 3 // 4, mem
            # the planner: all the activations (its formula's) beside them, a bound
            assert measured <= predicted <= measured + plan["activations"], (measured, predicted)
