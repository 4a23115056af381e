"""``dtlab plan --search``: every layout of N GPUs planned, those that fit ranked, the others with a reason.

Each figure a ranked layout shows is :func:`dtlab.plan`'s on that layout;
each rejection is the planner's or ``dtlab train``'s own refusal, or the
memory it lacks. No processes.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

import dtlab
from dtlab.config import TrainConfig
from dtlab.config.layout import Layout
from dtlab.i18n import ConfigError
from dtlab.planner.cli import run_plan
from dtlab.planner.hardware import GPUS
from dtlab.planner.search import MICRO_BATCH_SIZES, REASONS, SEARCHED, search
from tests.test_planner import _parse


@pytest.fixture(scope="module")
def gpt3():
    """GPT-3 175B on 1024 H100s, batch 1536 (the GPT-3 paper's, Brown et al. 2020, Table 2.1).

    With the fp32 masters in the module (dtlab's ``--master-weights model``): 16-bit copies and fp32
    gradients on top of the paper's split, the memory pressure under which the claims below were made.
    (With the masters in the optimizer, the paper's (2 + 2 + K)Ψ, GPipe fits too and the planner's
    fastest layouts use tp = 4.)"""
    return search("gpt3-175b", gpus=1024, gpu="H100", batch_size=1536, master_weights="model")


def _layout(p) -> Layout:
    return Layout(
        dp=p.dp,
        tp=p.tp,
        pp=p.pp,
        micro_batches=p.micro_batches,
        schedule=p.schedule,
        virtual_stages=p.virtual_stages,
        zero=p.zero,
        precision=p.precision,
        recompute=p.recompute,
        sp=p.sequence_parallel,
        dp_shard=p.dp_shard,
    )


def _rejections(found, reason, **fields):
    return [r for r in found.rejected if r.reason == reason and all(r.fields.get(k) == v for k, v in fields.items())]


def test_ranked_by_step_time_and_each_figure_is_the_planners(gpt3):
    assert gpt3.ranked, "some layout of 1024 H100s fits GPT-3"
    times = [p.step_time_s for p in gpt3.ranked]
    assert times == sorted(times)
    for p in gpt3.ranked[:10] + gpt3.ranked[-3:]:
        again = dtlab.plan("gpt3-175b", _layout(p), gpus=1024, gpu="H100", batch_size=1536, master_weights="model")
        assert again.to_dict() == p.to_dict()
        assert again.fits and again.dp * again.tp * again.pp == 1024


def test_every_layout_uses_every_gpu_and_the_pruned_space(gpt3):
    every = [p.to_dict() for p in gpt3.ranked] + [r.fields for r in gpt3.rejected]
    assert all(d["dp"] * d["tp"] * d["pp"] == 1024 for d in every)
    for p in gpt3.ranked:
        assert p.micro_batch_size in MICRO_BATCH_SIZES
        assert p.pp > 1 or p.schedule == "1f1b"
        assert p.tp > 1 or not p.sequence_parallel
    # GPipe keeps all m micro-batches' activations: on 1,024 H100s none of its layouts fits at its peak.
    assert {p.schedule for p in gpt3.ranked} == {"1f1b", "interleaved"}
    assert any(r.fields["schedule"] == "gpipe" for r in gpt3.by_reason()["memory"])
    assert all(p.virtual_stages == (2 if p.schedule == "interleaved" else 1) for p in gpt3.ranked)
    keys = {
        (p.dp, p.tp, p.pp, p.micro_batches, p.schedule, p.zero, p.recompute, p.sequence_parallel) for p in gpt3.ranked
    }
    assert len(keys) == len(gpt3.ranked), "no layout planned twice"


def test_published_sanity_tp_within_a_node_and_a_pipeline(gpt3):
    # Narayanan et al. 2021 (Megatron-LM), Sec. 3.3 takeaway #1 and Table 1 (175B: t = 8, p = 16):
    # tensor parallelism up to the GPUs of a node, pipeline parallelism across nodes.
    for p in gpt3.ranked[:5]:
        assert p.tp == GPUS["H100"].gpus_per_node and p.pp > 1
    assert all(p.tp <= 8 for p in gpt3.ranked)


def test_a_layout_that_does_not_fit_is_rejected_with_its_excess(gpt3):
    # Plain data parallelism over 8-way TP: every rank keeps 175B / 8 parameters' states.
    grid = dict(dp=128, tp=8, pp=1, micro_batches=6, schedule="1f1b", zero=0, recompute="none", sp=False)
    [rejected] = _rejections(gpt3, "memory", **grid)
    p = dtlab.plan(
        "gpt3-175b", Layout(precision="bf16", **grid), gpus=1024, gpu="H100", batch_size=1536, master_weights="model"
    )
    assert not p.fits
    need = max(p.memory["total"], p.memory["peak"])
    assert rejected.excess_bytes == need - 80 * 10**9 > 0
    assert f"{need / 1e9:.2f} GB" in rejected.en and f"{rejected.excess_bytes / 1e9:.2f} GB" in rejected.en
    assert f"{rejected.excess_bytes / 1e9:.2f} GB" in rejected.zh
    memory = gpt3.by_reason()["memory"]
    assert [r.excess_bytes for r in memory] == sorted(r.excess_bytes for r in memory)


def test_tp_beyond_a_node_is_rejected_for_that_reason(gpt3):
    [rejected] = _rejections(gpt3, "tp_beyond_node", dp=16, tp=16, pp=4)
    assert rejected.fields == {"dp": 16, "tp": 16, "pp": 4}  # whatever the other choices
    assert "tp = 16 spans 2 nodes of 8 GPUs" in rejected.en and "(allowed: tp <= 8)" in rejected.en
    assert "tp = 16 跨越 2 个节点" in rejected.zh
    assert {r.fields["tp"] for r in gpt3.rejected if r.reason == "tp_beyond_node"} == {16, 32}
    # tp = 64 and more do not divide GPT-3's 96 heads: the planner's own check says so first.
    [heads] = _rejections(gpt3, "divisibility", dp=16, tp=64, pp=1)
    assert heads.en == (
        "tp = 64 must divide heads = 96 of model 'gpt3-175b' (allowed: [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96])"
    )


def test_non_dividing_layouts_name_the_values(gpt3):
    [batch] = _rejections(gpt3, "divisibility", dp=1024, tp=1, pp=1)
    assert "batch_size = 1536 must split evenly into dp x ep = 1024" in batch.en and "1536" in batch.zh
    [blocks] = _rejections(gpt3, "divisibility", dp=8, tp=1, pp=128)
    assert blocks.en == "pp = 128 must not exceed layers = 96 of model 'gpt3-175b' (allowed: 1 to 96)"
    # dtlab's small GPT has 4 heads: 8-way TP cannot split them.
    small = search("small", gpus=8)
    [heads] = _rejections(small, "divisibility", tp=8)
    with pytest.raises(ConfigError) as refusal:
        dtlab.plan("small", Layout(tp=8))
    assert (heads.en, heads.zh) == (refusal.value.en, refusal.value.zh)
    assert "tp = 8 must divide heads = 4" in heads.en


def test_zero3_with_a_pipeline_is_refused_with_trains_words(gpt3):
    with pytest.raises(ConfigError) as train:
        TrainConfig(pp=2, zero=3).validate()
    [rejected] = _rejections(gpt3, "train_refuses", dp=512, tp=1, pp=2)
    assert rejected.fields == {"dp": 512, "tp": 1, "pp": 2, "zero": 3}
    assert (rejected.en, rejected.zh) == (train.value.en, train.value.zh)
    assert not any(p.zero == 3 and p.pp > 1 for p in gpt3.ranked)
    assert any(p.zero == 3 for p in gpt3.ranked + [r.plan for r in gpt3.rejected if r.plan])


def test_fixed_flags_are_not_searched():
    found = search("medium", gpus=8, batch_size=16, zero=1, precision="fp32", recompute="none")
    planned = found.ranked + [r.plan for r in found.rejected if r.plan]
    assert planned and all(p.zero == 1 and p.precision == "fp32" and p.recompute == "none" for p in planned)
    with pytest.raises(ConfigError) as refusal:
        search("medium", gpus=8, virtual=2)
    assert "not layout fields" in refusal.value.en and "不是布局字段" in refusal.value.zh
    assert set(SEARCHED) <= {f.name for f in dataclasses.fields(Layout)}


def test_cli_table_is_bilingual_and_json_is_a_list(capsys):
    flags = "--search --model medium --gpus 8 --batch-size 16 --top 3".split()
    assert run_plan(_parse(flags)) == 0
    table = capsys.readouterr().out
    for word in ("step time", "单步时间", "memory/GPU", "每卡显存", "bubble", "气泡", "rejected / 未入选"):
        assert word in table
    found = search("medium", gpus=8, batch_size=16)
    first = found.ranked[0]
    assert f"{first.mfu:.1%}" in table.splitlines()[4]
    for reason, rows in found.by_reason().items():
        assert f"{REASONS[reason][0]} / {REASONS[reason][1]}: {len(rows)}" in table
    assert run_plan(_parse(flags + ["--json"])) == 0
    listed = json.loads(capsys.readouterr().out)
    ranked = [d for d in listed if d["rank"] is not None]
    assert [d["rank"] for d in ranked] == [1, 2, 3]
    assert [d["step_time_s"] for d in ranked] == [p.step_time_s for p in found.ranked[:3]]
    rejected = [d for d in listed if d["rank"] is None]
    assert len(rejected) == len(found.rejected) and {d["rejected"] for d in rejected} <= set(REASONS)
    assert all(d["message"] and d["message_zh"] for d in rejected)


def test_cli_search_needs_gpus_and_a_shape(capsys):
    with pytest.raises(ConfigError) as refusal:
        run_plan(_parse("--search --model small".split()))
    assert "--search needs --gpus N" in refusal.value.en and "--search 需要 --gpus N" in refusal.value.zh
    with pytest.raises(ConfigError) as refusal:  # TP and PP cost nothing without a shape: no ranking
        run_plan(_parse("--search --params 7.5B --gpus 64".split()))
    assert "search needs a model with a shape" in refusal.value.en and "有形状的模型" in refusal.value.zh


def test_local_search_lists_only_what_dtlab_train_runs(tmp_path):
    # A machine profile as dtlab calibrate writes it (synthetic: nothing is measured here).
    from dtlab.planner.profile import save_profile
    from tests.test_calibrate import synthetic_profile

    path = str(tmp_path / "machine.json")
    save_profile(synthetic_profile(), path)
    found = search("small", gpus=4, gpu=path, batch_size=8)
    planned = found.ranked + [r.plan for r in found.rejected if r.plan]
    assert found.ranked and found.local
    assert all(
        p.schedule in TrainConfig.choices("schedule") and p.recompute in ("none", "full") and p.precision == "fp32"
        for p in planned
    )
    # dtlab train runs interleaving and the local model prices it: ranked like the others at pp = 2
    # (4 chunks of the small GPT's 4 blocks); pp = 4 would need 8 chunks, refused as train refuses it.
    assert {p.pp for p in planned if p.schedule == "interleaved"} == {2}
    assert all(p.virtual_stages == 2 for p in planned if p.schedule == "interleaved")
    assert {r.fields["pp"] for r in _rejections(found, "divisibility", schedule="interleaved")} >= {4}
    assert not [r for r in found.rejected if r.reason not in REASONS]
    assert not [r for r in found.rejected if r.reason == "train_refuses" and r.fields.get("schedule")]
    for p in found.ranked[:3]:
        assert dtlab.plan("small", _layout(p), gpus=4, gpu=path, batch_size=8).to_dict() == p.to_dict()


def test_a_layout_passed_as_the_model_and_top_without_search_are_refused(capsys):
    from dtlab.cli import main

    with pytest.raises(ConfigError) as error:
        dtlab.plan(TrainConfig().layout)
    assert "plan('small', config.layout)" in error.value.en and "layout=config.layout" in error.value.zh
    assert main(["plan", "--model", "small", "--top", "5"]) == 2
    err = capsys.readouterr().err
    assert "--top 5 without --search" in err and "--top 5 没有与 --search 同时使用" in err
