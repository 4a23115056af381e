"""The grid of ranks: which ranks share a data-, context-, tensor- or pipeline-parallel group.

With ``dp x cp x tp x pp`` ranks, every rank has four coordinates and belongs
to exactly one group along each axis: the ranks that differ from it in that
coordinate only. The order of the axes decides which ranks are *neighbours*,
and it is not arbitrary. Megatron-LM (Narayanan et al. 2021) puts
tensor parallelism innermost, because TP all-reduces twice per block in the
forward pass and twice in the backward: it must stay on the fastest links,
inside one machine (NVLink), and consecutive ranks are the ones placed on one
machine. Context parallelism passes K/V blocks round a ring in every
attention layer, so it comes next; pipeline parallelism, which only sends one
activation per micro-batch to the next stage, goes outermost. Our order is
Megatron-LM's (its ``tp-cp-ep-dp-pp`` order, without ep)::

    rank = ((pp_idx * dp + dp_idx) * cp + cp_idx) * tp + tp_idx     TP fastest, then CP, DP, PP

For dp=2, tp=2, pp=2 (8 ranks)::

              tp=0 tp=1
    pp=0 dp=0  [0    1]      TP groups: [0,1] [2,3] [4,5] [6,7]   (consecutive)
         dp=1  [2    3]      DP groups: [0,2] [1,3] [4,6] [5,7]
    pp=1 dp=0  [4    5]      PP groups: [0,4] [1,5] [2,6] [3,7]   (stage order)
         dp=1  [6    7]

With cp = 1 (the default) the picture above is unchanged. Context-parallel
ranks hold different tokens of the same sequences, so their gradients are
averaged together with the data-parallel replicas': ``groups.dp_cp`` is that
combined group (Megatron-LM's data-parallel-with-context-parallel group).

Expert parallelism (``ep``, :mod:`dtlab.parallel.moe.expert_parallel`) sits between CP
and DP, in Megatron's order, next-closest after TP and CP because its
all-to-alls move every token of every MoE layer twice per forward::

    rank = (((pp_idx * dp + dp_idx) * ep + ep_idx) * cp + cp_idx) * tp + tp_idx

The experts are split over an EP group; everything else is replicated over
the ranks of a stage that read different data, so ``dp_cp`` spans the ep
index too (dp x cp x ep ranks), while the experts' gradients are averaged
over ``dp``: the ranks holding the same experts (DeepSpeed-MoE's
expert-data-parallel group).

Hybrid sharding (HSDP, ``dp_shard`` = K, :mod:`dtlab.parallel.zero.hybrid`) cuts each DP
group once more: ZeRO shards over K *consecutive* DP indices (``dp_shard`` groups,
on one node when K is the ranks per node) and each shard is replicated over the
dp/K ranks with the same index in their group (``dp_replicate`` groups)::

    dp = 4, K = 2:   dp_shard [0 1] [2 3]     dp_replicate [0 2] [1 3]

Everything here is plain arithmetic except :func:`build_groups`, which asks
torch.distributed for the groups (a *device mesh*, as PyTorch's
``init_device_mesh`` calls the same idea).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch.distributed as dist

from dtlab.i18n import ConfigError

AXES = ("tp", "cp", "ep", "dp", "pp")
"""The axes, innermost first: the order groups are created in, on every rank."""


class Coords(NamedTuple):
    """Where one rank sits in the grid: its index along each axis."""

    dp: int
    pp: int
    tp: int
    cp: int = 0
    ep: int = 0


@dataclass(frozen=True)
class Grid:
    """``dp x cp x ep x tp x pp`` ranks, TP innermost: rank <-> (dp, pp, tp, cp, ep) and each axis' groups."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1

    def __post_init__(self):
        for axis in AXES:
            value = getattr(self, axis)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"{axis}={value!r} is not allowed; expected a positive integer",
                    f"{axis}={value!r} 不合法；应为正整数",
                )

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.ep * self.tp * self.pp

    def _product(self) -> str:
        axes = ["dp", *(a for a in ("cp", "ep") if getattr(self, a) > 1), "tp", "pp"]
        return f"{' x '.join(axes)} = {' x '.join(str(getattr(self, a)) for a in axes)}"

    def check_world_size(self, world_size: int) -> "Grid":
        """Raise unless the job has exactly dp x cp x ep x tp x pp ranks."""
        if world_size != self.world_size:
            raise ConfigError(
                f"{self._product()} = {self.world_size}, but the "
                f"job has {world_size} ranks (allowed: degrees whose product is {world_size})",
                f"{self._product()} = {self.world_size}，但作业有 "
                f"{world_size} 个 rank（允许：乘积等于 {world_size} 的并行度）",
            )
        return self

    def rank(self, *, dp: int = 0, pp: int = 0, tp: int = 0, cp: int = 0, ep: int = 0) -> int:
        """The global rank at these coordinates."""
        return (((pp * self.dp + dp) * self.ep + ep) * self.cp + cp) * self.tp + tp

    def coords(self, rank: int) -> Coords:
        """The coordinates of ``rank``: the inverse of :meth:`rank`."""
        if not 0 <= rank < self.world_size:
            raise ConfigError(
                f"rank {rank} is outside this grid of {self.world_size} ranks (allowed: 0 .. {self.world_size - 1})",
                f"rank {rank} 不在这个 {self.world_size} 个 rank 的网格内（允许：0 .. {self.world_size - 1}）",
            )
        tp, rest = rank % self.tp, rank // self.tp
        cp, rest = rest % self.cp, rest // self.cp
        ep, rest = rest % self.ep, rest // self.ep
        return Coords(dp=rest % self.dp, pp=rest // self.dp, tp=tp, cp=cp, ep=ep)

    def group_ranks(self, axis: str, rank: int) -> list[int]:
        """The ranks in ``rank``'s group along ``axis``, in order of that axis' index."""
        _check_axis(axis)
        here = self.coords(rank)._asdict()
        return [self.rank(**{**here, axis: i}) for i in range(getattr(self, axis))]

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along ``axis``: a partition of all ranks, ordered by their first rank."""
        _check_axis(axis)
        found = {tuple(self.group_ranks(axis, r)) for r in range(self.world_size)}
        return [list(g) for g in sorted(found)]

    def format(self) -> str:
        """The grid as a table: one line per (pp, dp[, ep][, cp]), the ranks of one TP group on it."""
        lines = []
        for pp in range(self.pp):
            for dp in range(self.dp):
                for ep in range(self.ep):
                    for cp in range(self.cp):
                        ranks = " ".join(f"{self.rank(dp=dp, pp=pp, tp=t, cp=cp, ep=ep):>2}" for t in range(self.tp))
                        where = (
                            f"pp={pp} dp={dp}"
                            + (f" ep={ep}" if self.ep > 1 else "")
                            + (f" cp={cp}" if self.cp > 1 else "")
                        )
                        lines.append(f"{where} | tp: {ranks}")
        return "\n".join(lines)

    def dp_cp_ranks(self, rank: int) -> list[int]:
        """The ranks ``rank`` averages its replicated gradients with: same tp and pp, any dp, cp, ep."""
        here = self.coords(rank)
        return sorted(
            self.rank(dp=d, cp=c, ep=e, tp=here.tp, pp=here.pp)
            for d in range(self.dp)
            for c in range(self.cp)
            for e in range(self.ep)
        )


def _check_axis(axis: str) -> None:
    if axis not in AXES:
        raise ConfigError(
            f"axis {axis!r} is not allowed; expected one of {AXES}", f"轴 {axis!r} 不合法；应为 {AXES} 之一"
        )


@dataclass(frozen=True)
class RankGroups:
    """This rank's place in the grid and the process group of each axis it belongs to.

    ``dp``, ``cp``, ``ep``, ``tp``, ``pp`` are process groups to pass as ``group=``; rank r's
    index *within* each group equals its coordinate on that axis, so
    ``dist.get_rank(groups.pp)`` is its pipeline stage. ``pp_prev`` and
    ``pp_next`` are the *global* ranks of the previous and next pipeline stage
    (``None`` at the ends), as ``dist.send``/``dist.recv`` address peers.
    ``dp_cp`` is the group gradients are averaged over: the ``dp`` group when
    cp = ep = 1, else every rank with this rank's tp and pp coordinates (under
    expert parallelism, every parameter but the experts, which use ``dp``).
    ``dp_shard`` and ``dp_replicate``: hybrid sharding's two groups (None without it).
    """

    grid: Grid
    coords: Coords
    dp: object
    tp: object
    pp: object
    pp_prev: int | None
    pp_next: int | None
    cp: object = None
    dp_cp: object = None
    ep: object = None
    dp_shard: object = None
    dp_replicate: object = None

    def __getitem__(self, axis: str):
        """``groups["tp"]``: the group along ``axis`` (or ``"dp_cp"``, the gradient-averaging group)."""
        if axis not in ("dp_cp", "dp_shard", "dp_replicate"):
            _check_axis(axis)
        return getattr(self, axis)


def hybrid_groups(grid: Grid, dp_shard: int) -> tuple[list[list[int]], list[list[int]]]:
    """``(shard groups, replicate groups)`` of every DP group: K consecutive DP indices shard, and
    the ranks at the same place in each shard group replicate (plain arithmetic, every rank the same)."""
    if dp_shard < 1 or grid.dp % dp_shard:
        raise ConfigError(
            f"dp_shard={dp_shard!r} does not divide dp={grid.dp} (allowed: a divisor of {grid.dp})",
            f"dp_shard={dp_shard!r} 不能整除 dp={grid.dp}（允许：{grid.dp} 的因数）",
        )
    shard, replicate = [], []
    for ranks in grid.groups("dp"):  # ordered by dp index
        shard += [ranks[i : i + dp_shard] for i in range(0, grid.dp, dp_shard)]
        replicate += [ranks[i::dp_shard] for i in range(dp_shard)]
    return shard, replicate


def build_groups(
    grid: Grid, *, rank: int | None = None, backend: str | None = None, dp_shard: int | None = None
) -> RankGroups:
    """Create every TP, CP, EP, DP and PP group of ``grid`` (and the DP x CP x EP ones); return this rank's.

    ``dist.new_group`` is itself a collective over the whole world: *every*
    rank must call it for *every* group, in the same order, even for groups
    it is not in (torch.distributed's rule). So each rank walks all groups of
    all axes in one fixed order and keeps the three it belongs to. Without a
    process group (one process, a grid of one rank) there is nothing to create
    and the groups are ``None``, which every dtlab collective treats as a
    world of one. ``dp_shard`` = K: also hybrid sharding's groups (:func:`hybrid_groups`).
    """
    initialized = dist.is_available() and dist.is_initialized()
    world_size = dist.get_world_size() if initialized else 1
    grid.check_world_size(world_size)
    rank = (dist.get_rank() if initialized else 0) if rank is None else rank
    coords = grid.coords(rank)
    mine = {}
    for axis in AXES:
        for ranks in grid.groups(axis):
            group = dist.new_group(ranks, backend=backend) if initialized else None
            if rank in ranks:
                mine[axis] = group
    mine["dp_cp"] = mine["dp"]
    if grid.cp > 1 or grid.ep > 1:
        for ranks in sorted({tuple(grid.dp_cp_ranks(r)) for r in range(grid.world_size)}):
            group = dist.new_group(list(ranks), backend=backend) if initialized else None
            if rank in ranks:
                mine["dp_cp"] = group
    if dp_shard is not None:
        for name, lists in zip(("dp_shard", "dp_replicate"), hybrid_groups(grid, dp_shard)):
            for ranks in lists:
                group = dist.new_group(ranks, backend=backend) if initialized else None
                if rank in ranks:
                    mine[name] = group
    here = {"dp": coords.dp, "tp": coords.tp, "cp": coords.cp, "ep": coords.ep}
    stage = coords.pp
    return RankGroups(
        grid=grid,
        coords=coords,
        **mine,
        pp_prev=grid.rank(**here, pp=stage - 1) if stage > 0 else None,
        pp_next=grid.rank(**here, pp=stage + 1) if stage < grid.pp - 1 else None,
    )
