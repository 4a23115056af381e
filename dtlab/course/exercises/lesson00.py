"""Lesson 00 (first distributed run): the answer key. The lesson has no code exercise."""

from __future__ import annotations

from dtlab.course.exercises.model import Mistake, Prediction

PSI = 236_928
"""Parameters of the small GPT."""

PREDICTIONS = (
    Prediction(
        "00.all_reduce_sum",
        0,
        "all-reduce SUM of rank+1 over 4 ranks",
        "4 个 rank 上 rank+1 的 all-reduce 求和",
        answer=10.0,
        hint_en="one number, the value every rank holds",
        hint_zh="一个数：每个 rank 上的值",
        mistakes=(
            Mistake(
                2.5,
                "2.5 is the mean: SUM adds, AVG would divide by the world size",
                "2.5 是平均值：SUM 只做加法，AVG 才会除以 world size",
            ),
            Mistake(
                4,
                "4 is the world size: SUM adds the values 1 + 2 + 3 + 4",
                "4 是 world size：SUM 加的是各 rank 的值 1 + 2 + 3 + 4",
            ),
            Mistake(
                1, "every rank ends with the total, not its own value", "每个 rank 最后拿到的都是总和，而不是自己的值"
            ),
        ),
        why_en="1 + 2 + 3 + 4 on every rank",
        why_zh="每个 rank 上都是 1 + 2 + 3 + 4",
    ),
    Prediction(
        "00.same_curve",
        0,
        "1 and 4 replicas give the same losses (relative difference below 1e-4)",
        "1 个和 4 个副本的损失相同（相对差小于 1e-4）",
        answer=True,
        hint_en="True or False",
        hint_zh="True 或 False",
        mistakes=(
            Mistake(
                False,
                "same data, same initial weights, same averaged gradient: only the order "
                "of floating-point additions differs, about 1e-7 relative",
                "数据、初始权重和平均后的梯度都相同：只有浮点加法的顺序不同，相对差约 1e-7",
            ),
        ),
    ),
    Prediction(
        "00.param_bytes",
        0,
        "parameter bytes per rank",
        "每个 rank 的参数字节数",
        answer=4 * PSI,
        hint_en="bytes, an integer",
        hint_zh="字节数（整数）",
        mistakes=(
            Mistake(
                PSI,
                "that is the parameter count (or a quarter of the bytes): each rank holds "
                "every parameter, 4 bytes each in fp32",
                "这是参数个数（或字节数的四分之一）：每个 rank 都持有全部参数，fp32 下每个 4 字节",
            ),
            Mistake(
                16 * PSI,
                "16 bytes per parameter is parameters + gradients + Adam's two moments; the parameters alone are 4",
                "每参数 16 字节是参数 + 梯度 + Adam 的两个动量；单算参数是 4 字节",
            ),
            Mistake(2 * PSI, "fp32 is 4 bytes per parameter, not 2", "fp32 每个参数 4 字节，不是 2 字节"),
        ),
    ),
    Prediction(
        "00.activation_ratio",
        0,
        "activations at dp=1 / at dp=4",
        "dp=1 与 dp=4 的激活值之比",
        answer=4.0,
        rel_tol=0.15,
        hint_en="a ratio, e.g. 2.0",
        hint_zh="一个比值，例如 2.0",
        mistakes=(
            Mistake(
                1.0,
                "activations grow with the sequences a rank processes: each of 4 ranks sees a quarter of the batch",
                "激活值随一个 rank 处理的序列数增长：4 个 rank 各处理四分之一的批次",
            ),
        ),
        why_en="activations scale with the sequences per rank",
        why_zh="激活值与每个 rank 的序列数成正比",
    ),
    Prediction(
        "00.try_accum",
        0,
        "activations at dp=4 / at dp=4 with 2 accumulation steps",
        "dp=4 与 dp=4 加 2 步梯度累积的激活值之比",
        answer=2.0,
        rel_tol=0.15,
        hint_en="a ratio",
        hint_zh="一个比值",
        mistakes=(
            Mistake(
                1.0,
                "each accumulation micro-step runs half of the rank's sequences, and backward "
                "frees them before the next",
                "每个累积微步只处理该 rank 一半的序列，反向传播会在下一步前释放它们",
            ),
        ),
    ),
)

EXERCISES = ()
