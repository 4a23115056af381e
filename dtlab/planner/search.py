"""The layout search: every layout of N GPUs the planner accepts, ranked by predicted step time.

:func:`search` enumerates layouts (dp, tp, pp, micro-batches, schedule, ZeRO
stage, recompute, sequence parallelism) whose ranks multiply to the GPUs
given, asks the planner (:func:`dtlab.planner.plan`) for each, and keeps
those that fit in the GPU's memory, fastest first. Every other layout is
kept too, with the reason it was rejected, in the words of the check that
refused it:

* ``"divisibility"``: the planner's own checks (:func:`dtlab.planner.checks.check_plan`):
  TP must divide the heads, PP must not exceed the blocks, the batch must
  split over dp x micro-batches, SP must split the sequence;
* ``"train_refuses"``: a layout ``dtlab train`` refuses (ZeRO-3 with pp > 1:
  :func:`dtlab.config.check_zero3_with_pipeline`), with train's message;
* ``"tp_beyond_node"``: a TP group wider than one node (the GPU preset's
  ``gpus_per_node``): its all-reduces, two per block per pass, would cross
  the network, which Megatron-LM (Narayanan et al. 2021, takeaway #1)
  advises against;
* ``"memory"``: the plan's ``total`` (or ``peak``, if higher) exceeds the GPU's memory, by ``excess_bytes``.

The space is pruned, so that 1024 GPUs take seconds, not hours:

* TP and PP degrees are powers of two that divide the GPUs; DP takes the rest;
* micro-batches: those that give a micro-batch of 1, 2, 4 or 8 sequences
  (:data:`MICRO_BATCH_SIZES`), m = batch / (dp x size);
* one schedule when pp = 1 (all are the same there); with a pipeline GPipe,
  1F1B and interleaved 1F1B with v = 2 (:data:`VIRTUAL_STAGES`); SP only when tp > 1;
* CP, EP and the precision are not searched: they stay as given (default:
  CP and EP 1, bf16 where the GPU has a bf16 figure);
* a layout rejected whatever its other choices (a TP wider than a node, a
  batch that does not split over dp, ZeRO-3 with a pipeline) is listed once,
  with only the values that decide it.

With ``--gpu local`` (a profile ``dtlab calibrate`` wrote) the search lists
layouts to run here: what ``dtlab train`` runs (fp32 by default, recompute
none or full; GPipe, 1F1B and interleaved 1F1B, each priced as dtlab's
runtime runs it, :mod:`dtlab.planner.local`).

Any layout field passed to :func:`search` (``zero=1``, ``tp=8``, ...) is
fixed instead of searched. Everything here is a prediction: the ranking is
the planner's, not a measurement.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from dtlab.config import check_zero3_with_pipeline
from dtlab.config.layout import RECOMPUTE, ZERO_STAGES, Layout, check_positive_int
from dtlab.i18n import ConfigError
from dtlab.planner.architectures import Architecture, as_architecture, with_options
from dtlab.planner.checks import check_plan
from dtlab.planner.local import device_for
from dtlab.planner.memory_models import FrameworkRefusal
from dtlab.planner.predict import DEFAULT_MODEL, Plan, plan
from dtlab.planner.profile import is_local
from dtlab.planner.step_memory import needed_bytes

MICRO_BATCH_SIZES = (1, 2, 4, 8)
"""Sequences per micro-batch the search tries (Megatron-LM's runs use 1 or 2)."""

VIRTUAL_STAGES = 2
"""Model chunks per rank the search gives the interleaved schedule (Megatron-LM's v)."""

LOCAL_RECOMPUTE = ("none", "full")
"""What ``dtlab train --recompute`` (a switch: whole blocks or nothing) runs, searched for ``--gpu local``."""

SEARCHED = ("dp", "tp", "pp", "micro_batches", "schedule", "virtual_stages", "zero", "dp_shard", "recompute", "sp")
"""The layout fields the search varies; the others (precision, cp, ep, experts) stay as given."""

REASONS = {
    "memory": ("does not fit in memory", "显存放不下"),
    "divisibility": ("does not divide", "无法整除 / 切分"),
    "tp_beyond_node": ("TP beyond a node", "TP 跨节点"),
    "train_refuses": ("dtlab train refuses it", "dtlab train 会拒绝"),
    "framework_refuses": ("the memory model's trainer does not run it", "该显存模型对应的训练框架不运行它"),
}
"""Why a layout was rejected: key -> (English, Chinese)."""


@dataclass(frozen=True)
class Rejection:
    """A layout (or every layout sharing ``fields``) the search did not keep, and why."""

    fields: dict
    """The layout values that decide the rejection (dp, tp, pp, and more when they matter)."""
    reason: str
    """A key of :data:`REASONS`."""
    en: str
    zh: str
    excess_bytes: int = 0
    """For ``"memory"``: bytes per GPU above the GPU's memory."""
    plan: Plan | None = None
    """For ``"memory"``: the plan that does not fit."""

    def to_dict(self) -> dict:
        d = {**self.fields, "rank": None, "rejected": self.reason, "message": self.en, "message_zh": self.zh}
        if self.plan is not None:
            d.update(
                memory_total=self.plan.memory["total"],
                gpu_memory=self.plan.gpu_memory,
                excess_bytes=self.excess_bytes,
                step_time_s=self.plan.step_time_s,
            )
        return d


@dataclass(frozen=True)
class Search:
    """What :func:`search` found: ``ranked`` (fits, fastest first) and ``rejected``."""

    model: str
    gpu: str
    gpus: int
    batch_size: int
    precision: str
    gpus_per_node: int
    local: bool = False
    """The machine ``dtlab calibrate`` measured: only what ``dtlab train`` runs is searched."""
    ranked: list[Plan] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)

    def by_reason(self) -> dict[str, list[Rejection]]:
        """The rejections grouped by reason, in :data:`REASONS`' order; memory's closest first."""
        groups = {reason: [r for r in self.rejected if r.reason == reason] for reason in REASONS}
        groups["memory"].sort(key=lambda r: r.excess_bytes)
        return {reason: rows for reason, rows in groups.items() if rows}

    def to_list(self, top: int | None = None) -> list[dict]:
        """``dtlab plan --search --json``: the top ``top`` plans (each ``dtlab plan --json``'s object with
        ``rank`` 1, 2, ... and ``rejected`` null), then every rejection (``rank`` null, ``rejected`` its reason)."""
        kept = self.ranked if top is None else self.ranked[:top]
        return [{**p.to_dict(), "rank": i, "rejected": None} for i, p in enumerate(kept, 1)] + [
            r.to_dict() for rows in self.by_reason().values() for r in rows
        ]


def _powers_of_two_dividing(n: int) -> list[int]:
    return [d for d in (2**k for k in range(n.bit_length())) if n % d == 0]


def search(
    model=DEFAULT_MODEL,
    *,
    gpus: int,
    gpu: str = "H100",
    batch_size: int | None = None,
    seq_len: int | None = None,
    tied_embeddings: bool | None = None,
    vocab_parallel: bool | None = None,
    memory_model: str = "runtime",
    master_weights: str | None = None,
    grad_dtype: str | None = None,
    offload: bool = False,
    **fixed,
) -> Search:
    """Every layout of ``gpus`` GPUs for ``model``, planned; those that fit ranked by step time.

    ``gpu`` is passed to :func:`dtlab.planner.plan` as it is (any GPU the
    planner resolves); its ``gpus_per_node`` bounds TP. ``batch_size`` is the
    global batch in sequences, the same for every layout (default: one
    sequence per GPU). ``fixed``: :class:`~dtlab.config.layout.Layout` fields held
    at the value given instead of searched (``zero=1``, ``precision="fp32"``). ``memory_model``,
    ``master_weights``, ``grad_dtype``, ``offload``: as :func:`dtlab.planner.plan` takes them, the same
    for every layout; a layout that memory model's trainer does not run is rejected as such.
    """
    check_positive_int("gpus", gpus)
    _check_layout_fields(fixed)
    device = device_for(gpu, Layout())  # local: measured in fp32
    batch_size = gpus if batch_size is None else batch_size
    check_positive_int("batch_size", batch_size)
    precision = fixed.pop("precision", "bf16" if "bf16" in device.peak_flops and not is_local(gpu) else "fp32")
    options = {
        "seq_len": seq_len,
        "tied_embeddings": tied_embeddings,
        "vocab_parallel": vocab_parallel,
        "gpu": gpu,
        "gpus": gpus,
        "batch_size": batch_size,
        "memory_model": memory_model,
        "master_weights": master_weights,
        "grad_dtype": grad_dtype,
        "offload": offload,
    }  # what every plan() is given
    arch = _shaped_architecture(model, seq_len=seq_len, tied_embeddings=tied_embeddings, vocab_parallel=vocab_parallel)
    base = Layout(precision=precision, **{k: v for k, v in fixed.items() if k not in SEARCHED}).validate()
    found = Search(
        model=arch.name,
        gpu=device.name,
        gpus=gpus,
        batch_size=batch_size,
        precision=precision,
        gpus_per_node=device.gpus_per_node,
        local=is_local(gpu),
    )
    others = base.cp * base.ep
    if gpus % others:
        raise ConfigError(
            f"gpus = {gpus} is not a multiple of cp x ep = {others}", f"gpus = {gpus} 不是 cp x ep = {others} 的倍数"
        )
    rest = gpus // others
    for tp in [fixed["tp"]] if "tp" in fixed else _powers_of_two_dividing(rest):
        for pp in [fixed["pp"]] if "pp" in fixed else _powers_of_two_dividing(rest // tp):
            if rest % (tp * pp) or fixed.get("dp", rest // (tp * pp)) != rest // (tp * pp):
                continue
            _search_grid(
                found,
                model,
                arch,
                device,
                dataclasses.replace(base, dp=rest // (tp * pp), tp=tp, pp=pp),
                fixed,
                options,
            )
    if not found.ranked and not found.rejected:
        raise ConfigError(
            f"no layout of {gpus} GPUs has the fixed values {fixed}", f"没有 {gpus} 张 GPU 的布局满足给定的取值 {fixed}"
        )
    found.ranked.sort(key=lambda p: (p.step_time_s, p.memory["total"]))
    return found


def _check_layout_fields(fixed: dict) -> None:
    """The values ``search`` holds fixed must be :class:`~dtlab.config.layout.Layout` fields."""
    unknown = set(fixed) - {f.name for f in dataclasses.fields(Layout)}
    if unknown:
        raise ConfigError(
            f"search: {sorted(unknown)} are not layout fields (allowed: "
            f"{[f.name for f in dataclasses.fields(Layout)]})",
            f"search：{sorted(unknown)} 不是布局字段（允许：{[f.name for f in dataclasses.fields(Layout)]}）",
        )


def _shaped_architecture(model, *, seq_len: int | None, **options) -> Architecture:
    """The model as an Architecture with ``seq_len`` and ``options`` applied; a bare parameter count refused."""
    if isinstance(model, int):
        raise ConfigError(
            "search needs a model with a shape (--model or --layers ...): from a parameter count "
            "alone the activations and TP and PP communication are unknown, so layouts cannot be "
            "ranked",
            "搜索需要有形状的模型（--model 或 --layers ……）：只给参数量时，激活以及 TP 和 PP "
            "的通信都未知，无法给布局排序",
        )
    return with_options(as_architecture(model, seq_len=seq_len), **options)


def _search_grid(found: Search, model, arch, device, grid: Layout, fixed: dict, options: dict) -> None:
    """Every layout on the grid (dp, tp, pp): refused as a whole, or each one planned."""
    decided = {"dp": grid.dp, "tp": grid.tp, "pp": grid.pp}
    try:  # the planner's checks on the grid alone: heads, blocks, the batch over dp
        check_plan(arch, grid, gpus=found.gpus, batch_size=found.batch_size)
    except ConfigError as refusal:
        found.rejected.append(Rejection(decided, "divisibility", refusal.en, refusal.zh))
        return
    if grid.tp > device.gpus_per_node:
        nodes = -(-grid.tp // device.gpus_per_node)
        found.rejected.append(
            Rejection(
                decided,
                "tp_beyond_node",
                f"tp = {grid.tp} spans {nodes} nodes of {device.gpus_per_node} GPUs: every block's all-reduces "
                f"would cross the {device.inter_node_link} link (allowed: tp <= {device.gpus_per_node})",
                f"tp = {grid.tp} 跨越 {nodes} 个节点（每节点 {device.gpus_per_node} 张 GPU）：每个 block 的全归约都要"
                f"经过 {device.inter_node_link} 网络（允许：tp <= {device.gpus_per_node}）",
            )
        )
        return
    zeros = [fixed["zero"]] if "zero" in fixed else list(ZERO_STAGES)
    for zero in list(zeros):
        try:  # train's own refusal, with train's words: once per grid, not once per layout
            check_zero3_with_pipeline(dataclasses.replace(grid, zero=zero))
        except ConfigError as refusal:
            found.rejected.append(Rejection({**decided, "zero": zero}, "train_refuses", refusal.en, refusal.zh))
            zeros.remove(zero)
    per_data_rank = found.batch_size // (grid.dp * grid.ep)
    if "micro_batches" in fixed:
        counts = [fixed["micro_batches"]]
    else:
        counts = sorted({per_data_rank // b for b in MICRO_BATCH_SIZES if per_data_rank % b == 0}, reverse=True)
    schedules = _schedules(grid, fixed)
    recomputes = [fixed["recompute"]] if "recompute" in fixed else list(LOCAL_RECOMPUTE if found.local else RECOMPUTE)
    sps = [fixed["sp"]] if "sp" in fixed else ([False, True] if grid.tp > 1 else [False])
    for m in counts:
        for schedule, v in schedules:
            pipeline = dataclasses.replace(grid, micro_batches=m, schedule=schedule, virtual_stages=v)
            try:  # m against the schedule (interleaved: a multiple of pp), once for every other choice
                check_plan(arch, pipeline, gpus=found.gpus, batch_size=found.batch_size)
            except ConfigError as refusal:
                fields = {**decided, "micro_batches": m, "schedule": schedule, "virtual_stages": v}
                found.rejected.append(Rejection(fields, "divisibility", refusal.en, refusal.zh))
                continue
            for zero in zeros:
                for shard in _dp_shards(grid, zero, fixed, device.gpus_per_node):
                    for recompute in recomputes:
                        for sp in sps:
                            layout = dataclasses.replace(
                                pipeline, zero=zero, dp_shard=shard, recompute=recompute, sp=sp
                            )
                            _plan_one(found, model, layout, options)


def _dp_shards(grid: Layout, zero: int, fixed: dict, gpus_per_node: int) -> list[int | None]:
    """Hybrid sharding's K to try: the given one (ZeRO 2|3 only), else plain ZeRO and, with ZeRO 2|3 on
    more than one node, K = the DP ranks of one node (the shard group on the fast link)."""
    if "dp_shard" in fixed:
        return [fixed["dp_shard"]] if zero in (2, 3) or fixed["dp_shard"] is None else []
    k = gpus_per_node // grid.tp
    hybrid = zero in (2, 3) and grid.cp == grid.ep == 1 and 1 <= k < grid.dp and grid.dp % k == 0
    return [None, k] if hybrid else [None]


def _schedules(grid: Layout, fixed: dict) -> list[tuple[str, int]]:
    """(schedule, virtual stages) pairs to try: 1F1B alone without a pipeline; with one, GPipe, 1F1B and
    interleaved 1F1B with :data:`VIRTUAL_STAGES` chunks (unless fixed)."""
    if "schedule" in fixed:
        default = VIRTUAL_STAGES if fixed["schedule"] == "interleaved" else 1
        return [(fixed["schedule"], fixed.get("virtual_stages", default))]
    if grid.pp == 1:
        return [("1f1b", 1)]
    return [("1f1b", 1), ("gpipe", 1), ("interleaved", fixed.get("virtual_stages", VIRTUAL_STAGES))]


def _plan_one(found: Search, model, layout: Layout, options: dict) -> None:
    """Plan one layout: ranked if it fits, else rejected with the refusal or the memory it lacks."""
    fields = {name: getattr(layout, name) for name in SEARCHED}
    try:
        p = plan(model, layout, **options)
    except FrameworkRefusal as refusal:
        found.rejected.append(Rejection(fields, "framework_refuses", refusal.en, refusal.zh))
        return
    except ConfigError as refusal:
        found.rejected.append(Rejection(fields, "divisibility", refusal.en, refusal.zh))
        return
    if p.fits:
        found.ranked.append(p)
        return
    need = needed_bytes(p.memory)
    excess = need - p.gpu_memory
    found.rejected.append(
        Rejection(
            fields,
            "memory",
            f"needs {need / 1e9:.2f} GB per GPU, {excess / 1e9:.2f} GB more than the "
            f"{p.gpu_memory / 1e9:.0f} GB of a {p.gpu}",
            f"每卡需要 {need / 1e9:.2f} GB，比 {p.gpu} 的 {p.gpu_memory / 1e9:.0f} GB 多 {excess / 1e9:.2f} GB",
            excess_bytes=excess,
            plan=p,
        )
    )
