"""Lesson 09 (3D parallelism): the answer key, and the exercise "the rank groups of a 3D grid".

The learner writes ``rank_groups(dp, tp, pp) -> {"tp": [[...], ...], "dp": [...], "pp": [...]}``:
every group of each axis, with TP innermost, then DP, then PP
(``rank = (pp_idx * dp + dp_idx) * tp + tp_idx``, Megatron-LM's order,
:class:`dtlab.grid.Grid`). The check compares the groups with dtlab's for
several layouts, then makes the learner's groups real on 4 ranks
(``dist.new_group`` for each) and has each rank find out, with an
all-reduce inside its group, who its partners are.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dtlab.comm.collectives import group_size_and_rank
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
from dtlab.grid import Grid
from dtlab.planner import params_per_rank

PREDICTIONS = (
    Prediction(
        "09.rank5_groups",
        9,
        "rank 5's TP, DP and PP groups (DP = TP = PP = 2)",
        "rank 5 的 TP、DP、PP 组（DP = TP = PP = 2）",
        answer={"tp": [4, 5], "dp": [5, 7], "pp": [1, 5]},
        hint_en='{"tp": [ranks], "dp": [ranks], "pp": [ranks]}',
        hint_zh='{"tp": [rank], "dp": [rank], "pp": [rank]}',
        mistakes=(
            Mistake(
                {"tp": [5, 7], "dp": [4, 5], "pp": [1, 5]},
                "TP is innermost: its ranks are consecutive; DP ranks are tp apart",
                "TP 在最内层：它的 rank 是连续的；DP 的 rank 相隔 tp",
            ),
        ),
        why_en="rank = (pp_idx x dp + dp_idx) x tp + tp_idx: rank 5 is pp 1, dp 0, tp 1",
        why_zh="rank = (pp_idx x dp + dp_idx) x tp + tp_idx：rank 5 是 pp 1、dp 0、tp 1",
    ),
    Prediction(
        "09.stage0_bytes",
        9,
        "parameter bytes on stage 0, TP rank 0",
        "第 0 阶段、TP rank 0 的参数字节数",
        answer=4 * params_per_rank("small", tp=2, pp=2, stage=0).total,
        hint_en="bytes, an integer",
        hint_zh="字节数（整数）",
        mistakes=(
            Mistake(
                4 * 236_928 // 4,
                "TP splits only the blocks' matrices and PP only the blocks: the embeddings stay whole on stage 0",
                "TP 只切分 block 的矩阵，PP 只切分 block：嵌入层在第 0 阶段是完整的",
            ),
        ),
    ),
    Prediction(
        "09.same_loss",
        9,
        "2x2x2 loss equals one process (rel. diff < 1e-4)",
        "2x2x2 的损失与单进程一致（相对差 < 1e-4）",
        answer=True,
        hint_en="True or False",
        hint_zh="True 或 False",
    ),
    Prediction(
        "09.call_groups",
        9,
        "rank 0's group for g, an activation send and the gradient all-reduce",
        "rank 0 的 g、激活值发送和梯度全归约所在的组",
        answer={"all_reduce.forward": "tp", "send.forward": "pp", "all_reduce": "dp"},
        hint_en='{"all_reduce.forward": axis, "send.forward": axis, "all_reduce": axis}, axis one of "tp", "dp", "pp"',
        hint_zh='{"all_reduce.forward": 组, "send.forward": 组, "all_reduce": 组}，组为 "tp"、"dp" 或 "pp"',
    ),
    Prediction(
        "09.try_least_memory",
        9,
        "layout with the fewest parameter bytes on its largest rank",
        "最大 rank 参数字节数最少的布局",
        answer="1x4x2",
        hint_en='"8x1x1", "1x4x2" or "2x2x2" (dp x tp x pp)',
        hint_zh='"8x1x1"、"1x4x2" 或 "2x2x2"（dp x tp x pp）',
        mistakes=(
            Mistake(
                "8x1x1", "data parallelism copies the whole model on every rank", "数据并行在每个 rank 上复制完整模型"
            ),
        ),
    ),
    Prediction(
        "09.try_max_tp",
        9,
        "the largest TP degree the small GPT allows",
        "小 GPT 允许的最大 TP 度",
        answer=4,
        hint_en="an integer",
        hint_zh="整数",
        mistakes=(
            Mistake(
                8,
                "TP splits attention by heads, and the small GPT has 4: 1 x 8 x 1 is refused",
                "TP 按注意力头切分，小 GPT 只有 4 个头：1 x 8 x 1 会被拒绝",
            ),
        ),
    ),
)


# --------------------------------------------------------------------------- the exercise


def rank_groups(dp, tp, pp):
    """Reference: the groups of each axis, TP innermost, then DP, then PP."""

    def rank(d, t, p):
        return (p * dp + d) * tp + t

    return {
        "tp": [[rank(d, t, p) for t in range(tp)] for p in range(pp) for d in range(dp)],
        "dp": [[rank(d, t, p) for d in range(dp)] for p in range(pp) for t in range(tp)],
        "pp": [[rank(d, t, p) for p in range(pp)] for d in range(dp) for t in range(tp)],
    }


LAYOUTS = ((2, 2, 2), (1, 4, 2), (4, 1, 2), (2, 4, 1), (3, 2, 2))


def _normal(groups) -> list[list[int]]:
    return sorted(sorted(int(r) for r in g) for g in groups)


def _pure(fn) -> tuple[str, str] | None:
    for dp, tp, pp in LAYOUTS:
        got, problem = call(fn, dp, tp, pp)
        if problem:
            return problem
        if not isinstance(got, dict) or set(got) != {"tp", "dp", "pp"}:
            return 'return {"tp": [...], "dp": [...], "pp": [...]}', '请返回 {"tp": [...], "dp": [...], "pp": [...]}'
        grid = Grid(dp=dp, tp=tp, pp=pp)
        for axis in ("tp", "dp", "pp"):
            found = difference(
                f"dp={dp} tp={tp} pp={pp}: {axis} groups (sorted)",
                f"dp={dp} tp={tp} pp={pp}：{axis} 组（排序后）",
                _normal(grid.groups(axis)),
                _normal(got[axis]),
            )
            if found:
                return found
    return None


def check_groups(ctx, source: str, name: str) -> dict:
    """On each rank: the learner's groups against dtlab's, then made real and asked who is in them."""
    size, rank = group_size_and_rank(None)
    try:
        fn = learner_function(source, name)
        problem = _pure(fn)
    except NotDone:
        return not_done(rank, name)
    except Exception as error:
        problem = does_not_compile(error)
    if problem is not None:  # the same pure verdict on every rank: none makes groups
        return verdict(rank, problem)
    for dp, tp, pp in ((2, 2, 1), (1, 2, 2)):
        mine = fn(dp, tp, pp)
        grid = Grid(dp=dp, tp=tp, pp=pp)
        for axis in ("tp", "dp", "pp"):
            seen = None
            for ranks in mine[axis]:  # every rank creates every group, in the same order
                group = dist.new_group(sorted(ranks))
                if rank in ranks:
                    onehot = torch.zeros(size)
                    onehot[rank] = 1.0
                    dist.all_reduce(onehot, group=group)
                    seen = [r for r in range(size) if onehot[r] > 0]
            # keep going after a difference: every rank must make every group
            problem = problem or difference(
                f"dp={dp} tp={tp} pp={pp}: the ranks in my {axis} group",
                f"dp={dp} tp={tp} pp={pp}：我的 {axis} 组中的 rank",
                grid.group_ranks(axis, rank),
                seen,
            )
    return verdict(rank, problem)


EXERCISES = (
    Exercise(
        "09.rank_groups",
        9,
        "the rank groups of a 3D grid",
        "3D 网格的 rank 分组",
        function="rank_groups",
        check=check_groups,
        reference=rank_groups,
        world_size=4,
    ),
)
