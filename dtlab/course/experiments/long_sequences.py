"""Lesson 13: sequence parallelism and ring attention on real ranks, and the online-softmax exercise.

* :func:`activations_per_rank` (on ranks): the activation bytes one training
  step holds for backward on each rank of a TP group, with and without
  sequence parallelism, beside the dense model's, and whether the losses agree.
* :func:`ring_attention_run` (on ranks): ring attention over the world against
  full causal attention (values and gradients), the K/V passes counted, the
  tiles each rank computed.
* The exercise: the learner writes the *online-softmax merge* of two
  attention blocks, ``merge(o_a, lse_a, o_b, lse_b) -> (o, lse)``. The
  reference is :func:`dtlab.ring_attention.merge`; :func:`check_merge` runs
  the learner's function inside dtlab's ring attention on real ranks and
  compares outputs and gradients with full attention; :func:`grade_merge`
  ships the learner's source to the ranks (a notebook's functions cannot be
  imported by a spawned process) and prints the verdict in both languages.
"""
from __future__ import annotations

import copy
import inspect
import textwrap

import torch

from dtlab.collectives import CommMeter, group_size_and_rank
from dtlab.config import ModelConfig
from dtlab.memory import ActivationMeter
from dtlab.model import build_model, causal_attention
from dtlab.ring_attention import KV, KV_GRAD, merge, positions, ring_attention, ring_schedule
from dtlab.sequence_parallel import apply_sequence_parallel
from dtlab.tensor_parallel import apply_tensor_parallel


def _step_activations(model, idx, tgt) -> tuple[float, int]:
    """One forward and backward: the loss and the peak bytes held for backward."""
    meter = ActivationMeter(exclude=model)
    with meter.track():
        loss = model(idx, tgt)
        loss.backward()
    return loss.item(), meter.peak


def activations_per_rank(ctx, *, seq_len: int = 256, d_model: int = 64, n_head: int = 4,
                         n_layer: int = 2, batch: int = 2) -> dict:
    """Activation peak on this rank: dense, TP over the world, TP + SP over the world."""
    size, rank = group_size_and_rank(None)
    cfg = ModelConfig(vocab_size=256, seq_len=seq_len, n_layer=n_layer, n_head=n_head, d_model=d_model)
    g = torch.Generator().manual_seed(1)
    idx, tgt = (torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=g) for _ in range(2))
    dense = build_model(cfg, seed=0)
    out = {"rank": rank, "ranks": size, "sbh_bytes": batch * seq_len * d_model * 4, "layers": n_layer}
    for name, apply in (("dense", None), ("tp", apply_tensor_parallel), ("tp_sp", apply_sequence_parallel)):
        model = copy.deepcopy(dense)
        if apply is not None:
            apply(model, group=None)
        out[f"{name}_loss"], out[name] = _step_activations(model, idx, tgt)
    out["losses_agree"] = abs(out["tp_sp_loss"] - out["dense_loss"]) < 1e-5 * abs(out["dense_loss"])
    return out


def _qkv(seq_len: int, batch: int = 2, heads: int = 2, head_size: int = 8):
    """The same full q, k, v (B, nh, T, hs) on every rank, with gradients wanted."""
    g = torch.Generator().manual_seed(7)
    return [torch.randn(batch, heads, seq_len, head_size, generator=g).requires_grad_() for _ in range(3)]


def _ring_versus_full(seq_len: int, zigzag: bool, combine) -> dict:
    size, rank = group_size_and_rank(None)
    full = _qkv(seq_len)
    w = torch.randn(full[0].shape, generator=torch.Generator().manual_seed(8))   # weights the outputs
    (causal_attention(*full) * w).sum().backward()
    mine = positions(seq_len, rank=rank, size=size, zigzag=zigzag)
    local = [t.detach()[:, :, mine].clone().requires_grad_() for t in full]
    meter, trace = CommMeter(), []
    out = ring_attention(*local, zigzag=zigzag, meter=meter, trace=trace, combine=combine)
    passes_forward = meter.calls[KV]
    (out * w[:, :, mine]).sum().backward()
    reference = causal_attention(*[t.detach() for t in full])[:, :, mine]
    return {
        "rank": rank,
        "max_diff": (out.detach() - reference).abs().max().item(),
        "max_grad_diff": max((a.grad - b.grad[:, :, mine]).abs().max().item() for a, b in zip(local, full)),
        "kv_passes_forward": passes_forward,
        "kv_passes_backward": meter.calls[KV_GRAD],
        "tiles": sum(len(s.tiles) for s in trace),
        "trace_is_schedule": trace == [s for s in ring_schedule(size, zigzag=zigzag) if s.rank == rank],
    }


def ring_attention_run(ctx, *, seq_len: int = 64, zigzag: bool = True) -> dict:
    """Ring attention over all ranks against full causal attention on the whole sequence."""
    result = _ring_versus_full(seq_len, zigzag, merge)
    result["equal"] = result["max_diff"] < 1e-5 and result["max_grad_diff"] < 1e-5
    return result


# --------------------------------------------------------------------------- the exercise

def check_merge(ctx, source: str, name: str) -> dict:
    """On each rank: ring attention with the learner's merge ``name`` (defined by ``source``)
    against full causal attention, values and gradients, with and without zigzag."""
    namespace = {"torch": torch}
    exec(compile(source, "<your merge>", "exec"), namespace)
    theirs = namespace[name]
    _, rank = group_size_and_rank(None)
    problem = None
    o, lse = torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3)
    try:
        got = theirs(o, lse, o, lse)
        if not (isinstance(got, tuple) and len(got) == 2 and got[0].shape == o.shape
                and got[1].shape == lse.shape):
            problem = ("return a pair (o, lse) shaped like o_a and lse_a",
                       "请返回一对 (o, lse)，形状分别与 o_a 和 lse_a 相同")
    except Exception as error:  # the learner's code: report it, and keep this rank in step
        problem = (f"your function raised {error!r}", f"你的函数抛出了异常 {error!r}")
    combine = theirs if problem is None else merge
    # Every rank runs the same sends whatever its verdict, so none is left waiting.
    results = [_ring_versus_full(32, zigzag, combine) for zigzag in (True, False)]
    worst = max(max(r["max_diff"], r["max_grad_diff"]) for r in results)
    if problem is None and not worst < 1e-5:
        problem = (f"ring attention with your merge differs from full attention by {worst:.3g} "
                   "(is the new lse log(e^lse_a + e^lse_b), and is each o weighted by e^(lse_x − lse)?)",
                   f"使用你的合并函数的环形注意力与完整注意力相差 {worst:.3g}"
                   "（新的 lse 是否等于 log(e^lse_a + e^lse_b)？每个 o 的权重是否为 e^(lse_x − lse)？）")
    return {"rank": rank, "ok": problem is None, "problem": problem, "max_diff": worst}


def grade_merge(fn, world_size: int = 2) -> bool:
    """Grade the learner's online-softmax merge ``fn`` on ``world_size`` real ranks; print the verdict."""
    from dtlab.launch import run

    source = textwrap.dedent(inspect.getsource(fn))
    results = run(check_merge, world_size, source, fn.__name__)
    ok = all(r["ok"] for r in results)
    if ok:
        print(f"✓ ring attention with your merge equals full attention (values and gradients) "
              f"on {world_size} ranks")
        print(f"✓ 使用你的合并函数，环形注意力在 {world_size} 个 rank 上与完整注意力相同（数值与梯度）")
    else:
        en, zh = next(r["problem"] for r in results if not r["ok"])
        print(f"✗ not yet: {en}")
        print(f"✗ 还没有通过：{zh}")
    return ok
