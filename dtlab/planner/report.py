"""``dtlab plan``'s text: a plan as a table, a search as a ranked table and its rejections.

:func:`format_plan` lays out one :class:`~dtlab.planner.predict.Plan` (rows for
the model, its memory per GPU, then its time), :func:`format_search` a
:class:`~dtlab.planner.search.Search`. Every label is in English and Chinese;
the widths count a Chinese character as two columns
(:func:`dtlab.i18n.display_width`). ``--json`` prints the objects instead
(:mod:`dtlab.planner.cli`).
"""

from __future__ import annotations

from dtlab.i18n import display_width
from dtlab.planner.predict import Plan
from dtlab.planner.search import REASONS, Search


def _schedule(p) -> str:
    """``1f1b``, or ``interleaved v=2``: a plan's (or a rejection's fields') schedule."""
    schedule, v = (p.schedule, p.virtual_stages) if isinstance(p, Plan) else (p["schedule"], p.get("virtual_stages", 1))
    return f"{schedule} v={v}" if schedule == "interleaved" else schedule


def _size(n: float, unit: str = "B") -> str:
    """Decimal prefixes (1 GB = 1e9 B), as the ZeRO paper's GB are."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n:.0f} {unit}"


def _count(n: int) -> str:
    """175B, 7.50M: the suffixes ``--params`` accepts."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}"
    return str(n)


def _seconds(t: float) -> str:
    return f"{t:.3g} s" if t >= 1e-3 or t == 0 else f"{t * 1e6:.3g} µs"


def format_plan(p: Plan) -> str:
    """A readable table; every label in English and Chinese."""
    rows = [*_model_rows(p), *_memory_rows(p), *_time_rows(p)]
    labels = [f"{en} / {zh}" for en, zh, _ in rows]
    width = max(display_width(label) for label in labels) + 2
    lines = ["dtlab plan (a prediction / 预测值)"]
    lines += [label + " " * (width - display_width(label)) + value for label, (_, _, value) in zip(labels, rows)]
    lines += [f"note / 注: {note}" for note in p.notes]
    return "\n".join(lines)


def _hybrid(dp_shard: int | None) -> str:
    """`` HSDP K=8`` for hybrid sharding over groups of 8 DP ranks, nothing for plain ZeRO."""
    return "" if dp_shard is None else f" HSDP K={dp_shard}"


def _layout_line(p: Plan) -> str:
    """``8 x H100: dp=2 tp=2 pp=2, m=4 (1f1b), ZeRO-1, bf16, recompute=none``: the plan's layout in one line."""
    return (
        f"{p.gpus} x {p.gpu}: dp={p.dp} "
        + (f"cp={p.cp} " if p.cp > 1 else "")
        + (f"ep={p.ep} " if p.ep > 1 else "")
        + f"tp={p.tp} pp={p.pp}, m={p.micro_batches} "
        f"({_schedule(p)}), ZeRO-{p.zero}{_hybrid(p.dp_shard)}, {p.precision}, recompute={p.recompute}"
        + (", sequence parallel" if p.sequence_parallel else "")
    )


def _model_rows(p: Plan) -> list[tuple[str, str, str]]:
    """The table's first rows, (English, Chinese, value): the model, the layout, the parameters."""
    return [
        ("model", "模型", f"{p.model}, seq_len {p.seq_len}, batch {p.batch_size} (micro-batch {p.micro_batch_size})"),
        ("layout", "布局", _layout_line(p)),
        (
            "params",
            "参数量",
            f"{_count(p.params)} ({p.params:,})"
            + (
                f"; {p.experts} experts, top-{p.top_k}: active per token / 每个 token 激活 {_count(p.active_params)}"
                if p.experts
                else ""
            ),
        ),
        ("params per GPU", "每卡参数量", f"{_count(p.params_per_gpu)} (before ZeRO / ZeRO 分片前)"),
        *(
            [
                (
                    "embeddings",
                    "嵌入层",
                    ("tied / 输入输出共享" if p.tied_embeddings else "untied / 不共享")
                    + "; "
                    + (
                        "split by vocabulary over TP / 在 TP 上按词表切分"
                        if p.vocab_parallel
                        else "whole on every TP rank / 每个 TP rank 完整保存"
                    ),
                )
            ]
            if p.tied_embeddings is not None
            else []
        ),
    ]


def _memory_rows(p: Plan) -> list[tuple[str, str, str]]:
    """The memory per GPU by category, its peak, and whether it fits."""
    mem = p.memory
    return [
        ("memory per GPU", "每卡显存", _memory_model_text(p)),
        ("  params", "参数", _size(mem["params"])),
        ("  grads", "梯度", _size(mem["grads"])),
        ("  optimizer", "优化器状态", _size(mem["optimizer"])),
        ("  16-bit copies", "16 位副本", _size(mem["copies"])),
        ("  activations", "激活", _size(mem["activations"])),
        ("  buffers", "缓冲区", _size(mem["buffers"])),
        ("  logits", "logits", _size(mem["logits"])),
        ("  peak", "峰值", f"{_size(mem['peak'])} (at one moment / 同一时刻)"),
        (
            "  total",
            "合计",
            f"{_size(mem['total'])} of / 共 {_size(p.gpu_memory)}: "
            + ("fits / 放得下" if p.fits else "does NOT fit / 放不下")
            + (" (judged by the peak / 按峰值判断)" if mem["peak"] > mem["total"] else ""),
        ),
    ]


def _memory_model_text(p: Plan) -> str:
    """Which memory model the plan assumed, in a few words and both languages."""
    grads, grads_zh = f"{p.grad_dtype} grads", f"{p.grad_dtype} 梯度"
    if p.memory_model == "deepspeed":
        offload = ", offload_optimizer: cpu" if p.offload else ""
        return (
            f"memory model: deepspeed, its ZeRO-{p.zero} estimator{offload} / "
            f"显存模型：deepspeed，它的 ZeRO-{p.zero} 估算公式{offload}"
        )
    if p.memory_model == "megatron":
        optimizer = ("distributed optimizer", "分布式优化器") if p.zero == 1 else ("optimizer whole", "优化器不切分")
        return (
            f"memory model: megatron, {p.precision} params, {grads}, {optimizer[0]} / "
            f"显存模型：megatron，{p.precision} 参数，{grads_zh}，{optimizer[1]}"
        )
    if p.master_weights is None:
        return "memory model: runtime, fp32 (no master copy) / 显存模型：runtime，fp32（没有主权重副本）"
    where = (
        ("fp32 master in the model, 16-bit casts", "fp32 主权重在模型里，另有 16 位副本")
        if p.master_weights == "model"
        else ("fp32 master in the optimizer, ZeRO's (2+2+K)Ψ", "fp32 主权重在优化器里，ZeRO 的 (2+2+K)Ψ")
    )
    return f"memory model: runtime, {where[0]}, {grads} / 显存模型：runtime，{where[1]}，{grads_zh}"


def _time_rows(p: Plan) -> list[tuple[str, str, str]]:
    """FLOPs, the bubble, compute and communication time, and what they give: step time, tokens/s, MFU."""
    v = "v·" if p.virtual_stages > 1 else ""
    comm = ", ".join(f"{axis} {_seconds(t)} ({p.links[axis]})" for axis, t in p.comm_time_s.items())
    return [
        (
            "FLOPs per iteration",
            "每次迭代 FLOPs",
            f"{p.flops_per_iteration:.3e} (model / 模型 {p.model_flops_per_iteration:.3e})",
        ),
        (
            "bubble",
            "流水线气泡",
            f"{p.bubble_fraction:.1%} of the time / 占总时间, (p-1)/({v}m+p-1); "
            f"{p.bubble_over_ideal:.1%} of ideal / 相对理想时间, (p-1)/({v}m)",
        ),
        (
            "compute time",
            "计算时间",
            f"{_seconds(p.compute_time_s)} "
            f"(at {p.achievable_fraction:.0%} of peak / 按峰值的 "
            f"{p.achievable_fraction:.0%})",
        ),
        ("communication", "通信时间", comm),
        *(
            [("all-to-all per GPU", "每卡全对全通信量", f"{_size(p.all_to_all_bytes)} per iteration / 每次迭代")]
            if p.ep > 1
            else []
        ),
        ("step time", "单步时间", _seconds(p.step_time_s)),
        ("tokens/s", "每秒 token 数", f"{p.tokens_per_s:,.0f}"),
        ("MFU", "模型 FLOPs 利用率", f"{p.mfu:.1%}"),
    ]


# --- dtlab plan --search's table -----------------------------------------------------


def _layout_text(fields: dict) -> str:
    """``dp=8 tp=8 pp=16 m=128 1f1b ZeRO-1 recompute=selective SP``: the values given, in order."""
    words = [f"{name}={fields[name]}" for name in ("dp", "tp", "pp") if name in fields]
    if "micro_batches" in fields:
        words.append(f"m={fields['micro_batches']}")
    if "schedule" in fields:
        words.append(_schedule(fields))
    if "zero" in fields:
        words.append(f"ZeRO-{fields['zero']}{_hybrid(fields.get('dp_shard'))}")
    if "recompute" in fields:
        words.append(f"recompute={fields['recompute']}")
    if fields.get("sp"):
        words.append("SP")
    return " ".join(words)


COLUMNS = (
    ("#", "#"),
    ("dp", "数据"),
    ("tp", "张量"),
    ("pp", "流水"),
    ("m", "微批次"),
    ("schedule", "调度"),
    ("ZeRO", "ZeRO"),
    ("recompute", "重计算"),
    ("SP", "序列并行"),
    ("memory/GPU", "每卡显存"),
    ("step time", "单步时间"),
    ("MFU", "MFU"),
    ("bubble", "气泡"),
)
"""The ranked table's columns: English header, Chinese header."""


def format_search(found: Search, top: int = 10) -> str:
    """The top ``top`` layouts as a table, then the rejected ones by reason (``top`` examples each);
    every label in English and Chinese."""
    fitting = len(found.ranked)
    considered = fitting + len(found.rejected)
    lines = [
        f"dtlab plan --search: {found.model} on {found.gpus} x {found.gpu}, batch {found.batch_size} "
        f"sequences, {found.precision} (predictions / 预测值)",
        f"{considered} layouts or groups of layouts searched, {fitting} fit; the fastest {min(top, fitting)} "
        f"by predicted step time / 共搜索 {considered} 个布局（或布局组），{fitting} 个放得下；"
        f"按预测单步时间列出最快的 {min(top, fitting)} 个",
    ]
    rows = [
        [
            str(i),
            str(p.dp),
            str(p.tp),
            str(p.pp),
            str(p.micro_batches),
            _schedule(p),
            str(p.zero) + _hybrid(p.dp_shard).replace(" HSDP K=", "/K"),
            p.recompute,
            "yes/是" if p.sequence_parallel else "-",
            _size(p.memory["total"]),
            _seconds(p.step_time_s),
            f"{p.mfu:.1%}",
            f"{p.bubble_fraction:.1%}",
        ]
        for i, p in enumerate(found.ranked[:top], 1)
    ]
    table = [[en for en, _ in COLUMNS], [zh for _, zh in COLUMNS], *rows]
    widths = [max(display_width(row[c]) for row in table) for c in range(len(COLUMNS))]
    for row in table:
        lines.append("  ".join(" " * (w - display_width(cell)) + cell for cell, w in zip(row, widths)).rstrip())
    if not found.ranked:
        lines.append("no layout fits / 没有放得下的布局")
    groups = found.by_reason()
    if groups:
        lines.append(f"rejected / 未入选: {len(found.rejected)}")
    for reason, rejections in groups.items():
        en, zh = REASONS[reason]
        lines.append(
            f"  {en} / {zh}: {len(rejections)}" + (" (closest first / 最接近的在前)" if reason == "memory" else "")
        )
        for r in rejections[:top]:
            lines.append(f"    {_layout_text(r.fields)}: {r.en} / {r.zh}")
        if len(rejections) > top:
            lines.append(f"    ... and {len(rejections) - top} more / 还有 {len(rejections) - top} 个")
    return "\n".join(lines)
