"""``dtlab plan``: the analytical planner on the command line.

The flags are DESIGN.md's. Each defaults to ``None`` here, so a flag that is
not given falls back to the default of :class:`dtlab.config.layout.Layout` or of
:func:`dtlab.planner.plan`: one place decides every default. The layout
flags are named after the Layout's fields (``--sequence-parallel`` is its
``sp``). ``--json`` prints one object with the contract fields; otherwise a
table with English and Chinese labels (:mod:`dtlab.planner.report`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

from dtlab.config.command_line import count
from dtlab.config.layout import PRECISIONS, RECOMPUTE, SCHEDULES, Layout
from dtlab.i18n import ConfigError
from dtlab.planner.architectures import ARCHITECTURES, Architecture, as_architecture, by_shape
from dtlab.planner.hardware import GPUS
from dtlab.planner.memory_models import DEFAULT_MASTER_WEIGHTS, GRAD_DTYPES, MASTER_WEIGHTS, MEMORY_MODELS
from dtlab.planner.predict import DEFAULT_MODEL, plan
from dtlab.planner.report import format_plan, format_search
from dtlab.planner.search import MICRO_BATCH_SIZES, search

_SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def parse_count(text: str) -> int:
    """A parameter count: ``175000000000``, ``175e9``, ``175B``, ``7.5B``, ``350M`` (at most 10^16)."""
    scale = _SUFFIXES.get(text[-1:].upper(), 1)
    number = text[:-1] if scale != 1 else text
    try:
        value = float(number) * scale
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 1 <= value <= 1e16):
        raise argparse.ArgumentTypeError(  # English, then Chinese: see dtlab.config.command_line
            f"--params must be a count from 1 to 1e16 such as 175e9, 175B or 350M, got {text!r}\n"
            f"--params 应是 1 到 1e16 之间的参数个数，例如 175e9、175B 或 350M，收到的是 {text!r}"
        )
    return round(value)


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dtlab plan`` (DESIGN.md, "Public contract")."""
    _add_model_arguments(
        parser.add_argument_group("model / 模型 (a preset, a shape, or --params / 预设、形状或 --params)")
    )
    _add_layout_arguments(parser.add_argument_group("layout / 并行布局"))
    _add_memory_model_arguments(
        parser.add_argument_group(
            "memory model / 显存模型",
            "whose layout of the model states the plan counts; the plan says which it assumed "
            "(--json: memory_model, master_weights, grad_dtype) / 规划按谁的方式计算模型状态；规划会写明它的假设"
            "（--json：memory_model、master_weights、grad_dtype）",
        )
    )
    found = parser.add_argument_group(
        "search / 布局搜索",
        "--search plans every layout of --gpus GPUs and ranks those that fit by predicted step time. "
        "Pruned: TP and PP are powers of two dividing --gpus, DP takes the rest; micro-batches give "
        f"micro-batches of {', '.join(map(str, MICRO_BATCH_SIZES))} sequences; one schedule at pp = 1, "
        "with a pipeline gpipe, 1f1b and interleaved with v = 2; SP only "
        "with tp > 1; precision, CP and EP are not searched (default bf16, 1, 1). A layout flag given "
        "(--zero 1, --tp 8, ...) is fixed instead of searched; --batch-size defaults to one sequence per GPU. "
        "Rejected: TP wider than a node, what the planner's checks or dtlab train refuse, and what does not fit. "
        "/ --search 为 --gpus 张 GPU 规划所有布局，按预测单步时间给放得下的排序。剪枝：TP 与 PP 取整除 --gpus 的 2 的幂，"
        "DP 取余下的；微批次数使每个微批次为 1、2、4 或 8 条序列；pp = 1 时只取一种调度，有流水线时取 gpipe、1f1b "
        "和 v = 2 的交错调度；SP 只在 tp > 1 时取；"
        "精度、CP、EP 不搜索（默认 bf16、1、1）。给出的布局参数（--zero 1、--tp 8 ……）固定不搜索；"
        "--batch-size 默认每卡一条序列。",
    )
    found.add_argument(
        "--search",
        action="store_true",
        help="list the layouts of --gpus GPUs that fit, fastest first, and why the others fail / "
        "列出 --gpus 张 GPU 上放得下的布局（最快的在前），并说明其余布局为何不行",
    )
    found.add_argument(
        "--top",
        type=count("--top"),
        default=10,
        help="layouts listed (and examples per rejection reason); default 10 / "
        "列出的布局数（也是每种拒绝原因列出的示例数）",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (with --search: a list) / 输出一个 JSON 对象（配合 --search 时是列表）",
    )


def _add_model_arguments(model) -> None:
    """``dtlab plan``'s model: a preset, a shape or a parameter count, and its experts."""
    model.add_argument("--model", help=f"preset: {', '.join(ARCHITECTURES)} / 预设模型")
    for flag in ("--layers", "--hidden", "--heads", "--vocab"):
        model.add_argument(
            flag,
            type=count(flag),
            help="shape, dtlab's GPT layout (with --seq-len; its own LM head "
            "unless --tied-embeddings) / 模型形状，按 dtlab 的 GPT 结构"
            "（配合 --seq-len；除非 --tied-embeddings，输出头有自己的权重）",
        )
    model.add_argument(
        "--seq-len",
        type=count("--seq-len"),
        help="tokens per sequence (overrides a preset's) / 每条序列的 token 数（覆盖预设的值）",
    )
    model.add_argument(
        "--tied-embeddings",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the LM head shares the token table (GPT-2/3, Megatron-LM); "
        "default: as the preset was published, untied for a shape / "
        "输出头与词嵌入表共享权重（GPT-2/3、Megatron-LM）；默认按预设发表时的做法，给出形状时不共享",
    )
    model.add_argument(
        "--vocab-parallel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="under --tp, split the token table and head by vocabulary (Megatron-LM); "
        "default: on for the published presets, off for dtlab's GPT and a shape "
        "(dtlab's TP keeps them whole) / 在 --tp 下按词表切分词嵌入表和输出头（Megatron-LM）；"
        "默认：已发表的预设开启，dtlab 的 GPT 和给出的形状关闭（dtlab 的张量并行不切分它们）",
    )
    model.add_argument(
        "--params",
        type=parse_count,
        help="only a parameter count, e.g. 7.5B "
        "(model-state memory; --seq-len optional) / "
        "只给参数个数，例如 7.5B（只估算模型状态的显存；"
        "--seq-len 可选）",
    )
    model.add_argument(
        "--experts",
        type=count("--experts"),
        help="a mixture of experts: E experts per MLP / 混合专家：每个 MLP 有 E 个专家",
    )
    model.add_argument(
        "--top-k",
        type=count("--top-k"),
        help="experts each token goes through (with --experts) / 每个 token 经过的专家数（配合 --experts）",
    )


def _add_layout_arguments(layout) -> None:
    """``dtlab plan``'s layout flags, the GPU and the batch."""
    layout.add_argument(
        "--gpus",
        type=count("--gpus"),
        help="must equal dp*cp*ep*tp*pp (default: their product) / GPU 数，必须等于 dp*cp*ep*tp*pp（默认即它们的乘积）",
    )
    layout.add_argument("--dp", type=count("--dp"), help="data-parallel degree / 数据并行度")
    layout.add_argument("--tp", type=count("--tp"), help="tensor-parallel degree / 张量并行度")
    layout.add_argument("--pp", type=count("--pp"), help="pipeline-parallel degree (stages) / 流水线并行度（stage 数）")
    layout.add_argument(
        "--cp", type=count("--cp"), help="context-parallel degree (ring attention) / 上下文并行度（环形注意力）"
    )
    layout.add_argument(
        "--ep", type=count("--ep"), help="expert-parallel degree (with --experts) / 专家并行度（配合 --experts）"
    )
    layout.add_argument(
        "--micro-batches",
        type=count("--micro-batches"),
        help="pipeline micro-batches per step (GPipe's m) / 每步的流水线微批次数（GPipe 的 m）",
    )
    layout.add_argument(
        "--schedule",
        help="|".join(SCHEDULES) + " (interleaved: with --virtual-stages) / "
        "流水线调度（interleaved 需配合 --virtual-stages）",
    )
    layout.add_argument(
        "--virtual-stages",
        type=count("--virtual-stages"),
        help="model chunks per pipeline rank for --schedule interleaved (Megatron-LM's v, >= 2; "
        "m a multiple of --pp) / 交错调度时每个流水线 rank 持有的模型块数（Megatron-LM 的 v，"
        "至少为 2；微批次数须是 --pp 的倍数）",
    )
    layout.add_argument("--zero", type=int, help="ZeRO stage 0|1|2|3 / ZeRO 阶段")
    layout.add_argument("--precision", help="|".join(PRECISIONS) + " / 计算精度")
    layout.add_argument("--recompute", help="|".join(RECOMPUTE) + " / 激活重计算：不做、选择性或整个 block")
    layout.add_argument(
        "--sequence-parallel",
        action="store_true",
        default=None,
        help="Megatron sequence parallelism (needs --tp > 1) / Megatron 序列并行（需要 --tp 大于 1）",
    )
    layout.add_argument(
        "--zero3-prefetch",
        type=int,
        metavar="UNITS",
        help="ZeRO-3 units gathered ahead, as dtlab train's (default 0) / "
        "ZeRO-3 提前收集的单元数，与 dtlab train 的相同",
    )
    layout.add_argument(
        "--dp-shard",
        type=int,
        metavar="K",
        help="hybrid sharding (HSDP) with --zero 2|3, as dtlab train's: ZeRO within groups of K DP ranks, "
        "replicated across the dp/K groups / 混合分片（HSDP，配合 --zero 2|3，与 dtlab train 的相同）："
        "ZeRO 只在每 K 个数据并行 rank 的组内分片，各组之间互为副本",
    )
    layout.add_argument(
        "--gpu",
        help="|".join(GPUS) + "|local|FILE.json (local: the profile `dtlab calibrate` "
        "wrote) / GPU 型号；local 表示 `dtlab calibrate` 测得的本机结果；也可以是一个 JSON 文件",
    )
    layout.add_argument(
        "--batch-size",
        type=count("--batch-size"),
        help="global batch in sequences, as in dtlab train / 全局 batch 的序列数，与 dtlab train 的相同",
    )


def _add_memory_model_arguments(group) -> None:
    """``dtlab plan``'s memory model: whose layout of the model states it counts (dtlab/planner/memory_models.py)."""
    group.add_argument(
        "--memory-model",
        help="|".join(MEMORY_MODELS) + ": what dtlab's runtime allocates for the flags (default), DeepSpeed's "
        "estimators (ZeRO-2/3), or Megatron-LM's bytes per parameter (--zero 1: its distributed optimizer) / "
        "dtlab 运行时为这些参数实际分配的（默认）、DeepSpeed 的估算公式（ZeRO-2/3），或 Megatron-LM 每个参数的"
        "字节数（--zero 1：它的分布式优化器）",
    )
    group.add_argument(
        "--master-weights",
        help="|".join(MASTER_WEIGHTS)
        + f" (runtime; default {DEFAULT_MASTER_WEIGHTS}, as dtlab train runs fp16 and bf16): "
        "the fp32 master copy sharded with the optimizer from ZeRO-1 on, ZeRO's (2+2+K)Ψ, or the fp32 module "
        "itself with 16-bit casts / fp32 主权重：放在优化器里、从 ZeRO-1 起随它分片（ZeRO 论文的 (2+2+K)Ψ），"
        f"或就是 fp32 模块本身、另加 16 位副本（runtime；默认 {DEFAULT_MASTER_WEIGHTS}，与 dtlab train 对 fp16、bf16 的默认做法相同）",
    )
    group.add_argument(
        "--grad-dtype",
        help="|".join(GRAD_DTYPES) + " gradient dtype under mixed precision (default: the compute dtype; fp32 "
        "with --master-weights model, and Megatron-LM's fp32 with bf16) / 混合精度下梯度的数据类型（默认与计算精度"
        "相同；--master-weights model 时为 fp32，Megatron-LM 在 bf16 下为 fp32）",
    )
    group.add_argument(
        "--offload",
        action="store_true",
        default=None,
        help="with --memory-model deepspeed: its optimizer offloaded to the CPU (offload_optimizer: cpu) / "
        "配合 --memory-model deepspeed：把它的优化器卸载到 CPU（offload_optimizer: cpu）",
    )


_MEMORY_MODEL_FLAGS = ("memory_model", "master_weights", "grad_dtype", "offload")
"""Parsed flags passed to :func:`dtlab.planner.plan` (and :func:`~dtlab.planner.search.search`) as they are."""


def _memory_model_options(args: argparse.Namespace) -> dict:
    return {name: getattr(args, name) for name in _MEMORY_MODEL_FLAGS if getattr(args, name, None) is not None}


_LAYOUT_FLAGS = {
    **{
        name: name
        for name in (
            "dp",
            "tp",
            "pp",
            "cp",
            "ep",
            "micro_batches",
            "schedule",
            "virtual_stages",
            "zero",
            "precision",
            "recompute",
            "zero3_prefetch",
            "dp_shard",
        )
    },
    "sequence_parallel": "sp",
}
"""Parsed flag -> :class:`~dtlab.config.layout.Layout` field (``--sequence-parallel`` is ``sp``)."""


def run_plan(args: argparse.Namespace) -> int:
    """Print the plan for the parsed flags; a bad value raises a bilingual ConfigError."""
    if getattr(args, "search", False):
        return run_search(args)
    if getattr(args, "top", 10) != 10:
        raise ConfigError(
            f"--top {args.top} without --search: it sets how many searched layouts are listed, and "
            "without --search there is one plan (allowed: --top with --search, or leave --top out)",
            f"--top {args.top} 没有与 --search 同时使用：它决定列出多少个搜索到的布局，不用 --search 时只有一个"
            "规划（允许：--top 与 --search 一起用，或去掉 --top）",
        )
    layout = Layout(
        **{field: getattr(args, flag) for flag, field in _LAYOUT_FLAGS.items() if getattr(args, flag, None) is not None}
    )
    model = with_experts(model_from_flags(args), args)
    given = {
        name: getattr(args, name) for name in ("gpus", "gpu", "batch_size") if getattr(args, name, None) is not None
    }
    seq_len = args.seq_len if isinstance(model, int) else None  # else already in the Architecture
    options = {name: getattr(args, name, None) for name in ("tied_embeddings", "vocab_parallel")}
    result = plan(model, layout, seq_len=seq_len, **options, **given, **_memory_model_options(args))
    print(json.dumps(result.to_dict()) if args.json else format_plan(result))
    return 0


def run_search(args: argparse.Namespace) -> int:
    """``dtlab plan --search``: the layouts of ``--gpus`` GPUs that fit, ranked (dtlab/planner/search.py)."""
    if args.gpus is None:
        raise ConfigError(
            "--search needs --gpus N: the layouts searched are those of N GPUs",
            "--search 需要 --gpus N：搜索的是 N 张 GPU 上的布局",
        )
    fixed = {
        field: getattr(args, flag) for flag, field in _LAYOUT_FLAGS.items() if getattr(args, flag, None) is not None
    }
    model = with_experts(model_from_flags(args), args)
    seq_len = args.seq_len if isinstance(model, int) else None  # else already in the Architecture
    options = {name: getattr(args, name, None) for name in ("tied_embeddings", "vocab_parallel")}
    given = {"gpu": args.gpu} if args.gpu is not None else {}
    found = search(
        model,
        gpus=args.gpus,
        batch_size=args.batch_size,
        seq_len=seq_len,
        **given,
        **options,
        **_memory_model_options(args),
        **fixed,
    )
    print(json.dumps(found.to_list(args.top)) if args.json else format_search(found, args.top))
    return 0


def with_experts(model: Architecture | int, args: argparse.Namespace) -> Architecture | int:
    """The model with ``--experts E --top-k K`` applied (they need its shape, not only --params)."""
    experts, top_k = getattr(args, "experts", None), getattr(args, "top_k", None)
    if experts is None and top_k is None:
        return model
    if not isinstance(model, Architecture) or experts is None:
        raise ConfigError(
            "--experts E (and --top-k K) need a model with a shape (--model or --layers ...) "
            f"and --top-k needs --experts; got --experts={experts}, --top-k={top_k}",
            "--experts E（和 --top-k K）需要一个有形状的模型（--model 或 --layers ……），"
            f"且 --top-k 需要 --experts；收到的是 --experts={experts}、--top-k={top_k}",
        )
    return dataclasses.replace(model, experts=experts, top_k=top_k or 1)


def model_from_flags(args: argparse.Namespace) -> str | Architecture | int:
    """The model from exactly one of: ``--model``, the shape flags, ``--params`` (with ``--seq-len``)."""
    shape = {name: getattr(args, name, None) for name in ("layers", "hidden", "heads", "vocab")}
    by_flags = any(v is not None for v in shape.values())
    model, params, seq_len = args.model, args.params, args.seq_len
    if (model is not None) + by_flags + (params is not None) > 1:
        raise ConfigError(
            "give the model one way: a preset (--model), its shape (--layers --hidden --heads "
            f"--vocab --seq-len) or a parameter count (--params); got --model={model!r}, "
            f"{shape}, --params={params!r}",
            "请只用一种方式指定模型：预设名 (--model)、形状 (--layers --hidden --heads --vocab "
            f"--seq-len) 或参数量 (--params)；收到的是 --model={model!r}, {shape}, --params={params!r}",
        )
    if params is not None:
        return params
    if by_flags:
        missing = [
            f"--{name.replace('_', '-')}" for name, value in {**shape, "seq_len": seq_len}.items() if value is None
        ]
        if missing:
            raise ConfigError(
                f"a model shape needs --layers --hidden --heads --vocab --seq-len together; "
                f"missing: {' '.join(missing)}",
                f"模型形状需要同时给出 --layers --hidden --heads --vocab --seq-len；缺少：{' '.join(missing)}",
            )
        return by_shape(**shape, seq_len=seq_len)
    return as_architecture(DEFAULT_MODEL if model is None else model, seq_len=seq_len)
