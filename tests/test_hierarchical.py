"""The hierarchical all-reduce equals the flat one (PyTorch's and the reference sum) at world sizes 1, 2, 4."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dtlab.cluster.hierarchical import build_node_groups, hierarchical_all_reduce, inter_node_bytes, node_ranks
from dtlab.comm.collectives import AVG, SUM, CommMeter
from dtlab.i18n import ConfigError
from tests.harness import run_ranks

NUMELS = (1, 7, 1000)  # fewer elements than ranks, uneven chunks, even chunks


def _tensor(rank: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(100 * rank + numel))


def check_against_torch(ctx) -> list[dict]:
    """Every node shape the world allows, every size, SUM and AVG; returns what was compared."""
    out = []
    for k in [k for k in (1, 2, 4) if ctx.world_size % k == 0]:
        groups = build_node_groups(k)
        for numel in NUMELS:
            for op in (SUM, AVG):
                mine, theirs = _tensor(ctx.rank, numel), _tensor(ctx.rank, numel)
                meter = CommMeter()
                hierarchical_all_reduce(mine, op, groups=groups, meter=meter)
                dist.all_reduce(theirs, op=dist.ReduceOp.SUM)
                if op == AVG:
                    theirs /= ctx.world_size
                reference = sum(_tensor(r, numel) for r in range(ctx.world_size))
                reference = reference / ctx.world_size if op == AVG else reference
                out.append(
                    {
                        "k": k,
                        "numel": numel,
                        "vs_torch": (mine - theirs).abs().max().item(),
                        "vs_reference": (mine - reference).abs().max().item(),
                        "inter_sent": meter.bytes_sent.get("all_reduce", 0),
                    }
                )
    return out


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_hierarchical_all_reduce_equals_torch_and_the_reference(world_size):
    results = run_ranks(check_against_torch, world_size)
    for rank_results in results:
        for r in rank_results:
            assert r["vs_torch"] < 1e-5 and r["vs_reference"] < 1e-5, r
    # Every rank's cross-node ring sends its share: K of them fill the node's link as predicted.
    for r in results[0]:
        if r["numel"] == 1000 and world_size > r["k"]:
            nodes = world_size // r["k"]
            per_node = r["k"] * r["inter_sent"]
            assert per_node == pytest.approx(inter_node_bytes(4000, nodes, r["k"], hierarchical=True))


def test_node_ranks_are_consecutive_like_torchrun_numbers_them():
    assert node_ranks(4, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    assert node_ranks(6, 3) == ([[0, 1, 2], [3, 4, 5]], [[0, 3], [1, 4], [2, 5]])
    assert node_ranks(2, 1) == ([[0], [1]], [[0, 1]])
    with pytest.raises(ConfigError):
        node_ranks(4, 3)


def test_the_slow_link_carries_less_than_a_flat_ring():
    assert inter_node_bytes(1.0, 2, 2, hierarchical=False) == 1.5
    assert inter_node_bytes(1.0, 2, 2, hierarchical=True) == 1.0
    assert inter_node_bytes(1.0, 4, 8, hierarchical=True) == 1.5 < inter_node_bytes(1.0, 4, 8, hierarchical=False)
    assert inter_node_bytes(1.0, 1, 8, hierarchical=True) == 0.0


def test_alpha_beta_fit_recovers_a_link_and_predicts_the_hierarchical_gain():
    from dtlab.cluster.bench import fit_link, predict

    alpha, beta = 100e-6, 12.5e6
    link = fit_link("x", {n: alpha + n / beta for n in (1 << 10, 1 << 16, 1 << 20)})
    assert link.latency_s == pytest.approx(alpha) and link.bandwidth_Bps == pytest.approx(beta)
    noisy = fit_link("y", {1 << 10: 2e-3, 1 << 20: 1e-3})  # slope < 0: largest size over its time
    assert noisy.bandwidth_Bps == pytest.approx((1 << 20) / 1e-3)
    fast = fit_link("z", {n: n / 1e9 for n in (1 << 10, 1 << 20)})
    times = predict(4 << 20, 2, 2, fast, link)
    assert times["hierarchical"] < times["flat"] and times["inter"] > times["intra"]
