"""Lesson 03 (mixed precision): the answer key, and the exercise "the dynamic loss-scaler update".

The learner writes ``update_scale(scale, clean_steps, overflow_here, growth_interval)
-> (scale, clean_steps, skip)``: one step of dynamic loss scaling (the rule of NVIDIA's
mixed-precision training guide and PyTorch's ``GradScaler``; Micikevicius et al. 2017,
Sec. 3.2, scale by a constant and skip an overflowing step; :class:`dtlab.numerics.loss_scaling.LossScaler`)
on one rank of a data-parallel group: the ranks vote on overflow (one rank's
inf skips the step everywhere), an overflow halves the scale and restarts the
count, ``growth_interval`` clean steps in a row double it. The check plays a
script on 2 real ranks in which rank 1 alone overflows now and then, and
compares every step with dtlab's scaler fed the same gradients.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dtlab.comm.collectives import group_size_and_rank
from dtlab.config import MODEL_PRESETS
from dtlab.course.exercises.model import Exercise, Mistake, Prediction
from dtlab.course.exercises.ranks import NotDone, any_rank_stops, call, compiled, difference, not_done, verdict
from dtlab.numerics.loss_scaling import LossScaler

PSI = MODEL_PRESETS["small"].param_count()  # Ψ of the small GPT the lesson trains

PREDICTIONS = (
    Prediction(
        "03.formats",
        3,
        "fp16 and bf16 formats",
        "fp16 与 bf16 的格式",
        answer={
            "fp16 max": 65504.0,
            "fp16 smallest subnormal": 2.0**-24,
            "bf16 exponent bits": 8,
            "bf16 mantissa bits": 7,
            "bf16 max / fp32 max": 1.0,
        },
        rel_tol=0.001,
        hint_en='{"fp16 max": x, "fp16 smallest subnormal": x, "bf16 exponent bits": n, '
        '"bf16 mantissa bits": n, "bf16 max / fp32 max": x}',
        hint_zh='{"fp16 max": x, "fp16 smallest subnormal": x, "bf16 exponent bits": n, '
        '"bf16 mantissa bits": n, "bf16 max / fp32 max": x}',
        mistakes=(
            Mistake(
                {
                    "fp16 max": 65504.0,
                    "fp16 smallest subnormal": 2.0**-14,
                    "bf16 exponent bits": 8,
                    "bf16 mantissa bits": 7,
                    "bf16 max / fp32 max": 1.0,
                },
                "2^-14 is the smallest normal number; the 10 mantissa bits go 10 powers further, 2^-24",
                "2^-14 是最小的规格化数；10 个尾数位还能再往下 10 个 2 的幂，到 2^-24",
            ),
        ),
    ),
    Prediction(
        "03.master",
        3,
        "the update 1e-4 changes the weight 1.0",
        "1e-4 的更新能改变值为 1.0 的权重",
        answer={"fp32": True, "fp16": False, "bf16": False},
        hint_en='{"fp32": bool, "fp16": bool, "bf16": bool}',
        hint_zh='{"fp32": bool, "fp16": bool, "bf16": bool}',
        mistakes=(
            Mistake(
                {"fp32": True, "fp16": True, "bf16": False},
                "fp16's epsilon at 1.0 is 2^-10 ≈ 0.001: an update below half of it rounds away",
                "fp16 在 1.0 处的 epsilon 是 2^-10 ≈ 0.001：小于它一半的更新会被舍入掉",
            ),
        ),
    ),
    Prediction(
        "03.zero",
        3,
        "zero in fp16 without scaling",
        "不缩放时在 fp16 中变成 0",
        answer=[False, False, False, False, True, True, True],
        hint_en="a list of 7 booleans",
        hint_zh="7 个布尔值的列表",
    ),
    Prediction(
        "03.zero_scaled",
        3,
        "zero in fp16 with S = 2^16",
        "S = 2^16 时在 fp16 中变成 0",
        answer=[False, False, False, False, False, False, True],
        hint_en="a list of 7 booleans",
        hint_zh="7 个布尔值的列表",
    ),
    Prediction(
        "03.inf_scaled",
        3,
        "inf in fp16 with S = 2^16",
        "S = 2^16 时在 fp16 中变成 inf",
        answer=[True, False, False, False, False, False, False],
        hint_en="a list of 7 booleans",
        hint_zh="7 个布尔值的列表",
    ),
    Prediction(
        "03.script",
        3,
        "dynamic loss scaling on the script",
        "脚本上的动态损失缩放",
        answer={"skipped steps": [2, 3], "final scale": 65536.0},
        hint_en='{"skipped steps": [steps], "final scale": S}',
        hint_zh='{"skipped steps": [步], "final scale": S}',
        mistakes=(
            Mistake(
                {"skipped steps": [2, 3, 4], "final scale": 16384.0},
                "3.0 x 16384 = 49152 fits under 65504: the third 3.0 goes through",
                "3.0 x 16384 = 49152 小于 65504：第三个 3.0 可以通过",
            ),
        ),
    ),
    Prediction(
        "03.runs",
        3,
        "fp32 / bf16 / fp16 runs",
        "fp32 / bf16 / fp16 三次运行",
        answer={
            "fp16 skips some steps": True,
            "each skip halves the next scale": True,
            "bf16 skips none": True,
            "final losses within 2% of fp32": True,
        },
        hint_en="a dict of four booleans",
        hint_zh="四个布尔值的字典",
    ),
    Prediction(
        "03.master_layouts",
        3,
        "bf16 model states per rank, the master in the optimizer or in the module",
        "bf16 每个 rank 的模型状态：主权重在优化器里或在模块里",
        answer={"optimizer": [2 * PSI, 2 * PSI, 4 * PSI, 8 * PSI], "model": [4 * PSI, 4 * PSI, 0, 8 * PSI]},
        hint_en='{"optimizer": [params, grads, master, optimizer], "model": [...]}, bytes',
        hint_zh='{"optimizer": [params, grads, master, optimizer], "model": [...]}，单位字节',
        mistakes=(
            Mistake(
                {"optimizer": [4 * PSI, 4 * PSI, 0, 8 * PSI], "model": [2 * PSI, 2 * PSI, 4 * PSI, 8 * PSI]},
                "the other way round: with the master in the optimizer the module itself is 16-bit",
                "正好反了：主权重放在优化器里时，模块本身是 16 位的",
            ),
            Mistake(
                {"optimizer": [2 * PSI, 2 * PSI, 4 * PSI, 8 * PSI], "model": [4 * PSI, 4 * PSI, 4 * PSI, 8 * PSI]},
                "in the module layout the fp32 parameters are the master: there is no second fp32 copy",
                "放在模块里时，fp32 参数本身就是主权重：没有第二份 fp32 副本",
            ),
        ),
        why_en="16-bit params and grads (2Ψ each), fp32 master 4Ψ, Adam 8Ψ; or fp32 params and grads, Adam 8Ψ",
        why_zh="16 位参数和梯度（各 2Ψ）、fp32 主权重 4Ψ、Adam 8Ψ；或 fp32 参数和梯度、Adam 8Ψ",
    ),
    Prediction(
        "03.try_settle",
        3,
        "steps skipped by [0.5] x 12 with growth_interval = 2",
        "[0.5] x 12、growth_interval = 2 时被跳过的步",
        answer=[2, 5, 8, 11],
        hint_en="a list of steps",
        hint_zh="步的列表",
        mistakes=(
            Mistake(
                [],
                "two clean steps double S to 131072, and 0.5 x 131072 = 65536 > 65504",
                "两个正常步让 S 翻倍到 131072，而 0.5 x 131072 = 65536 > 65504",
            ),
        ),
    ),
)


# --------------------------------------------------------------------------- the exercise


def update_scale(scale, clean_steps, overflow_here, growth_interval):
    """Reference: one dynamic loss-scaling step on one rank; returns (scale, clean_steps, skip)."""
    flag = torch.tensor([1.0 if overflow_here else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # one rank's inf skips the step on every rank
    if flag.item() > 0:
        return scale * 0.5, 0, True
    clean_steps += 1
    if clean_steps == growth_interval:
        return scale * 2.0, 0, False
    return scale, clean_steps, False


OVERFLOWS = {0: [False] * 10, 1: [False, False, True, False, False, False, False, True, False, False]}
"""Which steps overflow on which rank (rank 1 alone, twice)."""
INTERVAL = 3


def _expected(rank: int) -> list[tuple]:
    """dtlab's scaler, fed a gradient that is inf on the scripted steps of this rank."""
    scaler = LossScaler(growth_interval=INTERVAL)
    out = []
    for overflow in OVERFLOWS[rank % 2]:
        grad = torch.tensor([float("inf") if overflow else 1.0])
        found = scaler.unscale_and_check([grad])  # the overflow vote, over the world
        scaler.update(found)
        out.append((scaler.loss_scale, scaler.clean_steps, found))
    return out


def check_scaler(ctx, source: str, name: str) -> dict:
    """On each rank: the learner's update, step by step, against dtlab's LossScaler."""
    _, rank = group_size_and_rank(None)
    expected = _expected(rank)
    problem = None
    fn, problem = compiled(source, name)
    scale, clean = 2.0**16, 0
    for step, overflow in enumerate(OVERFLOWS[rank % 2]):
        if problem is None:
            try:
                got, problem = call(fn, scale, clean, overflow, INTERVAL)
            except NotDone:
                return not_done(rank, name)
            if problem is None:
                got = tuple(got) if isinstance(got, (list, tuple)) else got
                found = difference("(scale, clean_steps, skip)", "(scale, clean_steps, skip)", expected[step], got)
                if found:
                    why = " (rank 1 overflowed alone)" if OVERFLOWS[1][step] else ""
                    why_zh = "（只有 rank 1 上溢）" if OVERFLOWS[1][step] else ""
                    problem = (f"step {step}: {found[0]}{why}", f"第 {step} 步：{found[1]}{why_zh}")
                else:
                    scale, clean = got[0], got[1]
        if any_rank_stops(problem):
            break
    return verdict(rank, problem)


EXERCISES = (
    Exercise(
        "03.update_scale",
        3,
        "the dynamic loss-scaler update",
        "动态损失缩放的更新规则",
        function="update_scale",
        check=check_scaler,
        reference=update_scale,
        world_size=2,
    ),
)
