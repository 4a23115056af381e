"""Hybrid sharding (HSDP, ``--dp-shard K``): ZeRO inside groups of K DP ranks, replicated across them.

One warm pool runs the tiny GPT (CI's budget: start-up dominates on two cores):
``--dp 4 --zero 3 --dp-shard 2`` against the single-process reference, its
traced bytes per group against tests/expected_comm.py's formula, its resume
bit for bit, and its checkpoints resumed at plain ZeRO-3 and back; ZeRO-2 with
``--dp-shard`` too. The refusals need no rank.
"""

from __future__ import annotations

import pytest

import dtlab.train
from dtlab.config import TrainConfig
from dtlab.i18n import ConfigError
from dtlab.reference import reference_train
from dtlab.state.checkpoint import step_folder
from tests.expected_comm import check_traced_comm, check_traced_groups
from tests.harness import session_pool

RUN = dict(model="tiny", steps=20, seed=0, dp=4)
HSDP = dict(zero=3, dp_shard=2)
SAVED, MIDDLE = 10, 15  # HSDP saves at 10 -> plain ZeRO-3 runs 10..20, saving at 15 -> HSDP runs 15..20


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pool = session_pool()  # warm ranks shared with the rest of the suite (tests/harness.py)
    root = tmp_path_factory.mktemp("hsdp")
    hsdp, plain = root / "hsdp", root / "plain"

    def train(**options):
        return dtlab.train(TrainConfig(**{**RUN, **options}), pool=pool).wait()

    out = {"reference": reference_train(TrainConfig(model="tiny", steps=20, seed=0))[0]}
    out["hsdp"] = train(**HSDP, save=str(hsdp), save_every=SAVED)
    out["resumed"] = train(**HSDP, resume=str(step_folder(hsdp, SAVED)))
    out["to plain"] = train(zero=3, resume=str(step_folder(hsdp, SAVED)), save=str(plain), save_every=5)
    out["from plain"] = train(**HSDP, resume=str(step_folder(plain, MIDDLE)))
    out["zero2"] = train(zero=2, dp_shard=2, bucket_mb=0.01)  # 3 windows of the tiny GPT's flat gradient
    return out


def _saved_in(record: dict) -> bool:
    return any(kind.endswith(".checkpoint") for rank in record["ranks"] for kind in rank["comm"])


def _close(losses, reference) -> float:
    assert len(losses) == len(reference)
    return max(abs(a - b) / b for a, b in zip(losses, reference))


def test_hsdp_equals_the_single_process_reference_and_sends_the_formula_per_group(runs):
    for name, options in (("hsdp", HSDP), ("zero2", dict(zero=2, dp_shard=2, bucket_mb=0.01))):
        config = TrainConfig(**RUN, **options)
        run = runs[name]
        assert _close(run.losses(), runs["reference"]) < 1e-5, name
        steps = [r for r in run.records if not _saved_in(r)]  # a save's own calls are the checkpoint's
        check_traced_comm(config, steps)
        check_traced_groups(config, steps)  # dp_shard: gathers and scatters; dp_replicate: the all-reduce
        groups = run.records[-1]["ranks"][0]["comm_groups"]
        assert "dp" not in groups and groups["dp_replicate"]["bytes"] < groups["dp_shard"]["bytes"], name


def test_hsdp_resumes_bit_for_bit_and_reshards_to_and_from_plain_zero3(runs):
    straight = runs["hsdp"].losses()
    assert runs["resumed"].losses() == straight[SAVED:]  # exactly
    assert [r["step"] for r in runs["to plain"].records] == list(range(SAVED, 20))
    assert _close(runs["to plain"].losses(), straight[SAVED:]) < 1e-5
    assert [r["step"] for r in runs["from plain"].records] == list(range(MIDDLE, 20))
    assert _close(runs["from plain"].losses(), straight[MIDDLE:]) < 1e-5


@pytest.mark.parametrize(
    "options, named",
    [
        (dict(dp=4, zero=3, dp_shard=3), "dp_shard=3"),  # does not divide dp
        (dict(dp=4, zero=0, dp_shard=2), "zero=0"),  # nothing to shard
        (dict(dp=4, zero=1, dp_shard=2), "zero=1"),
        (dict(dp=4, zero=3, dp_shard=0), "dp_shard=0"),  # K < 1
        (dict(dp=4, zero=3, dp_shard=8), "dp_shard=8"),  # more than dp
        (dict(dp=2, cp=2, zero=3, dp_shard=2), "cp=2"),
    ],
)
def test_bad_dp_shard_is_refused_in_both_languages_before_any_rank_starts(options, named):
    with pytest.raises(ConfigError) as error:
        TrainConfig(model="tiny", **options).validate()
    assert "dp_shard" in error.value.en and named in error.value.en
    assert "dp_shard" in error.value.zh and any("\u4e00" <= c <= "\u9fff" for c in error.value.zh)


def test_the_planner_shards_over_k_and_prices_each_link():
    """Memory: model states over K, not dp; communication: the shard group on NVLink (K <= GPUs per node),
    the replicate group's all-reduce of a 1/K shard on InfiniBand; --search tries K = a node's DP ranks."""
    from dtlab.config.layout import Layout
    from dtlab.planner import plan
    from dtlab.planner.search import search

    common = dict(gpu="H100", gpus=16, batch_size=16)
    plain = plan("small", Layout(dp=16, zero=3), **common)
    hybrid = plan("small", Layout(dp=16, zero=3, dp_shard=8), **common)
    assert hybrid.dp_shard == 8 and abs(hybrid.memory["optimizer"] / plain.memory["optimizer"] - 2) < 0.01
    assert hybrid.links == {
        **{k: v for k, v in plain.links.items() if k != "dp"},
        "dp_shard": "nvlink",
        "dp_replicate": "infiniband",
    }
    assert set(hybrid.comm_time_s) == set(plain.comm_time_s) - {"dp"} | {"dp_shard", "dp_replicate"}
    found = search("small", gpus=16, gpu="H100", batch_size=16, tp=1, pp=1, zero=3, recompute="none")
    assert {p.dp_shard for p in found.ranked} == {None, 8}
