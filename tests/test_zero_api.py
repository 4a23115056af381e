"""ZeRO's Python API as PyTorch users write against it (issue 14, item 6).

* ZeRO-1/2's :class:`ZeroOptimizer` is a ``torch.optim.Optimizer``: parameter
  groups with their own ``lr`` and ``weight_decay``, an lr scheduler writing
  ``param_groups``, equal to ``torch.optim.AdamW`` with the same groups on one
  process; ``state_dict()`` saved after k steps and loaded into a fresh
  optimizer continues exactly as the run that never stopped.
* ZeRO-3's wrapper keeps the module's parameter names (FSDP2's names), each
  holding this rank's 1-D shard, with a ``.grad`` of the shard's shape and
  dtype after backward; a plain ``torch.optim.AdamW`` over
  ``wrapper.module.parameters()``, with two groups, trains it equal to the
  reference, although every rank built its model from another seed (the
  wrapper broadcasts rank 0's weights).

One launch per world size runs every check.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from dtlab.data import shard
from dtlab.i18n import ConfigError
from dtlab.model import build_model
from dtlab.numerics.master_weights import MasterWeights, to_16_bit
from dtlab.parallel.zero import ZeroOptimizer, ZeroStage3, unit_modules
from tests.harness import run_ranks
from tests.test_zero import CFG, _batch

STEPS, SAVED_AT = 6, 3
DECAY, PLAIN = dict(weight_decay=0.1), dict(weight_decay=0.0, lr=3e-3)  # the two groups' own options
OPT = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
DIMS = {name: p.dim() for name, p in build_model(CFG, seed=0).named_parameters()}


def _groups(named):
    """Matrices decay, vectors don't (nanoGPT's rule), chosen by name: a ZeRO-3 shard is 1-D whatever it was."""
    named = list(named)
    return [
        {"params": [item for item in named if DIMS[item[0]] >= 2], **DECAY},
        {"params": [item for item in named if DIMS[item[0]] < 2], **PLAIN},
    ]


def _plain(groups):
    return [{**g, "params": [p for _, p in g["params"]]} for g in groups]


def _schedule(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))


def _steps(ctx, model, optimizer, scheduler, steps: range) -> list[float]:
    """Each rank its slice of each global batch; the loss is the mean over ranks."""
    losses = []
    for step in steps:
        x, y = (shard(t, index=ctx.rank, count=ctx.world_size) for t in _batch(step))  # (B / N, T)
        optimizer.zero_grad()
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        mean = loss.detach().reshape(1) / ctx.world_size
        if ctx.world_size > 1:
            dist.all_reduce(mean)
        losses.append(mean.item())
    return losses


def _reference():
    model = build_model(CFG, seed=0)
    optimizer = torch.optim.AdamW(_plain(_groups(model.named_parameters())), **OPT)
    losses = _steps(_One(), model, optimizer, _schedule(optimizer), range(STEPS))
    return losses, model.state_dict()


class _One:
    rank, world_size = 0, 1


def _diff(ours: dict, reference: dict) -> float:
    return max((ours[k] - reference[k]).abs().max().item() for k in reference)


def _zero(stage: int, offload: bool, seed: int = 0):
    model = build_model(CFG, seed=seed)
    optimizer = ZeroOptimizer(_groups(model.named_parameters()), torch.optim.AdamW, stage=stage, offload=offload, **OPT)
    return model, optimizer, _schedule(optimizer)


def _groups_against_adamw(ctx, reference) -> dict:
    ref_losses, ref_params = reference
    out = {}
    for stage in (1, 2):
        model, optimizer, scheduler = _zero(stage, False)
        losses = _steps(ctx, model, optimizer, scheduler, range(STEPS))
        out[stage] = {
            "optimizer": isinstance(optimizer, torch.optim.Optimizer),
            "lrs": [g["lr"] for g in optimizer.param_groups],
            "loss_diff": max(abs(a - b) / b for a, b in zip(losses, ref_losses)),
            "param_diff": _diff(model.state_dict(), ref_params),
        }
    return out


def _state_dict_round_trip(ctx) -> dict:
    """Saved after SAVED_AT steps, loaded into a fresh optimizer (and model), continued: as if never stopped."""
    out = {}
    for stage, offload in ((1, False), (2, False), (2, True)):
        model, optimizer, scheduler = _zero(stage, offload)
        _steps(ctx, model, optimizer, scheduler, range(SAVED_AT))
        saved = copy.deepcopy(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
        )
        _steps(ctx, model, optimizer, scheduler, range(SAVED_AT, STEPS))
        fresh, fresh_optimizer, fresh_scheduler = _zero(stage, offload, seed=1)  # other weights, no state
        fresh.load_state_dict(saved["model"])
        fresh_optimizer.load_state_dict(saved["optimizer"])
        fresh_scheduler.load_state_dict(saved["scheduler"])
        _steps(ctx, fresh, fresh_optimizer, fresh_scheduler, range(SAVED_AT, STEPS))
        out[(stage, offload)] = {
            "param_diff": _diff(fresh.state_dict(), model.state_dict()),
            "lrs": ([g["lr"] for g in fresh_optimizer.param_groups], [g["lr"] for g in optimizer.param_groups]),
        }
    return out


def _stage3(ctx, reference) -> dict:
    """ZeroStage3 alone (no apply_zero), every rank from its own seed, a plain AdamW over module.parameters()."""
    ref_losses, ref_params = reference
    wrapped = ZeroStage3(build_model(CFG, seed=ctx.rank))
    named = list(wrapped.module.named_parameters())
    optimizer = torch.optim.AdamW(_plain(_groups(named)), **OPT)
    x, y = (shard(t, index=ctx.rank, count=ctx.world_size) for t in _batch(0))
    wrapped(x, y).backward()
    grads_fit = all(p.grad is not None and p.grad.shape == p.shape and p.grad.dtype == p.dtype for _, p in named)
    optimizer.zero_grad()
    losses = _steps(ctx, wrapped, optimizer, _schedule(optimizer), range(STEPS))
    ranges = {name: (start, stop, shard_param.numel()) for name, shard_param, start, stop in wrapped.named_shards()}
    return {
        "names": [n for n, _ in named],
        "one_d": all(p.dim() == 1 for _, p in named),
        "ranges": ranges,
        "grads_fit": grads_fit,
        "fsdp2_names": _fsdp2_names(),
        "loss_diff": max(abs(a - b) / b for a, b in zip(losses, ref_losses)),
        "param_diff": _diff(wrapped.full_state_dict(), ref_params),
    }


def _fsdp2_names() -> list[str]:
    from torch.distributed.fsdp import fully_shard

    model = build_model(CFG, seed=0)
    for unit in unit_modules(model):
        fully_shard(unit)
    fully_shard(model)
    return [n for n, _ in model.named_parameters()]


def api_checks(ctx) -> dict:
    torch.manual_seed(0)
    reference = _reference()
    return {
        "groups": _groups_against_adamw(ctx, reference),
        "round_trip": _state_dict_round_trip(ctx),
        "stage3": _stage3(ctx, reference),
    }


_RESULTS: dict[int, list[dict]] = {}


def results(n: int) -> list[dict]:
    if n not in _RESULTS:
        _RESULTS[n] = run_ranks(api_checks, n, timeout=600.0)
    return _RESULTS[n]


@pytest.mark.parametrize("n", [1, 2, 4])
def test_zero_optimizer_with_two_groups_equals_adamw(n):
    for r in results(n):
        for stage, g in r["groups"].items():
            assert g["optimizer"], stage  # a torch.optim.Optimizer
            # the scheduler wrote each group's own lr: 1e-3 and 3e-3 over (1 + 6)
            assert g["lrs"] == pytest.approx([1e-3 / (1 + STEPS), 3e-3 / (1 + STEPS)]), g
            assert g["loss_diff"] < 1e-5 and g["param_diff"] < 2e-5, (stage, g)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_state_dict_round_trip_continues_exactly(n):
    for r in results(n):
        for case, c in r["round_trip"].items():
            assert c["param_diff"] == 0.0, (case, c)
            assert c["lrs"][0] == c["lrs"][1], (case, c)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_stage3_module_keeps_its_names_each_a_shard(n):
    ranks = results(n)
    names = list(DIMS)
    whole = {name: p.numel() for name, p in build_model(CFG, seed=0).named_parameters()}
    for r in ranks:
        s = r["stage3"]
        assert s["names"] == names == s["fsdp2_names"]  # the module's own names, as FSDP2 keeps them
        assert s["one_d"] and s["grads_fit"]
        assert s["loss_diff"] < 1e-5 and s["param_diff"] < 2e-5, s  # ranks seeded 0..N-1: rank 0's won
    for name in names:  # the ranks' shards of each parameter are disjoint ranges that cover it
        held = sorted((start, stop) for r in ranks for start, stop, k in [r["stage3"]["ranges"][name]] if k)
        assert [r["stage3"]["ranges"][name][2] for r in ranks] == [
            r["stage3"]["ranges"][name][1] - r["stage3"]["ranges"][name][0] for r in ranks
        ]
        assert held[0][0] == 0 and held[-1][1] == whole[name]
        assert all(a[1] == b[0] for a, b in zip(held, held[1:])), (name, held)


def test_groups_are_checked_as_torch_optim_checks_them():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    first, second = model[0], model[1]
    with pytest.raises(ConfigError, match="two parameter groups"):
        ZeroOptimizer([{"params": first.parameters()}, {"params": [first.weight, *second.parameters()]}])
    with pytest.raises(ConfigError, match="one tensor"):
        ZeroOptimizer(first.weight)
    optimizer = ZeroOptimizer(
        [{"params": first.parameters()}, {"params": second.parameters(), "lr": 0.5}], torch.optim.SGD, lr=0.1
    )
    assert [g["lr"] for g in optimizer.param_groups] == [0.1, 0.5]
    buckets = ZeroOptimizer(model.parameters(), torch.optim.SGD, stage=2, bucket_mb=1e-3, lr=0.1)
    with pytest.raises(ConfigError, match="bucket"):
        buckets.add_param_group({"params": [nn.Parameter(torch.zeros(2))]})


def _add_group_run(ctx, stage: int, master: bool) -> float:
    """Two steps over the first layer, add the second as a group of its own (lr x 0.5), two more steps;
    the largest difference from torch's AdamW (or MasterWeights over it) doing the same on one process."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    ref = copy.deepcopy(net)
    if master:
        to_16_bit(net, torch.bfloat16)
        to_16_bit(ref, torch.bfloat16)
        ours = ZeroOptimizer(net[0].parameters(), torch.optim.AdamW, stage=stage, master_weights=True, lr=1e-2)
        theirs = MasterWeights(ref[0].parameters(), torch.optim.AdamW, lr=1e-2)
    else:
        ours = ZeroOptimizer(net[0].parameters(), torch.optim.AdamW, stage=stage, lr=1e-2)
        theirs = torch.optim.AdamW(ref[0].parameters(), lr=1e-2)
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(1)).to(next(net.parameters()).dtype)
    for step in range(4):
        if step == 2:
            ours.add_param_group({"params": list(net[2].parameters()), "lr": 5e-3})
            theirs.add_param_group({"params": list(ref[2].parameters()), "lr": 5e-3})
        for model, optimizer in ((net, ours), (ref, theirs)):
            optimizer.zero_grad()
            model(x).float().pow(2).mean().backward()  # the same batch on every rank: the mean is the gradient
            optimizer.step()
    return max((a.float() - b.float()).abs().max().item() for a, b in zip(net.parameters(), ref.parameters()))


def add_group_checks(ctx) -> dict:
    return {
        f"stage {s}{' master' if m else ''}": _add_group_run(ctx, s, m) for s, m in ((1, False), (2, False), (1, True))
    }


@pytest.mark.parametrize("n", [2, 4])
def test_add_param_group_after_construction_as_zero_redundancy_optimizer_allows(n):
    for rank in run_ranks(add_group_checks, n):
        assert max(rank.values()) < 1e-6, rank  # the same steps, states and masters as on one process
