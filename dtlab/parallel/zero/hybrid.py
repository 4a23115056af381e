"""Hybrid sharding (HSDP): ZeRO inside groups of K ranks, the shards replicated across the dp/K groups.

ZeRO over all N data-parallel ranks (:mod:`dtlab.parallel.zero`) sends every
byte of its all-gathers and reduce-scatters among all N. When the N ranks sit
on several nodes, that traffic crosses the slow link between them. Hybrid
sharding (PyTorch FSDP2's HSDP, a 2-D mesh of ``(replicate, shard)``;
DeepSpeed's ZeRO++ hpZ does the same for the parameters) shards each model
state over K ranks only, K the ranks of one node, and keeps dp/K copies of
that sharded model, one per node::

    dp = 4 on 2 nodes of 2, K = 2                     node 0          node 1
    dp_shard groups (ZeRO inside: fast link)          [r0  r1]        [r2  r3]
    dp_replicate groups (one all-reduce: slow link)    r0 ------------- r2
                                                           r1 ------------- r3

One step, per rank, for a flat buffer of Ψ elements (stage 3: per unit)::

    all-gather      the parameters, in the shard group          Ψ (N = K)
    reduce-scatter  the gradients, in the shard group           Ψ (N = K): this rank's (Ψ/K,) shard,
                                                                summed over K ranks
    all-reduce      that shard, in the replicate group          Ψ/K: summed over the dp/K copies

The mean over all dp ranks is the same as plain ZeRO's (each gradient is
divided by dp first, as ZeRO divides by N). What changes is where the bytes
go: on the slow link only the all-reduce of a 1/K shard, 2(R-1)/R x Ψ/K per
rank for R = dp/K replicas, instead of ZeRO-3's all-gathers and
reduce-scatters of the whole model over all dp ranks. The price is memory:
each rank holds 1/K of the model states, not 1/dp. K = dp is plain ZeRO
(one replica, no all-reduce); K = 1 is plain data parallelism's memory with
an all-reduce per shard.

:class:`Replicas` is what the ZeRO optimizers hold of the replicate group;
the groups themselves are :func:`dtlab.grid.hybrid_groups`'.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dtlab.comm import calls as comm
from dtlab.comm.collectives import CommMeter, group_size_and_rank

REPLICAS_KIND = "all_reduce.replicas"
"""The tracer's kind of hybrid sharding's one all-reduce across the replicas."""


@dataclass(frozen=True)
class Replicas:
    """The copies of this rank's shard on other shard groups: the ``dp_replicate`` group, its size and
    this rank's index in it (the first copy's rank counts the shard in the global gradient norm)."""

    group: object = None
    size: int = 1
    rank: int = 0

    @classmethod
    def of(cls, group) -> "Replicas":
        """``Replicas(group, its size, this rank's index)``; None: no replicas (plain ZeRO)."""
        return cls() if group is None else cls(group, *group_size_and_rank(group))

    def all_reduce(self, shard_grad: torch.Tensor, meter: CommMeter) -> None:
        """Sum ``shard_grad`` (S,), already divided by dp, over the replicas: the mean over all dp ranks."""
        if self.size > 1:
            meter.record_call("all_reduce", shard_grad)
            comm.all_reduce(shard_grad, group=self.group, kind=REPLICAS_KIND)  # (S,) -> (S,)
