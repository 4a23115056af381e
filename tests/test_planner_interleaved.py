"""Interleaved 1F1B in the planner (bubble, activations, point-to-point time), also priced for this machine.

Narayanan et al. 2021 (Megatron-LM), Sec. 2.2.2: v model chunks per rank
divide the bubble by v and multiply the pipeline's sends by v; Korthikanti et
al. 2022, Sec. 4.2.3: the first stage then holds p (1 + (p - 1) / (p v))
micro-batches' activations instead of p. No processes.
"""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction

import pytest

from dtlab.config import TrainConfig
from dtlab.config.layout import Layout
from dtlab.i18n import ConfigError
from dtlab.planner import plan
from dtlab.planner.cli import run_plan
from tests.test_planner import _parse

P, V, M = 16, 2, 32
GPT3 = Layout(dp=8, tp=8, pp=P, micro_batches=M, precision="bf16", recompute="selective", sp=True, zero=1)
INTERLEAVED = dataclasses.replace(GPT3, schedule="interleaved", virtual_stages=V)


def _plans():
    return (plan("gpt3-175b", GPT3, batch_size=8 * M), plan("gpt3-175b", INTERLEAVED, batch_size=8 * M))


def test_bubble_is_divided_by_v():
    plain, interleaved = _plans()
    assert plain.bubble_over_ideal == (P - 1) / M
    assert interleaved.bubble_over_ideal == pytest.approx((P - 1) / (V * M))
    assert interleaved.bubble_fraction == pytest.approx((P - 1) / (V * M + P - 1))
    # Compute is stretched by the bubble: 1 / (1 - bubble) = 1 + (p - 1) / (v m).
    assert interleaved.compute_time_s / plain.compute_time_s == pytest.approx(
        (1 + (P - 1) / (V * M)) / (1 + (P - 1) / M)
    )
    assert interleaved.virtual_stages == V and interleaved.to_dict()["virtual_stages"] == V


def test_first_stage_activations_grow_by_korthikantis_factor():
    plain, interleaved = _plans()
    # 96 blocks in 32 chunks of 3: exact. 1F1B's first stage holds p micro-batches of L / p blocks.
    factor = 1 + Fraction(P - 1, P * V)
    assert interleaved.memory["activations"] == pytest.approx(plain.memory["activations"] * float(factor), rel=1e-9)


def test_point_to_point_time_is_v_times():
    plain, interleaved = _plans()
    assert interleaved.comm_time_s["pp"] == pytest.approx(V * plain.comm_time_s["pp"])
    assert interleaved.comm_time_s["dp"] == plain.comm_time_s["dp"]
    assert interleaved.comm_time_s["tp"] == plain.comm_time_s["tp"]


@pytest.mark.parametrize(
    "layout, words",
    [
        (dataclasses.replace(INTERLEAVED, micro_batches=24), "micro_batches a multiple of pp"),
        (dataclasses.replace(INTERLEAVED, virtual_stages=1), "virtual_stages=1"),
        (dataclasses.replace(GPT3, virtual_stages=2), "needs schedule='interleaved'"),
        (dataclasses.replace(INTERLEAVED, virtual_stages=8), "pp x virtual_stages = 16 x 8 = 128 model chunks"),
    ],
)
def test_the_planner_refuses_what_does_not_interleave(layout, words):
    with pytest.raises(ConfigError) as refusal:
        plan("gpt3-175b", layout, batch_size=8 * layout.micro_batches)
    assert words in refusal.value.en and refusal.value.zh


def test_cli_plans_interleaved(capsys):
    flags = "--model small --pp 2 --micro-batches 4 --schedule interleaved --virtual-stages 2".split()
    run_plan(_parse(flags + ["--json"]))
    printed = json.loads(capsys.readouterr().out)
    assert (printed["schedule"], printed["virtual_stages"]) == ("interleaved", 2)
    assert printed["bubble_fraction"] == pytest.approx(1 / 9)  # (p - 1) / (v m + p - 1)
    run_plan(_parse(flags))
    table = capsys.readouterr().out
    assert "(interleaved v=2)" in table and "(p-1)/(v·m+p-1)" in table


def test_train_runs_what_the_planner_plans():
    config = TrainConfig(pp=2, micro_batches=2, schedule="interleaved", virtual_stages=2).validate()
    assert TrainConfig.choices("schedule") == ("gpipe", "1f1b", "interleaved")  # the control panel offers it
    assert plan("small", config.layout).virtual_stages == 2


def test_local_plans_price_interleaving_as_the_runtime_runs_it(tmp_path):
    """--gpu local: the small GPT's 4 blocks on 2 ranks as 4 chunks of one block (rank 0: virtual stages
    0 and 2, rank 1: 1 and 3 with the head), the same work per rank as 1F1B's 2 blocks; the interleaved
    bubble, 2v - 1 = 3 times rank 0's point-to-point calls, the rest unchanged."""
    from dtlab.planner.profile import save_profile
    from tests.test_calibrate import synthetic_profile

    path = str(tmp_path / "machine.json")
    save_profile(synthetic_profile(overhead_s=1e-3), path)
    layout = Layout(pp=2, micro_batches=4, schedule="interleaved", virtual_stages=2)
    interleaved = plan("small", layout, gpu=path, batch_size=8)
    plain = plan("small", dataclasses.replace(layout, schedule="1f1b", virtual_stages=1), gpu=path, batch_size=8)
    assert interleaved.compute_time_s == pytest.approx(plain.compute_time_s, rel=1e-12)  # slot: sum of chunks
    assert interleaved.bubble_fraction == pytest.approx((2 - 1) / (2 * 4 + 2 - 1))
    # rank 0 sends forward and receives backward for both chunks, and receives forward and sends backward
    # for its second (virtual stage 2, after rank 1's stage 1): 3 x 1F1B's calls (tests/test_calibrate.py).
    assert interleaved.comm_time_s["pp"] == pytest.approx(3 * plain.comm_time_s["pp"])
    assert interleaved.comm_time_s["step"] == plain.comm_time_s["step"]
    assert interleaved.step_time_s == pytest.approx(
        interleaved.compute_time_s / (1 - interleaved.bubble_fraction) + sum(interleaved.comm_time_s.values())
    )
    assert interleaved.memory["params"] == plain.memory["params"]
