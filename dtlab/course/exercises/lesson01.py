"""Lesson 01 (all-reduce): the answer key, and the exercise "one reduce-scatter step of the ring".

The learner writes ``ring_step(chunks, step, rank, size)``: this rank's part
in step ``step`` of the ring's reduce-scatter (send one chunk to the right
neighbour, add the chunk arriving from the left into its own copy), so that
after ``size - 1`` steps rank r holds chunk r summed over every rank, as
:func:`dtlab.comm.collectives.ring_reduce_scatter` leaves it. The check runs the
learner's step on 4 real ranks and, after every step, compares each rank's
chunks with the ring as :func:`dtlab.comm.collectives.ring_schedule` plays it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dtlab.comm.collectives import REDUCE_SCATTER, group_size_and_rank, ring_schedule
from dtlab.course.exercises.model import Exercise, Mistake, Prediction
from dtlab.course.exercises.ranks import NotDone, call, compiled, difference, not_done, verdict

N, MIB = 4, 1 << 20
PSI = 236_928
"""Parameters of the small GPT (lesson 00)."""

PREDICTIONS = (
    Prediction(
        "01.complete_chunks",
        1,
        "fully reduced chunks per rank after reduce-scatter",
        "reduce-scatter 之后每个 rank 上已完全归约的块",
        answer=[[0], [1], [2], [3]],
        hint_en="a list per rank of chunk numbers, e.g. [[1], [2], [3], [0]]",
        hint_zh="每个 rank 一个块编号列表，例如 [[1], [2], [3], [0]]",
        mistakes=(
            Mistake(
                [[0, 1, 2, 3]] * 4,
                "that is after the all-gather: reduce-scatter leaves each rank one complete chunk, its own",
                "那是 all-gather 之后的情况：reduce-scatter 只让每个 rank 拥有一个完整的块，即它自己的那块",
            ),
        ),
    ),
    Prediction(
        "01.bytes_sent",
        1,
        "bytes each rank sends, 4 MiB on 4 ranks",
        "4 个 rank 上 4 MiB 时每个 rank 发送的字节数",
        answer=2 * (N - 1) * 4 * MIB // N,
        hint_en="bytes, an integer",
        hint_zh="字节数（整数）",
        mistakes=(
            Mistake(
                4 * MIB,
                "each rank sends 2(N-1) chunks of 1/N of the tensor, not the tensor once",
                "每个 rank 发送 2(N-1) 个、每个为张量 1/N 大小的块，而不是整个张量发一次",
            ),
            Mistake(
                (N - 1) * 4 * MIB // N,
                "that is one half (reduce-scatter); the all-gather sends as much again",
                "这只是一半（reduce-scatter）；all-gather 还要再发同样多",
            ),
            Mistake(
                (N - 1) * 4 * MIB,
                "that is what rank 0 of the naive all-reduce sends each way; the ring spreads it",
                "这是朴素 all-reduce 中 rank 0 每个方向发送的量；环把它分摊了",
            ),
        ),
        why_en="2(N-1) steps, each sending nbytes/N",
        why_zh="2(N-1) 步，每步发送 nbytes/N",
    ),
    Prediction(
        "01.ring_steps",
        1,
        "ring steps",
        "环形步数",
        answer=2 * (N - 1),
        hint_en="an integer",
        hint_zh="整数",
        mistakes=(
            Mistake(
                N - 1,
                "N-1 is one phase; reduce-scatter and all-gather take N-1 each",
                "N-1 只是一个阶段；reduce-scatter 和 all-gather 各需 N-1 步",
            ),
            Mistake(
                N,
                "each phase has N-1 steps (a chunk needs N-1 hops to visit every other rank)",
                "每个阶段是 N-1 步（一个块要跳 N-1 次才能经过其他所有 rank）",
            ),
        ),
    ),
    Prediction(
        "01.equals_torch",
        1,
        "ring all-reduce equals torch.distributed.all_reduce on every rank",
        "环形 all-reduce 在每个 rank 上都等于 torch.distributed.all_reduce",
        answer=True,
        hint_en="True or False",
        hint_zh="True 或 False",
    ),
    Prediction(
        "01.shared_memory_same_bits",
        1,
        "the ring over shared memory gives the same bits as over gloo (random floats, every rank)",
        "经共享内存的环与经 gloo 的环结果逐位相同（随机浮点数，每个 rank）",
        answer=True,
        hint_en="True or False",
        hint_zh="True 或 False",
        mistakes=(
            Mistake(
                False,
                "the transport only moves bytes, and the ring never adds whatever arrives "
                "first: each step waits for its one chunk from the left, so which numbers are added, "
                "and in what order, is the schedule's, the same over either transport; only another "
                "algorithm (another order of additions) could change the bits",
                "传输方式只负责搬运字节；环也从不“谁先到就先加谁”：每一步都等左邻居的那一块到了才相加，"
                "所以加哪些数、按什么顺序加都由调度决定，在两种传输方式下完全一样；只有换一种算法"
                "（换一种相加顺序）才可能改变结果",
            ),
        ),
        why_en="the same schedule, the same additions in the same order",
        why_zh="调度相同，加法及其顺序都相同",
    ),
    Prediction(
        "01.bandwidths",
        1,
        "algbw and busbw for 64 MiB in 1 ms on 4 ranks (GB/s)",
        "4 个 rank 上 64 MiB 用时 1 毫秒的 algbw 和 busbw（GB/s）",
        answer={"algbw": 67.109, "busbw": 100.663},
        rel_tol=0.01,
        hint_en='{"algbw": GB/s, "busbw": GB/s}',
        hint_zh='{"algbw": GB/s, "busbw": GB/s}',
        mistakes=(
            Mistake(
                {"algbw": 67.109, "busbw": 67.109},
                "busbw = algbw x 2(N-1)/N (nccl-tests), 1.5 on 4 ranks",
                "busbw = algbw x 2(N-1)/N（nccl-tests），4 个 rank 时为 1.5 倍",
            ),
            Mistake(
                {"algbw": 64.0, "busbw": 96.0},
                "64 MiB is 67.1 MB: GB/s counts 10^9 bytes",
                "64 MiB 是 67.1 MB：GB/s 按 10^9 字节计",
            ),
        ),
    ),
    Prediction(
        "01.ethernet_ms",
        1,
        "64 MiB all-reduce over Ethernet on 4 ranks (ms)",
        "4 个 rank 上经以太网做 64 MiB all-reduce（毫秒）",
        answer=round((2 * 3 * 25e-6 + 2 * 3 / 4 * 64 * MIB / 12.5e9) * 1e3, 4),
        rel_tol=0.01,
        hint_en="milliseconds",
        hint_zh="毫秒",
        why_en="2(N-1) alpha + 2(N-1)/N x bytes / beta",
        why_zh="2(N-1) alpha + 2(N-1)/N x 字节数 / beta",
    ),
    Prediction(
        "01.nvlink_half_peak",
        1,
        "NVLink, 4 ranks: where busbw is half the peak, and 1 KiB's share",
        "NVLink，4 个 rank：busbw 达到峰值一半的消息大小，以及 1 KiB 的占比",
        answer={"half-peak size (bytes)": round(4 * 1e-6 * 450e9), "1 KiB share of peak (%)": 0.0569},
        rel_tol=0.05,
        hint_en='{"half-peak size (bytes)": ..., "1 KiB share of peak (%)": ...}',
        hint_zh='{"half-peak size (bytes)": ..., "1 KiB share of peak (%)": ...}',
    ),
    Prediction(
        "01.gradient_bytes",
        1,
        "gradient bytes all-reduced per step",
        "每步 all-reduce 的梯度字节数",
        answer=4 * PSI,
        hint_en="bytes, an integer",
        hint_zh="字节数（整数）",
        mistakes=(Mistake(PSI, "a float32 gradient is 4 bytes per parameter", "float32 梯度每个参数 4 字节"),),
    ),
    Prediction(
        "01.ring_bytes_per_step",
        1,
        "bytes each rank sends per step with a ring",
        "使用环时每步每个 rank 发送的字节数",
        answer=2 * 3 * 4 * PSI // 4,
        hint_en="bytes, an integer",
        hint_zh="字节数（整数）",
    ),
    Prediction(
        "01.ring_training_same_bits",
        1,
        "8 training losses on the learner's ring equal torch's to the last bit (DP 4)",
        "在学员的环上训练的 8 个损失值与 torch 的逐位相同（DP 4）",
        answer=False,
        hint_en="True or False",
        hint_zh="True 或 False",
        mistakes=(
            Mistake(
                True,
                "both add the same four gradients, but in different orders (the ring goes "
                "round from the chunk's next rank; gloo has its own), and floating-point addition "
                "is not associative: the last bits differ, by about 1e-7; on 2 ranks they would "
                "not (a + b = b + a)",
                "两者加的是同样的 4 份梯度，但顺序不同（环从该块的下一个 rank 开始绕一圈；gloo 有它自己的顺序），"
                "而浮点加法不满足结合律：最后几位会相差约 1e-7；2 个 rank 时则不会（a + b = b + a）",
            ),
        ),
        why_en="the same sums in another order: equal within rounding, not bit for bit",
        why_zh="同样的和、不同的顺序：只差舍入，并非逐位相同",
    ),
    Prediction(
        "01.try_steps_8",
        1,
        "ring steps of an all-reduce on 8 ranks",
        "8 个 rank 上一次全归约的环形步数",
        answer=2 * (8 - 1),
        hint_en="an integer",
        hint_zh="整数",
        mistakes=(
            Mistake(
                7,
                "7 is one phase: reduce-scatter and all-gather take N-1 each",
                "7 只是一个阶段：reduce-scatter 和 all-gather 各需 N-1 步",
            ),
        ),
    ),
    Prediction(
        "01.try_bytes_2",
        1,
        "bytes each rank sends, 4 MiB on 2 ranks",
        "2 个 rank 上 4 MiB 时每个 rank 发送的字节数",
        answer=2 * (2 - 1) * 4 * MIB // 2,
        hint_en="bytes, an integer",
        hint_zh="字节数（整数）",
        mistakes=(
            Mistake(
                6 * MIB,
                "6 MiB is for 4 ranks; on 2, 2(N-1)/N = 1: the tensor once",
                "6 MiB 是 4 个 rank 的情况；2 个 rank 时 2(N-1)/N = 1，正好一个张量",
            ),
            Mistake(
                2 * MIB, "two steps (one per phase) of half the tensor each", "两步（每个阶段一步），每步发送半个张量"
            ),
        ),
    ),
    Prediction(
        "01.try_term",
        1,
        "the alpha-beta term that grows linearly with N",
        "alpha-beta 模型中随 N 线性增长的项",
        answer="latency",
        hint_en='"latency" or "bandwidth"',
        hint_zh='"延迟"（latency）或 "带宽"（bandwidth）',
        words_zh=(("延迟", "latency"), ("带宽", "bandwidth")),
        mistakes=(
            Mistake(
                "bandwidth",
                "2(N-1)/N x S/beta stays below 2 S/beta whatever N is; 2(N-1) alpha grows with every rank added",
                "2(N-1)/N x S/beta 无论 N 多大都小于 2 S/beta；2(N-1) alpha 则随 rank 数线性增长",
            ),
        ),
    ),
)


# --------------------------------------------------------------------------- the exercise


def ring_step(chunks, step, rank, size):
    """Reference: this rank's part in reduce-scatter step ``step`` of a ring of ``size`` ranks."""
    right, left = (rank + 1) % size, (rank - 1) % size
    send = chunks[(rank - step - 1) % size]  # the partial sum my left neighbour needs next
    mine = chunks[(rank - step - 2) % size]  # the chunk arriving from the left
    incoming = torch.empty_like(mine)
    works = [dist.irecv(incoming, left), dist.isend(send, right)]  # both posted, then waited
    for work in works:
        work.wait()
    mine.add_(incoming)


def _start(rank: int, numel: int = 12) -> torch.Tensor:
    """Rank r's tensor: whole numbers, distinct per rank and element (sums are exact)."""
    return (torch.arange(numel) * (rank + 1) + 10 * rank).float()


def _expected(size: int, numel: int) -> list[list[list[torch.Tensor]]]:
    """[step][rank][chunk]: every rank's chunks after each reduce-scatter step, played from the schedule."""
    state = [list(torch.tensor_split(_start(r, numel), size)) for r in range(size)]
    out = []
    for s in range(size - 1):
        before = [[c.clone() for c in chunks] for chunks in state]
        for move in ring_schedule(size):
            if move.phase == REDUCE_SCATTER and move.step == s:
                state[(move.rank + 1) % size][move.send_chunk] += before[move.rank][move.send_chunk]
        out.append([[c.clone() for c in chunks] for chunks in state])
    return out


def _failed_anywhere(failed: bool) -> bool:
    flag = torch.tensor([1.0 if failed else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def check_ring_step(ctx, source: str, name: str) -> dict:
    """On each of the ranks: the learner's step, played size-1 times, against the schedule's ring."""
    size, rank = group_size_and_rank(None)
    fn, problem = compiled(source, name)
    expected = _expected(size, 12)
    chunks = list(torch.tensor_split(_start(rank), size))  # views of this rank's (12,) tensor
    for s in range(size - 1):
        if fn is not None and problem is None:
            try:
                _, problem = call(fn, chunks, s, rank, size)
            except NotDone:
                _failed_anywhere(True)
                return not_done(rank, name)
            if problem is None:
                found = difference("chunks", "块", expected[s][rank], chunks)
                if found:
                    problem = (f"after step {s}, {found[0]}", f"第 {s} 步之后，{found[1]}")
        if _failed_anywhere(problem is not None or fn is None):  # every rank stops at the same step
            break
    return verdict(rank, problem)


EXERCISES = (
    Exercise(
        "01.ring_step",
        1,
        "one reduce-scatter step of the ring",
        "环形 reduce-scatter 的一步",
        function="ring_step",
        check=check_ring_step,
        reference=ring_step,
        world_size=N,
    ),
)
