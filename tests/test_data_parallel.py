"""The three DP versions against the single-process reference and against torch's DDP.

Each rank gets its slice of one global batch; the reference is one model on
the whole batch. One launch per world size runs every check for every version.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import dtlab.train
from dtlab.cli import build_parser, config_from_args
from dtlab.comm import ring_backend as comm_ring
from dtlab.comm.ring_backend import collectives
from dtlab.config import DP_MODES, TrainConfig
from dtlab.i18n import ConfigError
from dtlab.parallel.data_parallel import DP_VERSIONS, apply_data_parallel
from dtlab.planner.hardware import LINKS
from dtlab.reference import reference_train
from tests.harness import cores_per_rank, run_ranks, session_pool

BATCH, SEQ, VOCAB = 8, 5, 16  # global batch of 8 sequences: 8 / (4 ranks x 2 micro-steps) = 1
ACCUM = 2
CAP_MB = 1e-3  # ~1 kB buckets, so the small model needs several


class TiedNet(nn.Module):
    """A small LM with the two cases DP must count right: a tied weight and a frozen one."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.mix = nn.Linear(8, 8)
        self.mix.weight.requires_grad_(False)  # frozen weight, trainable bias
        self.mlp = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
        self.head = nn.Linear(8, VOCAB, bias=False)
        self.head.weight = self.emb.weight  # tied: one Parameter, used twice

    def forward(self, x, y):
        h = self.mix(self.emb(x))  # (B, T, 8)
        h = h + self.mlp(h)
        return F.cross_entropy(self.head(h).flatten(0, 1), y.flatten())


GRAD_PARAMS = 6  # emb (= head), mix.bias, and the MLP's two weights and two biases


def _net(seed: int) -> TiedNet:
    torch.manual_seed(seed)
    return TiedNet()


def _batch(step: int):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return x, torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)  # (B, T) each


def _slice(t: torch.Tensor, index: int, count: int) -> torch.Tensor:
    per = t.shape[0] // count
    return t[index * per : (index + 1) * per]


def _grads(model: nn.Module) -> dict:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max((a[k] - b[k]).abs().max().item() for k in a)


VERSIONS = {  # label: (dp_mode, options)
    "per_parameter": ("per_parameter", {}),
    "bucketed": ("bucketed", {"bucket_cap_mb": CAP_MB}),
    "overlapped": ("overlapped", {"bucket_cap_mb": CAP_MB}),
    "overlapped, dtlab ring": ("overlapped", {"bucket_cap_mb": CAP_MB, "use_ring": True}),
}


def _check_version(mode: str, options: dict, rank: int, n: int) -> dict:
    reference = _net(0)
    x, y = _batch(0)
    reference(x, y).backward()
    out = {}

    # 1. One step: the averaged gradients equal the single-process ones. Every
    # rank but 0 starts from other weights: the broadcast must fix that.
    dp = apply_data_parallel(_net(rank), mode=mode, **options)
    out["buckets"] = len(getattr(dp, "buckets", dp.grad_params))
    # The calls issued while backward still computes: counted when the first layer's weight (among the
    # last gradients backward produces) has its gradient; registered after dp's own hook, so it runs after it.
    during = []
    dp.grad_params[0].register_post_accumulate_grad_hook(lambda p: during.append(dp.meter.calls["all_reduce"]))
    dp(_slice(x, rank, n), _slice(y, rank, n)).backward()
    out["calls_during_backward"] = during[0]
    out["calls_before_finish"] = dp.meter.calls["all_reduce"]  # when backward() returned: all of them, as DDP's
    dp.finish_gradient_sync()
    out["calls"] = dp.meter.calls["all_reduce"]
    out["grad"] = _max_diff(_grads(dp.module), _grads(reference))
    out["frozen_grad"] = dp.module.mix.weight.grad

    # 2. Accumulation: K micro-steps of B/(nK) equal one step on B/n, communicating once.
    dp.zero_grad(set_to_none=True)
    dp.meter.reset()
    xs, ys = _slice(x, rank, n), _slice(y, rank, n)
    for i in range(ACCUM):
        if i < ACCUM - 1:
            with dp.no_sync():
                (dp(_slice(xs, i, ACCUM), _slice(ys, i, ACCUM)) / ACCUM).backward()
                dp.finish_gradient_sync()  # inside no_sync: nothing to do yet
            out["calls_during_no_sync"] = dp.meter.calls["all_reduce"]
        else:
            (dp(_slice(xs, i, ACCUM), _slice(ys, i, ACCUM)) / ACCUM).backward()
    dp.finish_gradient_sync()
    out["accum_calls"] = dp.meter.calls["all_reduce"]
    out["accum_grad"] = _max_diff(_grads(dp.module), _grads(reference))

    # 3. Ten AdamW steps end with the same parameters as torch's DDP.
    ours = apply_data_parallel(_net(rank), mode=mode, **options)
    ddp = DistributedDataParallel(_net(0))
    for model in (ours, ddp):
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        for step in range(10):
            x, y = _batch(step)
            optimizer.zero_grad(set_to_none=True)
            model(_slice(x, rank, n), _slice(y, rank, n)).backward()
            if model is ours:
                model.finish_gradient_sync()
            optimizer.step()
    out["vs_ddp"] = max((a - b).abs().max().item() for a, b in zip(ours.module.parameters(), ddp.module.parameters()))
    return out


def _all_versions_on_rank(ctx) -> dict:
    results = {label: _check_version(*version, ctx.rank, ctx.world_size) for label, version in VERSIONS.items()}
    # OverlappedDP on --collectives dtlab: its buckets over shared memory, left in flight on this
    # thread and moved on by the gradient hooks (a core per rank), or run by the worker thread.
    flights = []
    started = comm_ring.start_ring_all_reduce
    comm_ring.start_ring_all_reduce = lambda *a, **k: flights.append(started(*a, **k)) or flights[-1]
    try:
        for enough in (True, False):
            flights.clear()
            with cores_per_rank(enough), collectives("dtlab", "gloo"):
                got = _check_version("overlapped", {"bucket_cap_mb": CAP_MB}, ctx.rank, ctx.world_size)
            got["in_flight"] = sum(f is not None for f in flights)
            results[f"overlapped, dtlab collectives, {1 if enough else 1 << 20} local ranks"] = got
    finally:
        comm_ring.start_ring_all_reduce = started
    return results


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_every_version_matches_the_reference_and_ddp(world_size):
    for rank, results in enumerate(run_ranks(_all_versions_on_rank, world_size)):
        for label, got in results.items():
            mode, where = VERSIONS[label][0] if label in VERSIONS else "overlapped", (rank, label, got)
            assert got["grad"] < 1e-6 and got["accum_grad"] < 1e-6, where
            assert got["vs_ddp"] < 1e-5, where
            assert got["frozen_grad"] is None, where
            # The promised number of collectives, and none at all for a world of one.
            per_step = 0 if world_size == 1 else got["buckets"]
            assert got["calls"] == got["accum_calls"] == per_step, where
            assert got["calls_during_no_sync"] == 0, where
            if "dtlab collectives" in label:  # buckets left in flight only with a core per rank
                assert (got["in_flight"] > 0) == (" 1 local" in label and world_size > 1), where
            if mode == "per_parameter":
                assert got["buckets"] == GRAD_PARAMS
            else:
                assert 1 < got["buckets"] < GRAD_PARAMS
            # By the time backward() returns every version has averaged the gradients (an autograd
            # callback, as DDP's); only the overlapped one launched buckets while backward still computed.
            assert got["calls_before_finish"] == per_step, where
            if mode == "overlapped" and world_size > 1:
                assert got["calls_during_backward"] >= 1, where
            else:
                assert got["calls_during_backward"] == 0, where


def test_trainer_with_dp4_and_accumulation_matches_the_single_process_reference():
    pool = session_pool()
    run = dtlab.train.start(TrainConfig(dp=4, grad_accum=2, steps=20, seed=0), pool=pool).wait()
    reference = reference_train(TrainConfig(steps=20, seed=0))[0]
    assert max(abs(a - b) / abs(b) for a, b in zip(run.losses(), reference)) < 1e-4
    assert len(run.losses()) == 20
    for mode in ("bucketed", "per_parameter"):
        run = dtlab.train.start(TrainConfig(dp=2, dp_mode=mode, steps=3, seed=0, model="tiny"), pool=pool).wait()
        reference = reference_train(TrainConfig(steps=3, seed=0, model="tiny"))[0]
        assert max(abs(a - b) / abs(b) for a, b in zip(run.losses(), reference)) < 1e-4, mode


def test_dp_mode_is_validated_and_reaches_the_cli():
    assert set(DP_MODES) == set(DP_VERSIONS)
    with pytest.raises(ConfigError, match="dp_mode='ring'") as error:
        TrainConfig(dp_mode="ring").validate()
    assert "之一" in str(error.value)
    args = build_parser().parse_args(["train", "--dp", "2", "--dp-mode", "bucketed"])
    assert config_from_args(args).dp_mode == "bucketed"
    assert TrainConfig().dp_mode == "overlapped"
    with pytest.raises(ConfigError, match="use_ring=True"):
        apply_data_parallel(TiedNet(), link=LINKS["ethernet"])


def test_the_dp_benchmark_times_both_wrappers_in_turn_and_they_train_the_same():
    """``dtlab bench dp`` trains a copy of the model under each wrapper (OverlappedDP on dtlab's and on
    torch's collectives, DDP), a step of each in turn: every timed step of each is timed (the slowest
    rank's), and the copies end with the same parameters."""
    from dtlab.bench import dp as dp_bench

    results = run_ranks(dp_bench._paired_step_times, 2)
    assert all(results[0][kind] == results[1][kind] for kind in dp_bench.KINDS)  # the slowest rank's, on both
    for kind in dp_bench.KINDS:
        assert len(results[0][kind]) == dp_bench.TIMED_STEPS and all(t > 0 for t in results[0][kind])
    assert all(r["max_param_difference"] < 1e-4 for r in results)  # measured 5.6e-7: sums in another order
