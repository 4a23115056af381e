"""Sequence parallelism equals tensor parallelism without it, and the dense model: loss, grads, params.

One launch of 4 ranks checks TP 4 (the whole world) and TP 2 (two groups of
two) at once. Every rank builds the dense model with the same seed, a TP copy
and a TP + SP copy, trains all three for a few SGD steps on the same batch,
and compares: SP's loss with the dense loss, SP's gradients and parameters
with TP's (the same shards, under the same names) and with its shard of the
dense ones. It also returns the collective counts and activation peaks.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

from dtlab.comm.collectives import CommMeter, group_size_and_rank
from dtlab.config import ModelConfig
from dtlab.course.experiments.tensor_parallel import dense_shard as _dense_shard
from dtlab.i18n import ConfigError
from dtlab.measure.memory import ActivationMeter
from dtlab.model import build_model
from dtlab.parallel.sequence_parallel import (
    GATHER_BACKWARD,
    GATHER_FORWARD,
    PARAM_GRADS,
    REGATHER,
    SCATTER_BACKWARD,
    SCATTER_FORWARD,
    apply_sequence_parallel,
    my_tokens,
)
from dtlab.parallel.tensor_parallel import BACKWARD, FORWARD, apply_tensor_parallel
from tests.harness import run_ranks

CFG = ModelConfig(vocab_size=64, seq_len=16, n_layer=2, n_head=4, d_model=16)
TOL = dict(atol=2e-6, rtol=1e-5)
B = 2


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(0, CFG.vocab_size, (B, CFG.seq_len), generator=g),
        torch.randint(0, CFG.vocab_size, (B, CFG.seq_len), generator=g),
    )


def _train(model, comm: CommMeter | None = None, steps: int = 3) -> dict:
    """SGD steps on the same batches; the first step's loss, gradients, collectives, activation peak.

    (SGD, not Adam: attention's key bias has an exactly zero gradient, and Adam
    would turn its rounding noise into full-size steps.)
    """
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    for step in range(steps):
        idx, tgt = _batch(step)
        opt.zero_grad()
        meter = ActivationMeter(exclude=model)
        with meter.track():
            loss = model(idx, tgt)
            loss.backward()
        if step == 0:
            first = {
                "loss": loss.detach(),
                "peak": meter.peak,
                "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
                "calls": dict(comm.calls) if comm else {},
                "bytes": dict(comm.nbytes) if comm else {},
            }
        opt.step()
    return first


def sp_checks(group) -> dict:
    """Dense, TP and TP + SP over ``group``: equal; returns counts, bytes and activation peaks."""
    size, rank = group_size_and_rank(group)
    dense = build_model(CFG, seed=0)
    tp_meter, sp_meter = CommMeter(), CommMeter()
    tp = apply_tensor_parallel(copy.deepcopy(dense), group=group, meter=tp_meter)
    sp = apply_sequence_parallel(copy.deepcopy(dense), group=group, meter=sp_meter)
    assert [n for n, _ in sp.named_parameters()] == [n for n, _ in tp.named_parameters()]
    d, t, s = _train(dense), _train(tp, tp_meter), _train(sp, sp_meter)
    assert_close(s["loss"], d["loss"], **TOL)
    assert_close(s["loss"], t["loss"], **TOL)
    params = dict(sp.named_parameters())
    for name, p in dense.named_parameters():  # after three steps each
        assert_close(s["grads"][name], t["grads"][name], **TOL, msg=lambda m, n=name: f"grad {n}: {m}")
        assert_close(s["grads"][name], _dense_shard(name, d["grads"][name], rank, size), **TOL)
        assert_close(
            params[name],
            _dense_shard(name, p.detach(), rank, size),
            atol=1e-5,
            rtol=1e-4,
            msg=lambda m, n=name: f"param {n}: {m}",
        )
    return {
        "size": size,
        "tp_calls": t["calls"],
        "tp_bytes": t["bytes"],
        "sp_calls": s["calls"],
        "sp_bytes": s["bytes"],
        "peaks": (d["peak"], t["peak"], s["peak"]),
    }


def all_checks(ctx) -> dict:
    size, rank = group_size_and_rank(None)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    return {"tp4": sp_checks(None), "tp2": sp_checks(pairs[rank // 2])}


def test_sequence_parallel_equals_tp_and_dense():
    results = run_ranks(all_checks, 4, timeout=120)
    L, BTC = CFG.n_layer, B * CFG.seq_len * CFG.d_model * 4  # bytes of one (B, T, C)
    for result in results:
        for key, t in (("tp2", 2), ("tp4", 4)):
            r = result[key]
            assert r["size"] == t
            assert r["tp_calls"] == {FORWARD: 2 * L, BACKWARD: 2 * L}
            # Korthikanti et al. Fig. 5: per block 2 all-gathers and 2 reduce-scatters each way, plus
            # the model's entry (backward all-gather) and exit (forward all-gather); the column layers'
            # inputs gathered again in backward; one all-reduce per LayerNorm weight/bias and row bias.
            assert r["sp_calls"] == {
                GATHER_FORWARD: 2 * L + 1,
                SCATTER_FORWARD: 2 * L,
                GATHER_BACKWARD: 2 * L + 1,
                SCATTER_BACKWARD: 2 * L,
                REGATHER: 2 * L,
                PARAM_GRADS: 6 * L,
            }
            # Same bytes on the wire as TP's all-reduces: a ring all-reduce sends 2(t-1)/t of the
            # tensor per rank, an all-gather or a reduce-scatter (t-1)/t.
            assert r["tp_bytes"][FORWARD] == 2 * L * BTC
            assert r["sp_bytes"][SCATTER_FORWARD] == 2 * L * BTC
            assert r["sp_bytes"][GATHER_FORWARD] == (2 * L + 1) * BTC
            dense_peak, tp_peak, sp_peak = r["peaks"]
            assert sp_peak < tp_peak < dense_peak


def test_tokens_that_do_not_split():
    with pytest.raises(ConfigError, match="cannot be split over tp = 3") as err:
        from dtlab.parallel.sequence_parallel import _check_tokens

        _check_tokens(16, 3)
    assert "序列并行" in str(err.value)
    assert my_tokens(torch.arange(6).view(1, 6), None).tolist() == [[0, 1, 2, 3, 4, 5]]
