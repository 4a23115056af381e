"""Lesson 15 (planning at scale): the answer key. The lesson has no code exercise (the planner is arithmetic)."""

from __future__ import annotations

from dtlab.course.exercises.model import MEASURED, Mistake, Prediction

PSI = 236_928

PREDICTIONS = (
    Prediction(
        "15.figure1_gb",
        15,
        "ZeRO Fig. 1: GB per GPU at stages 0-3 (7.5B, N_d = 64)",
        "ZeRO 图 1：阶段 0-3 每卡 GB（75 亿参数，N_d = 64）",
        answer=[120, 31.4, 16.6, 1.9],
        rel_tol=0.02,
        hint_en="a list of four numbers, GB",
        hint_zh="四个数的列表，单位 GB",
        why_en="(2 + 2 + 12)Ψ, each stage dividing one more term by N_d",
        why_zh="(2 + 2 + 12)Ψ，每个阶段多把一项除以 N_d",
    ),
    Prediction(
        "15.fits",
        15,
        "GPT-3 175B fits on 1,024 H100s",
        "GPT-3 175B 能放进 1,024 张 H100",
        answer=True,
        hint_en="True or False",
        hint_zh="True 或 False",
    ),
    Prediction(
        "15.sp_activations",
        15,
        "GPT-3 175B activations per GPU with sequence parallelism (GB)",
        "使用序列并行时 GPT-3 175B 每张 GPU 的激活值（GB）",
        answer=20.54,
        rel_tol=0.02,
        hint_en="GB",
        hint_zh="GB",
        mistakes=(
            Mistake(
                62.81,
                "that is without sequence parallelism: SP splits the LayerNorm and dropout "
                "activations that TP leaves whole over the t = 8 ranks",
                "这是不用序列并行的值：SP 会把 TP 留下的完整 LayerNorm 与 dropout 激活值分到 t = 8 个 rank 上",
            ),
        ),
    ),
    Prediction(
        "15.step_compute",
        15,
        "GPT-3 175B: compute part of one step (s)",
        "GPT-3 175B：一步中计算部分的时间（秒）",
        answer=7.52,
        rel_tol=0.1,
        hint_en="seconds",
        hint_zh="秒",
        why_en="6Ψ x 1,536 x 2,048 FLOPs / (1,024 x 0.5 x 989e12 FLOP/s) = 6.51 s, over 1 - 15/111; the "
        "planner adds attention's 12·l·h·s per token and selective recomputation's attention",
        why_zh="6Ψ x 1,536 x 2,048 次浮点运算 / (1,024 x 0.5 x 989e12 FLOP/s) = 6.51 秒，再除以 1 - 15/111；"
        "规划器还加上了每个 token 注意力的 12·l·h·s 和选择性重计算重做的注意力",
        mistakes=(
            Mistake(
                6.51,
                "that is the arithmetic alone: every stage also idles for the bubble, "
                "15/111 of the step, so divide by 1 - 15/111",
                "这只是运算本身：每个阶段还要空等气泡，占一步的 15/111，所以要再除以 1 - 15/111",
            ),
            Mistake(
                3.76,
                "that is at the full 989 TFLOP/s: the planner assumes 50% of the peak",
                "这是按满峰值 989 TFLOP/s 算的：规划器假设只能达到峰值的 50%",
            ),
            Mistake(
                2.51,
                "that counts the forward pass alone (2Ψ per token): the backward costs twice the forward, 6Ψ in all",
                "这只算了前向（每个 token 2Ψ）：反向的代价是前向的两倍，合计 6Ψ",
            ),
        ),
    ),
    Prediction(
        "15.mfu_recompute",
        15,
        "MFU with full recomputation, against selective",
        "完全重计算的 MFU 与选择性重计算相比",
        answer="lower",
        hint_en='"higher", "lower" or "same"',
        hint_zh='"更高"（higher）、"更低"（lower）或 "相同"（same）',
        words_zh=(("更高", "higher"), ("更低", "lower"), ("相同", "same")),
        mistakes=(
            Mistake(
                "higher",
                "recomputation adds FLOPs the hardware runs but not model FLOPs: the step "
                "gets longer, the numerator of MFU does not grow",
                "重计算增加的是硬件执行的 FLOPs，而不是模型 FLOPs：单步变长了，MFU 的分子却没有变大",
            ),
            Mistake(
                "same",
                "MFU counts the model's FLOPs only; recomputing more makes the step longer",
                "MFU 只统计模型的 FLOPs；重计算得越多，单步越长",
            ),
        ),
    ),
    Prediction(
        "15.bubbles",
        15,
        "bubble fraction p = 4, m = 4 and m = 16",
        "气泡比例 p = 4，m = 4 与 m = 16",
        answer=[round(3 / 7, 4), round(3 / 19, 4)],
        rel_tol=0.02,
        hint_en="a list of two fractions (two decimals are enough)",
        hint_zh="两个比例的列表（保留两位小数即可）",
        why_en="(p-1)/(m+p-1)",
        why_zh="(p-1)/(m+p-1)",
    ),
    Prediction(
        "15.optimizer",
        15,
        "optimizer bytes per rank",
        "每个 rank 的优化器字节数",
        answer=8 * PSI,
        hint_en="bytes, an integer",
        hint_zh="字节数（整数）",
        mistakes=(
            Mistake(
                12 * PSI,
                "K = 12 counts an fp32 master copy as well; training in fp32, the "
                "parameters are the master: Adam's two moments, 8 bytes",
                "K = 12 还包含 fp32 主权重；用 fp32 训练时参数本身就是主权重：只有 Adam 的两个动量，8 字节",
            ),
            Mistake(
                8 * PSI // 4,
                "plain DP (ZeRO 0) copies the optimizer state on every rank",
                "普通数据并行（ZeRO 0）在每个 rank 上都复制优化器状态",
            ),
        ),
    ),
    # 15.race_fastest is timed: which layout wins depends on this machine and its load at the time, so
    # only the run can say (the answer key fills in the measurement).
    Prediction(
        "15.race_fastest",
        15,
        "the planner's rank of the layout measured fastest",
        "实测最快的布局在规划器里的名次",
        answer=MEASURED,
        hint_en="1, 2, 3 or 4",
        hint_zh="1、2、3 或 4",
    ),
    Prediction(
        "15.try_llama_gpus",
        15,
        "fewest H100s (a power of two) for Llama 3 70B with ZeRO-3 alone",
        "仅用 ZeRO-3 时 Llama 3 70B 最少需要的 H100 数（2 的幂）",
        answer=32,
        hint_en="a number of GPUs",
        hint_zh="GPU 数量",
        mistakes=(
            Mistake(
                16,
                "at 16 GPUs the model states are 70.6B x 16 bytes / 16 ≈ 70.6 GB (ZeRO-3 "
                "shards all 16 bytes of a parameter); with 10.7 GB of activations, 81.3 GB > 80 GB",
                "16 张 GPU 时模型状态为 70.6B x 16 字节 / 16 ≈ 70.6 GB（ZeRO-3 把每个参数的 16 字节全部切分），"
                "加上 10.7 GB 激活值共 81.3 GB，超过 80 GB",
            ),
        ),
    ),
)

EXERCISES = ()
