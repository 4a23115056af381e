"""Lesson 12 (mixture of experts): the answer key, and the exercise "the top-k dispatch".

The learner writes ``top_k_dispatch(expert, gate, keep)``: from the router's
(S, k) choices, one row per *kept* choice, grouped by expert, as
``(token, expert, gate)`` tensors of shape (A,). The check plugs it into
dtlab's MoE layer (:class:`dtlab.parallel.moe.MoE`, whose ``dispatch`` is swappable)
under expert parallelism over the ranks, and compares the layer's outputs and
gradients with the same layer using dtlab's own dispatch
(:func:`dtlab.parallel.moe.layer.sort_by_expert`).
"""

from __future__ import annotations

import torch

from dtlab.comm.collectives import group_size_and_rank
from dtlab.course.exercises.model import Exercise, Mistake, Prediction
from dtlab.course.exercises.ranks import (
    NotDone,
    call,
    difference,
    does_not_compile,
    learner_function,
    not_done,
    verdict,
)
from dtlab.parallel.moe import MoE, apply_expert_parallel
from dtlab.parallel.moe.layer import sort_by_expert

N, MIB, T, K, E = 4, 1 << 20, 64, 2, 4

PREDICTIONS = (
    Prediction(
        "12.a2a_steps",
        12,
        "steps of the pairwise exchange on 4 ranks",
        "4 个 rank 上成对交换的步数",
        answer=N - 1,
        hint_en="an integer",
        hint_zh="整数",
        mistakes=(
            Mistake(
                N,
                "a rank's piece for itself is a local copy: N-1 steps reach the others",
                "发给自己的那一块是本地复制：N-1 步就覆盖了其他所有 rank",
            ),
            Mistake(
                2 * (N - 1),
                "that is a ring all-reduce; an all-to-all has no second phase",
                "那是环形全归约的步数；全对全没有第二个阶段",
            ),
        ),
    ),
    Prediction(
        "12.a2a_fraction",
        12,
        "fraction of its tensor each rank sends",
        "每个 rank 发出的张量比例",
        answer=(N - 1) / N,
        rel_tol=0.01,
        hint_en="a fraction, e.g. 0.5",
        hint_zh="比例，例如 0.5",
        mistakes=(
            Mistake(
                1.0, "each rank keeps its own piece, 1/N of the tensor", "每个 rank 留下自己的那一块，即张量的 1/N"
            ),
            Mistake(
                2 * (N - 1) / N,
                "2(N-1)/N is the all-reduce's factor; an all-to-all sends each piece once",
                "2(N-1)/N 是全归约的系数；全对全每块只发送一次",
            ),
        ),
    ),
    Prediction(
        "12.a2a_bytes",
        12,
        "bytes each rank sends, 4 MiB on 4 ranks",
        "4 个 rank 上 4 MiB 时每个 rank 发送的字节数",
        answer=(N - 1) * 4 * MIB // N,
        hint_en="bytes, an integer",
        hint_zh="字节数（整数）",
        mistakes=(
            Mistake(
                4 * MIB,
                "the piece for itself stays: (N-1)/N leaves the rank",
                "发给自己的那一块不离开：只有 (N-1)/N 被发出",
            ),
            Mistake(2 * (N - 1) * 4 * MIB // N, "that is a ring all-reduce", "那是环形全归约的发送量"),
        ),
        why_en="N-1 steps, one nbytes/N piece each",
        why_zh="N-1 步，每步一块 nbytes/N",
    ),
    Prediction(
        "12.capacity",
        12,
        "places per expert per sequence at capacity factor 1.0",
        "容量因子 1.0 时每个专家在每条序列中的位置数",
        answer=T * K // E,
        hint_en="an integer: ceil(factor x T x k / E)",
        hint_zh="整数：ceil(因子 x T x k / E)",
        mistakes=(
            Mistake(
                T // E,
                "each token makes k = 2 choices: 2T assignments per sequence",
                "每个 token 做 k = 2 次选择：每条序列有 2T 个分配",
            ),
        ),
    ),
    Prediction(
        "12.dropped_at_2",
        12,
        "assignments dropped at capacity factor 2.0",
        "容量因子 2.0 时被丢弃的分配数",
        answer=0,
        hint_en="an integer",
        hint_zh="整数",
        why_en="capacity is then T = 64, and a token picks an expert at most once: no expert can "
        "get more than 64 of a sequence's choices",
        why_zh="此时容量为 T = 64，而一个 token 至多选同一个专家一次：任何专家在一条序列中都得不到超过 64 个选择",
    ),
    Prediction(
        "12.drops_without_balance",
        12,
        "drops without the balancing loss, against with it",
        "不带均衡损失时的丢弃（与带均衡损失相比）",
        answer="more",
        hint_en='"more" or "fewer"',
        hint_zh='"多"（more）或 "少"（fewer）',
        words_zh=(("多", "more"), ("少", "fewer"), ("更多", "more"), ("更少", "fewer")),
        why_en="without it the router collapses onto favoured experts, which overflow their capacity",
        why_zh="没有它，路由器会坍缩到少数偏爱的专家上，这些专家超出容量",
    ),
    Prediction(
        "12.lower_loss",
        12,
        "the run with the lower final loss",
        "最终损失更低的运行",
        answer="with",
        hint_en='"with" or "without"',
        hint_zh='"带均衡损失"（with）或 "不带均衡损失"（without）',
        words_zh=(
            ("带均衡损失", "with"),
            ("不带均衡损失", "without"),
            ("带", "with"),
            ("不带", "without"),
            ("有", "with"),
            ("没有", "without"),
        ),
        why_en="a dropped assignment is a token an expert never saw: the model learns less from the batch",
        why_zh="被丢弃的分配就是专家从未见过的 token：模型从同一批次学到的更少",
    ),
    Prediction(
        "12.dispatch_bytes",
        12,
        "bytes one rank sends in one dispatch all-to-all (EP 2, b = 4, s = 64, h = 64, k = 2, fp32)",
        "一次分发全对全中每个 rank 发送的字节数（EP 2，b = 4，s = 64，h = 64，k = 2，fp32）",
        # k b s h values fed in (one row per choice, nothing dropped), (N-1)/N of them leave the rank
        answer=K * 4 * T * 64 * 4 // 2,
        hint_en="bytes, an integer",
        hint_zh="字节数（整数）",
        mistakes=(
            Mistake(
                K * 4 * T * 64 * 4,
                "the rows for this rank's own experts stay: (N-1)/N of k·b·s·h leaves the rank",
                "发给本 rank 自己专家的那些行不离开：离开的是 k·b·s·h 的 (N-1)/N",
            ),
            Mistake(
                4 * T * 64 * 4 // 2,
                "each token travels once per choice: k = 2 rows per token",
                "每个 token 每个选择发一次：每个 token 有 k = 2 行",
            ),
        ),
        why_en="k·b·s·h·(N-1)/N values of 4 bytes",
        why_zh="k·b·s·h·(N-1)/N 个值，每个 4 字节",
    ),
    Prediction(
        "12.planner_a2a",
        12,
        "all-to-all GB per GPU per iteration, the 70B MoE at EP 8 (b = 2, 40 layers, 8 micro-batches)",
        "70B MoE 在 EP 8 下每张 GPU 每次迭代的全对全字节数（GB；b = 2，40 层，8 个微批次）",
        # 4 all-to-alls per layer and micro-batch, each k b s h (N-1)/N values of 2 bytes (bf16)
        answer=round(4 * 40 * 8 * 2 * 2 * 8192 * 8192 * 7 / 8 * 2 / 1e9, 1),
        rel_tol=0.01,
        hint_en="GB (10^9 bytes), a number",
        hint_zh="GB（10^9 字节），一个数",
        mistakes=(
            Mistake(
                round(2 * 40 * 8 * 2 * 2 * 8192 * 8192 * 7 / 8 * 2 / 1e9, 1),
                "forward only: backward sends the gradients of dispatch and combine back, 4 all-to-alls per layer",
                "这只是前向：反向还要把分发和合并的梯度送回，每层共 4 次全对全",
            ),
            Mistake(
                round(4 * 80 * 8 * 2 * 2 * 8192 * 8192 * 7 / 8 * 2 / 1e9, 1),
                "PP 2: each GPU holds 40 of the 80 layers",
                "PP 2：每张 GPU 只持有 80 层中的 40 层",
            ),
            Mistake(
                round(4 * 40 * 8 * 2 * 2 * 8192 * 8192 * 2 / 1e9, 1),
                "one piece of eight is for this GPU's own experts and stays: (N-1)/N = 7/8 leaves",
                "八块中有一块属于本 GPU 自己的专家，留在本地：离开的是 (N-1)/N = 7/8",
            ),
        ),
        why_en="4 x 40 layers x 8 micro-batches x k·b·s·h·(N-1)/N x 2 bytes",
        why_zh="4 x 40 层 x 8 个微批次 x k·b·s·h·(N-1)/N x 2 字节",
    ),
)


# --------------------------------------------------------------------------- the exercise


def top_k_dispatch(expert, gate, keep):
    """Reference: every kept (token, choice) as one row, grouped by expert (ties in token order)."""
    S, k = expert.shape
    token = torch.arange(S, device=expert.device)[:, None].expand(S, k)[keep]  # (A,)
    chosen, weight = expert[keep], gate[keep]  # (A,)
    order = torch.argsort(chosen, stable=True)
    return token[order], chosen[order], weight[order]


def _layer() -> MoE:
    """A small MoE layer (C = 8, E = 4, top-2, capacity factor 0.75: some choices are dropped)."""
    torch.manual_seed(0)
    experts = [torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8)) for _ in range(4)]
    return apply_expert_parallel(MoE(8, experts, top_k=2, capacity_factor=0.75, aux_loss_coef=0.01))


def _run(layer: MoE, x: torch.Tensor) -> dict:
    """The layer's output and every gradient for a fixed weighting of the output."""
    x = x.clone().requires_grad_()
    out = layer(x)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    grads = {
        "output": out.detach(),
        "input gradient": x.grad,
        **{f"gradient of {k}": p.grad.clone() for k, p in layer.named_parameters()},
    }
    layer.zero_grad()
    return grads


def _shape_problem(got, kept: int) -> tuple[str, str] | None:
    """What is wrong with the returned rows before they are sent anywhere, in both languages."""
    if not (isinstance(got, tuple) and len(got) == 3 and all(isinstance(g, torch.Tensor) for g in got)):
        return ("return three tensors: token, expert, gate", "请返回三个张量：token、expert、gate")
    token, expert, gate = got
    if not (token.dim() == 1 and token.shape == expert.shape == gate.shape):
        return (
            "token, expert and gate must each be one row per kept choice, shape (A,)",
            "token、expert、gate 都应是每个保留的选择一行，形状为 (A,)",
        )
    if token.numel() != kept:
        return (
            f"{token.numel()} rows, but {kept} choices were kept (dropped choices, keep == False, are not sent)",
            f"共 {token.numel()} 行，但保留下来的选择有 {kept} 个（被丢弃的选择，即 keep == False，不发送）",
        )
    if expert.numel() > 1 and bool((expert[1:] < expert[:-1]).any()):
        return (
            "rows are not grouped by expert: the all-to-all sends each rank one contiguous piece",
            "行没有按专家分组：全对全给每个 rank 发送的是连续的一段",
        )
    return None


def check_top_k_dispatch(ctx, source: str, name: str) -> dict:
    """On each rank: the learner's dispatch inside an expert-parallel MoE layer, against dtlab's."""
    _, rank = group_size_and_rank(None)
    x = torch.randn(2, 12, 8, generator=torch.Generator().manual_seed(100 + rank))  # (B, T, C)
    layer = _layer()
    expected = _run(layer, x)
    route = layer.router(x.reshape(24, 8), seq_len=12)
    choices = (route.expert, route.gate.detach(), route.keep)  # (S, k) each
    problem, theirs, got, stub = None, None, None, False
    try:
        theirs = learner_function(source, name)
        got, problem = call(theirs, *choices)
    except NotDone:
        stub = True
    except Exception as error:  # the cell does not compile, or defines no such function
        problem = does_not_compile(error)
    if not stub and problem is None:
        problem = _shape_problem(got, int(route.keep.sum()))
    # Every rank runs the layer's collectives whatever its verdict (dtlab's dispatch in place of a
    # wrong one), so that no rank is left waiting in an all-to-all.
    layer.dispatch = theirs if not stub and problem is None else sort_by_expert
    found = difference("the layer's", "该层的", expected, _run(layer, x))
    if stub:
        return not_done(rank, name)
    if problem is None and found:
        problem = (
            f"with your dispatch, {found[0]} (is each gate with its own token and expert?)",
            f"使用你的分发时，{found[1]}（每个门控值是否与它自己的 token 和专家对应？）",
        )
    return verdict(rank, problem)


EXERCISES = (
    Exercise(
        "12.top_k_dispatch",
        12,
        "the top-k dispatch",
        "top-k 分发",
        function="top_k_dispatch",
        check=check_top_k_dispatch,
        reference=top_k_dispatch,
        world_size=2,
    ),
)
