"""Tensor parallelism equals the dense model: layers, a block, the whole GPT; and PyTorch's DTensor TP.

Every rank builds the dense reference with the same seed, converts a copy,
and compares outputs with the dense outputs and each gradient with *its
shard* of the dense gradient (cut exactly as the weights were cut): so every
rank checks its own part, and together they check all of it. One launch per
world size runs every check; TP 1 runs in this process, without a group.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.testing import assert_close

from dtlab.comm.collectives import group_size_and_rank
from dtlab.config import MODEL_PRESETS
from dtlab.course.experiments.tensor_parallel import block_versus_dense, model_versus_dense
from dtlab.i18n import ConfigError
from dtlab.model import MLP
from dtlab.parallel.tensor_parallel import (
    ColumnParallelLinear,
    ParallelMLP,
    RowParallelLinear,
    _check_divisible,
    column_shard,
    row_shard,
)
from tests.harness import run_ranks

CFG = MODEL_PRESETS["tiny"]  # d_model 8, 4 heads, 4 blocks: TP 4 leaves one head per rank
TOL = dict(atol=1e-6, rtol=1e-5)
DIFF = 1e-5  # largest absolute difference from the dense block or model


def _last_dim_shard(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return t.chunk(size, dim=-1)[rank]


def _inputs(seed: int, *shape):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def tp_checks(ctx=None) -> dict:
    """Every TP-versus-dense check over the world; returns the all-reduce counts."""
    size, rank = group_size_and_rank(None)
    torch.manual_seed(0)
    x = _inputs(1, 2, 5, CFG.d_model).requires_grad_()  # (B, T, C)
    # 1. A column-parallel layer: my slice of the output, the full input gradient (f).
    dense = nn.Linear(CFG.d_model, 4 * CFG.d_model)
    col = ColumnParallelLinear.from_dense(dense, group=None)
    w = _inputs(2, 2, 5, 4 * CFG.d_model)  # a loss weighting each output
    (dense(x) * w).sum().backward()
    dense_x_grad, x.grad = x.grad, None
    y = col(x)  # (B, T, 4C/tp)
    assert_close(y, _last_dim_shard(dense(x), rank, size), **TOL)
    (y * _last_dim_shard(w, rank, size)).sum().backward()  # my part of the same loss
    assert_close(x.grad, dense_x_grad, **TOL)
    assert_close(col.weight.grad, column_shard(dense.weight.grad, rank=rank, size=size), **TOL)
    assert_close(col.bias.grad, column_shard(dense.bias.grad, rank=rank, size=size), **TOL)
    # 2. A row-parallel layer: partial sums added by g, the bias once.
    dense = nn.Linear(4 * CFG.d_model, CFG.d_model)
    nn.init.normal_(dense.bias)
    row = RowParallelLinear.from_dense(dense, group=None)
    h = _inputs(3, 2, 5, 4 * CFG.d_model).requires_grad_()
    w = _inputs(4, 2, 5, CFG.d_model)
    (dense(h) * w).sum().backward()
    h_mine = _last_dim_shard(h.detach(), rank, size).clone().requires_grad_()
    out = row(h_mine)
    assert_close(out, dense(h), **TOL)
    (out * w).sum().backward()
    assert_close(h_mine.grad, _last_dim_shard(h.grad, rank, size), **TOL)
    assert_close(row.weight.grad, row_shard(dense.weight.grad, rank=rank, size=size), **TOL)
    assert_close(row.bias.grad, dense.bias.grad, **TOL)
    # 3. One block and 4. the whole small GPT against the dense ones: output (or loss), input
    # gradient and every parameter's gradient against its shard. Lesson 06 runs the same checks.
    counts = {}
    for part, result in (("block", block_versus_dense(CFG)), ("model", model_versus_dense(CFG))):
        diffs = {key: value for key, value in result.items() if key.endswith("_diff")}
        assert max(diffs.values()) <= DIFF, (part, diffs)
        counts[part] = (result["forward"], result["backward"])
    return counts


def dtensor_check(ctx) -> dict:
    """PyTorch's DTensor TP (ColwiseParallel / RowwiseParallel) against ours, on the MLP."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    size, rank = group_size_and_rank(None)
    torch.manual_seed(0)
    dense = MLP(CFG)
    ours = ParallelMLP(copy.deepcopy(dense), group=None)
    mesh = init_device_mesh("cpu", (size,))
    theirs = parallelize_module(copy.deepcopy(dense), mesh, {"fc": ColwiseParallel(), "proj": RowwiseParallel()})
    x = _inputs(8, 2, 5, CFG.d_model)
    w = _inputs(9, 2, 5, CFG.d_model)
    y_ours, y_theirs = ours(x), theirs(x)
    assert_close(y_ours, y_theirs, **TOL)
    (y_ours * w).sum().backward()
    (y_theirs * w).sum().backward()
    for name, p in ours.named_parameters():
        q = dict(theirs.named_parameters())[name]
        assert_close(p, q.to_local(), **TOL)  # the same shard of the weights
        assert_close(p.grad, q.grad.to_local(), **TOL, msg=lambda m, name=name: f"{name}: {m}")
    return {"dtensor_type": type(dict(theirs.named_parameters())["fc.weight"]).__name__}


def tp2_checks(ctx) -> dict:
    return {**tp_checks(ctx), **dtensor_check(ctx)}


def test_tp1_in_one_process():
    counts = tp_checks()
    assert counts == {"block": (0, 0), "model": (0, 0)}  # a world of one communicates nothing


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_equals_dense(tp):
    results = run_ranks(tp2_checks if tp == 2 else tp_checks, tp, timeout=60)
    for counts in results:
        # Megatron-LM: two all-reduces forward (g), two backward (f), per block.
        assert counts["block"] == (2, 2)
        assert counts["model"] == (2 * CFG.n_layer, 2 * CFG.n_layer)
        if tp == 2:
            assert counts["dtensor_type"] == "DTensor"


def test_sizes_that_do_not_split():
    with pytest.raises(ConfigError, match="cannot be split over tp = 3") as err:
        _check_divisible("attention heads (n_head)", 4, 3)
    assert "无法平均分到" in str(err.value)


def test_column_shard_keeps_q_k_v_of_a_head_together():
    C, size = 4, 2
    qkv = torch.arange(3 * C).float()  # [q0..q3, k0..k3, v0..v3]
    assert column_shard(qkv, rank=0, size=size, blocks=3).tolist() == [0, 1, 4, 5, 8, 9]
    assert column_shard(qkv, rank=1, size=size, blocks=3).tolist() == [2, 3, 6, 7, 10, 11]
    w = torch.arange(12.0).view(2, 6)
    assert row_shard(w, rank=1, size=3).tolist() == [[2, 3], [8, 9]]
