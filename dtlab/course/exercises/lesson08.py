"""Lesson 08 (pipeline parallelism): the answer key, and the exercise "the 1F1B order for stage s".

The learner writes ``one_f_one_b(stage, stages, micro_batches) -> ["F0", "F1", "B0", ...]``:
the order in which one pipeline stage runs its forwards and backwards under
1F1B (Narayanan et al. 2021, PipeDream-Flush): a few forwards to fill the
pipeline, then one forward and one backward in turn, then the remaining
backwards. What makes it 1F1B, checked for several (p, m): every action
once, the whole schedule free of deadlock (:func:`dtlab.parallel.pipeline.schedule.simulate`),
at most ``min(p - s, m)`` micro-batches' activations held at once, and no
more bubble than GPipe. Then 4 real pipeline ranks run one step of the small
GPT in the learner's order, and the loss and every stage's gradients are
compared with the whole model in one process.
"""

from __future__ import annotations

import copy
from fractions import Fraction

from dtlab.comm.collectives import group_size_and_rank
from dtlab.config import MODEL_PRESETS
from dtlab.course.exercises.model import Exercise, Mistake, Prediction
from dtlab.course.exercises.ranks import NotDone, call, does_not_compile, learner_function, not_done, verdict
from dtlab.course.experiments.pipeline import stage_versus_dense
from dtlab.data import global_batch
from dtlab.model import build_model
from dtlab.parallel.pipeline import PipelineRuntime, partition_gpt
from dtlab.parallel.pipeline.schedule import Action, Deadlock, gpipe, max_in_flight, simulate

PREDICTIONS = (
    Prediction(
        "08.in_flight_gpipe",
        8,
        "micro-batches in flight per stage after 4 slots (GPipe)",
        "GPipe 中 4 个时隙之后每个阶段在途的微批次数",
        answer=[4, 3, 2, 1],
        hint_en="a list, one number per stage",
        hint_zh="列表，每个阶段一个数",
        mistakes=(
            Mistake(
                [4, 4, 4, 4],
                "stage s starts s slots late: it has run 4 - s forwards",
                "阶段 s 晚 s 个时隙开始：它只跑了 4 - s 个前向",
            ),
        ),
    ),
    Prediction(
        "08.bubbles",
        8,
        "bubble fraction, p = 4, m = 4 and m = 16 (GPipe and 1F1B alike)",
        "气泡占比，p = 4，m = 4 与 m = 16（GPipe 与 1F1B 相同）",
        answer={4: round(3 / 7, 4), 16: round(3 / 19, 4)},
        rel_tol=0.001,
        hint_en="{4: fraction, 16: fraction}",
        hint_zh="{4: 比例, 16: 比例}",
        mistakes=(
            Mistake(
                {4: 0.75, 16: 0.1875},
                "(p-1)/m counts the bubble against the work; as a share of the whole time it is (p-1)/(m+p-1)",
                "(p-1)/m 是相对于有效工作的比例；占总时间的比例是 (p-1)/(m+p-1)",
            ),
            Mistake(
                {4: round(3 / 7, 4), 16: round(3 / 7, 4)},
                "more micro-batches fill the pipeline for longer: the bubble shrinks",
                "微批次越多，流水线满载的时间越长：气泡变小",
            ),
        ),
        why_en="(p-1)/(m+p-1)",
        why_zh="(p-1)/(m+p-1)",
    ),
    Prediction(
        "08.same_loss",
        8,
        "pipelined loss equals the single-process loss (|difference| < 1e-5)",
        "流水线损失等于单进程损失（|差| < 1e-5）",
        answer=True,
        hint_en="True or False",
        hint_zh="True 或 False",
    ),
    Prediction(
        "08.in_flight_1f1b",
        8,
        "micro-batches in flight per stage (1F1B)",
        "每个阶段在途的微批次数（1F1B）",
        answer=[4, 3, 2, 1],
        hint_en="a list, one number per stage",
        hint_zh="列表，每个阶段一个数",
        mistakes=(
            Mistake(
                [1, 1, 1, 1],
                "each stage first runs p - s - 1 forwards to fill the pipeline",
                "每个阶段先跑 p - s - 1 个前向来填满流水线",
            ),
        ),
    ),
    Prediction(
        "08.messages",
        8,
        "messages per step, first and last stage",
        "每步的消息数（第一个和最后一个阶段）",
        answer={0: {"send.forward": 4, "recv.backward": 4}, 3: {"recv.forward": 4, "send.backward": 4}},
        hint_en='{0: {"send.forward": n, "recv.backward": n}, 3: {"recv.forward": n, "send.backward": n}}',
        hint_zh='{0: {"send.forward": n, "recv.backward": n}, 3: {"recv.forward": n, "send.backward": n}}',
        mistakes=(
            Mistake(
                {0: {"send.forward": 1, "recv.backward": 1}, 3: {"recv.forward": 1, "send.backward": 1}},
                "one message per micro-batch: m = 4 each way",
                "每个微批次一条消息：每个方向 m = 4 条",
            ),
        ),
    ),
    Prediction(
        "08.peak_growth",
        8,
        "growth of stage 0's peak from m=4 to m=16",
        "m 从 4 到 16 时阶段 0 峰值的增长倍数",
        answer={"gpipe": 4, "1f1b": 1},
        rel_tol=0.05,
        hint_en='{"gpipe": x, "1f1b": x}',
        hint_zh='{"gpipe": x, "1f1b": x}',
        mistakes=(
            Mistake(
                {"gpipe": 4, "1f1b": 4},
                "1F1B holds at most p micro-batches, whatever m is",
                "无论 m 多大，1F1B 最多只持有 p 个微批次",
            ),
        ),
    ),
    Prediction(
        "08.try_bubble_8",
        8,
        "bubble fraction, p = 8, m = 8",
        "p = 8、m = 8 时的气泡占比",
        answer=round(7 / 15, 4),
        rel_tol=0.001,
        hint_en="a fraction",
        hint_zh="一个比例",
    ),
    Prediction(
        "08.try_in_flight_8",
        8,
        "1F1B in flight on stage 0, p = 4, m = 8",
        "p = 4、m = 8 时 1F1B 阶段 0 的在途微批次数",
        answer=4,
        hint_en="an integer",
        hint_zh="整数",
        mistakes=(
            Mistake(
                8,
                "that is GPipe; 1F1B starts backwards after p - s forwards",
                "那是 GPipe；1F1B 在 p - s 个前向之后就开始反向",
            ),
        ),
    ),
)


# --------------------------------------------------------------------------- the exercise


def one_f_one_b(stage, stages, micro_batches):
    """Reference: stage ``stage``'s actions under 1F1B, as ["F0", ..., "B0", ...]."""
    warmup = min(stages - stage - 1, micro_batches)
    order = [f"F{i}" for i in range(warmup)]  # fill the pipeline
    for i in range(micro_batches - warmup):  # steady state: one forward, one backward
        order += [f"F{warmup + i}", f"B{i}"]
    return order + [f"B{i}" for i in range(micro_batches - warmup, micro_batches)]


def _parse(stage: int, got, m: int) -> tuple[list[Action] | None, tuple[str, str] | None]:
    if not isinstance(got, (list, tuple)) or not all(
        isinstance(a, str) and a[:1] in "FB" and a[1:].isdigit() for a in got
    ):
        return None, ('return a list of strings like "F0", "B0"', '请返回 "F0"、"B0" 这样的字符串列表')
    actions = [Action(stage, a[0], int(a[1:])) for a in got]
    wanted = sorted((k, i) for k in "FB" for i in range(m))
    if sorted((a.kind, a.micro_batch) for a in actions) != wanted:
        return None, (
            f"stage {stage}: every micro-batch 0..{m - 1} needs exactly one F and one B, got {list(got)}",
            f"阶段 {stage}：每个微批次 0..{m - 1} 恰好需要一个 F 和一个 B，得到的是 {list(got)}",
        )
    return actions, None


def _judge(fn, p: int, m: int) -> tuple[str, str] | None:
    """What is wrong with the learner's order for p stages and m micro-batches (pure: no ranks)."""
    schedule = []
    for s in range(p):
        got, problem = call(fn, s, p, m)
        actions, problem = (None, problem) if problem else _parse(s, got, m)
        if problem:
            return problem
        schedule.append(actions)
    try:
        bubble = simulate(schedule).bubble_fraction
    except Deadlock as error:
        return f"p={p}, m={m}: {error.en}", f"p={p}，m={m}：{error.zh}"
    for s, held in enumerate(max_in_flight(schedule)):
        if held > min(p - s, m):
            return (
                f"p={p}, m={m}: stage {s} holds {held} micro-batches' activations at once; 1F1B holds at most "
                f"min(p - s, m) = {min(p - s, m)}",
                f"p={p}，m={m}：阶段 {s} 同时持有 {held} 个微批次的激活值；"
                f"1F1B 最多持有 min(p - s, m) = {min(p - s, m)} 个",
            )
    if bubble > simulate(gpipe(p, m)).bubble_fraction + 1e-9:
        return (
            f"p={p}, m={m}: the bubble is {Fraction(bubble).limit_denominator(1000)}, more than GPipe's "
            f"(p-1)/(m+p-1): a stage waits where it could run",
            f"p={p}，m={m}：气泡为 "
            f"{Fraction(bubble).limit_denominator(1000)}，比 GPipe 的 (p-1)/(m+p-1) 还大：有阶段本可以运行却在等待",
        )
    return None


def check_one_f_one_b(ctx, source: str, name: str) -> dict:
    """On each rank: the learner's order judged for several (p, m), then run on the real pipeline."""
    stages, rank = group_size_and_rank(None)
    try:
        fn = learner_function(source, name)
        problem = next(
            (found for p, m in ((4, 4), (4, 8), (2, 1), (3, 5), (stages, 4)) if (found := _judge(fn, p, m))), None
        )
    except NotDone:
        return not_done(rank, name)
    except Exception as error:
        problem = does_not_compile(error)
    # Every rank judges the same pure schedules, so all run the pipeline or none does.
    if problem is not None:
        return verdict(rank, problem)
    cfg = MODEL_PRESETS["small"]
    full = build_model(cfg, seed=0)
    dense = copy.deepcopy(full)
    stage = partition_gpt(full, stage=rank, stages=stages)
    runtime = PipelineRuntime(stage, d_model=cfg.d_model, group=None, micro_batches=4)
    runtime.actions = [Action(rank, a[0], int(a[1:])) for a in fn(rank, stages, 4)]  # the learner's order
    x, y = global_batch(0, batch_size=8, seq_len=cfg.seq_len, seed=0)
    result = runtime.step(x, y)
    dense_loss = dense(x, y)
    dense_loss.backward()
    grad_diff, _ = stage_versus_dense(full, stage, dense)
    if abs(result.loss - dense_loss.item()) > 1e-5 or grad_diff > 1e-5:
        problem = (
            f"the pipeline in your order gives loss {result.loss:.6f} (one process: {dense_loss.item():.6f}) "
            f"and gradients off by {grad_diff:.3g}",
            f"按你的顺序运行的流水线损失为 {result.loss:.6f}（单进程："
            f"{dense_loss.item():.6f}），梯度相差 {grad_diff:.3g}",
        )
    return verdict(rank, problem)


EXERCISES = (
    Exercise(
        "08.one_f_one_b",
        8,
        "the 1F1B order of one stage",
        "一个阶段的 1F1B 动作顺序",
        function="one_f_one_b",
        check=check_one_f_one_b,
        reference=one_f_one_b,
        world_size=4,
    ),
)
