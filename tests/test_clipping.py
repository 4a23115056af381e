"""--clip-grad: the global gradient norm over every shard equals torch.nn.utils.clip_grad_norm_ on one process.

One warm pool of 8 ranks runs the layouts of tests/test_layouts.py with
clipping on; each step's ``grad_norm`` and loss are compared with the
single-process reference, which clips with torch's own ``clip_grad_norm_``.
The protocol's part (which gradients a rank counts) is checked first in one
process for every DP optimizer form, against ``clip_grad_norm_`` directly.
"""

from __future__ import annotations

import pytest
import torch

import dtlab.train
from dtlab.config import TrainConfig
from dtlab.data import global_batch
from dtlab.model import build_model
from dtlab.numerics.gradient_clipping import KIND, clip_to, global_grad_norm
from dtlab.reference import reference_train
from tests import harness
from tests.harness import session_pool
from tests.test_dp_optimizer import CFG, _layouts

MAX_NORM = 3.0
"""Below the first steps' norms (about 3.7) and above the later ones (about 2): both cases occur."""
STEPS = 5
LAYOUTS = [*harness.LAYOUTS, dict(dp=2, tp=2, sp=True, zero=3), dict(dp=2, cp=2)]
MOE_LAYOUTS = [dict(experts=4, ep=2, dp=2), dict(experts=4, tp=2)]
"""Under expert parallelism an expert's gradient is the same only over its expert-data-parallel group."""


@pytest.mark.parametrize("name", sorted(_layouts()))
def test_every_dp_optimizer_clips_as_clip_grad_norm_does(name):
    """World of one: the norm over the optimizer's gradients, and the clipped gradients, equal torch's."""
    model, optimizer = _layouts()[name]
    reference = build_model(CFG, seed=0)
    x, y = global_batch(0, batch_size=4, seq_len=CFG.seq_len, seed=0)
    optimizer.zero_grad()
    model(x, y).backward()
    optimizer.finish_gradient_sync()
    reference(x, y).backward()
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.1).item()
    pieces = optimizer.gradients()
    norm = global_grad_norm(pieces)
    assert norm == pytest.approx(expected, rel=1e-6), name
    assert clip_to(pieces, 0.1, norm) and not clip_to(pieces, 10.0, 0.05)
    ours = torch.cat([p.grad.reshape(-1) for p in pieces])
    theirs = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
    assert sorted(ours.tolist()) == pytest.approx(sorted(theirs.tolist()), rel=1e-5, abs=1e-9), name
    assert sum(p.grad.numel() for p in pieces) == theirs.numel()
    assert global_grad_norm(pieces, uncounted=frozenset(p.name for p in pieces)) == 0.0


@pytest.fixture(scope="module")
def pool():
    return session_pool()  # warm ranks shared with the rest of the suite (tests/harness.py)


def test_the_global_norm_over_every_layout_is_torchs_on_one_process(pool):
    """Every layout: each step's grad_norm is clip_grad_norm_'s, the same steps are clipped, the losses
    stay equal, and each rank all-reduced one fp32 number for it (DP replicas and TP-replicated
    parameters counted once, ZeRO shards and pipeline stages each by their owner)."""
    norms: list[float] = []
    losses, _ = reference_train(TrainConfig(steps=STEPS, seed=0, clip_grad=MAX_NORM), norms)
    assert any(n > MAX_NORM for n in norms) and any(n < MAX_NORM for n in norms)
    assert all(abs(n - MAX_NORM) > 0.05 for n in norms)  # no step on the edge of clipping
    for layout in LAYOUTS:
        config = TrainConfig(steps=STEPS, seed=0, clip_grad=MAX_NORM, **layout)
        records = dtlab.train(config, pool=pool).wait().records
        assert [r["grad_norm"] for r in records] == pytest.approx(norms, rel=1e-5), layout
        assert [r["clipped"] for r in records] == [n > MAX_NORM for n in norms], layout
        assert [r["loss"] for r in records] == pytest.approx(losses, rel=1e-4), layout
        for record in records:
            calls = [r["comm"].get(KIND, {}) for r in record["ranks"]]
            assert all(c.get("count") == 1 and c.get("bytes") == 4 for c in calls), (layout, calls)
    moe_norms: list[float] = []
    reference_train(TrainConfig(steps=3, seed=0, clip_grad=MAX_NORM, experts=4), moe_norms)
    for layout in MOE_LAYOUTS:
        records = dtlab.train(TrainConfig(steps=3, seed=0, clip_grad=MAX_NORM, **layout), pool=pool).wait().records
        assert [r["grad_norm"] for r in records] == pytest.approx(moe_norms, rel=1e-5), layout


def test_fp16_unscales_before_the_norm_and_an_overflow_clips_nothing(pool):
    """fp16 with the dynamic scaler: each step's norm is the unscaled gradient's, close to fp32's. With a
    scale so large that every gradient overflows, every step is skipped on every layout (offloaded too:
    the scaler checks the device gradients the step would use), its norm null, nothing clipped."""
    norms: list[float] = []
    reference_train(TrainConfig(steps=4, seed=0, clip_grad=MAX_NORM), norms)
    for zero in (0, 2):
        records = (
            dtlab.train(TrainConfig(dp=2, zero=zero, steps=4, seed=0, clip_grad=MAX_NORM, precision="fp16"), pool=pool)
            .wait()
            .records
        )
        assert [r["grad_norm"] for r in records] == pytest.approx(norms, rel=0.01), zero
    for layout in (dict(dp=2, zero=2), dict(dp=2, zero=1, offload=True), dict(tp=2, pp=2, micro_batches=2)):
        records = (
            dtlab.train(
                TrainConfig(steps=2, seed=0, clip_grad=MAX_NORM, precision="fp16", loss_scale=str(2.0**100), **layout),
                pool=pool,
            )
            .wait()
            .records
        )
        for record in records:
            assert record["skipped"] and "overflow" in [e["kind"] for e in record["events"]], layout
            assert record["grad_norm"] is None and record["clipped"] is False
        assert records[1]["loss"] == pytest.approx(records[0]["loss"], rel=0.05), layout  # no NaN weights


def test_a_skipped_spike_still_reports_its_norm_and_clipping_is_off_by_default(pool):
    """The norm is taken before the spike guard decides: the skipped step has one, and clipped nothing."""
    records = dtlab.train(TrainConfig(steps=13, seed=0, clip_grad=1.0, spike=12), pool=pool).wait().records
    assert records[12]["skipped"] and records[12]["grad_norm"] > 0 and records[12]["clipped"] is False
    assert all(r["clipped"] for r in records[:12])
    plain = dtlab.train(TrainConfig(steps=2, seed=0), pool=pool).wait().records
    assert "grad_norm" not in plain[0] and "clipped" not in plain[0]


def test_the_dashboard_plots_the_norm_with_a_title_in_both_languages(pool):
    from dtlab.i18n import set_language
    from dtlab.lab import Dashboard

    dash = Dashboard(min_interval_s=0.0, grad_norm=True)
    run = dash.watch(dtlab.train(TrainConfig(dp=2, steps=3, model="tiny", clip_grad=0.1), pool=pool))
    assert list(dash.grad_norm.data[-1].y) == [r["grad_norm"] for r in run.records]
    shown, todo = [], [dash.widget]  # every widget the dashboard shows, however its figures are boxed
    while todo:
        widget = todo.pop()
        shown.append(widget)
        todo.extend(getattr(widget, "children", ()))
    assert any(widget is dash.grad_norm for widget in shown)
    try:
        set_language("zh")
        assert dash.grad_norm.layout.title.text.replace("<br>", "") == "全局梯度范数（裁剪前）"
    finally:
        set_language("en")
    assert dash.grad_norm.layout.title.text.replace("<br>", " ") == "Global gradient norm (before clipping)"  # wrapped
