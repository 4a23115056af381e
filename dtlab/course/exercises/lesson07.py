"""Lesson 07 (long sequences): the answer key, and the exercise "the online-softmax merge".

The learner writes ``my_merge(o_a, lse_a, o_b, lse_b) -> (o, lse)``: attention
over the keys of two blocks from each block's own output (normalised over its
keys) and log-sum-exp. The check plugs it into dtlab's ring attention
(:func:`dtlab.parallel.ring_attention.ring_attention`, ``combine=``) on 2 real ranks,
with and without zigzag, and compares each rank's output and q/k/v gradients
with full causal attention on the whole sequence. Backward uses the merged
log-sum-exp, so a wrong ``lse`` shows in the gradients even when ``o`` is right.
"""

from __future__ import annotations

import torch

from dtlab.comm.collectives import group_size_and_rank
from dtlab.course.exercises.hints import with_hint
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
from dtlab.course.experiments.long_sequences import ring_versus_full
from dtlab.parallel.ring_attention import merge

B, T, C, LAYERS, TP = 2, 256, 64, 2, 2
SBH = B * T * C * 4  # bytes of one fp32 (B, T, C) tensor

PREDICTIONS = (
    Prediction(
        "07.sp_saved_bytes",
        7,
        "activation bytes SP saves per rank at TP 2",
        "TP 2 时 SP 在每个 rank 上节省的激活字节数",
        # four (B, T, C) tensors per layer kept whole by TP (+ each LayerNorm's mean and
        # 1/std per token), of which SP keeps 1/t: it saves (1 - 1/t) of them.
        answer=LAYERS * (4 * SBH + 2 * 2 * B * T * 4) * (TP - 1) // TP,
        rel_tol=0.02,
        hint_en="bytes, a number",
        hint_zh="字节数",
        mistakes=(
            Mistake(
                LAYERS * 4 * SBH,
                "SP keeps 1/t of those tensors on each rank: it saves (1 - 1/t) of them, half at TP 2",
                "SP 让每个 rank 保留这些张量的 1/t：节省的是其中的 (1 - 1/t)，TP 2 时为一半",
            ),
            Mistake(4 * SBH // 2, "that is one layer; the model has two", "这只是一层；模型有两层"),
        ),
        why_en="layers x 4 x B x T x C x 4 bytes x (1 - 1/t)",
        why_zh="层数 x 4 x B x T x C x 4 字节 x (1 - 1/t)",
    ),
    Prediction(
        "07.ring_kv",
        7,
        "K/V passes per rank at CP 4, and equal to full attention",
        "CP 4 时每个 rank 传递 K/V 的次数，以及是否与完整注意力相同",
        answer={"kv_passes": 3, "equal": True},
        hint_en='{"kv_passes": an integer, "equal": True or False}',
        hint_zh='{"kv_passes": 整数, "equal": True 或 False}',
        mistakes=(
            Mistake(
                {"kv_passes": 4, "equal": True},
                "N - 1: at the first step each rank attends to its own K/V, which needs no pass",
                "N - 1：第一步每个 rank 用的是自己的 K/V，不需要传递",
            ),
            Mistake(
                {"kv_passes": 3, "equal": False},
                "the online-softmax merge is exact: only the order of the additions differs (below 1e-5)",
                "在线 softmax 合并是精确的：只有加法顺序不同（误差低于 1e-5）",
            ),
        ),
    ),
    Prediction(
        "07.tiles",
        7,
        "tiles per rank at CP 4",
        "CP 4 时每个 rank 计算的块数",
        answer={"contiguous": [1, 2, 3, 4], "zigzag": [9, 9, 9, 9]},
        hint_en='{"contiguous": [4 numbers], "zigzag": [4 numbers]}',
        hint_zh='{"contiguous": [4 个数], "zigzag": [4 个数]}',
        mistakes=(
            Mistake(
                {"contiguous": [4, 4, 4, 4], "zigzag": [9, 9, 9, 9]},
                "the causal mask hides every later chunk: rank r sees chunks 0 .. r only",
                "因果掩码遮住所有更晚的块：rank r 只看得到第 0 .. r 块",
            ),
        ),
        why_en="zigzag: 2N chunks, each rank r + 1 tiles for chunk r and 2N - r for chunk 2N-1-r",
        why_zh="zigzag：2N 块，每个 rank 对第 r 块算 r + 1 个，对第 2N-1-r 块算 2N - r 个",
    ),
    Prediction(
        "07.cp_kv_bytes",
        7,
        "K/V bytes one rank sends in one step's forward at CP 2 (4 layers, b = 4, s = 512, h = 64, fp32)",
        "CP 2 时一个 rank 在一步的前向中发送的 K/V 字节数（4 层，b = 4，s = 512，h = 64，fp32）",
        # per layer: its K and V block (2 b (s/N) h values) passed N - 1 times = 2 b s h (N-1)/N
        answer=4 * 2 * 4 * 512 * 64 * 4 // 2,
        hint_en="bytes, an integer",
        hint_zh="字节数（整数）",
        mistakes=(
            Mistake(
                4 * 4 * 512 * 64 * 4 // 2,
                "K and V both travel: 2·b·s·h·(N-1)/N values per layer",
                "K 和 V 都要传：每层 2·b·s·h·(N-1)/N 个值",
            ),
            Mistake(
                4 * 2 * 4 * 512 * 64 * 4,
                "each rank sends its own block, s/N tokens, N - 1 times: (N-1)/N of the sequence's K/V",
                "每个 rank 发送的是自己那块（s/N 个 token），共 N - 1 次：整条序列 K/V 的 (N-1)/N",
            ),
            Mistake(
                2 * 4 * 512 * 64 * 4 // 2,
                "that is one layer; every layer's attention runs its own ring, 4 layers",
                "这只是一层；每一层的注意力都各走一圈环，共 4 层",
            ),
        ),
        why_en="layers x 2·b·s·h·(N-1)/N x 4 bytes",
        why_zh="层数 x 2·b·s·h·(N-1)/N x 4 字节",
    ),
    Prediction(
        "07.cp_training",
        7,
        "CP 2 against one process",
        "CP 2 与单进程对比",
        answer={"same_losses": True, "less_than_half": True},
        hint_en='{"same_losses": True/False, "less_than_half": True/False}',
        hint_zh='{"same_losses": True/False, "less_than_half": True/False}',
        mistakes=(
            Mistake(
                {"same_losses": True, "less_than_half": False},
                "ring attention never stores the (T x T) attention weights, which grow with T²: more than half goes",
                "环形注意力从不保存随 T² 增长的 (T x T) 注意力权重：减少的不止一半",
            ),
        ),
    ),
)


# --------------------------------------------------------------------------- the exercise


def _probe(fn) -> tuple[str, str] | None:
    """Call the learner's merge once on small local tensors: shapes and form, no communication."""
    o, lse = torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3)
    got = fn(o, lse, o, lse)
    if not (
        isinstance(got, tuple)
        and len(got) == 2
        and all(isinstance(g, torch.Tensor) for g in got)
        and got[0].shape == o.shape
        and got[1].shape == lse.shape
    ):
        return ("return a pair (o, lse) shaped like (o_a, lse_a)", "请返回一对 (o, lse)，形状分别与 o_a 和 lse_a 相同")
    return None


def _statistic(fn) -> tuple[str, str] | None:
    """Which statistic of the learner's merge is wrong, from one local call on known blocks (no communication).

    Two blocks over 3 queries, block a's log-sum-exp far above b's on the last query (100 vs 1: e^100
    overflows float32, so only a merge that subtracts the running max first survives it).
    """
    g = torch.Generator().manual_seed(13)
    o_a, o_b = torch.randn(1, 1, 3, 4, generator=g), torch.randn(1, 1, 3, 4, generator=g)
    lse_a, lse_b = torch.tensor([[[0.5, 2.0, 100.0]]]), torch.tensor([[[1.5, -1.0, 1.0]]])
    o, lse = merge(o_a, lse_a, o_b, lse_b)
    try:
        got_o, got_lse = fn(o_a.clone(), lse_a.clone(), o_b.clone(), lse_b.clone())
        if got_o.shape != o.shape or got_lse.shape != lse.shape:
            return None
    except Exception:  # noqa: BLE001 - the ring run reports it
        return None
    close = lambda a, b: bool(torch.isclose(a, b, rtol=1e-4, atol=1e-5).all())  # noqa: E731
    if not torch.isfinite(got_lse).all():
        return (
            "your merge overflows at a log-sum-exp of 100 (e^100 is past float32's range): subtract the running "
            "max first, lse = m + log(e^(lse_a - m) + e^(lse_b - m)) with m = max(lse_a, lse_b) (torch.logaddexp does)",
            "你的合并在 log-sum-exp 为 100 时溢出（e^100 超出 float32 的范围）：先减去运行最大值，"
            "lse = m + log(e^(lse_a - m) + e^(lse_b - m))，其中 m = max(lse_a, lse_b)（torch.logaddexp 就是这样做的）",
        )
    if not close(got_lse, lse):
        if close(got_lse, torch.maximum(lse_a, lse_b)):
            return (
                "your lse is the running max only: the merged normaliser adds both blocks' sums, "
                "lse = log(e^lse_a + e^lse_b), which is more than either (the max is only where it starts)",
                "你的 lse 只是运行最大值：合并后的归一化因子是两块之和，lse = log(e^lse_a + e^lse_b)，"
                "比任何一块都大（最大值只是计算的起点）",
            )
        return (
            "your lse, the merged normaliser in log form, is wrong: it is log(e^lse_a + e^lse_b)",
            "你的 lse（对数形式的合并归一化因子）不对：应为 log(e^lse_a + e^lse_b)",
        )
    if not torch.isfinite(got_o).all():
        return (
            "your lse is right, but the output overflows at a log-sum-exp of 100: weigh each block by its share "
            "of the merged normaliser, e^(lse_a - lse), never by e^lse_a itself",
            "你的 lse 是对的，但输出在 log-sum-exp 为 100 时溢出：每块的权重应是它在合并归一化因子中的占比 "
            "e^(lse_a - lse)，而不是 e^lse_a 本身",
        )
    if close(got_o, o):
        return None  # right on these blocks: the ring run says what differs
    if close(got_o, (o_a + o_b) / 2):
        return (
            "your lse is right, but the output weighs both blocks equally: block a's weight is its share of "
            "the normaliser, e^(lse_a - lse), and b's e^(lse_b - lse)",
            "你的 lse 是对的，但输出对两块一视同仁：a 块的权重是它在归一化因子中的占比 e^(lse_a - lse)，"
            "b 块是 e^(lse_b - lse)",
        )
    return (
        "your lse is right, but the output's weights are not: e^(lse_a - lse) for block a and e^(lse_b - lse) "
        "for block b, which add up to 1 (each block's output is already divided by its own normaliser)",
        "你的 lse 是对的，但输出的权重不对：a 块为 e^(lse_a - lse)，b 块为 e^(lse_b - lse)，两者相加为 1"
        "（每块的输出已经除过它自己的归一化因子）",
    )


def check_merge(ctx, source: str, name: str) -> dict:
    """On each rank: ring attention with the learner's merge against full causal attention."""
    _, rank = group_size_and_rank(None)
    try:
        fn = learner_function(source, name)
    except Exception as error:  # the learner's code
        fn, problem = None, does_not_compile(error)
    else:
        try:
            shape_problem, problem = call(_probe, fn)
        except NotDone:
            return not_done(rank, name)  # every rank: the same local probe, no sends yet
        problem = problem or shape_problem
    raised: list = []

    def guarded(*args):
        """The learner's merge; if it raises, dtlab's, so every rank keeps passing blocks."""
        if not raised:
            try:
                return fn(*args)
            except Exception as error:  # noqa: BLE001 - reported below
                raised.append(
                    (
                        f"your function raised {type(error).__name__}: {error}",
                        f"你的函数抛出了 {type(error).__name__}：{error}",
                    )
                )
        return merge(*args)

    use = guarded if problem is None else merge
    for zigzag in (True, False):  # every rank runs both rings whatever its verdict
        result = ring_versus_full(32, zigzag, use)
        if problem is None and not raised:
            layout = "zigzag" if zigzag else "contiguous"
            for what, zh, expected, got in (
                ("output", "输出", result["expected"], result["out"]),
                *(
                    (f"grad of {n}", f"{n} 的梯度", e, g)
                    for n, e, g in zip("qkv", result["expected_grads"], result["grads"])
                ),
            ):
                found = difference(what, zh, expected, got, atol=1e-5, rtol=1e-4)
                if found:
                    problem = with_hint((f"{layout} layout: {found[0]}", f"{layout} 布局：{found[1]}"), _statistic(fn))
                    break
    return verdict(rank, problem or (raised[0] if raised else None))


EXERCISES = (
    Exercise(
        "07.merge",
        7,
        "the online-softmax merge of two attention blocks",
        "两个注意力块的在线 softmax 合并",
        function="my_merge",
        check=check_merge,
        reference=merge,
        world_size=2,
    ),
)
