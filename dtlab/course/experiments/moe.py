"""Lesson 14: the all-to-all on real ranks beside torch's, and the top-k dispatch exercise.

* :func:`all_to_all_versus_torch` (on ranks): dtlab's pairwise exchange and
  ``dist.all_to_all_single`` on the same pieces, even and uneven, with bytes
  and steps counted.
* The exercise: the learner writes the *top-k dispatch* (the router's (S, k)
  choices -> rows grouped by expert, dropped choices left out). An exercise is
  a reference (:func:`dtlab.moe.layer.sort_by_expert`), a check that runs on
  real ranks (:func:`check_dispatch`: the learner's function plugged into
  dtlab's expert-parallel MoE layer, compared with dtlab's own), and
  :func:`grade_dispatch`, which ships the learner's source to the ranks
  (a notebook's functions cannot be imported by a spawned process) and prints
  the verdict in both languages.
"""
from __future__ import annotations

import inspect
import textwrap
from dataclasses import asdict

import torch
import torch.distributed as dist

from dtlab.all_to_all import all_to_all_schedule, all_to_all_single
from dtlab.collectives import CommMeter, group_size_and_rank
from dtlab.moe import MoE, apply_expert_parallel
from dtlab.moe.layer import sort_by_expert


def all_to_all_versus_torch(ctx, nbytes: int = 1 << 20) -> dict:
    """One even all-to-all of an ``nbytes`` float32 tensor, metered and traced, beside torch's;
    then an uneven one (rank r sends r + j + 1 rows to rank j)."""
    n, rank = group_size_and_rank(None)
    x = (torch.arange(nbytes // 4) % 7 + rank).float().to(ctx.device)     # (nbytes / 4,)
    ours, theirs = torch.empty_like(x), torch.empty_like(x)
    meter, trace = CommMeter(), []
    all_to_all_single(ours, x, meter=meter, trace=trace)
    dist.all_to_all_single(theirs, x)
    send = [rank + j + 1 for j in range(n)]
    recv = [i + rank + 1 for i in range(n)]
    rows = torch.full((sum(send), 2), float(rank), device=ctx.device)      # (rows, 2)
    uneven, uneven_torch = (torch.empty(sum(recv), 2, device=ctx.device) for _ in range(2))
    all_to_all_single(uneven, rows, recv, send)
    dist.all_to_all_single(uneven_torch, rows, recv, send)
    expected = [asdict(e) for e in all_to_all_schedule(n) if e.rank == rank]
    return {"rank": rank, "nbytes": x.numel() * x.element_size(),
            "bytes_sent": meter.bytes_sent["all_to_all"], "steps": len(trace),
            "trace_is_schedule": [{k: t[k] for k in expected[0]} for t in trace] == expected,
            "equal_to_torch": torch.equal(ours, theirs),
            "uneven_equal_to_torch": torch.equal(uneven, uneven_torch)}


def routing_at_start(config, capacity_factors) -> dict:
    """In this process: what the untrained model's routers do with step 0's batch, per capacity factor.

    ``config`` is a :class:`dtlab.config.TrainConfig` with ``experts``; for each
    factor (``None``: no limit), the assignments routed and dropped over all
    MoE layers. No training, no ranks: routing is deterministic for a seed.
    """
    import dataclasses

    from dtlab.data import global_batch
    from dtlab.model import build_model
    from dtlab.moe import take_expert_stats

    out = {}
    for factor in capacity_factors:
        cfg = dataclasses.replace(config.model_config(), capacity_factor=factor)
        model = build_model(cfg, seed=config.seed)
        x, _ = global_batch(0, batch_size=config.batch_size, seq_len=cfg.seq_len, seed=config.seed)
        with torch.enable_grad():
            model(x)
        layers = take_expert_stats(model)
        out[factor] = {"routed": sum(sum(layer["routed"]) for layer in layers),
                       "dropped": sum(layer["dropped"] for layer in layers)}
    return out


# --------------------------------------------------------------------------- the exercise

def _layer(seed: int) -> MoE:
    """A small MoE layer (C = 8, E = 4, top-2, capacity factor 0.75: some choices are dropped)."""
    torch.manual_seed(seed)
    experts = [torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))
               for _ in range(4)]
    return MoE(8, experts, top_k=2, capacity_factor=0.75, aux_loss_coef=0.01)


def _run(layer: MoE, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
    x = x.clone().requires_grad_()
    out = layer(x)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    grads = {k: p.grad.clone() for k, p in layer.named_parameters()}
    layer.zero_grad()
    return torch.cat([out.detach().flatten(), x.grad.flatten()]), grads


def _problem(got, S: int, k: int) -> tuple[str, str] | None:
    """What is wrong with a dispatch's return value before running it, in both languages."""
    if not (isinstance(got, tuple) and len(got) == 3 and all(isinstance(g, torch.Tensor) for g in got)):
        return ("return three tensors: token, expert, gate", "请返回三个张量：token、expert、gate")
    token, expert, gate = got
    if not (token.shape == expert.shape == gate.shape and token.dim() == 1):
        return ("token, expert and gate must each be one row per kept choice, shape (A,)",
                "token、expert、gate 都应是每个保留的选择一行，形状为 (A,)")
    if token.numel() and (token.min() < 0 or token.max() >= S):
        return (f"token holds indices outside 0 .. {S - 1}", f"token 中有超出 0 .. {S - 1} 的下标")
    if expert.numel() > 1 and bool((expert[1:] < expert[:-1]).any()):
        return ("rows are not grouped by expert: the all-to-all sends each rank one contiguous piece",
                "行没有按专家分组：all-to-all 给每个 rank 发送的是连续的一段")
    return None


def check_dispatch(ctx, source: str, name: str) -> dict:
    """On each rank: the learner's ``name`` (defined by ``source``) in dtlab's MoE layer under
    expert parallelism over all ranks, against the same layer with dtlab's dispatch."""
    namespace = {"torch": torch}
    exec(compile(source, "<your dispatch>", "exec"), namespace)
    theirs = namespace[name]
    _, rank = group_size_and_rank(None)
    x = torch.randn(2, 12, 8, generator=torch.Generator().manual_seed(100 + rank))   # (B, T, C)
    layer = apply_expert_parallel(_layer(seed=0))
    expected, expected_grads = _run(layer, x)
    route = layer.router(x.reshape(24, 8), seq_len=12)
    choices = (route.expert, route.gate.detach(), route.keep)                  # (S, k) each
    try:
        got = theirs(*choices)
    except Exception as error:  # the learner's code: report it, and keep this rank in step
        got, problem = None, (f"your function raised {error!r}", f"你的函数抛出了异常 {error!r}")
    else:
        problem = _problem(got, 24, 2)
    if problem is None:
        wanted = sort_by_expert(*choices)
        if got[0].numel() != wanted[0].numel():
            problem = (f"{got[0].numel()} rows, but {wanted[0].numel()} choices were kept "
                       f"(dropped choices, keep == False, are not sent)",
                       f"共 {got[0].numel()} 行，但保留下来的选择有 {wanted[0].numel()} 个"
                       f"（被丢弃的选择，即 keep == False，不发送）")
    ok = problem is None
    # Every rank runs the same collectives whatever its verdict, so none is left waiting.
    layer.dispatch = theirs if ok else sort_by_expert
    got, got_grads = _run(layer, x)
    if ok and not (torch.allclose(got, expected, atol=1e-6)
                   and all(torch.allclose(got_grads[k], g, atol=1e-6) for k, g in expected_grads.items())):
        ok, problem = False, ("outputs or gradients differ from dtlab's dispatch (is each gate "
                              "with its own token and expert?)",
                              "输出或梯度与 dtlab 的分发结果不同（每个门控值是否与它自己的 token 和专家对应？）")
    return {"rank": rank, "ok": ok, "problem": problem}


def grade_dispatch(fn, world_size: int = 2) -> bool:
    """Grade the learner's top-k dispatch ``fn`` on ``world_size`` real ranks; print the verdict."""
    from dtlab.launch import run

    source = textwrap.dedent(inspect.getsource(fn))
    results = run(check_dispatch, world_size, source, fn.__name__)
    ok = all(r["ok"] for r in results)
    if ok:
        print(f"✓ your dispatch gives dtlab's outputs and gradients on {world_size} expert-parallel ranks")
        print(f"✓ 你的分发函数在 {world_size} 个专家并行 rank 上得到了与 dtlab 相同的输出和梯度")
    else:
        en, zh = next(r["problem"] for r in results if not r["ok"])
        print(f"✗ not yet: {en}")
        print(f"✗ 还没有通过：{zh}")
    return ok
