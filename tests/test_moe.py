"""All-to-all against PyTorch's, and the mixture of experts under expert parallelism against one process.

One launch per world size runs the all-to-all checks and every MoE layout on
real gloo ranks and returns what it measured; the assertions are made here.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict

import pytest
import torch
import torch.distributed as dist

from dtlab.comm.all_to_all import all_to_all, all_to_all_schedule, all_to_all_single
from dtlab.comm.collectives import CommMeter
from dtlab.config import MODEL_PRESETS
from dtlab.course.experiments import moe as lesson
from dtlab.data import global_batch, shard
from dtlab.i18n import ConfigError
from dtlab.model import build_model
from dtlab.parallel.moe import (
    MoE,
    apply_expert_parallel,
    capacity,
    dense_parameters,
    expert_parameters,
    reduce_expert_gradients,
    take_expert_stats,
)
from dtlab.planner.communication import all_to_all_time, ring_bytes_sent_per_rank
from dtlab.planner.hardware import Link
from tests.harness import run_ranks

BATCH, STEPS, LR = 8, 3, 3e-3
MOE = dataclasses.replace(MODEL_PRESETS["tiny"], n_experts=4, top_k=2, n_layer=2)
SLOW = Link(name="slow", latency_s=0.01, bandwidth_Bps=1e6)
CASES = {"no drops": dict(capacity_factor=None), "drops": dict(capacity_factor=0.5)}


def _uneven(rank: int, n: int) -> list[int]:
    """Rank r sends (r + j) % 3 rows to rank j: zeros included, different on every rank."""
    return [(rank + j) % 3 for j in range(n)]


# --------------------------------------------------------------------------- on the ranks


def _all_to_all_checks(ctx, group, n: int, rank: int) -> dict:
    """dtlab's all-to-all and PyTorch's on the same pieces, over ``group`` (n ranks, I am ``rank``)."""
    out = {}
    for name, send in (("even", [2] * n), ("uneven", _uneven(rank, n))):
        recv = [(i + rank) % 3 for i in range(n)] if name == "uneven" else [2] * n
        x = torch.randn(sum(send), 3, generator=torch.Generator().manual_seed(rank))  # (rows, 3)
        theirs = torch.empty(sum(recv), 3)
        dist.all_to_all_single(theirs, x, recv, send, group=group)
        meter, trace = CommMeter(), []
        mine = all_to_all_single(torch.empty(sum(recv), 3), x, recv, send, group=group, meter=meter, trace=trace)
        # Differentiable: the gradient of sum(w * out) comes back along the same route.
        xg = x.clone().requires_grad_()
        w = torch.arange(float(sum(recv) * 3)).view(-1, 3)
        (all_to_all(xg, send, recv, group=group) * w).sum().backward()
        back = torch.empty(sum(send), 3)
        dist.all_to_all_single(back, w, send, recv, group=group)
        out[name] = {
            "error": (mine - theirs).abs().max().item() if mine.numel() else 0.0,
            "grad_error": (xg.grad - back).abs().max().item() if back.numel() else 0.0,
            "sent": dict(meter.bytes_sent),
            "calls": dict(meter.calls),
            "trace": trace,
        }
    return out


def _moe_rank(ctx, cfg, ep: int) -> dict:
    """Train ``cfg`` for STEPS steps on dp x ep ranks (ep innermost); return losses, grads, params."""
    n, rank = ctx.world_size, ctx.rank
    dp = n // ep
    # Groups, created on every rank in the same order: EP = consecutive ranks, expert-DP = strided.
    ep_groups = [dist.new_group(list(range(d * ep, (d + 1) * ep))) for d in range(dp)]
    edp_groups = [dist.new_group(list(range(e, n, ep))) for e in range(ep)]
    ep_group, edp_group = ep_groups[rank // ep], edp_groups[rank % ep]
    model = apply_expert_parallel(build_model(cfg, seed=0), group=ep_group)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), eps=1e-8)
    losses, stats, first_grads = [], [], None
    for step in range(STEPS):
        x, y = global_batch(step, batch_size=BATCH, seq_len=cfg.seq_len, seed=0)
        x, y = shard(x, index=rank, count=n), shard(y, index=rank, count=n)
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        for p in dense_parameters(model):  # replicated on all dp x ep ranks: average
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        reduce_expert_gradients(model, group=edp_group, ep=ep)
        if first_grads is None:
            first_grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        losses.append(total.item())
        stats.append(take_expert_stats(model))
    return {
        "losses": losses,
        "grads": first_grads,
        "stats": stats,
        "params": {k: p.detach().clone() for k, p in model.named_parameters()},
        "experts": [layer.local_experts for layer in model.modules() if isinstance(layer, MoE)],
    }


def _on_a_slow_link() -> float:
    """Seconds of one all-to-all of 1024 floats per rank under a simulated slow link."""
    x = torch.ones(1024)
    started = time.perf_counter()
    all_to_all_single(torch.empty(1024), x, link=SLOW)
    return time.perf_counter() - started


def _ranks_checks(ctx) -> dict:
    """Everything in one launch of 4 ranks: world size 2 runs on the halves [0, 1] and [2, 3]."""
    halves = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    out = {
        "a2a": {
            4: _all_to_all_checks(ctx, None, 4, ctx.rank),
            2: _all_to_all_checks(ctx, halves[ctx.rank // 2], 2, ctx.rank % 2),
        },
        "moe": {},
        "lesson": lesson.all_to_all_versus_torch(ctx, 4096),
        "slow_s": _on_a_slow_link(),
    }
    for name, knobs in CASES.items():
        cfg = dataclasses.replace(MOE, **knobs)
        for ep in (4, 2):  # EP 4; DP 2 x EP 2
            out["moe"][name, ep] = _moe_rank(ctx, cfg, ep)
    return out


# --------------------------------------------------------------------------- the reference


def _reference(cfg) -> dict:
    model = build_model(cfg, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), eps=1e-8)
    losses, stats, first_grads = [], [], None
    for step in range(STEPS):
        x, y = global_batch(step, batch_size=BATCH, seq_len=cfg.seq_len, seed=0)
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        if first_grads is None:
            first_grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
        stats.append(take_expert_stats(model))
    return {
        "losses": losses,
        "grads": first_grads,
        "stats": stats,
        "params": {k: p.detach().clone() for k, p in model.named_parameters()},
    }


@pytest.fixture(scope="module")
def references():
    return {name: _reference(dataclasses.replace(MOE, **knobs)) for name, knobs in CASES.items()}


def _close(a: torch.Tensor, b: torch.Tensor, what, atol: float = 1e-6) -> None:
    assert torch.allclose(a, b, rtol=1e-4, atol=atol), (what, (a - b).abs().max().item())


def test_all_to_all_and_expert_parallel_equal_torch_and_one_process(references):
    results = run_ranks(_ranks_checks, 4, timeout=120)
    for rank, got in enumerate(results):
        # The lesson's measurement, on the same ranks.
        assert got["lesson"]["bytes_sent"] == 3 * 4096 // 4 and got["lesson"]["steps"] == 3
        assert got["lesson"]["trace_is_schedule"] and got["lesson"]["equal_to_torch"]
        assert got["lesson"]["uneven_equal_to_torch"]
        # The link model: (N-1)/N of the tensor per rank, and a lower bound on the time (enforced by sleeping).
        assert got["lesson"]["bytes_sent"] == ring_bytes_sent_per_rank(4096, 4, "all_to_all")
        assert got["slow_s"] >= all_to_all_time(4096, 4, SLOW)
        for n, checks in got["a2a"].items():
            me = rank % n
            for name, a2a in checks.items():
                assert a2a["error"] == 0.0 and a2a["grad_error"] == 0.0, (rank, n, name, a2a)
                assert a2a["calls"] == {"all_to_all": 1}
                schedule = [asdict(e) for e in all_to_all_schedule(n) if e.rank == me]
                assert [{k: t[k] for k in schedule[0]} for t in a2a["trace"]] == schedule
            # Even: (N-1)/N of the input leaves each rank (2 rows of 3 floats per peer).
            assert checks["even"]["sent"] == {"all_to_all": (n - 1) * 2 * 3 * 4}
            assert checks["uneven"]["sent"] == {
                "all_to_all": sum(r for j, r in enumerate(_uneven(me, n)) if j != me) * 3 * 4
            }
    for (name, ep), _ in results[0]["moe"].items():
        ref, label = references[name], f"dp {4 // ep} x ep {ep}"
        per_rank = [r["moe"][name, ep] for r in results]
        for got in per_rank:
            for a, b in zip(got["losses"], ref["losses"]):
                assert abs(a - b) <= 1e-4 * abs(b), (name, label, got["losses"], ref["losses"])
            for k, p in got["params"].items():  # every name global: experts.2 is experts.2
                _close(got["grads"][k], ref["grads"][k], (name, label, "grad", k))
                # AdamW divides by sqrt(v): a near-zero gradient's last-bit differences move a
                # parameter by up to a fraction of lr, so parameters get a looser absolute bound.
                _close(p, ref["params"][k], (name, label, "param", k), atol=2e-5)
        # Every expert lives on exactly one rank of each EP group.
        assert sorted(e for got in per_rank[:ep] for e in got["experts"][0]) == list(range(4))
        # The router routes and drops the same assignments as one process, step by step.
        for step in range(STEPS):
            for layer, ref_layer in enumerate(ref["stats"][step]):
                for key in ("routed", "kept"):
                    summed = [sum(col) for col in zip(*(g["stats"][step][layer][key] for g in per_rank))]
                    assert summed == ref_layer[key], (name, label, step, layer, key)
                dropped = sum(g["stats"][step][layer]["dropped"] for g in per_rank)
                assert dropped == ref_layer["dropped"]
                assert (dropped > 0) == (name == "drops")


# --------------------------------------------------------------------------- one process


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_pairwise_schedule_sends_every_piece_once_and_each_step_is_a_permutation(n):
    schedule = all_to_all_schedule(n)
    assert len(schedule) == (n - 1) * n
    pairs = {(e.rank, e.send_to) for e in schedule}
    assert pairs == {(r, j) for r in range(n) for j in range(n) if r != j}
    for s in range(1, n):
        step = [e for e in schedule if e.step == s]
        assert sorted(e.send_to for e in step) == list(range(n))
        for e in step:  # what I receive is what my sender sends me
            assert step[e.recv_from].send_to == e.rank


def test_without_a_process_group_all_to_all_is_a_copy_and_bad_splits_are_refused():
    x = torch.arange(6.0).view(3, 2)
    assert all_to_all_single(torch.empty(3, 2), x).equal(x)
    assert all_to_all(x, [3], [3]) is x
    with pytest.raises(ConfigError, match="split_sizes") as error:
        all_to_all_single(torch.empty(3, 2), x, [3], [2])
    assert "切成" in str(error.value)


def test_router_capacity_drops_later_tokens_and_the_balancing_loss_is_part_of_the_objective():
    torch.manual_seed(0)
    layer = MoE(8, [torch.nn.Linear(8, 8) for _ in range(4)], top_k=2, capacity_factor=0.5, aux_loss_coef=0.5)
    x = torch.randn(2, 16, 8, requires_grad=True)  # (B, T, C)
    route = layer.router(x.detach().reshape(32, 8), seq_len=16)
    assert capacity(16, experts=4, top_k=2, capacity_factor=0.5) == 4
    # Per sequence no expert keeps more than its capacity, and nothing is dropped needlessly.
    kept = torch.nn.functional.one_hot(route.expert, 4) * route.keep[..., None]
    assert kept.view(2, 16 * 2, 4).sum(dim=1).max() <= 4
    assert int((~route.keep).sum()) == int((route.routed - route.kept).sum()) > 0
    assert torch.allclose(route.gate.sum(dim=-1), torch.ones(32))  # top-2 gates renormalised
    # The gradient the layer sends into the router equals that of objective + coef x balance.
    w = torch.randn(2, 16, 8)
    layer.aux_grad_scale = 1.0
    (layer(x) * w).sum().backward()
    mine = layer.router.weight.weight.grad.clone()
    layer.zero_grad()
    layer.aux_grad_scale = 0.0  # balance gets no gradient here
    out = layer(x)
    ((out * w).sum() + 0.5 * layer.router(x.reshape(32, 8), seq_len=16).balance).backward()
    assert torch.allclose(layer.router.weight.weight.grad, mine, atol=1e-6)


def test_routing_is_deterministic_for_a_seed():
    x, y = global_batch(0, batch_size=4, seq_len=MOE.seq_len, seed=0)
    runs = []
    for seed in (0, 0, 1):
        model = build_model(MOE, seed=seed)
        model(x, y)
        runs.append(take_expert_stats(model))
    assert runs[0] == runs[1] and runs[0] != runs[2]
    model = build_model(MOE, seed=0)
    assert len(expert_parameters(model)) == 2 * 4 * 4  # layers x experts x (2 weights, 2 biases)
    assert model.blocks[0].mlp.local_experts == [0, 1, 2, 3]


def test_the_step_view_fills_one_piece_per_rank_per_step():
    from dtlab.lab.all_to_all_view import AllToAllView, arrived

    assert arrived(4, 0) == [[r == j for j in range(4)] for r in range(4)]
    assert all(all(row) for row in arrived(4, 3))
    counts = [[1, 2, 0], [3, 1, 1], [0, 4, 2]]  # counts[src][dst] rows
    view = AllToAllView(counts=counts)
    view.step()
    assert view.sent_rows() == [2, 1, 0]  # step 1: r -> r + 1
    assert sum(map(sum, view.state())) == 3 + 3
    view.step()
    view.step()  # no step beyond N - 1
    assert view.steps_done == 2 and view.sent_rows() == [2, 4, 4]
    assert "rank 0" in view.table.value and "2→0: 0" not in view.table.value  # a script's steps: not shown
    view.step_button.click()  # the learner's first press starts from step 0
    assert view.steps_done == 1 and "0→1: 2" in view.table.value and "1→0: 3" not in view.table.value
    view.step_button.click()
    assert "1→0: 3" in view.table.value


def test_the_planner_counts_what_the_model_holds_and_prices_the_all_to_all():
    from dtlab.planner import experts as moe_costs
    from dtlab.planner import params_per_rank
    from dtlab.planner.architectures import from_model_config
    from dtlab.planner.hardware import LINKS

    model, arch = build_model(MOE, seed=0), from_model_config(MOE)
    mlp = sum(p.numel() for p in build_model(dataclasses.replace(MOE, n_experts=0), seed=0).blocks[0].mlp.parameters())
    assert arch.param_count() == sum(p.numel() for p in model.parameters()) == MOE.param_count()
    assert arch.mlp_params() == mlp
    assert arch.active_param_count() == arch.param_count() - MOE.n_layer * 2 * mlp  # 2 of 4 idle
    held = apply_expert_parallel(build_model(MOE, seed=0))  # one process: every expert
    assert params_per_rank(arch, ep=1).total == sum(p.numel() for p in held.parameters())
    assert params_per_rank(arch, ep=2).experts == MOE.n_layer * 2 * mlp
    # One layer's dispatch on 2 ranks: k b s h values, half of them across the wire.
    nbytes = moe_costs.dispatch_bytes(micro_batch=4, seq_len=16, hidden=8, top_k=2, bytes_per_value=4)
    assert nbytes == 2 * 4 * 16 * 8 * 4
    assert moe_costs.all_to_all_bytes_sent(nbytes, ep=2, layers=1, micro_batches=1) == 4 * nbytes / 2
    link = LINKS["infiniband"]
    assert moe_costs.expert_parallel_comm_time(
        nbytes, ep=2, layers=2, micro_batches=3, link=link
    ) == 4 * 2 * 3 * all_to_all_time(nbytes, 2, link)
    assert moe_costs.expert_parallel_comm_time(nbytes, ep=1, layers=2, micro_batches=3, link=link) == 0.0
