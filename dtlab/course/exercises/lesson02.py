"""Lesson 02 (data parallelism): the answer key, and the exercise "assign parameters to buckets".

The learner writes ``assign_buckets(sizes, cap_bytes)``: given each
parameter's gradient size in bytes, in the model's order, the buckets as
lists of parameter indices, filled in the order backward produces the
gradients (last parameter first), a bucket closed as soon as it holds at
least the cap (DDP's rule, Li et al. 2020, Sec. 3.2.2;
:func:`dtlab.parallel.buckets.make_buckets`). The check compares the assignment with
dtlab's at several caps, then uses the learner's buckets for real: it
all-reduces the small GPT's gradients on 2 ranks bucket by bucket and
compares every gradient with dtlab's :class:`~dtlab.parallel.data_parallel.BucketedDP`.
"""

from __future__ import annotations

import torch

from dtlab.comm.collectives import group_size_and_rank
from dtlab.config import MODEL_PRESETS
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
from dtlab.data import global_batch
from dtlab.model import build_model
from dtlab.parallel.buckets import make_buckets
from dtlab.parallel.data_parallel import BucketedDP

TENSORS = 53
"""Parameter tensors of the small GPT (every one gets a gradient)."""
SMALL_CAP_BUCKETS = 4
"""0.25 MiB buckets for the small GPT's 0.9 MiB of gradients (each closed once it holds 0.25 MiB)."""
TINY_CAP_BUCKETS = 7
"""0.1 MiB buckets for the same gradients: most close at about 0.125 MiB (two 64 KiB weights pass the cap)."""

PREDICTIONS = (
    Prediction(
        "02.calls_per_step",
        2,
        "all-reduce calls per step",
        "每步的全归约调用次数",
        answer={"per_parameter": TENSORS, "bucketed": 1, "overlapped": 1},
        hint_en='{"per_parameter": n, "bucketed": n, "overlapped": n}',
        hint_zh='{"per_parameter": n, "bucketed": n, "overlapped": n}',
        mistakes=(
            Mistake(
                {"per_parameter": TENSORS, "bucketed": TENSORS, "overlapped": TENSORS},
                "a bucket packs many gradients into one flat tensor: one call per bucket, and the "
                "small GPT's 0.9 MiB fit one 25 MiB bucket",
                "一个桶把许多梯度装进一个扁平张量：每个桶一次调用，小 GPT 的 0.9 MiB 梯度装得进一个 25 MiB 的桶",
            ),
        ),
        why_en="count the parameter tensors, and the 25 MiB buckets the 0.9 MiB of gradients fill",
        why_zh="数一数参数张量，以及 0.9 MiB 梯度占满的 25 MiB 桶的个数",
    ),
    Prediction(
        "02.overlap_versions",
        2,
        "versions with communication in flight while the ranks compute",
        "在 rank 计算的同时有通信在进行的版本",
        answer={"per_parameter": False, "bucketed": False, "overlapped": True},
        hint_en='{"per_parameter": bool, "bucketed": bool, "overlapped": bool}',
        hint_zh='{"per_parameter": bool, "bucketed": bool, "overlapped": bool}',
        mistakes=(
            Mistake(
                {"per_parameter": False, "bucketed": False, "overlapped": False},
                "overlapped sends its bucket from a backward hook and waits only before the "
                "optimizer step: even one bucket is in flight for a while as backward finishes",
                "overlapped 在反向钩子里发出桶，只在优化器步之前才等待：即使只有一个桶，它在反向传播收尾时"
                "也会在途一段时间",
            ),
        ),
        why_en="only a version that sends during backward and waits later can overlap",
        why_zh="只有在反向传播期间发送、稍后才等待的版本才能重叠",
    ),
    Prediction(
        "02.early_buckets",
        2,
        "buckets whose all-reduce starts before backward's last gradient exists",
        "在反向传播算出最后一个梯度之前就开始全归约的桶数",
        answer={"25 MiB": 0, "0.25 MiB": SMALL_CAP_BUCKETS - 1},
        hint_en='{"25 MiB": n, "0.25 MiB": n}',
        hint_zh='{"25 MiB": n, "0.25 MiB": n}',
        mistakes=(
            Mistake(
                {"25 MiB": 1, "0.25 MiB": SMALL_CAP_BUCKETS},
                "the last bucket to fill holds the first layers' gradients, which backward makes "
                "last: no gradient is left to come when it is sent, only the end of backward",
                "最后填满的桶装的是最前面几层的梯度，反向传播最后才算出它们：它发出时已经没有梯度要算了，"
                "只剩反向传播的收尾",
            ),
        ),
    ),
    Prediction(
        "02.accum_calls",
        2,
        "all-reduce calls per optimizer step, K = 4",
        "K = 4 时每个优化器步的全归约调用次数",
        answer=1,
        hint_en="an integer",
        hint_zh="整数",
        mistakes=(
            Mistake(
                4,
                "the first K-1 backward passes run inside no_sync(): only the last one sends",
                "前 K-1 次反向传播都在 no_sync() 里：只有最后一次发送",
            ),
        ),
    ),
    Prediction(
        "02.accum_same",
        2,
        "same loss as K = 1 (relative 1e-4)",
        "损失与 K = 1 相同（相对 1e-4）",
        answer=True,
        hint_en="True or False",
        hint_zh="True 或 False",
        mistakes=(
            Mistake(
                False,
                "the sum of K micro-steps' gradients is the gradient of the whole share: the same update",
                "K 个微步梯度之和就是整份数据的梯度：更新相同",
            ),
        ),
    ),
    Prediction(
        "02.flagged",
        2,
        "ranks flagged as stragglers in every step",
        "每一步都被标记为慢节点的 rank",
        answer=[3],
        hint_en="a list of ranks",
        hint_zh="rank 列表",
        mistakes=(
            Mistake(
                [0, 1, 2],
                "the others wait in the all-reduce: their compute is normal, so only "
                "the slow rank's compute stands out",
                "其他 rank 在全归约里等待：它们的计算时间正常，只有慢 rank 的计算时间突出",
            ),
        ),
    ),
    Prediction(
        "02.all_slow",
        2,
        "every rank's step lasts at least ~0.5 s (90%)",
        "每个 rank 的一步都至少持续约 0.5 秒（90%）",
        answer=True,
        hint_en="True or False",
        hint_zh="True 或 False",
        mistakes=(
            Mistake(
                False,
                "no rank can finish the all-reduce before the slow rank's gradient arrives",
                "慢 rank 的梯度没到，哪个 rank 都完成不了全归约",
            ),
        ),
    ),
    Prediction(
        "02.try_accum_2",
        2,
        "sequences per micro-step per rank, and all-reduces per step, at K = 2",
        "K = 2 时每个 rank 每个微步的序列数，以及每步的全归约次数",
        answer={"sequences": 2, "all-reduces": 1},
        hint_en='{"sequences": n, "all-reduces": n}',
        hint_zh='{"sequences": n, "all-reduces": n}',
        mistakes=(
            Mistake(
                {"sequences": 4, "all-reduces": 1},
                "8 sequences over 2 ranks is 4 each, over K = 2 micro-steps 2 each",
                "8 条序列分给 2 个 rank 是每个 4 条，再分成 K = 2 个微步就是每步 2 条",
            ),
        ),
    ),
    Prediction(
        "02.try_small_cap",
        2,
        "all-reduce calls per step with 0.1 MiB buckets",
        "桶大小 0.1 MiB 时每步的全归约调用次数",
        answer=TINY_CAP_BUCKETS,
        hint_en="an integer",
        hint_zh="整数",
        mistakes=(
            Mistake(
                9,
                "0.9 MiB / 0.1 MiB assumes full buckets; a bucket closes once it holds at "
                "least the cap, and two 64 KiB weights already hold 0.125 MiB",
                "0.9 MiB / 0.1 MiB 假设每个桶刚好装满；桶装到至少上限才关闭，而两个 64 KiB 的权重就已经有 0.125 MiB",
            ),
        ),
    ),
)


# --------------------------------------------------------------------------- the exercise


def assign_buckets(sizes, cap_bytes):
    """Reference: parameter indices per bucket, in backward order (last parameter first)."""
    buckets, used = [], 0
    for i in reversed(range(len(sizes))):
        if not buckets or used >= cap_bytes:
            buckets.append([])
            used = 0
        buckets[-1].append(i)
        used += sizes[i]
    return buckets


def _dtlab_buckets(params, cap_bytes: int) -> list[list[int]]:
    index = {p: i for i, p in enumerate(params)}
    return [[index[p] for p in b.params] for b in make_buckets(reversed(params), cap_bytes=cap_bytes)]


def _partition_problem(buckets, n: int) -> tuple[str, str] | None:
    if not (isinstance(buckets, (list, tuple)) and all(isinstance(b, (list, tuple)) for b in buckets)):
        return "return a list of buckets, each a list of parameter indices", "请返回桶的列表，每个桶是参数下标的列表"
    seen = [i for b in buckets for i in b]
    for i in range(n):
        if seen.count(i) != 1:
            where = "no bucket" if seen.count(i) == 0 else f"{seen.count(i)} buckets"
            where_zh = "没有任何桶" if seen.count(i) == 0 else f"{seen.count(i)} 个桶"
            return (
                f"parameter {i} is in {where}: each gradient must travel once",
                f"参数 {i} 在{where_zh}里：每个梯度必须恰好发送一次",
            )
    return None


def _gradients(model, buckets_from, rank: int) -> dict[str, torch.Tensor]:
    """The averaged gradients of one step of ``model`` on this rank's half of the batch, sent bucket by bucket."""
    cfg = MODEL_PRESETS["small"]
    x, y = global_batch(0, batch_size=4, seq_len=cfg.seq_len, seed=0)
    dp = BucketedDP(model)
    if buckets_from is not None:
        params = list(model.parameters())
        dp.buckets = [make_buckets([params[i] for i in b], cap_bytes=1 << 62)[0] for b in buckets_from]
    dp(x[2 * rank : 2 * rank + 2], y[2 * rank : 2 * rank + 2]).backward()
    dp.finish_gradient_sync()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def check_buckets(ctx, source: str, name: str) -> dict:
    """The learner's assignment against dtlab's at three caps, then used to all-reduce real gradients."""
    _, rank = group_size_and_rank(None)
    params = list(build_model(MODEL_PRESETS["small"], seed=0).parameters())
    sizes = [p.numel() * p.element_size() for p in params]
    problem, theirs = None, None
    try:
        fn = learner_function(source, name)
        for cap in (25 << 20, 1 << 18, 0):
            got, problem = call(fn, list(sizes), cap)
            problem = problem or _partition_problem(got, len(sizes))
            if problem is None:
                found = difference("buckets", "桶", _dtlab_buckets(params, cap), [list(b) for b in got])
                problem = found and (f"cap {cap:,} bytes: {found[0]}", f"上限 {cap:,} 字节：{found[1]}")
            if problem:
                break
            if cap == 1 << 18:
                theirs = [list(b) for b in got]  # several buckets: the one to run for real
    except NotDone:
        return not_done(rank, name)
    except Exception as error:
        problem = does_not_compile(error)
    # Every rank all-reduces, with the learner's buckets if they are a partition, else dtlab's.
    expected = _gradients(build_model(MODEL_PRESETS["small"], seed=0), None, rank)
    got = _gradients(build_model(MODEL_PRESETS["small"], seed=0), theirs if problem is None else None, rank)
    if problem is None:
        for key in expected:
            found = difference(f"gradient of {key}", f"{key} 的梯度", expected[key], got[key])
            if found:
                return verdict(rank, found)
    return verdict(rank, problem)


EXERCISES = (
    Exercise(
        "02.buckets",
        2,
        "gradient buckets in backward order",
        "按反向顺序分配梯度桶",
        function="assign_buckets",
        check=check_buckets,
        reference=assign_buckets,
        world_size=2,
    ),
)
