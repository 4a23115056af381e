"""Ring attention equals full causal attention, values and gradients, at CP 2 and 4, zigzag or not;
the small GPT under context parallelism (alone and with tensor parallelism) equals the dense one.

One launch of 4 ranks runs everything: CP 4 over the world, CP 2 over two
groups of two, and CP 2 x TP 2. The schedule, the merge and the layout are
checked in this process, without a process group.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

from dtlab.comm.collectives import CommMeter, group_size_and_rank
from dtlab.config import ModelConfig
from dtlab.course.experiments.long_sequences import activations_per_rank, ring_attention_run
from dtlab.course.experiments.tensor_parallel import dense_shard as _dense_shard
from dtlab.i18n import ConfigError
from dtlab.measure.memory import ActivationMeter
from dtlab.model import build_model, causal_attention
from dtlab.parallel.context_parallel import apply_context_parallel, average_over, shard_sequence
from dtlab.parallel.ring_attention import (
    DIAGONAL,
    KV,
    KV_GRAD,
    attention_block,
    merge,
    positions,
    ring_attention,
    ring_schedule,
)
from dtlab.parallel.sequence_parallel import apply_sequence_parallel
from dtlab.parallel.tensor_parallel import apply_tensor_parallel
from tests.harness import run_ranks

TOL = dict(atol=1e-5, rtol=1e-5)
CFG = ModelConfig(vocab_size=64, seq_len=32, n_layer=2, n_head=4, d_model=16)


def _randn(seed: int, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def attention_checks(group, zigzag: bool) -> dict:
    """Ring attention on this rank's tokens against full attention on the whole sequence."""
    size, rank = group_size_and_rank(group)
    B, nh, T, hs = 2, 3, 24, 8
    full = [_randn(i, B, nh, T, hs).requires_grad_() for i in range(3)]  # q, k, v
    w = _randn(3, B, nh, T, hs)  # weights the outputs
    (causal_attention(*full) * w).sum().backward()
    mine = positions(T, rank=rank, size=size, zigzag=zigzag)
    local = [t.detach()[:, :, mine].clone().requires_grad_() for t in full]
    meter, trace = CommMeter(), []
    out = ring_attention(*local, group=group, zigzag=zigzag, meter=meter, trace=trace)
    forward_calls = dict(meter.calls)
    (out * w[:, :, mine]).sum().backward()
    assert_close(out, causal_attention(*[t.detach() for t in full])[:, :, mine], **TOL)
    for name, a, b in zip("qkv", local, full):
        assert_close(a.grad, b.grad[:, :, mine], **TOL, msg=lambda m, n=name: f"d{n}: {m}")
    expected = [s for s in ring_schedule(size, zigzag=zigzag) if s.rank == rank]
    return {
        "forward": forward_calls,
        "all": dict(meter.calls),
        "bytes": dict(meter.nbytes),
        "trace_matches": trace == expected,
        "local_bytes": local[0].numel() * 4,
    }


def model_checks(cp_group, tp_group=None, sp: bool = False) -> dict:
    """The small GPT with CP (and TP when ``tp_group`` is given) against the dense model: loss, grads."""
    cp, _ = group_size_and_rank(cp_group)
    tp, tp_rank = group_size_and_rank(tp_group) if tp_group is not None else (1, 0)
    dense = build_model(CFG, seed=0)
    model = copy.deepcopy(dense)
    if tp > 1:
        (apply_sequence_parallel if sp else apply_tensor_parallel)(model, group=tp_group)
    apply_context_parallel(model, group=cp_group)
    g = torch.Generator().manual_seed(5)
    idx, tgt = (torch.randint(0, CFG.vocab_size, (2, CFG.seq_len), generator=g) for _ in range(2))
    dense_meter, meter = ActivationMeter(exclude=dense), ActivationMeter(exclude=model)
    with dense_meter.track():
        dense_loss = dense(idx, tgt)
        dense_loss.backward()
    with meter.track():
        loss = model(shard_sequence(idx, group=cp_group), shard_sequence(tgt, group=cp_group))
        loss.backward()
    average_over(model.parameters(), group=cp_group)
    dist.all_reduce(loss := loss.detach().clone(), group=cp_group)
    assert_close(loss / cp, dense_loss.detach(), **TOL)
    grads = dict(dense.named_parameters())
    for name, p in model.named_parameters():
        assert_close(
            p.grad, _dense_shard(name, grads[name].grad, tp_rank, tp), **TOL, msg=lambda m, n=name: f"grad {n}: {m}"
        )
    return {"loss": loss.item() / cp, "peaks": (dense_meter.peak, meter.peak), "cp": cp, "tp": tp}


def all_checks(ctx) -> dict:
    size, rank = group_size_and_rank(None)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # CP 2 (also: TP 2 in a 2 x 2)
    columns = [dist.new_group([0, 2]), dist.new_group([1, 3])]  # CP 2 across them
    pair, column = pairs[rank // 2], columns[rank % 2]
    out = {}
    for zigzag in (True, False):
        out[("cp4", zigzag)] = attention_checks(None, zigzag)
        out[("cp2", zigzag)] = attention_checks(pair, zigzag)
    out["model_cp4"] = model_checks(None)
    out["model_cp2"] = model_checks(pair)
    out["model_cp2_tp2"] = model_checks(column, pair)
    out["model_cp2_tp2_sp"] = model_checks(column, pair, sp=True)
    # Lesson 07's rank-side functions, on the same launch.
    out["lesson_ring"] = ring_attention_run(ctx, seq_len=32)
    out["lesson_sp"] = activations_per_rank(ctx, seq_len=32, d_model=16)
    return out


def test_ring_attention_and_context_parallel_model():
    results = run_ranks(all_checks, 4, timeout=120)
    for r in results:
        for cp in (2, 4):
            for zigzag in (True, False):
                a = r[(f"cp{cp}", zigzag)]
                assert a["trace_matches"]
                # K/V (one stacked tensor: 2 x local) passes N-1 times forward; backward passes
                # K/V with dK/dV (4 x local) N-1 times, then dK/dV (2 x local) home once.
                assert a["forward"] == {KV: cp - 1}
                assert a["all"] == {KV: cp - 1, KV_GRAD: cp}
                assert a["bytes"] == {
                    KV: (cp - 1) * 2 * a["local_bytes"],
                    KV_GRAD: ((cp - 1) * 4 + 2) * a["local_bytes"],
                }
        for key in ("model_cp4", "model_cp2"):
            # The accountant: every per-token activation divided by cp, and ring attention keeps no
            # (T x T) attention weights, so each rank holds less than 1/cp of the dense peak.
            dense_peak, cp_peak = r[key]["peaks"]
            assert cp_peak < dense_peak / r[key]["cp"], (key, dense_peak, cp_peak)
        losses = [r[k]["loss"] for k in r if str(k).startswith("model")]
        assert losses == pytest.approx([losses[0]] * 4, rel=1e-6)
        ring = r["lesson_ring"]
        assert ring["equal"] and ring["trace_is_schedule"]
        assert (ring["kv_passes_forward"], ring["kv_passes_backward"], ring["tiles"]) == (3, 4, 9)
        # The accountant: SP divides by t the four (B, T, C) tensors TP keeps whole on every rank
        # (inputs of both LayerNorms, of QKV and of the MLP's fc; Korthikanti et al.'s "10 sbh" term,
        # which counts 2-byte values and dropout masks), plus the LayerNorms' per-token mean and rstd.
        sp = r["lesson_sp"]
        t, L, sbh = sp["ranks"], sp["layers"], sp["sbh_bytes"]
        stats = 2 * 2 * (sbh // 16)  # 2 LayerNorms x (mean, rstd), one float per token
        assert sp["losses_agree"]
        assert sp["tp"] - sp["tp_sp"] == L * (4 * sbh + stats) * (t - 1) // t


def test_schedule_zigzag_balances_the_causal_work():
    for n in (2, 4):

        def tiles_per_rank(zigzag):
            counts = [0] * n
            for s in ring_schedule(n, zigzag=zigzag):
                counts[s.rank] += len(s.tiles)
            return counts

        assert tiles_per_rank(True) == [2 * n + 1] * n  # equal: 3 at step 0, then 2 per step
        assert tiles_per_rank(False) == list(range(1, n + 1))  # rank r computes r + 1 tiles
        for s in ring_schedule(n, zigzag=True):
            assert len(s.tiles) == (3 if s.step == 0 else 2)
            assert s.kv_from == (s.rank - s.step) % n
            assert all((t.kind == DIAGONAL) == (t.q_chunk == t.k_chunk) for t in s.tiles)


def test_merge_of_two_blocks_is_attention_over_both():
    q, k, v = (_randn(i, 1, 2, 5, 4) for i in range(3))
    o1, l1 = attention_block(q, k[:, :, :2], v[:, :, :2], causal=False)
    o2, l2 = attention_block(q, k[:, :, 2:], v[:, :, 2:], causal=False)
    o, lse = merge(o1, l1, o2, l2)
    s = q @ k.transpose(-2, -1) / 2.0
    assert_close(o, s.softmax(-1) @ v, **TOL)
    assert_close(lse, s.logsumexp(-1), **TOL)
    assert_close(merge(o2, l2, o1, l1)[0], o, **TOL)  # the order does not matter


def test_layout_and_refusals():
    assert positions(8, rank=0, size=2).tolist() == [0, 1, 6, 7]
    assert positions(8, rank=1, size=2).tolist() == [2, 3, 4, 5]
    assert positions(8, rank=1, size=2, zigzag=False).tolist() == [4, 5, 6, 7]
    assert shard_sequence(torch.arange(8).view(1, 8)).tolist() == [list(range(8))]  # no group: all
    with pytest.raises(ConfigError, match="cannot be cut into 8 equal chunks") as err:
        positions(12, rank=0, size=4)
    assert "等长" in str(err.value)


def test_ring_attention_step_view():
    from dtlab.i18n import set_language
    from dtlab.lab.ring_attention_view import RingAttentionView, tiles_done

    assert tiles_done(2, zigzag=True, steps=2) == {
        (0, 0): (0, 0),
        (3, 0): (0, 0),
        (3, 3): (0, 0),
        (1, 1): (1, 0),
        (2, 1): (1, 0),
        (2, 2): (1, 0),
        (1, 0): (1, 1),
        (2, 0): (1, 1),
        (3, 1): (0, 1),
        (3, 2): (0, 1),
    }
    view = RingAttentionView(4)
    assert view.passes() == 0 and view.tiles_per_rank() == [0, 0, 0, 0]
    for _ in range(6):  # more clicks than steps: stops at N
        view.step()
    assert view.steps_done == 4 and view.passes() == 3 and view.tiles_per_rank() == [9, 9, 9, 9]
    view.zigzag.value = False  # a change resets the view
    assert view.steps_done == 0
    for _ in range(4):
        view.step()
    assert view.tiles_per_rank() == [1, 2, 3, 4]
    try:
        set_language("zh")
        assert "第 4 步" in view.ring.value and "行：查询块" in view.matrix.value
    finally:
        set_language("en")
    assert "step 4 of 4" in view.ring.value
