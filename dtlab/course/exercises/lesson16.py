"""Lesson 16 (from laptop to cluster): the answer key, and the exercise "a hierarchical all-reduce".

The learner writes ``hierarchical_all_reduce(tensor, node_group, cross_group)``:
sum ``tensor`` over every rank, in place, crossing the slow link between nodes
with only 1/K of it (K ranks per node): reduce-scatter inside the node, all-reduce
the piece across nodes, all-gather inside the node
(:func:`dtlab.cluster.hierarchical.hierarchical_all_reduce` is dtlab's, on its
own ring). The check runs it on 4 real ranks numbered the way torchrun numbers
two nodes of two ranks (node groups {0, 1} and {2, 3}, cross-node groups
{0, 2} and {1, 3}) and compares the sum; then it looks at the traffic of the
collectives the function called: none may span the whole world, and what the
rank sends across nodes may not exceed what a ring all-reduce of 1/K of the
tensor sends there.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dtlab.cluster.hierarchical import build_node_groups
from dtlab.comm.collectives import group_size_and_rank
from dtlab.course.exercises.model import MEASURED, Exercise, Mistake, Prediction
from dtlab.course.exercises.ranks import (
    CountingDist,
    NotDone,
    any_rank_stops,
    call,
    compiled,
    difference,
    not_done,
    verdict,
)
from dtlab.planner.communication import ring_bytes_sent_per_rank

GRADIENT_BYTES = 947_712
"""The small GPT's gradients in float32 (236,928 parameters x 4 bytes): what DP all-reduces each step."""

PREDICTIONS = (
    # 16.link_order is timed: on a quiet machine TP, DP, PP, but on a loaded one TP's and DP's added
    # times come close enough to swap, so only the run can say (the answer key fills in the measurement).
    Prediction(
        "16.same_losses",
        16,
        "the same losses, bit for bit",
        "损失逐位相同",
        answer=True,
        hint_en="True or False",
        hint_zh="True 或 False",
        mistakes=(
            Mistake(
                False,
                "the same seed, batches and reduction order on the same kind of ranks: "
                "where the processes run does not change the arithmetic",
                "相同的种子、批次和归约顺序：进程在哪里运行不会改变运算",
            ),
        ),
    ),
    Prediction(
        "16.link_order",
        16,
        "layouts by the time the link adds to a step, most first",
        "按链路给每步增加的时间排序的布局（最多的在前）",
        answer=MEASURED,
        hint_en='a list of "tp", "dp", "pp"',
        hint_zh='"tp"、"dp"、"pp" 的列表',
        mistakes=(
            Mistake(
                ["dp", "tp", "pp"],
                "DP's 0.9 MiB of gradients go in a few bucket all-reduces "
                "per step, overlapped with backward; TP sends more (16 x 128 KiB = 2 MiB) and each "
                "of its all-reduces blocks the computation",
                "DP 的 0.9 MiB 梯度每步分成几个桶做全归约，并与反向传播重叠；TP 发送得更多"
                "（16 x 128 KiB = 2 MiB），而且它的每次全归约都会阻塞计算",
            ),
        ),
    ),
    Prediction(
        "16.link_ms",
        16,
        "ms the 20 Mbit/s link adds to a step of DP over 2 nodes x 2",
        "20 Mbit/s 链路给 2 节点 x 2 上数据并行的每一步增加的毫秒数",
        answer=round(1.5 * GRADIENT_BYTES * 8 / 20e6 * 1e3),
        rel_tol=0.3,
        hint_en="milliseconds",
        hint_zh="毫秒",
        mistakes=(
            Mistake(
                round(GRADIENT_BYTES * 8 / 20e6 * 1e3),
                "a ring all-reduce over P = 4 ranks sends 2(P-1)/P = 1.5 times the gradients over "
                "each node's link, not 1.0 times",
                "4 个 rank 的环形全归约让每个节点的链路承载梯度的 2(P-1)/P = 1.5 倍，而不是 1.0 倍",
            ),
            Mistake(
                round(1.5 * GRADIENT_BYTES / 20e6 * 1e3),
                "20 Mbit/s is 20 million bits a second: multiply the bytes by 8",
                "20 Mbit/s 是每秒 2000 万比特：字节数要乘以 8",
            ),
            Mistake(
                round(1.5 * GRADIENT_BYTES * 8 / 20e6, 2),
                "that is the answer in seconds; the question asks for milliseconds",
                "这是以秒为单位的答案；题目问的是毫秒",
            ),
            Mistake(
                round(2 * 1.5 * GRADIENT_BYTES * 8 / 20e6 * 1e3),
                "count one direction of one node's link: in the ring one rank per node sends "
                "across it, while the other direction carries the same bytes at the same time",
                "只算一个节点链路的一个方向：环中每个节点只有一个 rank 经它发送，另一个方向同时传着同样多的字节",
            ),
        ),
        why_en="a flat ring over P = 4 ranks sends 2(P-1)/P of the 947,712 bytes of gradients over each "
        "node's link: 1.5 x 947,712 x 8 bits / 20e6 bit/s",
        why_zh="4 个 rank 的扁平环让每个节点的链路承载 947,712 字节梯度的 2(P-1)/P："
        "1.5 x 947,712 x 8 比特 / 20e6 比特每秒",
    ),
    Prediction(
        "16.mib",
        16,
        "MiB over each node's link, each way",
        "每个节点链路每个方向的 MiB",
        answer={"flat": 6.0, "hierarchical": 4.0},
        hint_en='{"flat": MiB, "hierarchical": MiB}',
        hint_zh='{"flat": MiB, "hierarchical": MiB}',
        why_en="flat: 2(P-1)/P of the tensor; hierarchical: 2(N-1)/N",
        why_zh="扁平：张量的 2(P-1)/P；分层：2(N-1)/N",
    ),
    Prediction(
        "16.zero3_link_mb",
        16,
        "MB a rank sends per step on the group that crosses the link: ZeRO-3 over dp = 4",
        "ZeRO-3（dp = 4）时一个 rank 每步在跨链路的组上发送的 MB",
        answer=round(2.25 * GRADIENT_BYTES / 1e6, 2),
        rel_tol=0.05,
        hint_en="MB (10^6 bytes)",
        hint_zh="MB（10^6 字节）",
        mistakes=(
            Mistake(
                round(3 * GRADIENT_BYTES / 1e6, 2),
                "a ring all-gather or reduce-scatter over N = 4 ranks sends (N-1)/N of the tensor, not all of it",
                "N = 4 个 rank 的环形全收集或归约散射只发送张量的 (N-1)/N，而不是全部",
            ),
            Mistake(
                round(1.5 * GRADIENT_BYTES / 1e6, 2),
                "ZeRO-3 all-gathers the parameters twice (forward and backward) and reduce-scatters the "
                "gradients once: three passes, not two",
                "ZeRO-3 全收集参数两次（前向、反向），再归约散射梯度一次：共三遍，而不是两遍",
            ),
        ),
        why_en="all-gather forward, all-gather backward, reduce-scatter: 3 x 3/4 x 947,712 bytes",
        why_zh="前向全收集、反向全收集、归约散射：3 x 3/4 x 947,712 字节",
    ),
    Prediction(
        "16.hsdp_link_mb",
        16,
        "MB a rank sends per step on the group that crosses the link: HSDP, dp = 4, K = 2",
        "HSDP（dp = 4，K = 2）时一个 rank 每步在跨链路的组上发送的 MB",
        answer=round(0.5 * GRADIENT_BYTES / 1e6, 2),
        rel_tol=0.05,
        hint_en="MB (10^6 bytes)",
        hint_zh="MB（10^6 字节）",
        mistakes=(
            Mistake(
                round(GRADIENT_BYTES / 1e6, 2),
                "the all-reduce across nodes carries this rank's 1/K shard of the gradient, not all of it",
                "跨节点的全归约只传本 rank 的 1/K 梯度分片，而不是整个梯度",
            ),
            Mistake(
                round(0.25 * GRADIENT_BYTES / 1e6, 2),
                "a ring all-reduce over R ranks sends 2(R-1)/R of the tensor: 1.0 x the shard for R = 2",
                "R 个 rank 的环形全归约发送张量的 2(R-1)/R：R = 2 时是分片的 1.0 倍",
            ),
        ),
        why_en="one all-reduce of the K = 2 shard over R = 2 replicas: 2(R-1)/R x 947,712 / 2 bytes",
        why_zh="在 R = 2 个副本之间对 K = 2 的分片做一次全归约：2(R-1)/R x 947,712 / 2 字节",
    ),
    Prediction(
        "16.hier_faster",
        16,
        "hierarchical faster than the flat ring",
        "分层比扁平环更快",
        answer=True,
        hint_en="True or False",
        hint_zh="True 或 False",
    ),
)


# --------------------------------------------------------------------------- the exercise

K, NUMEL = 2, 12  # ranks per node; elements of each rank's tensor (a multiple of K)


def hierarchical_all_reduce(tensor, node_group, cross_group):
    """Reference: reduce-scatter inside the node, all-reduce 1/K across nodes, all-gather inside the node."""
    k = dist.get_world_size(node_group)
    piece = torch.empty(tensor.numel() // k, dtype=tensor.dtype)
    dist.reduce_scatter_single(piece, tensor, group=node_group)  # (numel,) -> (numel / K,): my node's sum
    dist.all_reduce(piece, group=cross_group)  # ... summed over every node
    dist.all_gather_single(tensor, piece, group=node_group)  # (numel / K,) -> (numel,)
    return tensor


WHOLE = {
    # collective -> (its kind for ring_bytes_sent_per_rank, the argument that is the whole tensor)
    "all_reduce": ("all_reduce", "tensor"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "all_gather_into_tensor": ("all_gather", "output_tensor"),
    "all_gather_single": ("all_gather", "output_tensor"),
    "broadcast": ("broadcast", "tensor"),
}


def _traffic(log: list[tuple[str, dict]], world: int) -> list[tuple[str, bool, bool, float]]:
    """For each call in ``log`` (:class:`CountingDist`'s) that carries a tensor: (name, whether its group
    is the whole world, whether it crosses between nodes, the elements this rank sends for it, as a ring
    does). A receive is its sender's traffic; a collective dtlab does not price counts its largest tensor."""
    node, out = dist.get_rank() // K, []
    for name, arguments in log:
        group = arguments.get("group")
        ranks = (
            list(range(world)) if group is None or group is dist.group.WORLD else dist.get_process_group_ranks(group)
        )
        tensors = [v for v in arguments.values() if isinstance(v, torch.Tensor)]
        if not tensors or name in ("recv", "irecv"):
            continue
        if name in ("send", "isend"):
            peer = arguments["dst"] if arguments.get("dst") is not None else ranks[arguments.get("group_dst") or 0]
            out.append((name, False, peer // K != node, tensors[0].numel()))
            continue
        kind, whole = WHOLE.get(name, (None, None))
        sent = (
            ring_bytes_sent_per_rank(arguments[whole].numel(), len(ranks), kind)
            if whole in arguments
            else max(t.numel() for t in tensors)
        )
        out.append((name, len(ranks) == world, len({r // K for r in ranks}) > 1, sent))
    return out


def _start(rank: int) -> torch.Tensor:
    """Rank r's tensor: whole numbers, distinct per rank and element (sums are exact)."""
    return (torch.arange(NUMEL) * (rank + 1) + 100 * rank).float()


def _traffic_problem(calls, world: int) -> tuple[str, str] | None:
    """What is wrong with the traffic of the collectives the learner called, if anything: one over the
    whole world, or more elements sent across nodes than a ring all-reduce of 1/K of the tensor sends."""
    for name, whole_world, _, _ in calls:
        if whole_world:
            return (
                f"dist.{name} over the whole world: its ring crosses the slow link carrying all of "
                "the tensor; use node_group and cross_group",
                f"dist.{name} 用的是整个 world：它的环带着整个张量穿过慢链路；请使用 node_group 和 cross_group",
            )
    enough = ring_bytes_sent_per_rank(NUMEL / K, world // K, "all_reduce")  # 1/K of it, across the nodes
    sent = sum(wire for _, _, crosses, wire in calls if crosses)
    if sent > enough + 1e-9:
        return (
            f"the sum is right, but this rank sent {sent:g} elements across the slow link, where a ring "
            f"all-reduce of 1/K of the tensor across the nodes sends {enough:g}: reduce-scatter inside "
            "the node first",
            f"和是对的，但本 rank 经慢链路发送了 {sent:g} 个元素，而跨节点对张量的 1/K 做环形全归约只需发送 "
            f"{enough:g} 个：先在节点内做归约散射（reduce-scatter）",
        )
    return None


def check_hierarchical(ctx, source: str, name: str) -> dict:
    """On 4 ranks as 2 nodes of 2: the learner's sum against the world's, and what crossed the nodes."""
    size, rank = group_size_and_rank(None)
    groups = build_node_groups(K)  # every rank makes every group, in the same order
    expected = sum(_start(r) for r in range(size))  # (NUMEL,)
    recorder = CountingDist()
    fn, problem = compiled(source, name, dist=recorder)
    tensor, returned = _start(rank), None
    if problem is None:
        try:
            returned, problem = call(fn, tensor, groups.intra, groups.inter)
        except NotDone:
            return not_done(rank, name)
    if problem is None:
        problem = (
            difference("tensor", "张量", expected, tensor)
            or (returned is not None and difference("the tensor returned", "返回的张量", expected, returned))
            or _traffic_problem(_traffic(recorder.log, size), size)
        )
    any_rank_stops(problem)  # every rank ends here together
    return verdict(rank, problem)


EXERCISES = (
    Exercise(
        "16.hierarchical",
        16,
        "a hierarchical all-reduce",
        "分层全归约",
        function="hierarchical_all_reduce",
        check=check_hierarchical,
        reference=hierarchical_all_reduce,
        world_size=4,
    ),
)
