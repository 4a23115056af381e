"""The checks a plan makes beyond the layout's own (:meth:`dtlab.config.layout.Layout.validate`).

Each refuses bad input with a bilingual ConfigError naming the value and what
is allowed, before any arithmetic, as ``dtlab train`` does before any rank starts.
"""

from __future__ import annotations

from dtlab.config import check_pipeline_schedule, check_zero3_precision, check_zero3_with_pipeline
from dtlab.config.layout import Layout, check_positive_int
from dtlab.i18n import ConfigError
from dtlab.parallel.pipeline.schedule import check_interleaved, check_kind
from dtlab.planner.architectures import Architecture, check_model_parallel
from dtlab.planner.experts import check_experts


def check_plan(
    arch: Architecture | None, layout: Layout, *, gpus, batch_size, master_weights: str | None = None
) -> tuple[int, int, tuple[str, ...]]:
    """The checks that need more than the layout alone; returns (gpus, batch_size, flags).

    ``dtlab train``'s own checks come first: a layout no trainer runs (ZeRO-3
    with a pipeline) is refused with train's message; one only dtlab's runtime
    refuses (ZeRO-3 in fp16 with the fp32 masters in the model, ``master_weights``; DeepSpeed runs it)
    is planned, and ``flags`` holds train's message as a note.
    """
    check_zero3_with_pipeline(layout)
    flags = _flagged(lambda checked: check_zero3_precision(checked, master_weights), layout)
    check_kind(layout.schedule, layout.virtual_stages)
    if layout.schedule == "interleaved":
        check_interleaved(layout.pp, layout.micro_batches, layout.virtual_stages)
    check_experts(arch, layout)
    dp, tp, pp, m = layout.dp * layout.ep, layout.tp, layout.pp, layout.micro_batches
    gpus = layout.world_size if gpus is None else gpus
    check_positive_int("gpus", gpus)
    if layout.world_size != gpus:
        axes = ["dp", *(a for a in ("cp", "ep") if getattr(layout, a) > 1), "tp", "pp"]
        product = f"{'*'.join(axes)} = {'*'.join(str(getattr(layout, a)) for a in axes)}"
        others = layout.world_size // layout.dp
        dp_en, dp_zh = (
            (
                f", e.g. --dp {gpus // others} with the other degrees as they are",
                f"，例如其他并行度不变、用 --dp {gpus // others}",
            )
            if gpus % others == 0
            else ("", "")
        )
        raise ConfigError(
            f"{product} = {layout.world_size} must equal gpus = {gpus} (allowed: degrees whose "
            f"product is {gpus}{dp_en}; or --gpus {layout.world_size})",
            f"{product} = {layout.world_size} 必须等于 gpus = {gpus}（允许：乘积为 {gpus} 的并行度"
            f"{dp_zh}；或 --gpus {layout.world_size}）",
        )
    if arch is not None:
        check_model_parallel(arch, tp=tp, pp=pp)
        check_chunks(arch, layout)
        check_sequence(arch.seq_len, layout)
    batch_size = dp * m if batch_size is None else batch_size
    check_positive_int("batch_size", batch_size)
    if batch_size % (dp * m):
        raise ConfigError(
            f"batch_size = {batch_size} must split evenly into dp x ep = {dp} ranks x "
            f"micro_batches = {m}: use a multiple of {dp * m}",
            f"batch_size = {batch_size} 必须能均分给 dp x ep = {dp} 个 rank x "
            f"micro_batches = {m} 个微批次：请用 {dp * m} 的倍数",
        )
    return gpus, batch_size, flags


def _flagged(check, layout: Layout) -> tuple[str, ...]:
    """``check``'s refusal as a bilingual note, or nothing when it passes."""
    try:
        check(layout)
    except ConfigError as refusal:
        return (f"dtlab train refuses this layout: {refusal.en} / dtlab train 会拒绝此布局：{refusal.zh}",)
    return ()


def check_sequence(seq_len: int, layout: Layout) -> None:
    """SP needs TP; CP cuts each sequence into 2 x cp equal chunks (zigzag), SP each rank's part by tp."""
    if layout.sp and layout.tp == 1:
        raise ConfigError(
            "--sequence-parallel needs tp > 1: it splits what tensor parallelism leaves "
            "whole (allowed: with --tp 2 or more)",
            "--sequence-parallel 需要 tp > 1：它切分的是张量并行未切分的部分（允许：与 --tp 2 或更大同时使用）",
        )
    chunks = 2 * layout.cp if layout.cp > 1 else 1
    if seq_len % chunks or (layout.sp and (seq_len // layout.cp) % layout.tp):
        need = chunks * (layout.tp if layout.sp else 1)
        raise ConfigError(
            f"seq_len {seq_len} does not split for cp = {layout.cp}"
            + (f", tp = {layout.tp} with sequence parallelism" if layout.sp else "")
            + f" (allowed: a multiple of {need})",
            f"seq_len {seq_len} 无法按 cp = {layout.cp}"
            + (f"、tp = {layout.tp}（序列并行）" if layout.sp else "")
            + f" 切分（允许：{need} 的倍数）",
        )


def check_chunks(arch: Architecture, layout: Layout) -> None:
    """Interleaving cuts the model into pp x v chunks of at least one block each: train's check, in its words."""
    check_pipeline_schedule(layout, arch.layers, arch.name)
