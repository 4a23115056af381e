"""Lesson 15 (from laptop to cluster): the answer key, and the exercise "a hierarchical all-reduce".

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

import inspect

import torch
import torch.distributed as dist

from dtlab.cluster.hierarchical import build_node_groups
from dtlab.collectives import group_size_and_rank
from dtlab.course.exercises.model import MEASURED, Exercise, Mistake, Prediction
from dtlab.course.exercises.ranks import NotDone, any_rank_stops, call, compiled, difference, not_done, verdict

PREDICTIONS = (
    # 15.link_order is timed: on a quiet machine TP, DP, PP, but on a loaded one TP's and DP's added
    # times come close enough to swap, so only the run can say (the answer key fills in the measurement).
    Prediction("15.same_losses", 15, "the same losses, bit for bit", "损失逐位相同", answer=True,
               hint_en="True or False", hint_zh="True 或 False",
               mistakes=(Mistake(False, "the same seed, batches and reduction order on the same kind of ranks: "
                                 "where the processes run does not change the arithmetic",
                                 "相同的种子、批次和归约顺序：进程在哪里运行不会改变运算"),)),
    Prediction("15.link_order", 15, "layouts by the time the link adds to a step, most first",
               "按链路给每步增加的时间排序的布局（最多的在前）", answer=MEASURED,
               hint_en='a list of "tp", "dp", "pp"', hint_zh='"tp"、"dp"、"pp" 的列表',
               mistakes=(Mistake(["dp", "tp", "pp"], "DP sends the most bytes in one all-reduce, but TP's 16 small "
                                 "all-reduces each block the computation", "DP 一次全归约的字节最多，但 TP 的 16 次小全归约每次都会阻塞计算"),)),
    Prediction("15.mib", 15, "MiB over each node's link, each way", "每个节点链路每个方向的 MiB",
               answer={"flat": 6.0, "hierarchical": 4.0}, hint_en='{"flat": MiB, "hierarchical": MiB}',
               hint_zh='{"flat": MiB, "hierarchical": MiB}',
               why_en="flat: 2(P-1)/P of the tensor; hierarchical: 2(N-1)/N", why_zh="扁平：张量的 2(P-1)/P；分层：2(N-1)/N"),
    Prediction("15.hier_faster", 15, "hierarchical faster than the flat ring", "分层比扁平环更快", answer=True,
               hint_en="True or False", hint_zh="True 或 False"),
)


# --------------------------------------------------------------------------- the exercise

K, NUMEL = 2, 12     # ranks per node; elements of each rank's tensor (a multiple of K)


def hierarchical_all_reduce(tensor, node_group, cross_group):
    """Reference: reduce-scatter inside the node, all-reduce 1/K across nodes, all-gather inside the node."""
    k = dist.get_world_size(node_group)
    piece = torch.empty(tensor.numel() // k, dtype=tensor.dtype)
    dist.reduce_scatter_tensor(piece, tensor, group=node_group)      # (numel,) -> (numel / K,): my node's sum
    dist.all_reduce(piece, group=cross_group)                         # ... summed over every node
    dist.all_gather_into_tensor(tensor, piece, group=node_group)     # (numel / K,) -> (numel,)
    return tensor


WIRE = {
    # collective -> (the argument whose elements count, the share of them one rank of a ring of g sends)
    "all_reduce": ("tensor", lambda g: 2 * (g - 1) / g),
    "reduce_scatter_tensor": ("input", lambda g: (g - 1) / g),
    "reduce_scatter_single": ("input", lambda g: (g - 1) / g),
    "all_gather_into_tensor": ("input_tensor", lambda g: g - 1),
    "all_gather_single": ("input_tensor", lambda g: g - 1),
    "all_gather": ("tensor", lambda g: g - 1),
    "broadcast": ("tensor", lambda g: 1),
}
SENDS = ("send", "isend")          # a receive is its sender's traffic


class _Recorder:
    """``torch.distributed`` as the learner's cell sees it: every call works, and each one that carries a
    tensor is written down as (name, whether its group is the whole world, whether it crosses between
    nodes, the elements this rank puts on the wire for it, as a ring does)."""

    def __init__(self, world: int):
        self.world, self.node = world, dist.get_rank() // K
        self.calls: list[tuple[str, bool, bool, float]] = []

    def __getattr__(self, name: str):
        attr = getattr(dist, name)
        if not inspect.isfunction(attr) or name.startswith(("get_", "is_", "new_")):
            return attr

        def recorded(*args, **kwargs):
            try:
                bound = inspect.signature(attr).bind(*args, **kwargs).arguments
            except (TypeError, ValueError):
                bound = kwargs
            self._record(name, bound)
            return attr(*args, **kwargs)

        return recorded

    def _record(self, name: str, bound: dict) -> None:
        group = bound.get("group")
        ranks = list(range(self.world)) if group is None or group is dist.group.WORLD \
            else dist.get_process_group_ranks(group)
        tensors = [v for v in bound.values() if isinstance(v, torch.Tensor)]
        if not tensors or name in ("recv", "irecv"):
            return
        if name in SENDS:
            peer = bound["dst"] if bound.get("dst") is not None else ranks[bound.get("group_dst") or 0]
            self.calls.append((name, False, peer // K != self.node, tensors[0].numel()))
            return
        argument, share = WIRE.get(name, (None, lambda g: 1))
        numel = bound[argument].numel() if argument in bound else max(t.numel() for t in tensors)
        self.calls.append((name, len(ranks) == self.world, len({r // K for r in ranks}) > 1,
                           numel * share(len(ranks))))


def _start(rank: int) -> torch.Tensor:
    """Rank r's tensor: whole numbers, distinct per rank and element (sums are exact)."""
    return (torch.arange(NUMEL) * (rank + 1) + 100 * rank).float()


def _traffic_problem(calls, world: int) -> tuple[str, str] | None:
    """What is wrong with the traffic of the collectives the learner called, if anything: one over the
    whole world, or more elements sent across nodes than a ring all-reduce of 1/K of the tensor sends."""
    for name, whole_world, _, _ in calls:
        if whole_world:
            return (f"dist.{name} over the whole world: its ring crosses the slow link carrying all of "
                    "the tensor; use node_group and cross_group",
                    f"dist.{name} 用的是整个 world：它的环带着整个张量穿过慢链路；请使用 node_group 和 cross_group")
    nodes = world // K
    enough = 2 * (nodes - 1) / nodes * NUMEL / K
    sent = sum(wire for _, _, crosses, wire in calls if crosses)
    if sent > enough + 1e-9:
        return (f"the sum is right, but this rank sent {sent:g} elements across the slow link, where a ring "
                f"all-reduce of 1/K of the tensor across the nodes sends {enough:g}: reduce-scatter inside "
                "the node first",
                f"和是对的，但本 rank 经慢链路发送了 {sent:g} 个元素，而跨节点对张量的 1/K 做环形全归约只需发送 "
                f"{enough:g} 个：先在节点内做 reduce-scatter")
    return None


def check_hierarchical(ctx, source: str, name: str) -> dict:
    """On 4 ranks as 2 nodes of 2: the learner's sum against the world's, and what crossed the nodes."""
    size, rank = group_size_and_rank(None)
    groups = build_node_groups(K)                     # every rank makes every group, in the same order
    expected = sum(_start(r) for r in range(size))    # (NUMEL,)
    recorder = _Recorder(size)
    fn, problem = compiled(source, name, dist=recorder)
    tensor, returned = _start(rank), None
    if problem is None:
        try:
            returned, problem = call(fn, tensor, groups.intra, groups.inter)
        except NotDone:
            return not_done(rank, name)
    if problem is None:
        problem = (difference("tensor", "张量", expected, tensor)
                   or (returned is not None and difference("the tensor returned", "返回的张量", expected, returned))
                   or _traffic_problem(recorder.calls, size))
    any_rank_stops(problem)                           # every rank ends here together
    return verdict(rank, problem)


EXERCISES = (
    Exercise("15.hierarchical", 15, "a hierarchical all-reduce", "分层全归约",
             function="hierarchical_all_reduce", check=check_hierarchical, reference=hierarchical_all_reduce,
             world_size=4),
)
