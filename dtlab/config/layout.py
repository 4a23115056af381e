"""The layout of a training step: how its work is spread over GPUs, as one frozen value.

A :class:`Layout` says how many ways the model and the batch are split (DP,
TP, PP and, with later issues, SP, CP, EP), how the pipeline is scheduled,
what ZeRO shards, the compute precision and what is recomputed. It holds no
model and no batch size: the same layout applies to any of them.

Two parts of dtlab read it, so it lives on its own, torch-free:

* :class:`dtlab.config.TrainConfig` (what runs) gives its own as
  ``config.layout``;
* :func:`dtlab.planner.plan` (what is predicted) takes one, so a learner
  passes the layout they ran to the planner unchanged.

The choices are ``Literal`` types; the tuples of allowed values (used in
messages and on the command line) are derived from them, so each list of
choices is written once. :meth:`Layout.validate` refuses a bad value with a
bilingual error naming it and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from dtlab.i18n import ConfigError

ScheduleName = Literal["gpipe", "1f1b", "interleaved"]
RuntimeScheduleName = ScheduleName
"""The schedules dtlab's pipeline runtime runs (``dtlab train``): all three."""
Precision = Literal["fp32", "bf16", "fp16", "fp8"]
ZeroStage = Literal[0, 1, 2, 3]
Recompute = Literal["none", "selective", "full"]


def default_master_weights(precision: str, *, offload: bool = False, ep: int = 1) -> str | None:
    """Where fp16 and bf16 keep the fp32 master weights unless told (``--master-weights``): in the optimizer,
    sharded with it (ZeRO's Figure 1; dtlab/numerics/master_weights.py), but in the fp32 module with an
    offloaded optimizer (it keeps its own masters on the host) or expert parallelism; None for fp32 and
    fp8, which keep none (fp8 quantizes the fp32 module's weights itself)."""
    if precision not in ("fp16", "bf16"):
        return None
    return "model" if offload or ep > 1 else "optimizer"


SCHEDULES: tuple[str, ...] = get_args(ScheduleName)
RUNTIME_SCHEDULES: tuple[str, ...] = get_args(RuntimeScheduleName)
PRECISIONS: tuple[str, ...] = get_args(Precision)
ZERO_STAGES: tuple[int, ...] = get_args(ZeroStage)
RECOMPUTE: tuple[str, ...] = get_args(Recompute)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """One parallel layout. Each degree is 1 (disabled) unless set; see the field docstrings."""

    dp: int = 1
    """Data-parallel degree: replicas of the model (or ZeRO shards), each on its slice of the batch."""
    tp: int = 1
    """Tensor-parallel degree (Megatron-LM): each block's matrices split over this many ranks."""
    pp: int = 1
    """Pipeline-parallel degree: consecutive blocks on this many stages."""
    micro_batches: int = 1
    """Pipeline micro-batches per step (GPipe's m): more of them shrink the bubble."""
    schedule: ScheduleName = "1f1b"
    """Pipeline schedule: ``"gpipe"`` (all forwards, then all backwards), ``"1f1b"``, or
    ``"interleaved"`` (1F1B over ``virtual_stages`` model chunks per rank)."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank with the interleaved schedule (Megatron-LM's v, >= 2); 1 otherwise."""
    zero: ZeroStage = 0
    """ZeRO stage: 0 (plain DP), 1 (optimizer state sharded), 2 (+ gradients), 3 (+ parameters)."""
    precision: Precision = "fp32"
    """Compute precision: ``"fp32"``, ``"bf16"``, ``"fp16"`` (16-bit ones keep fp32 master weights) or
    ``"fp8"`` (bf16, with the blocks' matmuls on float8 inputs: dtlab/numerics/fp8.py)."""
    recompute: Recompute = "none"
    """Activation recomputation (Korthikanti et al. 2022): ``"none"``; ``"selective"``, only the
    attention core; ``"full"``, every block's forward again in backward, keeping only its input.
    :class:`dtlab.config.TrainConfig`'s bool ``recompute`` checkpoints whole blocks: True is
    ``"full"``, False is ``"none"``."""
    sp: bool = False
    """Megatron sequence parallelism (Korthikanti et al. 2022): with tp > 1, the regions outside
    the TP blocks hold 1/tp of the sequence per rank."""
    cp: int = 1
    """Context-parallel degree: every sequence split along its length over this many ranks
    (ring attention). Room for issue 18; the planner refuses cp > 1 until it models it."""
    ep: int = 1
    """Expert-parallel degree: ranks a mixture-of-experts layer's experts are spread over, E/ep
    each; like dp it multiplies the ranks and splits the batch (dtlab/parallel/moe/expert_parallel.py)."""
    experts: int = 0
    """Experts per mixture-of-experts layer; 0 is a dense model (TrainConfig's ``experts``,
    which its ``model_config()`` passes on as ``ModelConfig.n_experts``)."""
    zero3_prefetch: int = 0
    """ZeRO-3's prefetch (FSDP2's): units whose all-gather is issued while the unit before them
    computes, so up to zero3_prefetch + 1 units are gathered at once; 0 gathers one at a time."""
    dp_shard: int | None = None
    """Hybrid sharding (HSDP) with ZeRO 2 or 3: model states sharded within groups of this many
    data-parallel ranks and replicated across the dp / dp_shard groups; None shards over all dp."""

    @property
    def world_size(self) -> int:
        """Ranks the layout needs: dp x cp x ep x tp x pp, the rank grid's axes (dtlab/grid.py)."""
        return self.dp * self.cp * self.ep * self.tp * self.pp

    @property
    def zero_ranks(self) -> int:
        """Ranks ZeRO shards the (dense) model states over: dp x cp x ep, or hybrid sharding's dp_shard."""
        return self.dp_shard if self.dp_shard is not None else self.dp * self.cp * self.ep

    def validate(self) -> "Layout":
        """Check each field's type and range; raise a bilingual ConfigError naming the first bad one.

        Whether the layout suits a model (TP dividing the heads, PP at most the
        blocks) is the caller's check: the layout does not know the model.
        """
        for name in ("dp", "tp", "pp", "micro_batches", "cp", "ep", "virtual_stages"):
            check_positive_int(name, getattr(self, name))
        if isinstance(self.experts, bool) or not isinstance(self.experts, int) or self.experts < 0:
            raise ConfigError(
                f"experts must be an integer >= 0 (0: dense), got {self.experts!r}",
                f"experts 必须是 >= 0 的整数（0 表示稠密模型），收到的是 {self.experts!r}",
            )
        if isinstance(self.zero3_prefetch, bool) or not isinstance(self.zero3_prefetch, int) or self.zero3_prefetch < 0:
            raise ConfigError(
                f"zero3_prefetch must be an integer >= 0 (0: no prefetch), got {self.zero3_prefetch!r}",
                f"zero3_prefetch 必须是 >= 0 的整数（0 表示不预取），收到的是 {self.zero3_prefetch!r}",
            )
        if self.zero3_prefetch and self.zero != 3:
            raise ConfigError(
                f"zero3_prefetch={self.zero3_prefetch!r} with zero={self.zero!r}: only ZeRO-3 gathers "
                "parameters before use (allowed: zero3_prefetch=0, or zero=3)",
                f"zero3_prefetch={self.zero3_prefetch!r} 与 zero={self.zero!r} 不能同时使用：只有 ZeRO-3 "
                "在使用前收集参数（允许：zero3_prefetch=0，或 zero=3）",
            )
        check_dp_shard(self)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("zero", self.zero, ZERO_STAGES)
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("recompute", self.recompute, RECOMPUTE)
        check_choice("sp", self.sp, (False, True))
        return self


def check_dp_shard(layout) -> None:
    """Hybrid sharding's K (``dp_shard``, of a Layout or a TrainConfig): a whole number of ranks from 1
    that divides dp, with ZeRO 2 or 3 (what it shards), over data-parallel ranks only (no cp or ep)."""
    k = layout.dp_shard
    if k is None:
        return
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(
            f"dp_shard={k!r} is not allowed; expected a whole number of ranks from 1 that divides dp={layout.dp}",
            f"dp_shard={k!r} 不合法；应为能整除 dp={layout.dp} 的正整数（rank 个数）",
        )
    if layout.zero not in (2, 3):
        raise ConfigError(
            f"dp_shard={k} with zero={layout.zero!r}: hybrid sharding shards gradients and parameters "
            f"within groups of {k} ranks, which ZeRO stage 2 or 3 does (allowed: --dp-shard with --zero 2 or "
            f"--zero 3, or no --dp-shard)",
            f"dp_shard={k} 与 zero={layout.zero!r} 不能同时使用：混合分片在每 {k} 个 rank 的组内切分梯度和参数，"
            f"这是 ZeRO 第 2、3 阶段做的事（允许：--dp-shard 配合 --zero 2 或 --zero 3，或不给 --dp-shard）",
        )
    if layout.dp % k:
        allowed = [d for d in range(1, layout.dp + 1) if layout.dp % d == 0]
        raise ConfigError(
            f"dp_shard={k} does not divide dp={layout.dp}: the dp ranks must form equal groups of {k} "
            f"(allowed: {allowed})",
            f"dp_shard={k} 不能整除 dp={layout.dp}：dp 个 rank 要分成大小都是 {k} 的组（允许：{allowed}）",
        )
    if layout.cp > 1 or layout.ep > 1:
        raise ConfigError(
            f"dp_shard={k} with cp={layout.cp}, ep={layout.ep}: hybrid sharding groups data-parallel ranks "
            f"only (allowed: --dp-shard with cp=1 and ep=1)",
            f"dp_shard={k} 与 cp={layout.cp}、ep={layout.ep} 不能同时使用：混合分片只对数据并行的 rank 分组"
            f"（允许：cp=1 且 ep=1 时使用 --dp-shard）",
        )


def check_positive_int(name: str, value) -> None:
    """Refuse anything but an int >= 1 (a bool is not a count)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{name} must be a positive integer, got {value!r}", f"{name} 必须是正整数，收到的是 {value!r}"
        )


def check_choice(name: str, value, allowed: tuple) -> None:
    """Refuse a value outside ``allowed``, or of another type (``zero=True`` is not stage 1)."""
    if value not in allowed or type(value) is not type(allowed[0]):
        shown = ", ".join(repr(a) for a in allowed)
        raise ConfigError(
            f"{name} must be one of {shown}, got {value!r}", f"{name} 只能是 {shown} 之一，收到的是 {value!r}"
        )
