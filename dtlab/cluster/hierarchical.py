"""Hierarchical all-reduce: cross the slow inter-node link once, with 1/K of the data per rank.

A flat ring over all N x K ranks of N nodes (K ranks each) crosses a node
boundary at every K-th hop, and every byte of the ring passes those hops:
the link out of each node carries what one rank sends in a ring of P = NK
ranks, 2(P-1)/P x nbytes, almost twice the tensor. Inter-node links are the
slow ones (tens of GB/s of InfiniBand against hundreds of NVLink; here a
shaped veth against loopback), so that is where a flat ring spends its time.

The hierarchical all-reduce splits the work by link. The two-level idea is
Jia et al. 2018 ("Highly scalable deep learning training system with
mixed-precision"), who reduce to one master rank per node; the reduce-scatter
form below, which spreads the cross-node bytes over the K ranks of a node, is
Horovod's hierarchical all-reduce (HOROVOD_HIERARCHICAL_ALLREDUCE, 2018)::

    node 0: ranks 0 1          node 1: ranks 2 3          (N = 2 nodes, K = 2)

    1. reduce-scatter inside each node (fast):   rank 0 holds chunk 0 summed over node 0,
                                                 rank 1 chunk 1, rank 2 chunk 0 over node 1 ...
    2. all-reduce across nodes, one ring per     ranks {0, 2} all-reduce chunk 0,
       local rank, each on 1/K of the tensor:    ranks {1, 3} chunk 1: now chunk c is
                                                 the sum over all 4 ranks
    3. all-gather inside each node (fast):       every rank holds every chunk

Inter-node traffic per node: K rings each send 2(N-1)/N x nbytes/K, i.e.
2(N-1)/N x nbytes in all, against a flat ring's 2(NK-1)/NK x nbytes: for
2 nodes of 2 ranks, 1 x nbytes instead of 1.5 x nbytes each way, and the
gain grows with K. The price is two extra intra-node phases, cheap on fast links.

Every step is one of dtlab's ring collectives (:mod:`dtlab.comm.collectives`) on
an explicit process group. Ranks of one node are consecutive, as torchrun
numbers them: rank = node x K + local rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from dtlab.comm.collectives import (
    AVG,
    SUM,
    CommMeter,
    group_size_and_rank,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
)
from dtlab.i18n import ConfigError


def node_ranks(world_size: int, nproc_per_node: int) -> tuple[list[list[int]], list[list[int]]]:
    """The groups, as rank lists: (one per node, one per local rank across the nodes).

    >>> node_ranks(4, 2)
    ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    """
    if nproc_per_node < 1 or world_size % nproc_per_node:
        raise ConfigError(
            f"world size {world_size} is not a whole number of nodes of {nproc_per_node} ranks",
            f"world size {world_size} 不能被每节点 {nproc_per_node} 个 rank 整除",
        )
    k, n = nproc_per_node, world_size // nproc_per_node
    intra = [list(range(node * k, (node + 1) * k)) for node in range(n)]
    inter = [list(range(local, world_size, k)) for local in range(k)]
    return intra, inter


@dataclass(frozen=True)
class NodeGroups:
    """This rank's two process groups: its node (``intra``) and its peers across nodes (``inter``)."""

    intra: object
    inter: object
    nproc_per_node: int


def build_node_groups(nproc_per_node: int) -> NodeGroups:
    """Create every node group and every cross-node group (all ranks must call this, in order)."""
    world, rank = group_size_and_rank()
    intra_lists, inter_lists = node_ranks(world, nproc_per_node)
    if world == 1:
        return NodeGroups(None, None, nproc_per_node)
    # new_group is collective: every rank creates every group, keeping only its own.
    intra = [dist.new_group(ranks) for ranks in intra_lists][rank // nproc_per_node]
    inter = [dist.new_group(ranks) for ranks in inter_lists][rank % nproc_per_node]
    return NodeGroups(intra, inter, nproc_per_node)


def hierarchical_all_reduce(
    tensor: torch.Tensor, op=SUM, *, groups: NodeGroups, meter: CommMeter | None = None
) -> torch.Tensor:
    """All-reduce ``tensor`` in place over every rank: reduce-scatter, all-reduce, all-gather.

    The same result as ``ring_all_reduce(tensor)`` over the world (up to the
    order of float additions). ``op`` is SUM or AVG; AVG divides the chunk
    this rank owns once, after step 2, by the world size.
    """
    if op not in (SUM, AVG):
        raise ConfigError(f"op={op!r} is not supported; use SUM or AVG", f"不支持 op={op!r}；请使用 SUM 或 AVG")
    world, _ = group_size_and_rank()
    if world == 1:
        return tensor
    k, local = group_size_and_rank(groups.intra)
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.flatten()  # (numel,)
    mine = torch.tensor_split(flat, k)[local].clone()  # (~numel / K,)
    ring_reduce_scatter(mine, flat, SUM, group=groups.intra, meter=meter)  # summed over my node
    ring_all_reduce(mine, SUM, group=groups.inter, meter=meter)  # ... over every node
    if op == AVG:
        mine.div_(world)
    ring_all_gather(flat, mine, group=groups.intra, meter=meter)  # (numel,) everywhere
    if not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))
    return tensor


def inter_node_bytes(nbytes: float, nodes: int, nproc_per_node: int, *, hierarchical: bool) -> float:
    """Bytes the link out of one node carries (each way) in one all-reduce of ``nbytes``.

    Flat ring over P = NK ranks: the one rank at the node's edge sends
    2(P-1)/P x nbytes over it. Hierarchical: K cross-node rings of nbytes/K
    each send 2(N-1)/N of it, K x that in all.
    """
    if nodes == 1:
        return 0.0
    if hierarchical:
        return 2 * (nodes - 1) / nodes * nbytes
    p = nodes * nproc_per_node
    return 2 * (p - 1) / p * nbytes
