"""Sequence and context parallelism in the trainer: 20 steps equal one process, records carry cp.

The session's warm pool of 4 ranks (tests/harness.py) runs every layout; each is compared, step by step,
with the single-process reference (dtlab/reference.py). Refusals are checked
without starting any process.
"""

from __future__ import annotations

import pytest

import dtlab.train
from dtlab.config import TrainConfig
from dtlab.i18n import ConfigError
from dtlab.reference import reference_train
from tests.harness import session_pool


@pytest.fixture(scope="module")
def pool():
    return session_pool()


@pytest.fixture(scope="module")
def reference():
    return reference_train(TrainConfig(steps=20, seed=0))[0]


@pytest.mark.parametrize(
    "layout",
    [
        dict(dp=2, cp=2),
        dict(cp=2, tp=2),
        dict(cp=2, tp=2, sp=True, recompute=True),
        dict(tp=2, sp=True, pp=2, micro_batches=2),
    ],
    ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()),
)
def test_layout_matches_the_single_process_loss_at_every_step(layout, pool, reference):
    run = dtlab.train(TrainConfig(steps=20, seed=0, **layout), pool=pool).wait()
    assert max(abs(a - b) / b for a, b in zip(run.losses(), reference, strict=True)) < 1e-4
    ranks = run.records[-1]["ranks"]
    dp, cp, tp, pp = (layout.get(k, 1) for k in ("dp", "cp", "tp", "pp"))
    assert sorted((r["dp"], r["cp"], r["tp"], r["pp"]) for r in ranks) == sorted(
        (d, c, t, p) for d in range(dp) for c in range(cp) for t in range(tp) for p in range(pp)
    )
    assert (run.summary["cp"], run.summary["sp"]) == (cp, layout.get("sp", False))


@pytest.mark.parametrize(
    "bad, match, zh",
    [
        (dict(sp=True), "sp=True needs tp > 1", "需要 tp > 1"),
        (dict(cp=3), "cp=3 does not divide the sequence", "无法整除序列"),
        (dict(cp=2, seq_len=102), "multiple of 4", "4 的倍数"),
        (dict(cp=2, tp=4, sp=True, seq_len=20), "do not split over tp", "无法在 tp 上平均切分"),
        (dict(cp=4, tp=4), "dp x cp x tp x pp = 1 x 4 x 4 x 1 = 16", "最多允许 8"),
        (dict(cp=0), "cp=0", "正整数"),
    ],
)
def test_bad_combinations_are_refused_before_start(bad, match, zh):
    with pytest.raises(ConfigError, match=match) as err:
        dtlab.train(TrainConfig(**bad))
    assert zh in str(err.value)


def test_cli_flags_reach_the_config():
    import argparse

    from dtlab.config.flags import add_train_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    config = config_from_args(parser.parse_args(["--cp", "2", "--seq-len", "512", "--tp", "2", "--sp"]))
    assert (config.cp, config.seq_len, config.tp, config.sp) == (2, 512, 2, True)
    assert config.validate().world_size == 4
    assert (config.layout.cp, config.layout.sp) == (2, True)


def test_control_panel_runs_context_and_sequence_parallelism(pool):
    from dtlab.lab import ControlPanel

    panel = ControlPanel(
        TrainConfig(steps=2, model="tiny"), pool=pool, auto_run=False, show=("cp", "tp", "sp", "seq_len")
    )
    assert panel.seq_len.value == 64 and panel.cp.description == "CP degree"
    panel.cp.value, panel.tp.value, panel.sp.value, panel.seq_len.value = 2, 2, True, 128
    config = panel.config()
    assert (config.cp, config.tp, config.sp, config.seq_len) == (2, 2, True, 128)
    panel.handle(config.validate())  # what a click runs, here on this thread: 4 real ranks
    assert panel.current.summary["cp"] == 2 and panel.current.summary["sp"]
    assert sorted(r["cp"] for r in panel.current.records[-1]["ranks"]) == [0, 0, 1, 1]
    assert 1 not in panel.tp.options  # with SP on, the TP slider does not offer 1
    panel.sp.value = False
    panel.tp.value = 1
    panel.sp.value = True  # a checkbox cannot narrow: the combination is refused in the panel
    panel.submit()  # refused in the panel, nothing starts
    assert "sp=True needs tp > 1" in panel.status.value or "tp > 1" in panel.status.value
