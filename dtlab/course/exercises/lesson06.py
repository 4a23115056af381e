"""Lesson 06 (tensor parallelism): the answer key, and the exercise "column and row split with f and g".

The learner writes ``parallel_mlp(x, fc, proj, rank, size)``: the MLP
``proj(gelu(fc(x)))`` run on one rank of a TP group, from the dense layers'
weights: ``fc`` split by columns (its weight's output rows), ``proj`` by rows
(its weight's input columns), Megatron's ``f`` where the replicated input
enters and ``g`` where the partial sums leave, the row-parallel bias added
once (Shoeybi et al. 2019, Sec. 3; :mod:`dtlab.parallel.tensor_parallel`). The check
runs it on 2 real ranks against the dense layer: the output, the input's
gradient, and the weights' gradients summed over the ranks.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dtlab.comm.collectives import group_size_and_rank
from dtlab.config import ModelConfig
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
from dtlab.model import MLP
from dtlab.parallel.tensor_parallel import f, g

SHAPES = {
    2: {
        "mlp.fc.weight": [128, 64],
        "mlp.fc.bias": [128],
        "mlp.proj.weight": [64, 128],
        "mlp.proj.bias": [64],
        "heads": 2,
    },
    4: {"mlp.fc.weight": [64, 64], "mlp.fc.bias": [64], "mlp.proj.weight": [64, 64], "mlp.proj.bias": [64], "heads": 1},
}

PREDICTIONS = (
    Prediction(
        "06.shapes",
        6,
        "shapes each rank holds at TP 2 and TP 4",
        "TP 2 与 TP 4 时每个 rank 持有的形状",
        answer=SHAPES,
        hint_en='{2: {"mlp.fc.weight": [out, in], "mlp.fc.bias": [n], "mlp.proj.weight": [out, in], '
        '"mlp.proj.bias": [n], "heads": n}, 4: {the same keys}}',
        hint_zh='{2: {"mlp.fc.weight": [out, in], "mlp.fc.bias": [n], "mlp.proj.weight": [out, in], '
        '"mlp.proj.bias": [n], "heads": n}, 4: {同样的键}}',
        why_en="PyTorch stores a weight as (out, in): column-parallel cuts the first dimension, row-parallel "
        "the second, and the row-parallel bias is not cut",
        why_zh="PyTorch 按 (out, in) 存权重：列并行切第一维，行并行切第二维，行并行的偏置不切",
    ),
    Prediction(
        "06.layer_equal",
        6,
        "TP layers equal the dense layer (max abs difference < 1e-5)",
        "TP 层与稠密层一致（最大绝对误差 < 1e-5）",
        answer=True,
        hint_en="True or False",
        hint_zh="True 或 False",
    ),
    Prediction(
        "06.block_comm",
        6,
        "all-reduces per block (forward, backward) and bytes each",
        "每个 block 的 all-reduce 次数（前向、反向）及每次字节数",
        answer={"forward": 2, "backward": 2, "bytes": 2 * 64 * 64 * 4},
        hint_en='{"forward": n, "backward": n, "bytes": n}',
        hint_zh='{"forward": n, "backward": n, "bytes": n}',
        mistakes=(
            Mistake(
                {"forward": 4, "backward": 4, "bytes": 2 * 64 * 64 * 4},
                "f is the identity forward and g the identity backward: each pass has one "
                "all-reduce per region, two regions per block",
                "f 在前向是恒等，g 在反向是恒等：每个方向每个区域一次 all-reduce，一个 block 两个区域",
            ),
            Mistake(
                {"forward": 2, "backward": 2, "bytes": 2 * 64 * 64 * 4 // 4},
                "the all-reduce carries the whole (B, T, C) activation, not a 1/TP slice",
                "all-reduce 传的是完整的 (B, T, C) 激活值，不是 1/TP 的一片",
            ),
        ),
    ),
    Prediction(
        "06.model_comm",
        6,
        "all-reduces for the whole model",
        "整个模型的 all-reduce 次数",
        answer={"forward": 8, "backward": 8},
        hint_en='{"forward": n, "backward": n}',
        hint_zh='{"forward": n, "backward": n}',
    ),
    Prediction(
        "06.step_comm",
        6,
        "TP all-reduces in one training step, rank 0",
        "一个训练步中的 TP all-reduce（rank 0）",
        answer={"g (forward)": 8, "f (backward)": 8, "bytes each": 8 * 64 * 64 * 4},
        hint_en='{"g (forward)": n, "f (backward)": n, "bytes each": n}',
        hint_zh='{"g (forward)": n, "f (backward)": n, "bytes each": n}',
        mistakes=(
            Mistake(
                {"g (forward)": 2, "f (backward)": 2, "bytes each": 8 * 64 * 64 * 4},
                "two per block, and the small GPT has 4 blocks",
                "每个 block 两次，小 GPT 有 4 个 block",
            ),
        ),
    ),
    Prediction(
        "06.tp16_link",
        6,
        "link of a TP 16 group",
        "TP 16 组使用的链路",
        answer="infiniband",
        hint_en='"nvlink" or "infiniband"',
        hint_zh='"nvlink" 或 "infiniband"',
        mistakes=(
            Mistake(
                "nvlink",
                "a node holds 8 GPUs: a group of 16 spans two nodes",
                "一个节点有 8 张 GPU：16 个 rank 的组横跨两个节点",
            ),
        ),
    ),
    Prediction(
        "06.tp16_faster",
        6,
        "faster step with TP 16 on twice the GPUs",
        "TP 16、GPU 翻倍后单步变快",
        answer=False,
        hint_en="True or False",
        hint_zh="True 或 False",
        mistakes=(
            Mistake(
                True,
                "the compute halves, but the TP all-reduces move to InfiniBand and cost about ten times more",
                "计算减半，但 TP 的 all-reduce 改走 InfiniBand，开销约为十倍",
            ),
        ),
    ),
    Prediction(
        "06.try_batch_8",
        6,
        "TP 2, batch 8: all-reduces per block and bytes each",
        "TP 2、批大小 8：每个 block 的 all-reduce 次数及每次字节数",
        answer={"forward": 2, "backward": 2, "bytes": 8 * 64 * 64 * 4},
        hint_en='{"forward": n, "backward": n, "bytes": n}',
        hint_zh='{"forward": n, "backward": n, "bytes": n}',
        mistakes=(
            Mistake(
                {"forward": 2, "backward": 2, "bytes": 8 * 64 * 64 * 4 // 2},
                "the bytes depend on B, T and C, not on TP: every rank sums whole activations",
                "字节数取决于 B、T 和 C，与 TP 无关：每个 rank 求和的都是完整激活值",
            ),
        ),
    ),
)


# --------------------------------------------------------------------------- the exercise


def parallel_mlp(x, fc, proj, rank, size):
    """Reference: proj(gelu(fc(x))) on one rank of a TP group of ``size``, from the dense layers."""
    per_rank = fc.out_features // size  # 4C / TP hidden features each
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    h = F.linear(f(x), fc.weight[mine], fc.bias[mine])  # column-parallel: (B, T, 4C/TP), no communication
    z = F.linear(F.gelu(h), proj.weight[:, mine])  # row-parallel: a partial sum (B, T, C)
    return g(z) + proj.bias  # summed over the group, the bias added once


CFG = ModelConfig(vocab_size=256, seq_len=8, n_layer=1, n_head=2, d_model=16)


def check_parallel_mlp(ctx, source: str, name: str) -> dict:
    """On each rank: the learner's TP MLP against the dense MLP, forward and backward."""
    size, rank = group_size_and_rank(None)
    torch.manual_seed(0)
    dense = MLP(CFG)
    x = torch.randn(2, CFG.seq_len, CFG.d_model, generator=torch.Generator().manual_seed(1), requires_grad=True)
    w = torch.randn(2, CFG.seq_len, CFG.d_model, generator=torch.Generator().manual_seed(2))
    expected = dense(x)
    (expected * w).sum().backward()
    mine, x2 = copy.deepcopy(dense), x.detach().clone().requires_grad_()
    mine.zero_grad(set_to_none=True)
    try:
        fn = learner_function(source, name, f=f, g=g, F=F)
        got, problem = call(fn, x2, mine.fc, mine.proj, rank, size)
    except NotDone:
        return not_done(rank, name)
    except Exception as error:
        got, problem = None, does_not_compile(error)
    problem = problem or difference("output", "输出", expected.detach(), got)
    if problem is None:
        _, problem = call(lambda: (got * w).sum().backward())
        problem = problem or difference("x.grad", "x.grad", x.grad, x2.grad)
    # Every rank sums its weights' gradients, whatever happened above (the column and row slices
    # of the ranks add up to the dense gradient; the replicated bias must equal it on each rank).
    params = dict(mine.named_parameters())
    for key in ("fc.weight", "fc.bias", "proj.weight"):
        total = torch.zeros_like(params[key]) if params[key].grad is None else params[key].grad.clone()
        dist.all_reduce(total)
        problem = problem or difference(
            f"{key}.grad summed over the ranks",
            f"各 rank 的 {key}.grad 之和",
            dict(dense.named_parameters())[key].grad,
            total,
        )
    bias = params["proj.bias"].grad
    problem = problem or difference(
        "proj.bias.grad",
        "proj.bias.grad",
        dense.proj.bias.grad,
        torch.zeros_like(dense.proj.bias) if bias is None else bias,
    )
    return verdict(rank, problem)


EXERCISES = (
    Exercise(
        "06.parallel_mlp",
        6,
        "column- and row-parallel MLP with f and g",
        "用 f 和 g 写列并行与行并行 MLP",
        function="parallel_mlp",
        check=check_parallel_mlp,
        reference=parallel_mlp,
        world_size=2,
    ),
)
