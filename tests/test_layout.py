"""The shared Layout: a frozen, keyword-only value read by TrainConfig and the planner."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re

import pytest

from dtlab.config import TrainConfig
from dtlab.config.layout import PRECISIONS, RECOMPUTE, SCHEDULES, ZERO_STAGES, Layout
from dtlab.i18n import ConfigError

CJK = re.compile(r"[\u4e00-\u9fff]")


def test_layout_is_frozen_and_keyword_only():
    layout = Layout(dp=2, tp=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.dp = 4
    with pytest.raises(TypeError):
        Layout(2, 2)
    assert layout.world_size == 4 and Layout(dp=2, cp=2, ep=2, tp=2, pp=2).world_size == 32


def test_every_field_has_a_docstring():
    tree = ast.parse(inspect.getsource(Layout))
    body = tree.body[0].body
    documented = {
        stmt.target.id
        for stmt, nxt in zip(body, body[1:])
        if isinstance(stmt, ast.AnnAssign)
        and isinstance(nxt, ast.Expr)
        and isinstance(nxt.value, ast.Constant)
        and isinstance(nxt.value.value, str)
    }
    assert documented == {f.name for f in dataclasses.fields(Layout)}


def test_choices_are_derived_from_the_literal_types():
    assert SCHEDULES == ("gpipe", "1f1b", "interleaved") and PRECISIONS == ("fp32", "bf16", "fp16", "fp8")
    assert ZERO_STAGES == (0, 1, 2, 3) and RECOMPUTE == ("none", "selective", "full")


@pytest.mark.parametrize(
    "fields, shown",
    [
        (dict(dp=0), ("dp", " 0")),
        (dict(tp=1.5), ("tp", "1.5")),
        (dict(pp=True), ("pp", "True")),
        (dict(micro_batches=-1), ("micro_batches", "-1")),
        (dict(cp=0), ("cp", " 0")),
        (dict(experts=-2), ("experts", "-2")),
        (dict(schedule="zigzag"), ("schedule", "'zigzag'", "'gpipe'", "'1f1b'")),
        (dict(zero=4), ("zero", " 4", "0, 1, 2, 3")),
        (dict(zero=True), ("zero", "True")),
        (dict(precision="fp4"), ("precision", "'fp4'", "'bf16'")),
        (dict(recompute=True), ("recompute", "True", "'full'")),
        (dict(sp="yes"), ("sp", "'yes'")),
        (dict(zero3_prefetch=-1), ("zero3_prefetch", "-1")),
        (dict(zero3_prefetch=True), ("zero3_prefetch", "True")),
        (dict(zero=2, zero3_prefetch=1), ("zero3_prefetch=1", "zero=2")),
    ],
)
def test_validate_names_the_bad_value_in_both_languages(fields, shown):
    with pytest.raises(ConfigError) as info:
        Layout(**fields).validate()
    for text in shown:
        assert text in info.value.en and text in info.value.zh
    assert CJK.search(info.value.zh) and not CJK.search(info.value.en)
    assert Layout().validate() == Layout()


def test_train_config_gives_its_layout():
    config = TrainConfig(
        dp=2, tp=2, pp=2, micro_batches=4, schedule="gpipe", zero=1, precision="bf16", recompute=True, batch_size=16
    )
    assert config.layout == Layout(
        dp=2, tp=2, pp=2, micro_batches=4, schedule="gpipe", zero=1, precision="bf16", recompute="full"
    )
    # TrainConfig's bool recompute checkpoints whole blocks: the planner's "full"; False is "none".
    assert TrainConfig().layout == Layout()
    assert TrainConfig().layout.recompute == "none"
    assert config.layout.world_size == config.world_size
    # Fields the two share by name come through as they are (sp, cp, ep: issues 18 and 19).
    longctx = TrainConfig(dp=2, tp=2, sp=True, cp=2, batch_size=16)
    assert (longctx.layout.sp, longctx.layout.cp) == (True, 2)
    assert longctx.layout.world_size == longctx.world_size
    moe = TrainConfig(dp=2, ep=2, experts=4, top_k=2, batch_size=16)
    assert (moe.layout.ep, moe.layout.experts) == (2, 4) and moe.layout.world_size == moe.world_size
