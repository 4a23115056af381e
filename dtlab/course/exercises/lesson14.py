"""Lesson 14 (FP8): the answer key, and the exercise "the scale and the quantized tensor".

The learner writes ``quantize_e4m3(x) -> (scale, q)``: the per-tensor scale that
puts ``x``'s amax at e4m3's largest value, 448, and ``x`` cast to
``torch.float8_e4m3fn`` with it. The check runs on two real ranks, each on its
own tensors (as each tensor-parallel rank scales its own shard), and compares
the scale with :func:`dtlab.numerics.fp8.compute_scale` and the fp8 tensor,
byte for byte, with :func:`dtlab.numerics.fp8.quantize` at the learner's scale.
"""

from __future__ import annotations

import torch

from dtlab.comm.collectives import group_size_and_rank
from dtlab.course.exercises.model import MEASURED, Exercise, Mistake, Prediction
from dtlab.course.exercises.ranks import NotDone, call, compiled, not_done, verdict
from dtlab.numerics.fp8 import E4M3, compute_scale, quantize, tensor_amax

PREDICTIONS = (
    Prediction(
        "14.max",
        14,
        "the largest finite e4m3 and e5m2 values",
        "e4m3 与 e5m2 的最大有限值",
        answer={"e4m3": 448.0, "e5m2": 57344.0},
        hint_en='{"e4m3": a number, "e5m2": a number}',
        hint_zh='{"e4m3": 一个数, "e5m2": 一个数}',
        mistakes=(
            Mistake(
                {"e4m3": 240.0, "e5m2": 57344.0},
                "240 is e4m3 with IEEE-style infinities; the OCP e4m3 (float8_e4m3fn) keeps only one NaN pattern and "
                "uses the top exponent for numbers: 1.75 x 2^8 = 448",
                "240 是保留 IEEE 式无穷大的 e4m3；OCP 的 e4m3（float8_e4m3fn）只留一个 NaN 编码，最高指数也用来表示数：1.75 x 2^8 = 448",
            ),
        ),
        why_en="e4m3: 1.75 x 2^8; e5m2: 1.75 x 2^15 (OCP FP8 specification; Micikevicius et al., 2022, Table 1)",
        why_zh="e4m3：1.75 x 2^8；e5m2：1.75 x 2^15（OCP FP8 规范；Micikevicius 等，2022，表 1）",
    ),
    Prediction(
        "14.flushed_unscaled",
        14,
        "share of N(0, 1e-5²) gradients flushed to zero in e5m2 without a scale",
        "不缩放时 N(0, 1e-5²) 的梯度在 e5m2 中被冲成零的比例",
        answer=0.55,
        rel_tol=0.1,
        hint_en="a fraction between 0 and 1",
        hint_zh="0 到 1 之间的比例",
        mistakes=(
            Mistake(
                0.0,
                "e5m2's smallest subnormal is 2^-16 = 1.5e-5: anything below half of it (7.6e-6) rounds to 0, and "
                "about half of N(0, 1e-5²) is that small",
                "e5m2 最小的次正规数是 2^-16 = 1.5e-5：小于它一半（7.6e-6）的数都舍入为 0，而 N(0, 1e-5²) 中大约一半这么小",
            ),
        ),
        why_en="P(|x| < 2^-17) for x ~ N(0, 1e-5²): 2^-17 is 0.76 standard deviations, about 0.55",
        why_zh="x ~ N(0, 1e-5²) 时 P(|x| < 2^-17)：2^-17 是 0.76 个标准差，约 0.55",
    ),
    Prediction(
        "14.within_3_percent",
        14,
        "fp8's loss within 3% of bf16's after the run",
        "运行结束时 fp8 的损失与 bf16 相差在 3% 以内",
        answer=True,
        hint_en="True or False",
        hint_zh="True 或 False",
    ),
    # Which tensor saturates first depends on this machine's rounding in a long run: only the run can say.
    Prediction(
        "14.first_saturated",
        14,
        "the layer and tensor that saturates first under delayed scaling",
        "延迟缩放下最先饱和的层和张量",
        answer=MEASURED,
        hint_en='["blocks.L.name", "input" | "weight" | "grad"]',
        hint_zh='["blocks.L.name", "input" | "weight" | "grad"]',
    ),
    Prediction(
        "14.spike_steps",
        14,
        "steps after the spike whose scale the spike's amax sets (history 8)",
        "尖峰之后由尖峰的 amax 决定缩放因子的步数（历史长度 8）",
        answer=8,
        hint_en="a number of steps",
        hint_zh="步数",
        mistakes=(
            Mistake(
                1,
                "the history keeps the largest amax of the last 8 steps: the spike's stays the largest until 8 more "
                "steps have pushed it out",
                "历史保存最近 8 步中最大的 amax：尖峰的 amax 一直是最大的，直到又过了 8 步才被挤出去",
            ),
            Mistake(
                0,
                "that is current scaling; delayed scaling takes the amax from the history of past steps",
                "那是即时缩放；延迟缩放取的是过去各步历史中的 amax",
            ),
        ),
        why_en="the spike's amax is the largest in the history for as many steps as the history holds",
        why_zh="尖峰的 amax 在历史中保持最大的步数，等于历史的长度",
    ),
)


# --------------------------------------------------------------------------- the exercise


def quantize_e4m3(x):
    """Reference: the scale 448 / amax (1 for a tensor of zeros) and x cast to e4m3 with it."""
    amax = x.abs().max().item() if x.numel() else 0.0
    scale = 448.0 / amax if amax > 0 else 1.0
    return scale, (x * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def cases(rank: int) -> list[torch.Tensor]:
    """The tensors rank ``rank`` quantizes: ordinary, with one outlier, tiny, negative-heavy, all zeros."""
    g = torch.Generator().manual_seed(17 + rank)
    outlier = torch.randn(256, generator=g)
    outlier[7] = 1000.0 * (rank + 1)
    return [
        torch.randn(4, 16, generator=g) * 3,
        outlier,
        torch.randn(128, generator=g) * 1e-4,
        -torch.rand(64, generator=g) * 50 + 1,  # its amax is a negative value's
        torch.zeros(8),
    ]


def _scale_problem(case: str, got: float, expected: float, x: torch.Tensor) -> tuple[str, str]:
    amax = tensor_amax(x).item()
    hints = (
        (
            amax / 448.0 if amax else None,
            "that is amax / 448, the factor that dequantizes; the scale multiplies x up to 448",
            "这是 amax / 448，是反量化的因子；缩放因子要把 x 放大到 448",
        ),
        (
            448.0 / x.max().item() if x.numel() and x.max().item() > 0 else None,
            "amax is the largest magnitude, |x|: a negative value can be the largest",
            "amax 是最大的绝对值 |x|：最大的可能是一个负数",
        ),
    )
    for value, en, zh in hints:
        if value is not None and abs(got - value) <= 1e-6 * abs(value):
            return (
                f"{case}: scale {expected:.6g} expected, got {got:.6g}; {en}",
                f"{case}：缩放因子应为 {expected:.6g}，得到 {got:.6g}；{zh}",
            )
    if not amax:
        en, zh = "a tensor of zeros needs no scale: use 1", "全零的张量不需要缩放：用 1"
        return f"{case}: scale 1 expected, got {got!r}; {en}", f"{case}：缩放因子应为 1，得到 {got!r}；{zh}"
    return (
        f"{case}: scale {expected:.6g} expected, got {got:.6g}",
        f"{case}：缩放因子应为 {expected:.6g}，得到 {got:.6g}",
    )


def check_quantize_e4m3(ctx, source: str, name: str) -> dict:
    """On a rank: the learner's scale and e4m3 tensor against dtlab's, on this rank's own tensors."""
    _, rank = group_size_and_rank(None)
    fn, problem = compiled(source, name)
    for i, x in enumerate(cases(rank) if problem is None else ()):
        try:
            got, problem = call(fn, x.clone())
        except NotDone:
            return not_done(rank, name)
        if problem is not None:
            break
        case = f"rank {rank}, tensor {i} {tuple(x.shape)}"
        if not (isinstance(got, tuple) and len(got) == 2):
            problem = (f"{case}: return (scale, q)", f"{case}：请返回 (scale, q)")
            break
        scale, q = got
        scale = float(scale)
        expected = compute_scale(tensor_amax(x), E4M3).item()
        if not abs(scale - expected) <= 1e-6 * expected:
            problem = _scale_problem(case, scale, expected, x)
        elif not isinstance(q, torch.Tensor) or q.dtype != torch.float8_e4m3fn or q.shape != x.shape:
            shown = q.dtype if isinstance(q, torch.Tensor) else type(q).__name__
            problem = (
                f"{case}: q should be a torch.float8_e4m3fn tensor of x's shape, got {shown}",
                f"{case}：q 应是与 x 同形状的 torch.float8_e4m3fn 张量，得到的是 {shown}",
            )
        else:
            reference = quantize(x, E4M3, scale)[0]
            wrong = (q.view(torch.uint8) != reference.view(torch.uint8)).nonzero()
            if len(wrong):
                at = tuple(wrong[0].tolist())
                problem = (
                    f"{case}: element {at} is {q[at].float().item():g}, expected {reference[at].float().item():g} "
                    f"(x * scale = {(x[at] * scale).item():g}, cast to e4m3)",
                    f"{case}：元素 {at} 为 {q[at].float().item():g}，应为 {reference[at].float().item():g}"
                    f"（x * scale = {(x[at] * scale).item():g}，再转换为 e4m3）",
                )
        if problem is not None:
            break
    return verdict(rank, problem)


EXERCISES = (
    Exercise(
        "14.quantize_e4m3",
        14,
        "the scale and the quantized tensor",
        "缩放因子与量化后的张量",
        function="quantize_e4m3",
        check=check_quantize_e4m3,
        reference=quantize_e4m3,
        world_size=2,
    ),
)
