"""Lesson 10 (warmup and loss spikes): the answer key, and two exercises.

* ``10.warmup_lr``: the learner writes ``warmup_lr(step, peak, warmup, total)``, linear
  warmup then cosine decay towards a tenth of the peak, reached at step ``total`` (Goyal et al. 2017,
  :func:`dtlab.numerics.lr_schedule.lr_at`). The check compares it on a grid of
  steps, then trains a small model for 6 data-parallel steps on 2 real ranks
  with the learner's rates and with dtlab's, and compares the parameters.
* ``10.is_spike``: the learner writes ``is_spike(local_loss, recent)``, the
  spike rule of :class:`dtlab.numerics.loss_spikes.SpikeDetector` on one rank: the
  decision is about the *global* loss (the mean over the ranks: every rank
  must take the same decision), a spike is a loss above the median of the
  recent ones by more than 3 robust deviations. The check plays a script on 2
  ranks in which one rank's batch is corrupted, and compares each step with
  dtlab's detector fed the global loss.
"""

from __future__ import annotations

import math
import statistics

import torch
import torch.distributed as dist

from dtlab.comm.collectives import group_size_and_rank
from dtlab.config import ModelConfig
from dtlab.course.exercises.model import Exercise, Mistake, Prediction
from dtlab.course.exercises.ranks import (
    NotDone,
    any_rank_stops,
    call,
    compiled,
    difference,
    does_not_compile,
    learner_function,
    not_done,
    verdict,
)
from dtlab.data import global_batch
from dtlab.model import build_model
from dtlab.numerics.loss_spikes import SpikeDetector
from dtlab.numerics.lr_schedule import lr_at as dtlab_lr_at
from dtlab.parallel.data_parallel import apply_data_parallel

PREDICTIONS = (
    Prediction(
        "10.lr_step2",
        10,
        "learning rate at step 2 (peak 0.3, W = 10)",
        "第 2 步的学习率（峰值 0.3，W = 10）",
        answer=0.09,
        rel_tol=1e-6,
        hint_en="a learning rate",
        hint_zh="一个学习率",
        mistakes=(
            Mistake(
                0.06,
                "dtlab's warmup starts at peak / W on step 0: step 2 is the third, 3/10 of the peak",
                "dtlab 的预热在第 0 步就是峰值 / W：第 2 步是第三步，即峰值的 3/10",
            ),
        ),
    ),
    Prediction(
        "10.warmup_runs",
        10,
        "peak lr 0.3 without and with warmup",
        "峰值学习率 0.3，不预热与预热",
        answer={"diverges without warmup": True, "diverges with warmup": False, "lower final loss with warmup": True},
        hint_en="a dict of three booleans",
        hint_zh="三个布尔值的字典",
    ),
    Prediction(
        "10.spike",
        10,
        "an injected spike, skipped and rolled back",
        "注入的尖峰：跳过与回滚",
        answer={
            "detected at step": 15,
            "rollback returns to step": 10,
            "both recover below the pre-spike loss": True,
            "skip ends lower than rollback": True,
        },
        hint_en='{"detected at step": n, "rollback returns to step": n, ...: bool}',
        hint_zh='{"detected at step": n, "rollback returns to step": n, ...: bool}',
        mistakes=(
            Mistake(
                {
                    "detected at step": 16,
                    "rollback returns to step": 10,
                    "both recover below the pre-spike loss": True,
                    "skip ends lower than rollback": True,
                },
                "the corrupted batch's own loss is the spike: it is flagged at its step, 15",
                "损坏批次自己的损失就是尖峰：它在自己那一步（第 15 步）就被标记",
            ),
        ),
    ),
    Prediction(
        "10.clip_norm",
        10,
        "the global gradient norm across shards",
        "跨分片的全局梯度范数",
        answer={
            "bytes each rank all-reduces for the norm": 4,
            "same norm as one process": True,
            "the norm grows more than the loss at step 1": True,
        },
        hint_en='{"bytes each rank all-reduces for the norm": n, ...: bool}',
        hint_zh='{"bytes each rank all-reduces for the norm": n, ...: bool}',
        why_en="each rank sends one fp32 number, the sum of the squares it counts (4 bytes), not its "
        "gradient; counted once per element, the sum is the one-process norm; at step 1 the loss "
        "rises by about 2% and the norm by about 2.5 times",
        why_zh="每个 rank 只发送一个 fp32 数，即它负责计数的平方和（4 字节），而不是它的梯度；每个元素只计一次，"
        "总和就是单进程的范数；第 1 步损失只升高约 2%，范数却变为约 2.5 倍",
    ),
    Prediction(
        "10.try_early_spike",
        10,
        "spike events when the bad batch comes at step 3",
        "坏批次出现在第 3 步时的尖峰事件数",
        answer=0,
        hint_en="an integer",
        hint_zh="整数",
        mistakes=(
            Mistake(
                1,
                "the detector judges only after 5 losses: at step 3 the bad batch goes through",
                "检测器要先看到 5 个损失才开始判断：第 3 步的坏批次会被放过去",
            ),
        ),
    ),
)


# --------------------------------------------------------------------------- exercise 1: the schedule


def warmup_lr(step, peak, warmup, total):
    """Reference: linear warmup from peak / W to peak over W steps, then cosine down to peak / 10."""
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


TINY = ModelConfig(vocab_size=256, seq_len=16, n_layer=1, n_head=2, d_model=16)
GRID = [(s, w, n) for w, n in ((10, 40), (0, 20), (3, 8), (5, 5)) for s in range(n)]


def _train(rank: int, size: int, schedule) -> list[torch.Tensor]:
    """6 data-parallel AdamW steps of a tiny model at ``schedule(step)``; the parameters after them."""
    model = build_model(TINY, seed=0)
    dp = apply_data_parallel(model, mode="bucketed")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    for step in range(6):
        x, y = global_batch(step, batch_size=2 * size, seq_len=TINY.seq_len, seed=0)
        dp(x[2 * rank : 2 * rank + 2], y[2 * rank : 2 * rank + 2]).backward()
        dp.finish_gradient_sync()
        for group in optimizer.param_groups:
            group["lr"] = schedule(step)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()]


def check_lr(ctx, source: str, name: str) -> dict:
    """On each rank: the learner's schedule on a grid, then 6 real DP steps with it."""
    size, rank = group_size_and_rank(None)
    try:
        fn = learner_function(source, name)
        problem = None
        for s, w, n in GRID:
            got, problem = call(fn, s, 0.3, w, n)
            problem = problem or difference(
                f"warmup_lr(step={s}, peak=0.3, warmup={w}, total={n})",
                f"warmup_lr(step={s}, peak=0.3, warmup={w}, total={n})",
                dtlab_lr_at(s, lr=0.3, warmup=w, total_steps=n, min_ratio=0.1),
                got,
                neighbours=[
                    (f"{label} (step {t})", f"{label_zh}（第 {t} 步）", dtlab_lr_at(t, lr=0.3, warmup=w, total_steps=n))
                    for t, label, label_zh in (
                        (s - 1, "one step earlier", "早一步"),
                        (s + 1, "one step later", "晚一步"),
                    )
                ],
            )
            if problem:
                break
    except NotDone:
        return not_done(rank, name)
    except Exception as error:
        problem = does_not_compile(error)
    expected = _train(rank, size, lambda step: dtlab_lr_at(step, lr=0.01, warmup=3, total_steps=6))
    theirs = (
        (lambda step: fn(step, 0.01, 3, 6))
        if problem is None
        else (lambda step: dtlab_lr_at(step, lr=0.01, warmup=3, total_steps=6))
    )  # keep the ranks in step
    got = _train(rank, size, theirs)
    return verdict(rank, problem or difference("parameters after 6 steps", "6 步之后的参数", expected, got))


# --------------------------------------------------------------------------- exercise 2: the spike rule


def is_spike(local_loss, recent):
    """Reference: is the global loss of this step a spike? Returns (spike, global_loss)."""
    total = torch.tensor([float(local_loss)])
    dist.all_reduce(total)  # every rank judges the same number
    loss = total.item() / dist.get_world_size()
    if not math.isfinite(loss):
        return True, loss
    if len(recent) < 5:
        return False, loss
    median = statistics.median(recent)
    spread = statistics.median(abs(v - median) for v in recent)
    return loss > median + 3 * max(1.4826 * spread, 0.05 * abs(median)), loss


LOCAL = {
    0: [5.0, 4.9, 4.8, 4.85, 4.7, 4.6, 4.65, 4.5, 4.55, 4.4, 4.45, 4.3],
    1: [5.1, 5.0, 4.9, 4.8, 4.75, 4.7, 4.6, 4.6, 9.0, 4.5, 4.4, float("nan")],
}
"""Each rank's loss per step: rank 1's batch is corrupted at step 8, and its loss is NaN at step 11."""


def check_spike(ctx, source: str, name: str) -> dict:
    """On each rank: the learner's rule step by step against dtlab's SpikeDetector on the global loss."""
    _, rank = group_size_and_rank(None)
    detector, expected = SpikeDetector(window=10, patience=99), []
    for a, b in zip(LOCAL[0], LOCAL[1]):
        expected.append(detector.observe((a + b) / 2))
    problem = None
    fn, problem = compiled(source, name, statistics=statistics)
    recent: list[float] = []
    for step, local in enumerate(LOCAL[rank % 2]):
        if problem is None:
            try:
                got, problem = call(fn, local, list(recent))
            except NotDone:
                return not_done(rank, name)
            if problem is None and not (isinstance(got, tuple) and len(got) == 2):
                problem = ("return (spike, global_loss)", "请返回 (spike, global_loss)")
            if problem is None:
                found = difference("spike", "尖峰", expected[step], bool(got[0]))
                problem = found and (
                    f"step {step} (rank 1's local loss {LOCAL[1][step]}): {found[0]}",
                    f"第 {step} 步（rank 1 的本地损失 {LOCAL[1][step]}）：{found[1]}",
                )
                if not got[0] and problem is None:
                    recent = (recent + [got[1]])[-10:]  # accepted losses join the window
        if any_rank_stops(problem):
            break
    return verdict(rank, problem)


EXERCISES = (
    Exercise(
        "10.warmup_lr",
        10,
        "the warmup schedule",
        "学习率预热调度",
        function="warmup_lr",
        check=check_lr,
        reference=warmup_lr,
        world_size=2,
    ),
    Exercise(
        "10.is_spike",
        10,
        "the spike rule on the global loss",
        "基于全局损失的尖峰判定",
        function="is_spike",
        check=check_spike,
        reference=is_spike,
        world_size=2,
    ),
)
