"""Lesson 05 (offloading): the answer key, and the exercise "the offloaded optimizer step".

The learner writes ``offloaded_step(params, masters, host_grads, optimizer)``:
the three moves of ZeRO-Offload's step (Ren et al. 2021) as
:meth:`dtlab.parallel.zero.offload.OffloadOptimizer.step` makes them: each device
gradient into its host buffer (d2h), the host optimizer's update on the fp32
masters, the updated masters back into the device parameters (h2d); it
returns the bytes moved each way. The check trains 3 steps of data
parallelism on 2 real ranks with the learner's step and with dtlab's, and
compares the device parameters, the host masters and the bytes after each step.
"""

from __future__ import annotations

import math

import torch

from dtlab.comm.collectives import group_size_and_rank
from dtlab.config import ModelConfig
from dtlab.course.exercises.model import Exercise, Mistake, Prediction
from dtlab.course.exercises.ranks import NotDone, call, compiled, difference, not_done, verdict
from dtlab.data import global_batch
from dtlab.model import build_model
from dtlab.parallel.data_parallel import apply_data_parallel
from dtlab.parallel.zero.offload import OffloadOptimizer

PSI = 236_928
BIG = 7_500_000_000
COPY_S = 2 * (2e-6 + 2 * BIG / 64e9)  # bf16 both ways over PCIe Gen5 (alpha + n / beta)
PER_TOKEN_S = 6 * BIG / (0.5 * 989e12)  # 6Ψ FLOPs per token at half an H100's bf16 peak
HOST_STEP_S = 28 * BIG / 100e9  # 28 bytes of host memory traffic per parameter

PREDICTIONS = (
    Prediction(
        "05.one_rank_bytes",
        5,
        "bytes copied per step, one rank",
        "每步拷贝的字节数，单个 rank",
        answer={"d2h": 4 * PSI, "h2d": 4 * PSI},
        hint_en='{"d2h": bytes, "h2d": bytes}',
        hint_zh='{"d2h": 字节, "h2d": 字节}',
        mistakes=(
            Mistake(
                {"d2h": 16 * PSI, "h2d": 16 * PSI},
                "only the gradients go down and the parameters come up; the optimizer state never moves",
                "下行的只有梯度，上行的只有参数；优化器状态从不移动",
            ),
        ),
    ),
    Prediction(
        "05.device_optimizer",
        5,
        "device optimizer bytes per rank, offloaded",
        "卸载后每个 rank 设备上的优化器字节数",
        answer=0,
        hint_en="bytes, an integer",
        hint_zh="字节数（整数）",
    ),
    Prediction(
        "05.host_bytes",
        5,
        "host bytes per rank, offloaded",
        "卸载后每个 rank 的主机字节数",
        answer=(4 + 4 + 8) * PSI // 4,
        hint_en="bytes, an integer",
        hint_zh="字节数（整数）",
        mistakes=(
            Mistake(
                8 * PSI // 4,
                "the host keeps Adam's two moments and also an fp32 master and a "
                "gradient buffer: 16 bytes per value of the shard",
                "主机除了 Adam 的两个动量，还保存 fp32 主权重和梯度缓冲区：分片中每个值 16 字节",
            ),
        ),
    ),
    Prediction(
        "05.same_loss",
        5,
        "offloading leaves the loss curve unchanged",
        "卸载不改变损失曲线",
        answer=True,
        hint_en="True or False",
        hint_zh="True 或 False",
    ),
    Prediction(
        "05.zero2_bytes",
        5,
        "bytes copied per step per rank, ZeRO-2 on 4 ranks",
        "每个 rank 每步拷贝的字节数，4 个 rank 上的 ZeRO-2",
        answer={"d2h": PSI, "h2d": PSI},
        hint_en='{"d2h": bytes, "h2d": bytes}',
        hint_zh='{"d2h": 字节, "h2d": 字节}',
        mistakes=(
            Mistake(
                {"d2h": 4 * PSI, "h2d": 4 * PSI},
                "each rank offloads only its ZeRO shard: a quarter",
                "每个 rank 只卸载自己的 ZeRO 分片：四分之一",
            ),
        ),
    ),
    Prediction(
        "05.copy_s",
        5,
        "PCIe copy seconds per step, 7.5B in bf16",
        "每步 PCIe 拷贝秒数，75 亿参数，bf16",
        answer=round(COPY_S, 3),
        rel_tol=0.01,
        hint_en="seconds",
        hint_zh="秒",
        mistakes=(
            Mistake(
                round(COPY_S / 2, 3),
                "two copies, one after the other: gradients down, then parameters up",
                "两次拷贝先后进行：先下行梯度，再上行参数",
            ),
        ),
    ),
    Prediction(
        "05.host_step_s",
        5,
        "host optimizer step seconds, 7.5B, memory-bound at 100 GB/s",
        "主机优化器一步的秒数，75 亿参数，100 GB/s 内存带宽受限",
        answer=round(HOST_STEP_S, 2),
        rel_tol=0.02,
        hint_en="seconds",
        hint_zh="秒",
        why_en="28 bytes of host memory traffic per parameter, over 100 GB/s",
        why_zh="每个参数 28 字节主机内存流量，除以 100 GB/s",
    ),
    Prediction(
        "05.breakeven",
        5,
        "break-even tokens per GPU per step, copies only (H100, bf16, PCIe Gen5)",
        "只算拷贝时每张 GPU 每步的盈亏平衡 token 数（H100，bf16，PCIe Gen5）",
        answer=math.ceil(COPY_S / PER_TOKEN_S),
        rel_tol=0.01,
        hint_en="tokens, an integer",
        hint_zh="token 数（整数）",
    ),
    Prediction(
        "05.breakeven_with_step",
        5,
        "break-even tokens with the host's step as well (delayed update)",
        "再算上主机更新时的盈亏平衡 token 数（延迟更新）",
        answer=math.ceil((COPY_S + HOST_STEP_S) / PER_TOKEN_S),
        rel_tol=0.01,
        hint_en="tokens, an integer",
        hint_zh="token 数（整数）",
        mistakes=(
            Mistake(
                math.ceil(COPY_S / PER_TOKEN_S),
                "that leaves out the host's step, which takes 4x longer than the copies",
                "这漏掉了主机上的更新，它是拷贝的 4 倍多",
            ),
        ),
    ),
    Prediction(
        "05.depends_on_size",
        5,
        "the break-even depends on the model size",
        "盈亏平衡点与模型大小有关",
        answer=False,
        hint_en="True or False",
        hint_zh="True 或 False",
        mistakes=(
            Mistake(
                True,
                "copy, host step and compute all grow with Ψ: it cancels",
                "拷贝、主机更新和计算都随 Ψ 增长：Ψ 被约掉了",
            ),
        ),
    ),
    Prediction(
        "05.try_fp32",
        5,
        "break-even tokens in fp32, copies only",
        "fp32 下只算拷贝的盈亏平衡 token 数",
        answer=698,
        rel_tol=0.01,
        hint_en="tokens, an integer",
        hint_zh="token 数（整数）",
    ),
    Prediction(
        "05.try_stage3_device",
        5,
        "device parameter bytes per rank, ZeRO-3 + offload, DP = 2",
        "ZeRO-3 + 卸载、DP = 2 时每个 rank 设备上的参数字节数",
        answer=4 * PSI // 2,
        hint_en="bytes, an integer",
        hint_zh="字节数（整数）",
    ),
)


# --------------------------------------------------------------------------- the exercise


def offloaded_step(params, masters, host_grads, optimizer):
    """Reference: gradients down, the host's update, parameters up; the bytes moved each way."""
    moved = {"d2h": 0, "h2d": 0}
    with torch.no_grad():
        for p, m, g in zip(params, masters, host_grads):
            g.copy_(p.grad)  # device -> host
            m.grad = g
            moved["d2h"] += p.grad.numel() * p.grad.element_size()
        optimizer.step()  # on the host, on the fp32 masters
        for p, m in zip(params, masters):
            p.copy_(m.to(p.dtype))  # host -> device
            moved["h2d"] += p.numel() * p.element_size()
    return moved


TINY = ModelConfig(vocab_size=256, seq_len=16, n_layer=1, n_head=2, d_model=16)


def _train(rank: int, size: int, step_fn) -> list[dict]:
    """Three DP steps with an offloaded AdamW; after each: device params, host masters, bytes."""
    model = build_model(TINY, seed=0)
    dp = apply_data_parallel(model, mode="bucketed")
    offload = OffloadOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2)
    out = []
    for step in range(3):
        x, y = global_batch(step, batch_size=2 * size, seq_len=TINY.seq_len, seed=0)
        dp(x[2 * rank : 2 * rank + 2], y[2 * rank : 2 * rank + 2]).backward()
        dp.finish_gradient_sync()
        moved = step_fn(offload)
        out.append(
            {
                "params": [p.detach().clone() for p in offload.params],
                "masters": [m.detach().clone() for m in offload.master],
                "bytes": moved,
            }
        )
        offload.zero_grad()
    return out


def check_offload(ctx, source: str, name: str) -> dict:
    """On each rank: 3 steps with the learner's offloaded step against dtlab's OffloadOptimizer."""
    size, rank = group_size_and_rank(None)

    def dtlab_step(o):
        o.step()
        return dict(o.transfer_bytes)

    expected = _train(rank, size, dtlab_step)
    problem = None
    fn, problem = compiled(source, name)

    def learner_step(o):
        nonlocal problem
        if problem is None:
            moved, problem = call(fn, o.params, o.master, o.host_grads, o.optimizer)
            return moved
        return dtlab_step(o)  # keep every rank's collectives in step

    try:
        got = _train(rank, size, learner_step)
    except NotDone:
        return not_done(rank, name)
    for step, (e, g) in enumerate(zip(expected, got)):
        if problem is not None:
            break
        for what, what_zh in (("masters", "主机上的主权重"), ("params", "设备上的参数"), ("bytes", "拷贝字节数")):
            found = difference(what, what_zh, e[what], g[what])
            if found:
                problem = (f"after step {step}, {found[0]}", f"第 {step} 步之后，{found[1]}")
                break
    return verdict(rank, problem)


EXERCISES = (
    Exercise(
        "05.offload_step",
        5,
        "the offloaded optimizer step",
        "卸载后的优化器一步",
        function="offloaded_step",
        check=check_offload,
        reference=offloaded_step,
        world_size=2,
    ),
)
