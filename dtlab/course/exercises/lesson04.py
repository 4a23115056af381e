"""Lesson 04 (ZeRO): the answer key, and the exercise "a shard's bounds and its reduce-scatter".

The learner writes ``zero_shard(flat_grad, rank, size) -> (start, stop, shard)``:
the bounds of this rank's shard in the flat buffer padded to a multiple of
``size`` (ZeRO's equal shards, :class:`dtlab.parallel.zero.flat.FlatLayout`), and the
gradient of that shard averaged over the ranks, got with one reduce-scatter
(Ψ on the wire, where an all-reduce would move 2Ψ). The check runs it on 4
real ranks with Ψ = 1089 (not a multiple of 4: the padding matters) and
compares with what dtlab's ZeRO stage 2 (:class:`dtlab.parallel.zero.ZeroOptimizer`)
leaves in its shard's ``.grad`` for the same gradients.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from dtlab.comm.collectives import group_size_and_rank
from dtlab.course.exercises.model import Exercise, Mistake, Prediction
from dtlab.course.exercises.ranks import (
    CountingDist,
    NotDone,
    call,
    difference,
    does_not_compile,
    learner_function,
    not_done,
    verdict,
)
from dtlab.parallel.zero.flat import FlatLayout
from dtlab.parallel.zero.stage12 import ZeroOptimizer

PSI = 236_928
BLOCK = 12 * 64 * 64 + 13 * 64  # 49,984 parameters in one block at d = 64

PREDICTIONS = (
    Prediction(
        "04.figure1_gb",
        4,
        "ZeRO Fig. 1: GB per GPU at stages 0-3 (7.5B, N_d = 64)",
        "ZeRO 图 1：阶段 0-3 每卡 GB（75 亿参数，N_d = 64）",
        answer=[120, 31.4, 16.6, 1.9],
        rel_tol=0.02,
        hint_en="a list of four numbers, GB",
        hint_zh="四个数的列表，单位 GB",
        mistakes=(
            Mistake(
                [120, 120, 120, 1.9],
                "stages 1 and 2 already shard the optimizer state (KΨ/N_d), the largest part",
                "阶段 1 和 2 已经切分了优化器状态（KΨ/N_d），这是最大的一块",
            ),
        ),
        why_en="(2 + 2 + 12)Ψ, each stage dividing one more term by N_d",
        why_zh="(2 + 2 + 12)Ψ，每个阶段多把一项除以 N_d",
    ),
    Prediction(
        "04.states_bytes",
        4,
        "model-state bytes per rank, stages 0-3, DP = 4",
        "每个 rank 的模型状态字节数，阶段 0-3，DP = 4",
        answer=[16 * PSI, 8 * PSI + 8 * PSI // 4, 4 * PSI + 12 * PSI // 4, 16 * PSI // 4],
        hint_en="a list of four integers, bytes",
        hint_zh="四个整数的列表，单位字节",
        mistakes=(
            Mistake(
                [16 * PSI, 4 * PSI + 12 * PSI // 4, 2 * PSI + 14 * PSI // 4, 16 * PSI // 4],
                "that uses the mixed-precision (2 + 2 + 12)Ψ; here training is fp32: 4 + 4 + 8 bytes",
                "这是混合精度的 (2 + 2 + 12)Ψ；这里用 fp32 训练：4 + 4 + 8 字节",
            ),
        ),
        why_en="fp32: 4Ψ parameters, 4Ψ gradients, 8Ψ Adam; stage s shards one more of them over 4",
        why_zh="fp32：参数 4Ψ、梯度 4Ψ、Adam 8Ψ；阶段 s 多把其中一项切成 4 份",
    ),
    Prediction(
        "04.figure1_measured",
        4,
        "bf16 model states of rank 0, [params, grads, master, optimizer] per stage, DP = 4",
        "bf16 下 rank 0 的模型状态，每个阶段的 [params, grads, master, optimizer]，DP = 4",
        answer=[
            [2 * PSI, 2 * PSI, 4 * PSI, 8 * PSI],
            [2 * PSI, 2 * PSI, PSI, 2 * PSI],
            [2 * PSI, PSI // 2, PSI, 2 * PSI],
            [PSI // 2, PSI // 2, PSI, 2 * PSI],
        ],
        hint_en="a list of four lists of four integers, bytes",
        hint_zh="由四个列表组成的列表，每个列表四个整数，单位字节",
        mistakes=(
            Mistake(
                [
                    [2 * PSI, 2 * PSI, 4 * PSI, 8 * PSI],
                    [2 * PSI, 2 * PSI, 4 * PSI, 2 * PSI],
                    [2 * PSI, PSI // 2, 4 * PSI, 2 * PSI],
                    [PSI // 2, PSI // 2, PSI, 2 * PSI],
                ],
                "the fp32 master is optimizer state (the paper's K): stage 1 shards it with Adam's moments",
                "fp32 主权重属于优化器状态（论文中的 K）：阶段 1 把它和 Adam 的动量一起切分",
            ),
        ),
        why_en="2Ψ + 2Ψ + (4 + 8)Ψ; stage 1 divides the K = 12 by 4, stage 2 the gradients too, stage 3 all",
        why_zh="2Ψ + 2Ψ + (4 + 8)Ψ；阶段 1 把 K = 12 除以 4，阶段 2 再除梯度，阶段 3 全部除以 4",
    ),
    Prediction(
        "04.volume",
        4,
        "communication volume per step, in Ψ",
        "每步通信量（以 Ψ 计）",
        answer=[2, 2, 2, 3],
        hint_en="a list of four numbers, in Ψ",
        hint_zh="四个数的列表，单位 Ψ",
        mistakes=(
            Mistake(
                [2, 3, 2, 3],
                "you predicted 3Ψ for stage 1: dtlab's stage 1 reduce-scatters (Ψ) and "
                "all-gathers (Ψ), so 2Ψ; PyTorch's ZeroRedundancyOptimizer beside DDP all-reduces (2Ψ) and then "
                "broadcasts each rank's updated shard (Ψ in all), 3Ψ",
                "你预测阶段 1 是 3Ψ：dtlab 的阶段 1 做归约散射（Ψ）和全收集（Ψ），所以是 2Ψ；"
                "PyTorch 的 ZeroRedundancyOptimizer 配合 DDP 先做全归约（2Ψ），再由每个 rank 广播自己更新后的分片"
                "（合计 Ψ），才是 3Ψ",
            ),
            Mistake(
                [2, 3, 3, 3],
                "stages 1 and 2 reduce-scatter the gradient and all-gather the parameters: 2Ψ, as DP",
                "阶段 1 和 2 对梯度做归约散射、对参数做全收集：2Ψ，与数据并行相同",
            ),
            Mistake(
                [2, 2, 2, 2],
                "stage 3 gathers the parameters twice, in forward and in backward: 3Ψ",
                "阶段 3 在前向和反向各收集一次参数：3Ψ",
            ),
        ),
    ),
    Prediction(
        "04.stage3_ratio",
        4,
        "stage 3 over plain DP",
        "阶段 3 与普通数据并行之比",
        answer=1.5,
        hint_en="a ratio",
        hint_zh="一个比值",
    ),
    Prediction(
        "04.peak_gathered",
        4,
        "most gathered bytes held at once (stage 3, DP = 4)",
        "同时持有的已收集字节数的最大值（阶段 3，DP = 4）",
        answer=4 * BLOCK,
        hint_en="bytes, an integer",
        hint_zh="字节数（整数）",
        mistakes=(
            Mistake(
                4 * 16_384,
                "a block (49,984 parameters) is a bigger unit than an embedding",
                "一个 block（49,984 个参数）比嵌入层更大",
            ),
            Mistake(BLOCK, "that is parameters; fp32 holds 4 bytes each", "这是参数个数；fp32 每个 4 字节"),
            Mistake(
                4 * PSI,
                "stage 3 gathers one unit at a time, never the whole model",
                "阶段 3 一次只收集一个单元，从不收集整个模型",
            ),
        ),
    ),
    Prediction(
        "04.first_backward",
        4,
        "unit gathered at event 17",
        "第 17 个事件时已收集的单元",
        answer=["head"],
        hint_en='a list with one unit name, e.g. ["ln_f"]',
        hint_zh='含一个单元名的列表，例如 ["ln_f"]',
        mistakes=(
            Mistake(
                ["tok_emb"],
                "backward runs the units in reverse: the head first",
                "反向按相反顺序处理各单元：输出头最先",
            ),
        ),
    ),
    Prediction(
        "04.padding",
        4,
        "stage 3, DP = 3: bytes above the formula",
        "阶段 3，DP = 3：比公式多出的字节数",
        answer=80,
        hint_en="bytes, an integer",
        hint_zh="字节数（整数）",
        mistakes=(
            Mistake(
                0,
                "stage 3 pads each unit to a multiple of 3, and the padding is allocated",
                "阶段 3 把每个单元分别填充到 3 的整数倍，填充也分配了内存",
            ),
        ),
        why_en="16 x (sum over units of ceil(Ψ_u / 3) - ceil(Ψ / 3))",
        why_zh="16 x（各单元 ceil(Ψ_u / 3) 之和 - ceil(Ψ / 3)）",
    ),
    Prediction(
        "04.try_zero_redundancy",
        4,
        "Ψ per step: ZeroRedundancyOptimizer beside DDP",
        "每步多少 Ψ：ZeroRedundancyOptimizer 配合 DDP",
        answer=3,
        hint_en="a number, in Ψ",
        hint_zh="一个数，单位 Ψ",
        mistakes=(
            Mistake(
                2,
                "DDP all-reduces the whole gradient (2Ψ) before the optimizer broadcasts each "
                "rank's updated shard (Ψ in all)",
                "DDP 先全归约整个梯度（2Ψ），优化器再让每个 rank 广播自己更新后的分片（合计 Ψ）",
            ),
        ),
    ),
    Prediction(
        "04.try_bf16_bytes",
        4,
        "stage 3 in bf16: all-gather bytes per step",
        "bf16 的阶段 3：每步全收集的字节数",
        answer=2 * 2 * PSI,
        hint_en="bytes, an integer",
        hint_zh="字节数（整数）",
        mistakes=(
            Mistake(
                2 * 4 * PSI,
                "stage 3 gathers in the compute precision: 2 bytes per value in bf16",
                "阶段 3 按计算精度收集：bf16 每个值 2 字节",
            ),
        ),
    ),
)


# --------------------------------------------------------------------------- the exercise


def zero_shard(flat_grad, rank, size):
    """Reference: this rank's bounds in the padded buffer and its shard of the mean gradient."""
    shard = -(-flat_grad.numel() // size)  # S = ceil(Ψ / N)
    padded = torch.zeros(shard * size, dtype=flat_grad.dtype)
    padded[: flat_grad.numel()] = flat_grad  # (L,): zeros after Ψ
    mine = torch.empty(shard, dtype=flat_grad.dtype)
    dist.reduce_scatter_single(mine, padded)  # (L,) -> (S,): chunk `rank`, summed
    return rank * shard, (rank + 1) * shard, mine / size


SHAPES = ((20, 30), (30,), (7, 17), (340,))  # Ψ = 1089: the last shard is padded


def _grads(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(50 + rank)
    return [torch.randint(-8, 9, shape, generator=g).float() for shape in SHAPES]


def check_shard(ctx, source: str, name: str) -> dict:
    """On each rank: the learner's bounds and averaged shard against dtlab's ZeRO stage 2."""
    size, rank = group_size_and_rank(None)
    params = [nn.Parameter(torch.zeros(shape)) for shape in SHAPES]
    zero = ZeroOptimizer(params, torch.optim.SGD, stage=2, lr=0.0)
    for p, g in zip(params, _grads(rank)):
        p.grad = g.clone()
    zero.reduce_gradients()  # dtlab's reduce-scatter
    bounds = zero.layout.shard(rank)
    expected = (bounds.start, bounds.stop, zero.shard.grad.detach().clone())
    flat = torch.cat([g.flatten() for g in _grads(rank)])  # (Ψ,) unpadded
    counting = CountingDist()
    try:
        fn = learner_function(source, name, dist=counting)
        got, problem = call(fn, flat.clone(), rank, size)
    except NotDone:
        return not_done(rank, name)
    except Exception as error:
        got, problem = None, does_not_compile(error)
    if problem is None and not (isinstance(got, tuple) and len(got) == 3):
        problem = ("return (start, stop, shard)", "请返回 (start, stop, shard)")
    if problem is None:
        problem = difference("(start, stop)", "(start, stop)", expected[:2], tuple(got[:2])) or difference(
            "shard", "分片", expected[2], got[2]
        )
    if problem is None and counting.calls["all_reduce"]:
        problem = (
            "your shard is right, but it all-reduced the whole gradient (2Ψ on the wire): ZeRO "
            "reduce-scatters (Ψ), dist.reduce_scatter_single",
            "分片是对的，但你对整个梯度做了全归约（线上 2Ψ）：ZeRO 用归约散射（Ψ），即 dist.reduce_scatter_single",
        )
    return verdict(rank, problem)


EXERCISES = (
    Exercise(
        "04.shard",
        4,
        "a ZeRO shard's bounds and its reduce-scatter",
        "ZeRO 分片的边界及其归约散射",
        function="zero_shard",
        check=check_shard,
        reference=zero_shard,
        world_size=4,
    ),
)

assert FlatLayout(SHAPES, 4).padded_numel > FlatLayout(SHAPES, 4).numel  # the exercise needs padding
