"""A mixture-of-experts GPT trained on DP x EP (x TP, x PP) ranks equals the single-process MoE model.

The runs share the session's warm pool; each is compared, step by step, with
dtlab/reference.py, which builds the same MoE model from the same config.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

import dtlab.train
from dtlab.config import TrainConfig
from dtlab.config.flags import add_train_arguments, config_from_args
from dtlab.i18n import ConfigError
from dtlab.parallel.moe import take_expert_stats
from dtlab.planner import params_per_rank, plan_for_config
from dtlab.reference import reference_train
from tests.harness import session_pool

MOE = TrainConfig(model="tiny", experts=4, top_k=2, capacity_factor=1.0, steps=20, seed=0)


def _relative(losses, reference):
    assert len(losses) == len(reference)
    return max(abs(a - b) / b for a, b in zip(losses, reference))


def test_dp2_x_ep2_trains_like_one_process_for_20_steps_and_drops_the_same_tokens():
    reference, model = reference_train(MOE)
    counts = take_expert_stats(model)  # every forward of the 20 reference steps
    run = dtlab.train(dataclasses.replace(MOE, dp=2, ep=2), pool=session_pool()).wait()
    assert _relative(run.losses(), reference) < 1e-4
    experts = [r["experts"] for r in run.records]
    routed = [sum(col) for col in zip(*(e["routed"] for e in experts))]
    assert routed == [sum(col) for col in zip(*(c["routed"] for c in counts))]
    assert sum(e["dropped"] for e in experts) == sum(c["dropped"] for c in counts) > 0
    first = experts[0]
    # 8 sequences x 16 tokens x top-2, in each of the 4 MoE layers, before capacity.
    assert sum(first["routed"]) == 8 * 16 * 2 * 4 and len(first["per_layer"]) == 4
    assert first["tokens"] == [sum(col) for col in zip(*first["per_layer"])]
    assert first["dropped"] == sum(first["routed"]) - sum(first["tokens"])
    assert 0.04 <= first["aux_loss"] < 0.05 and first["balance"] >= 1.0 - 1e-6  # 4 layers x 0.01 x ~1
    ranks = run.records[-1]["ranks"]
    assert sorted((r["dp"], r["ep"]) for r in ranks) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # The all-to-all per rank: calls, bytes on the wire and seconds (the communication tracer).
    assert all(r["comm"]["all_to_all"]["wire_bytes"] > 0 and r["comm"]["all_to_all"]["seconds"] > 0 for r in ranks)
    assert {r["comm"]["all_to_all"]["count"] for r in ranks} == {4 * 5}  # layers x (3 forward + 2 backward)
    # Each rank holds the dense parameters and 2 of the 4 experts of each of the 4 layers (fp32),
    # as the planner predicts for this layout; and it predicts the model states the ranks measured.
    held = params_per_rank(MOE.model_config(), ep=2).total
    assert {r["mem"]["params"] for r in ranks} == {4 * held}
    predicted = plan_for_config(dataclasses.replace(MOE, dp=2, ep=2))
    assert all(r["mem"][k] == predicted.memory[k] for r in ranks for k in ("params", "grads", "optimizer"))
    assert predicted.active_params < predicted.params and predicted.all_to_all_bytes > 0
    assert run.summary["ep"] == 2


@pytest.mark.parametrize(
    "layout",
    [dict(ep=2, tp=2), dict(ep=2, pp=2, micro_batches=2, recompute=True), dict(dp=2, zero=1)],
    ids=["ep2-tp2", "ep2-pp2-recompute", "dp2-zero1-no-ep"],
)
def test_expert_parallelism_composes_with_tensor_and_pipeline_parallelism(layout):
    """... and without EP, every data-parallel rank has every expert and sends no token anywhere."""
    config = dataclasses.replace(MOE, steps=4, **layout)
    reference, _ = reference_train(config)
    run = dtlab.train(config, pool=session_pool()).wait()
    assert _relative(run.losses(), reference) < 1e-4
    # TP ranks run the same router on the same tokens: counted once. Recomputation is not counted.
    assert sum(run.records[0]["experts"]["routed"]) == 8 * 16 * 2 * 4
    assert ("all_to_all" in run.records[0]["ranks"][0]["comm"]) == (config.ep > 1)


def _parse(*flags: str) -> TrainConfig:
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    return config_from_args(parser.parse_args(list(flags)))


def test_the_flags_and_the_refusals_before_any_rank_starts():
    config = _parse("--experts", "4", "--top-k", "2", "--ep", "2", "--capacity-factor", "none")
    assert (config.experts, config.top_k, config.ep, config.capacity_factor) == (4, 2, 2, None)
    assert config.validate().world_size == 2 and config.model_config().n_experts == 4
    assert config.layout.ep == 2 and config.layout.experts == 4
    for flags, needle in [
        (("--experts", "4", "--ep", "3"), "ep=3 does not divide the 4 experts"),
        (("--experts", "4", "--top-k", "5"), "top_k=5 is more than the 4 experts"),
        (
            (
                "--ep",
                "2",
            ),
            "need a mixture of experts",
        ),
        (("--experts", "4", "--ep", "2", "--zero", "1"), "ep=2 with zero=1"),
        (("--experts", "4", "--capacity-factor", "0"), "capacity_factor=0"),
        (("--experts", "4", "--ep", "2", "--batch-size", "3"), "dp x ep x grad_accum"),
    ]:
        with pytest.raises(ConfigError, match=needle) as error:
            _parse(*flags).validate()
        assert any("\u4e00" <= ch <= "\u9fff" for ch in error.value.zh), flags


def test_the_lab_draws_expert_load_and_the_panel_has_moe_controls():
    from dtlab.i18n import set_language
    from dtlab.lab.controls import ControlPanel
    from dtlab.lab.expert_load_view import ExpertLoadView, shares

    record = {"step": 0, "experts": {"tokens": [3, 1, 0, 4], "routed": [3, 2, 1, 4], "dropped": 2, "balance": 1.2}}
    view = ExpertLoadView(4, min_interval_s=0)
    view.push(record)
    view.push({"step": 1, "loss": 1.0})  # a dense record: nothing to draw
    assert shares(record) == [3 / 8, 1 / 8, 0.0, 4 / 8]
    assert list(view.load.data[0].y) == [3 / 8] and list(view.load.data[-1].y) == [0.25]
    assert list(view.drops.data[0].y) == [0.2] and list(view.drops.data[1].y) == [1.2]
    set_language("zh")
    try:
        assert view.load.data[1].name == "专家 1" and "专家" in view.load.layout.title.text
    finally:
        set_language("en")
    panel = ControlPanel(
        dataclasses.replace(MOE, ep=2), show=("experts", "top_k", "ep"), auto_run=False, pool=session_pool()
    )
    assert panel.config().ep == 2 and panel.fields["experts"].description == "experts E"


def test_dtlab_plan_takes_experts_top_k_and_ep(capsys):
    import json

    from dtlab.cli import main

    assert main(["plan", "--model", "small", "--experts", "4", "--top-k", "2", "--ep", "2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["experts"], got["top_k"], got["ep"], got["gpus"]) == (4, 2, 2, 2)
    assert got["active_params"] < got["params"] == TrainConfig(experts=4).model_config().param_count()
    assert got["all_to_all_bytes"] > 0 and got["comm_time_s"]["ep"] > 0
    assert main(["plan", "--model", "small", "--experts", "4", "--ep", "3"]) == 2
    assert "ep = 3" in capsys.readouterr().err
