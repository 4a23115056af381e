"""``--master-weights optimizer``: 16-bit parameters, the fp32 master in the optimizer, ZeRO's Figure 1 to the byte.

Issue 36, item 1. The optimizer (:class:`dtlab.numerics.master_weights.MasterWeights`) steps
fp32 masters of 16-bit parameters; the runs check each rank's model states against
ZeRO's split, (2 + 2 + K)Ψ with K = 12 (4 master + 8 Adam), sharded one more category
per stage, padding counted as the flat layouts allocate it; the losses against the
single-process reference of the same layout; checkpoints against an uninterrupted run,
and across to the fp32-module layout and back.
"""

from __future__ import annotations

import pytest
import torch

import dtlab
from dtlab.config import TrainConfig
from dtlab.data import global_batch
from dtlab.model import build_model
from dtlab.numerics.master_weights import MasterWeights, to_16_bit
from dtlab.numerics.precision import MixedPrecision, apply_mixed_precision
from dtlab.parallel.zero.units import assign_units
from dtlab.reference import adamw_options, reference_train
from dtlab.state.checkpoint import step_folder
from tests.harness import session_pool

TINY = dict(model="tiny", seed=0, lr=3e-3, master_weights="optimizer")


# --------------------------------------------------------------------------- one process


def test_the_masters_step_as_a_hand_written_loop_would():
    """fp32 masters of bf16 parameters, AdamW on the masters, the parameters their rounding: bit for bit."""
    config = TrainConfig(**TINY, precision="bf16")
    model = to_16_bit(apply_mixed_precision(build_model(config.model_config(), seed=0), "bf16"), torch.bfloat16)
    by_hand = to_16_bit(apply_mixed_precision(build_model(config.model_config(), seed=0), "bf16"), torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    optimizer = MasterWeights(model.parameters(), torch.optim.AdamW, **adamw_options(config))
    masters = [p.detach().float().clone().requires_grad_() for p in by_hand.parameters()]
    adam = torch.optim.AdamW(masters, **adamw_options(config))
    for step in range(3):
        x, y = global_batch(step, batch_size=4, seq_len=config.model_config().seq_len, seed=0)
        for m in (model, by_hand):
            m.zero_grad(set_to_none=True)
            m(x, y).backward()
        assert all(p.grad.dtype == torch.bfloat16 for p in model.parameters())  # 16-bit gradients
        optimizer.step()
        for master, p in zip(masters, by_hand.parameters()):
            master.grad = p.grad.float()
        adam.step()
        with torch.no_grad():
            for master, p in zip(masters, by_hand.parameters()):
                p.copy_(master)
    for p, q, master, mine in zip(model.parameters(), by_hand.parameters(), masters, optimizer.masters):
        assert torch.equal(p, q) and torch.equal(master, mine)
    assert optimizer.master_bytes() == 4 * sum(p.numel() for p in model.parameters())


def test_fp16_unscales_on_the_fp32_master_gradients():
    """A gradient that fp16 keeps only while scaled survives the unscale: it is divided in fp32."""
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float16))
    optimizer = MasterWeights([p], torch.optim.SGD, lr=1.0)
    precision = MixedPrecision("fp16", loss_scale=2.0**16)
    true_grad = 1e-8  # below fp16's smallest subnormal (6e-8): 0 if unscaled in fp16
    p.grad = torch.full((4,), true_grad * 2.0**16, dtype=torch.float16)
    assert (p.grad / 2.0**16).eq(0).all()  # what unscaling in fp16 would give
    skipped, _ = precision.step(optimizer)
    assert not skipped
    assert torch.allclose(optimizer.masters[0], torch.full((4,), -true_grad), rtol=1e-3)
    p.grad = torch.full((4,), float("inf"), dtype=torch.float16)  # an overflow: the step is skipped
    before = optimizer.masters[0].clone()
    skipped, _ = precision.step(optimizer)
    assert skipped and torch.equal(optimizer.masters[0], before)


# --------------------------------------------------------------------------- ZeRO's Figure 1, measured


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def figure_1(psi: int, n: int, stage: int, units: list[int]) -> dict[str, int]:
    """One rank's model states in bytes: 2Ψ 16-bit parameters, 2Ψ 16-bit gradients, 4Ψ fp32 master and 8Ψ
    Adam moments, each sharded N ways from the stage that shards it on (ZeRO, Fig. 1), as the flat
    layouts allocate them: a shard is S = ceil(Ψ / N) elements, a buffer L = N x S; ZeRO-3 shards each
    unit (``units``: their element counts) and keeps its masters for the elements, not the padding."""
    s, whole = _ceil(psi, n), _ceil(psi, n) * n
    if stage == 0:
        return {"params": 2 * psi, "grads": 2 * psi, "master": 4 * psi, "optimizer": 8 * psi}
    if stage in (1, 2):
        return {"params": 2 * whole, "grads": 2 * (whole if stage == 1 else s), "master": 4 * s, "optimizer": 8 * s}
    shards = sum(_ceil(u, n) for u in units)
    return {"params": 2 * shards, "grads": 2 * shards, "master": 4 * shards, "optimizer": 8 * shards}


FIGURE = [(1, 0, "fp16"), (2, 0, "bf16"), (4, 0, "fp16")]
FIGURE += [(n, stage, precision) for stage in (1, 2, 3) for n, precision in ((2, "fp16"), (4, "bf16"))]
FIGURE += [(4, 3, "fp16"), (1, 3, "bf16")]


@pytest.fixture(scope="module")
def figure_runs():
    pool = session_pool()
    return {
        (n, stage, precision): dtlab.train(
            TrainConfig(**TINY, dp=n, zero=stage, precision=precision, steps=1), pool=pool
        ).wait()
        for n, stage, precision in FIGURE
    }


@pytest.mark.parametrize(("n", "stage", "precision"), FIGURE)
def test_each_rank_holds_zero_figure_1_to_the_byte(figure_runs, n, stage, precision):
    run = figure_runs[(n, stage, precision)]
    model = build_model(TrainConfig(model="tiny").model_config(), seed=0)
    psi = sum(p.numel() for p in model.parameters())
    units = [sum(p.numel() for p, _ in params) for _, _, params in assign_units(model)]
    for rank in run.records[-1]["ranks"]:
        held = {k: rank["mem"][k] for k in ("params", "grads", "master", "optimizer")}
        expected = figure_1(psi, n, stage, units)
        if stage == 3:  # a rank's masters and moments cover its elements, not the units' padding
            mine = held["master"] // 4
            assert 0 <= expected["master"] // 4 - mine < len(units) * n
            expected.update(master=4 * mine, optimizer=8 * mine)
        assert held == expected, (rank["rank"], held, expected)
    # The paper's totals, padding aside: (2 + 2 + 12) Ψ at stage 0, 16Ψ / N at stage 3.
    total = sum(held.values())
    paper = {0: 16 * psi, 1: 4 * psi + 12 * psi / n, 2: 2 * psi + 14 * psi / n, 3: 16 * psi / n}[stage]
    assert abs(total - paper) / paper < 0.01


@pytest.mark.parametrize(("n", "stage", "precision"), [f for f in FIGURE if f[0] > 1])
def test_the_planners_prediction_counts_the_same_model_states(figure_runs, n, stage, precision):
    """The run's summary puts the planner's numbers for ``--master-weights optimizer`` beside the
    measured ones; the planner counts the paper's K (master and moments) as ``optimizer``."""
    beside = figure_runs[(n, stage, precision)].summary["predicted"]
    for category in ("params", "grads", "optimizer"):
        assert beside["memory"][category] == beside["measured_memory"][category], category


# --------------------------------------------------------------------------- the same losses


LOSS_LAYOUTS = {"zero2 fp16": dict(dp=2, zero=2, precision="fp16"), "zero3 bf16": dict(dp=4, zero=3, precision="bf16")}


@pytest.mark.parametrize("name", list(LOSS_LAYOUTS))
def test_losses_equal_the_single_process_reference_of_the_same_layout(name):
    config = TrainConfig(**TINY, **LOSS_LAYOUTS[name], steps=20)
    losses = dtlab.train(config, pool=session_pool()).wait().losses()
    reference, _ = reference_train(config)
    assert max(abs(a - b) / b for a, b in zip(losses, reference)) < 1e-3, (losses, reference)
    assert reference[-1] < reference[0] - 0.2  # it trained


# --------------------------------------------------------------------------- checkpoints


SAVED, STEPS = 3, 6


def _steps(run) -> list[tuple]:
    return [(r["step"], r["loss"], r["skipped"], r["loss_scale"]) for r in run.records]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An uninterrupted fp16 ZeRO-2 run with the masters in the optimizer, saving at step 3, and its save."""
    folder = tmp_path_factory.mktemp("master") / "zero2"
    config = TrainConfig(**TINY, dp=2, zero=2, precision="fp16", steps=STEPS, save=str(folder), save_every=SAVED)
    return dtlab.train(config, pool=session_pool()).wait(), step_folder(folder, SAVED)


def test_a_resumed_run_continues_bit_for_bit(saved):
    straight, folder = saved
    config = TrainConfig(**TINY, dp=2, zero=2, precision="fp16", steps=STEPS, resume=str(folder))
    resumed = dtlab.train(config, pool=session_pool()).wait()
    assert _steps(resumed) == _steps(straight)[SAVED:]


@pytest.mark.parametrize(
    "layout",
    [dict(dp=4, zero=3), dict(dp=1, zero=0), dict(dp=2, zero=1, master_weights="model")],
    ids=["zero3 dp4", "one rank", "masters in the model"],
)
def test_a_checkpoint_reshards_to_other_layouts_and_master_placements(saved, layout):
    """The fp32 masters are what is saved: another layout (or the fp32-module layout) continues the same run
    within 16-bit reduction-order tolerance."""
    straight, folder = saved
    config = TrainConfig(**{**TINY, **layout}, precision="fp16", steps=STEPS, resume=str(folder))
    resumed = dtlab.train(config, pool=session_pool()).wait()
    assert [r["step"] for r in resumed.records] == list(range(SAVED, STEPS))
    assert max(abs(a - b) / b for a, b in zip(resumed.losses(), straight.losses()[SAVED:])) < 2e-3


def test_a_checkpoint_of_the_fp32_module_layout_resumes_with_the_masters_in_the_optimizer(tmp_path):
    """The other way: fp32 module weights saved, loaded as masters (their 16-bit rounding the parameters)."""
    common = dict(model="tiny", seed=0, lr=3e-3, dp=2, precision="fp16", steps=STEPS)
    straight = dtlab.train(
        TrainConfig(**common, zero=1, save=str(tmp_path / "model"), save_every=SAVED), pool=session_pool()
    ).wait()
    config = TrainConfig(
        **common, zero=2, master_weights="optimizer", resume=str(step_folder(tmp_path / "model", SAVED))
    )
    resumed = dtlab.train(config, pool=session_pool()).wait()
    assert [r["step"] for r in resumed.records] == list(range(SAVED, STEPS))
    assert max(abs(a - b) / b for a, b in zip(resumed.losses(), straight.losses()[SAVED:])) < 2e-3
