"""The 3D grid: coordinates and groups as arithmetic, then real groups on 4 ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dtlab.grid import Coords, Grid, build_groups
from dtlab.i18n import ConfigError
from tests.harness import run_ranks

GRIDS = [Grid(dp=d, tp=t, pp=p, cp=c) for d in (1, 2, 3) for t in (1, 2, 4) for p in (1, 2, 3) for c in (1, 2)]


def test_coords_round_trip_and_tp_innermost():
    for grid in GRIDS:
        for rank in range(grid.world_size):
            c = grid.coords(rank)
            assert grid.rank(**c._asdict()) == rank
        assert {grid.coords(r) for r in range(grid.world_size)} == {
            Coords(d, p, t, c)
            for d in range(grid.dp)
            for p in range(grid.pp)
            for t in range(grid.tp)
            for c in range(grid.cp)
        }


def test_the_8_rank_example():
    grid = Grid(dp=2, tp=2, pp=2)
    assert grid.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]  # consecutive: one machine
    assert grid.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert grid.coords(5) == Coords(dp=0, pp=1, tp=1)
    assert grid.format().splitlines()[3] == "pp=1 dp=1 | tp:  6  7"


def test_the_8_rank_example_with_context_parallelism():
    grid = Grid(dp=2, cp=2, tp=2)
    assert grid.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]  # TP innermost, then CP
    assert grid.groups("cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert grid.coords(6) == Coords(dp=1, pp=0, tp=0, cp=1)
    assert grid.dp_cp_ranks(1) == [1, 3, 5, 7]  # gradients averaged here
    assert grid.format().splitlines()[1] == "pp=0 dp=0 cp=1 | tp:  2  3"
    assert Grid(dp=2, tp=2, pp=2).format().splitlines()[3] == "pp=1 dp=1 | tp:  6  7"  # cp=1: as before


def test_groups_partition_the_ranks():
    for grid in GRIDS:
        for axis in ("dp", "cp", "tp", "pp"):
            groups = grid.groups(axis)
            assert len(groups) == grid.world_size // getattr(grid, axis)
            assert sorted(r for g in groups for r in g) == list(range(grid.world_size))
            for g in groups:  # a group's ranks differ only on its axis, in the order of that axis
                coords = [grid.coords(r)._asdict() for r in g]
                assert [c[axis] for c in coords] == list(range(len(g)))
                assert len({tuple(v for k, v in c.items() if k != axis) for c in coords}) == 1


def test_errors_are_bilingual():
    with pytest.raises(ConfigError, match="2 x 2 x 1 = 4, but the job has 8") as err:
        Grid(dp=2, tp=2).check_world_size(8)
    assert "作业有 8 个 rank" in str(err.value)
    with pytest.raises(ConfigError, match="dp x cp x tp x pp = 1 x 2 x 1 x 1 = 2, but the job has 4"):
        Grid(cp=2).check_world_size(4)
    with pytest.raises(ConfigError, match="tp=0"):
        Grid(tp=0)
    with pytest.raises(ConfigError, match="rank 4 is outside"):
        Grid(dp=2, pp=2).coords(4)
    with pytest.raises(ConfigError, match="axis 'xp'"):
        Grid().groups("xp")


def test_expert_parallel_ranks_sit_between_tp_and_dp():
    grid = Grid(dp=2, ep=2, tp=2)  # 8 ranks
    assert grid.world_size == 8 and grid.coords(3) == (0, 0, 1, 0, 1)  # dp 0, pp 0, tp 1, cp 0, ep 1
    assert grid.groups("ep") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]  # the same experts
    assert grid.dp_cp_ranks(3) == [1, 3, 5, 7]  # replicas of the rest
    assert "ep=1" in grid.format()


def test_one_process_needs_no_groups():
    groups = build_groups(Grid())
    assert (groups.dp, groups.tp, groups.pp, groups.pp_prev, groups.pp_next) == (None,) * 5
    assert (groups.cp, groups.dp_cp) == (None, None)
    with pytest.raises(ConfigError):
        build_groups(Grid(dp=2))


def _check_groups(ctx, layouts):
    """For each layout: build the groups, sum ranks over each, compare with the arithmetic."""
    out = []
    for dp, tp, pp, cp in layouts:
        grid = Grid(dp=dp, tp=tp, pp=pp, cp=cp)
        groups = build_groups(grid)
        sums = {}
        for axis in ("dp", "cp", "tp", "pp", "dp_cp"):
            t = torch.tensor([float(ctx.rank)])
            dist.all_reduce(t, group=groups[axis])
            sums[axis] = (t.item(), dist.get_rank(groups[axis]))
        out.append({"coords": tuple(groups.coords), "sums": sums, "prev": groups.pp_prev, "next": groups.pp_next})
    return out


def test_real_groups_on_four_ranks():
    layouts = [
        (2, 2, 1, 1),
        (1, 2, 2, 1),
        (2, 1, 2, 1),
        (4, 1, 1, 1),
        (1, 1, 4, 1),
        (1, 2, 1, 2),
        (2, 1, 1, 2),
        (1, 1, 2, 2),
    ]
    results = run_ranks(_check_groups, 4, layouts)
    for rank, per_layout in enumerate(results):
        for (dp, tp, pp, cp), got in zip(layouts, per_layout):
            grid = Grid(dp=dp, tp=tp, pp=pp, cp=cp)
            c = grid.coords(rank)
            assert got["coords"] == tuple(c)
            for axis in ("dp", "cp", "tp", "pp"):
                members = grid.group_ranks(axis, rank)
                # The all-reduce spanned exactly these ranks; my rank in the group is my coordinate.
                assert got["sums"][axis] == (float(sum(members)), getattr(c, axis))
            assert got["sums"]["dp_cp"][0] == float(sum(grid.dp_cp_ranks(rank)))
            pp_ranks = grid.group_ranks("pp", rank)
            assert got["prev"] == (pp_ranks[c.pp - 1] if c.pp > 0 else None)
            assert got["next"] == (pp_ranks[c.pp + 1] if c.pp < pp - 1 else None)
