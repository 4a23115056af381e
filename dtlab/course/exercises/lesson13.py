"""Lesson 13 (one GPU, fast): the answer key, and the exercise "the bytes of the attention scores".

The learner writes ``scores_bytes(batch, heads, seq_len, dtype) -> int``: the
bytes of the (B, nh, T, T) attention scores that the explicit (eager) kernel
keeps for backward in one layer. The check runs dtlab's eager kernel
(:func:`dtlab.model.causal_attention`) on real q, k, v tensors of a few shapes
and dtypes on a real rank, counts the bytes of the scores autograd saved
(:func:`dtlab.course.experiments.attention_memory.attention_saved_bytes`), and
compares; an answer off by a known factor (the heads, T, 2, the bytes of an
element, the batch) is told which.
"""

from __future__ import annotations

import torch

from dtlab.comm.collectives import group_size_and_rank
from dtlab.course.exercises.model import MEASURED, Exercise, Mistake, Prediction
from dtlab.course.exercises.ranks import NotDone, call, compiled, not_done, verdict
from dtlab.course.experiments.attention_memory import attention_saved_bytes

PARAMS_100M = 100_411_392
"""Parameters of the ~100M GPT (dtlab.course.experiments.one_gpu.GPT_100M): 14 blocks, d 768, T 1024."""
FLOPS_PER_TOKEN = 6 * PARAMS_100M + 12 * 14 * 768 * 1024  # PaLM, App. B: 734,588,928
EAGER_MS = 65.67  # the stored H200 table's first row, batch 8 x 1024 tokens
STEP_WORDS = '"sdpa", "fused", "compile" or "batch"'

PREDICTIONS = (
    Prediction(
        "13.flops_per_token",
        13,
        "model FLOPs per token of the ~100M GPT",
        "约 1 亿参数 GPT 每个 token 的模型 FLOPs",
        answer=FLOPS_PER_TOKEN,
        rel_tol=0.01,
        hint_en="FLOPs, a number",
        hint_zh="浮点运算次数（一个数）",
        mistakes=(
            Mistake(
                6 * PARAMS_100M,
                "that is 6N alone: attention's scores and weighted sum multiply activations, not weights, and add "
                "12 x layers x d_model x T per token",
                "这只是 6N：注意力的分数和加权求和乘的是激活而不是权重，每个 token 还要加上 12 x 层数 x d_model x T",
            ),
            Mistake(
                2 * PARAMS_100M + 4 * 14 * 768 * 1024,
                "that is the forward pass alone: the backward pass costs twice the forward, so 6N + 12·L·d·T",
                "这只是前向：反向的代价是前向的两倍，所以是 6N + 12·L·d·T",
            ),
        ),
        why_en="6 x 100,411,392 + 12 x 14 x 768 x 1024",
        why_zh="6 x 100,411,392 + 12 x 14 x 768 x 1024",
    ),
    Prediction(
        "13.eager_mfu",
        13,
        "MFU of the eager row of the H200 table",
        "H200 表中 eager 一行的 MFU",
        answer=round(8 * 1024 / (EAGER_MS / 1e3) * FLOPS_PER_TOKEN / 989e12, 4),
        rel_tol=0.03,
        hint_en="a fraction between 0 and 1",
        hint_zh="0 到 1 之间的比例",
        mistakes=(
            Mistake(
                round(1024 / (EAGER_MS / 1e3) * FLOPS_PER_TOKEN / 989e12, 4),
                "a step trains 8 sequences of 1024 tokens: 8,192 tokens",
                "一步训练 8 条 1024 个 token 的序列：共 8,192 个 token",
            ),
            Mistake(
                round(8 * 1024 / (EAGER_MS / 1e3) * 6 * PARAMS_100M / 989e12, 4),
                "that counts 6N per token: PaLM's model FLOPs add attention's 12·L·d·T",
                "这只按每个 token 6N 计：PaLM 的模型 FLOPs 还要加上注意力的 12·L·d·T",
            ),
        ),
        why_en="tokens per second x FLOPs per token / 989e12 FLOP/s",
        why_zh="每秒 token 数 x 每个 token 的 FLOPs / 989e12 FLOP/s",
    ),
    Prediction(
        "13.gains_most",
        13,
        "the step that gains most in the H200 table",
        "H200 表中提升最大的一步",
        answer="sdpa",
        hint_en=STEP_WORDS,
        hint_zh=STEP_WORDS,
        mistakes=(
            Mistake(
                "batch",
                "a larger batch fills the GPU better, but at batch 8 x 1024 tokens the matmuls are already large; "
                "the eager attention wastes far more, writing and reading (B, nh, T, T) scores in memory",
                "更大的批次能让 GPU 更满，但 8 x 1024 个 token 时矩阵乘法已经够大；eager 注意力浪费得多得多："
                "它要在显存里写出再读回 (B, nh, T, T) 的分数",
            ),
            Mistake(
                "compile",
                "torch.compile fuses the small element-wise kernels (LayerNorm, GELU, residual adds) but keeps the "
                "attention it is given; the fused attention kernel gains more",
                "torch.compile 融合的是小的逐元素内核（LayerNorm、GELU、残差相加），注意力照原样保留；融合的注意力内核提升更大",
            ),
            Mistake(
                "fused",
                "a fused AdamW saves a few hundred small kernel launches per step: about 4 ms of 24",
                "融合的 AdamW 每步省下几百次小内核启动：24 毫秒里的 4 毫秒左右",
            ),
        ),
    ),
    # 13.here_gains_most is timed on the learner's machine (a CPU shared with other work, or a GPU): only the
    # run can say.
    Prediction(
        "13.here_gains_most",
        13,
        "the step that gains most on this machine",
        "本机上提升最大的一步",
        answer=MEASURED,
        hint_en=STEP_WORDS,
        hint_zh=STEP_WORDS,
    ),
    Prediction(
        "13.growth",
        13,
        "growth of the small GPT's activations from T = 256 to 512",
        "小 GPT 的激活值从 T = 256 到 512 的增长倍数",
        answer={"eager": 3.0, "sdpa": 2.0},
        rel_tol=0.05,
        hint_en='{"eager": a factor, "sdpa": a factor}',
        hint_zh='{"eager": 倍数, "sdpa": 倍数}',
        mistakes=(
            Mistake(
                {"eager": 4.0, "sdpa": 2.0},
                "only eager's scores grow as T²: the rest of its activations are sdpa's, which double; at T = 256 "
                "the two parts are about equal, so (2 + 4) / 2 = 3",
                "eager 只有分数按 T² 增长：其余激活值与 sdpa 的相同，只翻倍；T = 256 时两部分差不多大，所以是 (2 + 4) / 2 = 3",
            ),
            Mistake(
                {"eager": 2.0, "sdpa": 2.0},
                "eager keeps the (B, nh, T, T) scores, which grow 4x when T doubles",
                "eager 保存 (B, nh, T, T) 的分数，T 翻倍时它们变成 4 倍",
            ),
            Mistake(
                {"eager": 4.0, "sdpa": 4.0},
                "sdpa keeps no T x T tensor: every tensor it saves is (B, T, ·) or (B, nh, T), and doubles with T",
                "sdpa 不保存任何 T x T 的张量：它保存的都是 (B, T, ·) 或 (B, nh, T) 形状，随 T 翻倍",
            ),
        ),
        why_en="sdpa's activations double; eager's are sdpa's plus scores that quadruple",
        why_zh="sdpa 的激活值翻倍；eager 的等于 sdpa 的加上变成 4 倍的分数",
    ),
    Prediction(
        "13.try_lse_ratio",
        13,
        "eager's bf16 scores over FlashAttention's fp32 log-sum-exp at T = 1024",
        "T = 1024 时 eager 的 bf16 分数与 FlashAttention 的 fp32 log-sum-exp 之比",
        answer=512,
        rel_tol=0.01,
        hint_en="a factor",
        hint_zh="倍数",
        mistakes=(
            Mistake(
                1024,
                "the scores are bf16 (2 bytes), the log-sum-exp fp32 (4 bytes): T x 2 / 4",
                "分数是 bf16（2 字节），log-sum-exp 是 fp32（4 字节）：T x 2 / 4",
            ),
            Mistake(
                2048,
                "T x T scores against T statistics, per head: a factor T, times 2 / 4 bytes",
                "每个头 T x T 个分数对 T 个统计量：差 T 倍，再乘以 2 / 4 字节",
            ),
        ),
        why_en="T x T x 2 bytes against T x 4 bytes, per head",
        why_zh="每个头 T x T x 2 字节对 T x 4 字节",
    ),
)


# --------------------------------------------------------------------------- the exercise


def scores_bytes(batch, heads, seq_len, dtype):
    """Reference: bytes of one layer's (batch, heads, T, T) attention scores kept by the eager kernel."""
    bytes_per_element = torch.empty((), dtype=dtype).element_size()
    return batch * heads * seq_len * seq_len * bytes_per_element


CASES = (
    (3, 5, 40, torch.float32),
    (1, 12, 64, torch.bfloat16),
    (4, 3, 24, torch.float16),
    (2, 6, 56, torch.float32),
)
"""(batch, heads, T, dtype) the check measures. The first one's factors (3, 5, 40, 4 bytes) all differ, so an
answer off by one of them is told which."""


def _why(got: int, measured: int, batch: int, heads: int, T: int, size: int) -> tuple[str, str] | None:
    """The factor an answer is off by, named (both languages), or None."""
    hints = (
        (
            measured // heads,
            "every head has its own T x T scores: multiply by the heads",
            "每个头都有自己的 T x T 分数：要乘以头数",
        ),
        (
            measured // T,
            "T x T: each of the T queries has a score for each of the T keys",
            "是 T x T：T 个查询中的每一个都对 T 个键各有一个分数",
        ),
        (
            batch * heads * T * (T + 1) // 2 * size,
            "the causal mask hides the upper half, but the eager kernel stores the whole T x T square (the hidden "
            "scores are -inf, then 0 after the softmax)",
            "因果掩码遮住了上半部分，但 eager 内核保存整个 T x T 方阵（被遮住的分数是 -inf，softmax 之后为 0）",
        ),
        (
            measured // size,
            "that counts elements: multiply by the bytes of an element",
            "这是元素个数：还要乘以每个元素的字节数",
        ),
        (measured // batch, "each sequence of the batch has its own scores", "批次里每条序列都有自己的分数"),
    )
    for value, en, zh in hints:
        if got == value and value != measured:
            return en, zh
    if got * 2 == measured or got == measured * 2:
        return (
            "off by 2: the bytes of an element are 4 for float32, 2 for bfloat16 and float16",
            "差了 2 倍：每个元素的字节数 float32 是 4，bfloat16 和 float16 是 2",
        )
    return None


def check_scores_bytes(ctx, source: str, name: str) -> dict:
    """On a rank: the learner's bytes against the scores dtlab's eager kernel saved, shape by shape."""
    _, rank = group_size_and_rank(None)
    fn, problem = compiled(source, name)
    for batch, heads, T, dtype in CASES if problem is None else ():
        measured = attention_saved_bytes(batch, heads, T, dtype)["scores"]
        try:
            got, problem = call(fn, batch, heads, T, dtype)
        except NotDone:
            return not_done(rank, name)
        if problem is not None:
            break
        case = f"{name}({batch}, {heads}, {T}, {dtype})"
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            problem = (
                f"{case} returned {type(got).__name__}: return a number of bytes",
                f"{case} 返回的是 {type(got).__name__}：请返回字节数",
            )
        elif got != measured:
            size = torch.empty((), dtype=dtype).element_size()
            why = _why(got, measured, batch, heads, T, size)
            problem = (
                f"{case}: measured {measured:,} bytes of saved scores, got {got:,}" + (f"; {why[0]}" if why else ""),
                f"{case}：实测保存的分数为 {measured:,} 字节，得到的是 {got:,}" + (f"；{why[1]}" if why else ""),
            )
        if problem is not None:
            break
    return verdict(rank, problem)


EXERCISES = (
    Exercise(
        "13.scores_bytes",
        13,
        "the bytes of the attention scores",
        "注意力分数的字节数",
        function="scores_bytes",
        check=check_scores_bytes,
        reference=scores_bytes,
        world_size=1,
    ),
)
