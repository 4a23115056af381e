"""ZeRO-3's sharding policy (issue 36, item 4): ``ZeroStage3(model, shard_modules=...)`` shards the matching
modules' parameters and keeps the rest whole on every rank.

On 4 real ranks, the small GPT's one backward: a replicated parameter's (a LayerNorm's) ``.grad`` is shaped
like it and ``torch.equal`` on every rank, and equals the single-process gradient; a sharded one's
gradient equals the reference's slice. Then ``dtlab train --zero 3 --zero3-shard linear`` at dp 2
equals the single-process reference over 20 steps, resumes from its save bit for bit, and a plain ZeRO-3
save resumes under the policy.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dtlab
from dtlab.config import MODEL_PRESETS, TrainConfig
from dtlab.data import global_batch
from dtlab.i18n import ConfigError
from dtlab.model import build_model
from dtlab.parallel.zero import ZeroStage3
from dtlab.parallel.zero.policy import matrices, shard_predicate
from dtlab.reference import reference_train
from dtlab.state.checkpoint import step_folder
from tests.harness import run_ranks, session_pool

CFG = MODEL_PRESETS["tiny"]


def _one_backward(ctx) -> dict:
    x, y = global_batch(0, batch_size=8, seq_len=CFG.seq_len, seed=0)
    reference = build_model(CFG, seed=0)
    reference(x, y).backward()
    expected = {name: p.grad for name, p in reference.named_parameters()}
    model = ZeroStage3(build_model(CFG, seed=0), shard_modules=(nn.Linear, nn.Embedding))
    mine = slice(ctx.rank * 8 // ctx.world_size, (ctx.rank + 1) * 8 // ctx.world_size)
    model(x[mine], y[mine]).backward()
    sharded = {
        name: (shard.grad.clone(), expected[name].flatten()[start:stop])
        for name, shard, start, stop in model.named_shards()
    }
    whole = {name: (p.grad.clone(), expected[name]) for name, p in model.named_replicated()}
    return {"sharded": sharded, "whole": whole, "bytes": model.memory_bytes()}


def test_replicated_gradients_are_whole_and_equal_on_every_rank_and_sharded_ones_are_the_reference():
    ranks = run_ranks(_one_backward, 4)
    whole = ranks[0]["whole"]
    assert whole and all(".ln" in name or name.startswith("ln_f") for name in whole)  # the norms, nothing else
    assert {name for name in ranks[0]["sharded"]} & set(whole) == set()
    for name, (grad, expected) in whole.items():
        assert grad.shape == expected.shape and grad.dtype == torch.float32
        assert all(torch.equal(r["whole"][name][0], grad) for r in ranks[1:]), name  # bit for bit, every rank
        torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6)
    for r in ranks:
        for name, (grad, expected) in r["sharded"].items():
            torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6)
    params = sum(p.numel() for p in build_model(CFG, seed=0).parameters())
    replicated = sum(g.numel() for g, _ in whole.values())
    assert ranks[0]["bytes"]["params"] >= 4 * (replicated + (params - replicated) // 4)  # whole norms + a shard


def test_train_with_the_linear_policy_equals_the_reference_and_resumes(tmp_path):
    pool = session_pool()
    common = dict(model="tiny", steps=20, seed=0)
    reference = reference_train(TrainConfig(**common))[0]
    saved, plain = tmp_path / "linear", tmp_path / "all"
    layout = dict(dp=2, zero=3)  # (4 ranks: the gradient test above)
    straight = dtlab.train(
        TrainConfig(**common, **layout, zero3_shard="linear", save=str(saved), save_every=10), pool=pool
    ).wait()
    resumed = dtlab.train(
        TrainConfig(**common, **layout, zero3_shard="linear", resume=str(step_folder(saved, 10))), pool=pool
    ).wait()
    assert max(abs(a - b) / abs(b) for a, b in zip(straight.losses(), reference)) < 1e-5
    assert resumed.losses() == straight.losses()[10:]  # bit for bit
    dtlab.train(TrainConfig(**common, **layout, save=str(plain), save_every=10), pool=pool).wait()
    reshard = dtlab.train(
        TrainConfig(**common, **layout, zero3_shard="linear", resume=str(step_folder(plain, 10))), pool=pool
    ).wait()
    assert max(abs(a - b) / abs(b) for a, b in zip(reshard.losses(), straight.losses()[10:])) < 1e-5


def test_a_policy_is_a_type_a_tuple_or_a_predicate_and_anything_else_is_refused():
    block = build_model(CFG, seed=0).blocks[0]
    assert shard_predicate(nn.LayerNorm)(block.ln1) and not shard_predicate(nn.LayerNorm)(block.mlp.fc)
    assert shard_predicate(None)(block.ln1) and shard_predicate("linear") is matrices
    assert matrices(block.mlp.fc) and not matrices(block.ln1)
    with pytest.raises(ConfigError, match="shard_modules=3") as error:
        shard_predicate(3)
    assert "不合法" in str(error.value)
    with pytest.raises(ConfigError, match="zero3_shard='linear' with zero=2") as error:
        TrainConfig(dp=2, zero=2, zero3_shard="linear").validate()
    assert "不能同时使用" in str(error.value)
