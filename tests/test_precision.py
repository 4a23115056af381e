"""Mixed precision and loss scaling, against torch.amp.GradScaler and the fp32 run."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from dtlab.config import MODEL_PRESETS, TrainConfig
from dtlab.data import global_batch
from dtlab.i18n import ConfigError
from dtlab.measure.memory import ActivationMeter
from dtlab.model import build_model
from dtlab.numerics.loss_scaling import LossScaler, ScalerStep, make_loss_scaler
from dtlab.numerics.precision import (
    MixedPrecision,
    apply_mixed_precision,
    describe_formats,
    format_table,
    overflows_in,
    underflows_in,
)
from dtlab.reference import make_optimizer
from tests.harness import run_ranks

INF, NAN = float("inf"), float("nan")

# The gradient each step should see: a finite one, or one with an inf or a NaN in it.
SCRIPT = ["ok", "ok", "inf", "ok", "ok", "ok", "ok", "nan", "ok", "ok", "ok", "ok", "ok", "ok", "inf"]


def _script_step(kind: str, step: int) -> torch.Tensor:
    c = torch.linspace(-1, 1, 8).reshape(2, 4) * (step + 1)
    if kind != "ok":
        c[1, 2] = INF if kind == "inf" else NAN
    return c


def test_dynamic_scaler_equals_torch_gradscaler_on_a_scripted_sequence():
    torch.manual_seed(0)
    ours, theirs = nn.Linear(4, 2), nn.Linear(4, 2)
    theirs.load_state_dict(ours.state_dict())
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=0.1)
    opt_theirs = torch.optim.AdamW(theirs.parameters(), lr=0.1)
    scaler = LossScaler(growth_interval=3)
    reference = torch.amp.GradScaler("cpu", growth_interval=3)
    reference_scales = []
    for step, kind in enumerate(SCRIPT):
        c = _script_step(kind, step)
        for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            opt.zero_grad(set_to_none=True)
        scaler.scale((ours.weight * c).sum()).backward()
        if not scaler.unscale_and_check(ours.parameters()):
            opt_ours.step()
        scaler.update(kind != "ok")
        reference_scales.append(reference.get_scale())
        reference.scale((theirs.weight * c).sum()).backward()
        reference.step(opt_theirs)
        reference.update()
        for a, b in zip(ours.parameters(), theirs.parameters()):
            assert torch.equal(a, b), step
    assert [h.scale for h in scaler.history] == reference_scales
    assert [h.skipped for h in scaler.history] == [kind != "ok" for kind in SCRIPT]
    assert scaler.loss_scale == reference.get_scale()
    assert scaler.clean_steps == reference.state_dict()["_growth_tracker"]
    assert opt_ours.state_dict()["state"][0]["step"] == opt_theirs.state_dict()["state"][0]["step"]
    # The same defaults as GradScaler: 2^16, x2, x0.5, every 2000 clean steps.
    default, torch_default = LossScaler(), torch.amp.GradScaler("cpu")
    assert (default.loss_scale, default.growth_factor, default.backoff_factor, default.growth_interval) == (
        torch_default.get_scale(),
        torch_default.get_growth_factor(),
        torch_default.get_backoff_factor(),
        torch_default.get_growth_interval(),
    )


def test_static_scaler_skips_overflows_but_never_changes():
    scaler = make_loss_scaler("1024")
    p = nn.Parameter(torch.ones(3))
    for kind in ["ok", "inf", "ok", "ok"]:
        p.grad = torch.full((3,), 2048.0)
        if kind == "inf":
            p.grad[0] = INF
        found = scaler.unscale_and_check([p])
        assert found == (kind == "inf")
        scaler.update(found)
    assert torch.equal(p.grad, torch.full((3,), 2.0))  # unscaled by 1024
    assert scaler.history == [
        ScalerStep(1024.0, False),
        ScalerStep(1024.0, True),
        ScalerStep(1024.0, False),
        ScalerStep(1024.0, False),
    ]
    with pytest.raises(ConfigError, match="loss_scale='big'") as error:
        make_loss_scaler("big")
    assert "不合法" in str(error.value)
    with pytest.raises(ConfigError, match="precision='fp4'"):
        MixedPrecision("fp4")


def _tiny_step(model, optimizer, mp, step):
    cfg = MODEL_PRESETS["tiny"]
    x, y = global_batch(step, batch_size=8, seq_len=cfg.seq_len, seed=0)
    optimizer.zero_grad(set_to_none=True)
    loss = model(x, y)
    mp.backward(loss)
    return loss


def test_a_skipped_step_leaves_weights_and_optimizer_state_unchanged():
    mp = MixedPrecision("fp16")
    model = mp.apply(build_model(MODEL_PRESETS["tiny"], seed=0))
    optimizer = make_optimizer(model.parameters(), TrainConfig(lr=1e-2))
    for step in range(2):
        _tiny_step(model, optimizer, mp, step)
        assert mp.step(optimizer) == (False, 2.0**16)
    weights = copy.deepcopy(model.state_dict())
    optimizer_state = copy.deepcopy(optimizer.state_dict())
    _tiny_step(model, optimizer, mp, 2)
    model.blocks[1].mlp.fc.weight.grad[0, 0] = INF  # as if an fp16 activation gradient overflowed
    skipped, used = mp.step(optimizer)
    assert skipped and used == 2.0**16 and mp.loss_scale == 2.0**15
    for name, value in model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    after = optimizer.state_dict()
    for index, state in optimizer_state["state"].items():
        for key, value in state.items():
            assert torch.equal(after["state"][index][key], value), (index, key)
    # The next healthy step goes through, at the halved scale.
    _tiny_step(model, optimizer, mp, 3)
    assert mp.step(optimizer) == (False, 2.0**15)
    restored = MixedPrecision("fp16")
    restored.load_state_dict(mp.state_dict())
    assert restored.loss_scale == 2.0**15 and restored.scaler.clean_steps == 1


def test_bf16_and_fp16_train_the_tiny_gpt_like_fp32():
    """20 AdamW steps (lr 1e-2) of the tiny GPT from the same weights and batches.

    Tolerance: every step's loss within 1% (relative) of the fp32 run's. Measured
    on CPU: about 2e-4 for bf16 and 2e-5 for fp16. The fp32 master weights stay
    fp32, and the activations held for backward take fewer bytes than in fp32.
    """
    losses, peaks = {}, {}
    for precision in ("fp32", "bf16", "fp16"):
        mp = MixedPrecision(precision)
        model = mp.apply(build_model(MODEL_PRESETS["tiny"], seed=0))
        optimizer = make_optimizer(model.parameters(), TrainConfig(lr=1e-2))
        meter = ActivationMeter(model)
        losses[precision] = []
        for step in range(20):
            with meter.track():
                loss = _tiny_step(model, optimizer, mp, step)
            assert loss.dtype == torch.float32  # the loss is computed in fp32
            assert not mp.step(optimizer).skipped
            losses[precision].append(loss.item())
        assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
        peaks[precision] = meter.peak
    for precision in ("bf16", "fp16"):
        worst = max(abs(a - b) / b for a, b in zip(losses[precision], losses["fp32"]))
        assert worst < 1e-2, (precision, worst)
        assert peaks[precision] < 0.8 * peaks["fp32"], (precision, peaks)
    assert losses["fp32"][-1] < losses["fp32"][0] - 0.1  # and it did learn something


def test_layers_compute_in_16_bits_on_fp32_master_weights():
    model = apply_mixed_precision(build_model(MODEL_PRESETS["tiny"], seed=0), "fp16")
    seen = {}
    for name in ("tok_emb", "blocks.0.ln1", "blocks.0.mlp.fc", "blocks.0", "head"):
        module = model.get_submodule(name)
        module.register_forward_hook(lambda m, args, out, name=name: seen.update({name: out.dtype}))
    x = torch.randint(0, 256, (2, 16))
    assert model(x, x).dtype == torch.float32
    assert seen == {
        "tok_emb": torch.float16,
        "blocks.0.ln1": torch.float32,
        "blocks.0.mlp.fc": torch.float16,
        "blocks.0": torch.float16,
        "head": torch.float32,
    }
    with pytest.raises(RuntimeError):
        model(x.float(), x)  # a forward that fails halfway ...
    for p in model.parameters():  # ... still puts the masters back
        assert type(p) is nn.Parameter and p.dtype == torch.float32
    with pytest.raises(ConfigError, match="apply precision once"):
        apply_mixed_precision(model, "bf16")


def test_format_table_and_which_gradients_underflow():
    rows = {row["format"]: row for row in format_table()}
    assert rows["fp16"]["max"] == 65504 and rows["fp16"]["smallest_subnormal"] == 2.0**-24
    assert (rows["fp16"]["exponent_bits"], rows["fp16"]["mantissa_bits"]) == (5, 10)
    assert (rows["bf16"]["exponent_bits"], rows["bf16"]["mantissa_bits"]) == (8, 7)
    assert rows["bf16"]["smallest_normal"] == rows["fp32"]["smallest_normal"] == 2.0**-126
    assert rows["fp32"]["smallest_subnormal"] == 2.0**-149 and rows["fp32"]["epsilon"] == 2.0**-23
    assert "65504" in describe_formats()
    grads = [1e-13, 1e-8, 2.0**-25, 1e-6, 1e-3, 0.0]
    assert underflows_in(grads).tolist() == [True, True, True, False, False, False]
    assert underflows_in(grads, scale=2.0**16).tolist() == [True, False, False, False, False, False]
    assert not underflows_in(grads, torch.bfloat16).any()  # bf16 has fp32's range
    assert overflows_in([1.0, 0.5], scale=2.0**16).tolist() == [True, False]


def _overflow_on_one_rank(ctx) -> dict:
    """Rank 1 alone sees an inf at step 1; each rank has its own model, no data parallelism."""
    mp = MixedPrecision("fp16", loss_scale="dynamic")  # group=None: the whole world
    model = mp.apply(build_model(MODEL_PRESETS["tiny"], seed=0))
    optimizer = make_optimizer(model.parameters(), TrainConfig(lr=1e-2))
    skipped, unchanged = [], None
    for step in range(3):
        _tiny_step(model, optimizer, mp, step)
        if step == 1 and ctx.rank == 1:
            model.head.weight.grad[0, 0] = INF
        before = [p.detach().clone() for p in model.parameters()]
        result = mp.step(optimizer)
        skipped.append(result.skipped)
        if step == 1:
            unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    return {"skipped": skipped, "history": mp.scaler.history, "unchanged": unchanged}


def test_an_overflow_on_one_rank_skips_the_step_on_every_rank():
    results = run_ranks(_overflow_on_one_rank, 2)
    for got in results:
        assert got["skipped"] == [False, True, False]
        assert got["unchanged"]
        assert [tuple(h) for h in got["history"]] == [(2.0**16, False), (2.0**16, True), (2.0**15, False)]
