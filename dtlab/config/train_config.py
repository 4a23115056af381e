"""A training job as data: one frozen, keyword-only dataclass, validated once.

``TrainConfig.validate()`` runs in the caller's process before any rank starts,
so a bad value is reported in English and Chinese, naming the value and what
would be accepted, instead of as a traceback from four processes.

``TrainConfig`` is the one list of training options. Each field's type, default
and the docstring under it are all there is to say about an option (beside its
help's Chinese, dtlab/config/help_zh.py): the ``dtlab train`` flags and their
help (dtlab/config/flags.py), the control panel's widgets
(dtlab/lab/controls.py) and validation are derived from them. A choice is a
``Literal`` type (the layout's are in dtlab/config/layout.py), so its allowed values
are written once. What a docstring cannot say lives in the
field's ``metadata``:

    flag      the command-line flag, if not ``--`` + the name with dashes; None: no flag
    metavar   how ``--help`` shows the value (a Literal's choices are shown by default)
    parse     turns the flag's text into the field's value (raises ValueError)

The checks ``validate()`` runs live in dtlab/config/checks.py; the model's
shape and presets in dtlab/config/model_config.py.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Literal

from dtlab.config.checks import (
    bad,
    check_combinations,
    check_fast_path,
    check_layout,
    check_straggler,
)
from dtlab.config.layout import (  # noqa: F401
    PRECISIONS,
    ZERO_STAGES,
    Layout,
    Precision,
    RuntimeScheduleName,
    ZeroStage,
    default_master_weights,
)
from dtlab.config.layout import RUNTIME_SCHEDULES as SCHEDULES  # what dtlab train runs  # noqa: F401
from dtlab.config.limits import check_numbers
from dtlab.config.model_config import MODEL_PRESETS, Attention, ModelConfig
from dtlab.config.output_paths import check_save_target, checkpoint_bytes
from dtlab.config.rank_limit import local_limit_reason, local_rank_limit, pool_limit_reason
from dtlab.i18n import ConfigError
from dtlab.numerics.lr_schedule import DeepSpeedSchedule
from dtlab.parallel.moe.options import check_experts, parse_capacity

DpMode = Literal["overlapped", "bucketed", "per_parameter"]
Collectives = Literal["torch", "ring", "dtlab"]
SpikePolicy = Literal["skip", "rollback"]
Zero3Shard = Literal["all", "linear"]
MasterWeightsLayout = Literal["model", "optimizer"]
DP_MODES: tuple[str, ...] = typing.get_args(DpMode)


def parse_straggler(text: str) -> tuple[int, float]:
    """``"1:0.2"`` -> ``(1, 0.2)``: the ``--straggler RANK:SECONDS`` flag's value."""
    try:
        rank, seconds = text.split(":")
        return int(rank), float(seconds)
    except ValueError:
        raise ConfigError(
            f"--straggler {text!r}: expected RANK:SECONDS, e.g. 1:0.2",
            f"--straggler {text!r}：应为 RANK:SECONDS，例如 1:0.2",
        ) from None


def parse_betas(text: str) -> tuple[float, float]:
    """``"0.9,0.999"`` -> ``(0.9, 0.999)``: the ``--betas BETA1,BETA2`` flag's value."""
    try:
        beta1, beta2 = text.split(",")
        return float(beta1), float(beta2)
    except ValueError:
        raise ConfigError(
            f"--betas {text!r}: expected BETA1,BETA2, e.g. 0.9,0.95",
            f"--betas {text!r}：应为 BETA1,BETA2，例如 0.9,0.95",
        ) from None


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training job of the small GPT: layout, optimisation and fault injection.

    ``batch_size`` is the *global* batch in sequences per optimizer step: it is
    split across data-parallel ranks and then across accumulation micro-steps,
    so the same batch size gives the same result on any layout.
    """

    dp: int = 1
    """Data-parallel degree: replicas of the model, each on its slice of the batch."""
    dp_mode: DpMode = "overlapped"
    """How data parallelism averages gradients: 'overlapped' (bucketed all-reduces started
    during backward, as DDP does), 'bucketed' (one all-reduce per bucket after backward)
    or 'per_parameter' (one all-reduce per parameter after backward)."""
    bucket_mb: float = field(default=0.25, metadata={"metavar": "MIB"})
    """Gradient bucket in MiB for DP and ZeRO-2 (DDP's bucket_cap_mb; DeepSpeed's reduce_bucket_size
    maps to it). DP: a bucket is closed once it holds this much (DDP's rule), so 0.25 cuts the small
    GPT's 0.9 MiB of gradients into 4 buckets, the first three all-reduced while backward still
    computes; DDP's 25 holds them all in one, sent after
    backward; 0: one bucket per parameter. ZeRO-2 (DeepSpeed's overlap_comm): the flat gradient in
    windows of this size, each reduce-scattered during backward as soon as its gradients exist, so
    a rank holds its 1/N shard and at most two buckets, never the whole gradient; it must be > 0.
    ZeRO-1 (which keeps the whole gradient) and ZeRO-3 (unit by unit) have no bucket: a value other
    than the default is refused with --zero 1 or 3."""
    collectives: Collectives = "torch"
    """Who runs every DP, ZeRO and TP collective: 'torch' (torch.distributed's own), 'ring'
    (dtlab's ring of sends and receives, dtlab/comm/collectives.py, the one lesson 01 builds) or 'dtlab'
    (transport and algorithm chosen as NCCL chooses them: ranks all on one machine run the ring at
    every size over shared memory, dtlab/comm/shared_memory.py; across machines, recursive doubling for
    all-reduces of at most 1 MiB, dtlab/comm/recursive_doubling.py, and the ring for the rest). 'ring'
    and 'dtlab' run on the gloo backend only."""
    tp: int = 1
    """Tensor-parallel degree. 1 means disabled."""
    sp: bool = False
    """Megatron sequence parallelism (needs tp > 1): LayerNorms, dropout and residuals hold
    1/tp of the sequence per rank; all-gather and reduce-scatter replace TP's all-reduces."""
    cp: int = 1
    """Context-parallel degree: every sequence split along its length over this many ranks,
    attention as ring attention (zigzag chunks). 1 means disabled."""
    pp: int = 1
    """Pipeline-parallel degree (stages). 1 means disabled."""
    micro_batches: int = 1
    """Pipeline micro-batches per step (GPipe's m)."""
    schedule: RuntimeScheduleName = "1f1b"
    """Pipeline schedule: 'gpipe' (all forwards, then all backwards), '1f1b' (one forward, one
    backward: fewer activations held) or 'interleaved' (1F1B over --virtual-stages model chunks per
    rank, Megatron-LM's: a smaller bubble, more messages; needs pp >= 2 and micro_batches a multiple of pp)."""
    virtual_stages: int = field(default=1, metadata={"metavar": "V"})
    """Model chunks per pipeline rank with --schedule interleaved (Megatron-LM's v, >= 2): the blocks
    are cut into pp x V chunks and rank r holds chunks r, r + pp, ...; pp x V must not exceed the
    model's blocks. 1 with 'gpipe' and '1f1b'."""
    zero: ZeroStage = 0
    """ZeRO stage: 0 (plain DP), 1 (optimizer state), 2 (+gradients), 3 (+parameters)."""
    offload: bool = False
    """Keep optimizer state, and run the optimizer step, on the CPU side (needs a ZeRO stage)."""
    zero3_prefetch: int = field(default=0, metadata={"metavar": "UNITS"})
    """ZeRO-3: units whose all-gather is issued ahead, while the unit before them computes, in
    forward and (in reverse) in backward, as FSDP2 prefetches (its default is 1); up to this many
    plus one units are then gathered at once. 0 gathers each unit only when it is needed. With --zero 3 only."""
    zero3_shard: Zero3Shard = "all"
    """ZeRO-3's sharding policy (FSDP's wrapping policy): 'all' shards every parameter; 'linear' shards
    the Linear and Embedding weights (tensor-parallel ones too) and keeps the rest, the LayerNorms,
    whole on every rank, their gradients all-reduced. With --zero 3 only."""
    dp_shard: int | None = field(default=None, metadata={"metavar": "K"})
    """Hybrid sharding (HSDP, FSDP2's; DeepSpeed's hpZ for parameters), with --zero 2 or 3: shard the
    model states within groups of K consecutive data-parallel ranks (K the ranks of one node) and
    replicate them across the dp/K groups: all-gathers and reduce-scatters stay inside a group, and
    only one all-reduce of each gradient shard crosses between groups. K must divide dp; K = dp is
    plain ZeRO. Unset: shard over all dp ranks."""
    precision: Precision = "fp32"
    """Compute precision: 'fp32', 'bf16', 'fp16' or 'fp8' (as bf16, but the blocks' Linear layers multiply
    float8 inputs with a scale per tensor: e4m3 weights and activations, e5m2 gradients; dtlab/numerics/fp8.py)."""
    loss_scale: str = field(default="dynamic", metadata={"metavar": "dynamic|NUMBER"})
    """fp16 loss scale: 'dynamic' or a fixed number."""
    master_weights: MasterWeightsLayout | None = None
    """Where fp16 and bf16 keep the fp32 master weights: 'optimizer' (the parameters and their gradients are
    16-bit and the optimizer keeps an fp32 master beside Adam's moments, K = 12 bytes per parameter, sharded
    from ZeRO stage 1 on: ZeRO's Figure 1, Megatron-LM, DeepSpeed; dtlab/numerics/master_weights.py) or
    'model' (the module's parameters stay fp32 and each layer computes on 16-bit casts of them: PyTorch
    AMP, FSDP's MixedPrecision). 'optimizer' needs fp16 or bf16, and not --offload or ep > 1. Unset:
    'optimizer' for fp16 and bf16, 'model' with --offload or ep > 1 (their optimizers keep the masters in
    the module); fp32 and fp8 keep none (:attr:`masters`)."""
    fp8_amax_history: int = field(default=0, metadata={"metavar": "N"})
    """With --precision fp8: 0 is current scaling (each tensor scaled by its own amax, its largest magnitude);
    N from 1 to 1024 is delayed scaling (the largest amax of the same tensor over the last N steps)."""
    grad_accum: int = 1
    """Gradient accumulation micro-steps per optimizer step (communicates once per step)."""
    recompute: bool = False
    """Activation (gradient) checkpointing per transformer block."""
    attention: Attention | None = None
    """The attention kernel: 'eager' (softmax(QK^T)V written out, the (B, nh, T, T) scores kept for
    backward: the one the lessons step through, dtlab/model.py) or 'sdpa' (PyTorch's fused
    scaled_dot_product_attention: FlashAttention or memory-efficient kernels on CUDA, no T x T scores
    kept). The same numbers either way. Unset: 'sdpa' on CUDA, 'eager' on the CPU. With cp > 1
    attention is ring attention (dtlab/parallel/ring_attention.py) whichever is set, so 'sdpa' is refused there."""
    compile: bool = False
    """torch.compile each transformer block's forward on every rank, after the parallelisms that rewrite
    the blocks (dtlab/train/rank.py says where); the first steps are slower while it compiles. Not with
    pp, cp or ep > 1, --zero 3 or --recompute (refused: dtlab/config/checks.py says why)."""
    lr: float = 1e-3
    """Peak learning rate (AdamW)."""
    warmup: int = 0
    """Linear warmup steps before cosine decay."""
    lr_schedule: DeepSpeedSchedule | None = field(default=None, metadata={"flag": None})
    """A DeepSpeed scheduler read from a ds_config (dtlab/numerics/lr_schedule.py), replacing the warmup and
    cosine decay above; set by --deepspeed-config, not a flag of its own."""
    steps: int = 20
    """Optimizer steps to run."""
    seed: int = 0
    """Seeds the weights and the data order; the same seed gives the same run."""
    seq_len: int | None = None
    """Tokens per sequence (2 to 1024); unset, the model preset's."""
    model: str = field(default="small", metadata={"metavar": "|".join(MODEL_PRESETS)})
    """Model preset, by size (see MODEL_PRESETS)."""
    batch_size: int = 8
    """Sequences per optimizer step in total (the global batch), split across data-parallel
    ranks and accumulation micro-steps, so the same batch gives the same result on any layout."""
    weight_decay: float = field(default=0.0, metadata={"flag": None})
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] | None = field(default=None, metadata={"parse": parse_betas, "metavar": "BETA1,BETA2"})
    """AdamW's (beta1, beta2), each in [0, 1); unset, dtlab's (0.9, 0.95: dtlab/reference.py)."""
    eps: float | None = None
    """AdamW's epsilon, from 0 to 1; unset, dtlab's (1e-8: dtlab/reference.py)."""
    clip_grad: float | None = field(default=None, metadata={"metavar": "NORM"})
    """Clip the gradient to this global L2 norm, taken over every shard on every rank (what
    torch.nn.utils.clip_grad_norm_ does on one process; DeepSpeed's gradient_clipping). Unset: no clipping."""
    straggler: tuple[int, float] | None = field(
        default=None, metadata={"parse": parse_straggler, "metavar": "RANK:SECONDS"}
    )
    """Slow one rank down: (rank, seconds) makes that rank sleep this long in every step's compute."""
    spike: int | None = field(default=None, metadata={"metavar": "STEP"})
    """Feed one corrupted batch at this step (a loss spike to detect)."""
    spike_policy: SpikePolicy = "skip"
    """What to do when a loss spike is detected: 'skip' the batch, or 'rollback' to the last snapshot."""
    save: str | None = field(default=None, metadata={"metavar": "DIR"})
    """Directory to write training checkpoints to."""
    save_every: int = field(default=10, metadata={"metavar": "STEPS"})
    """With ``save``: write a training checkpoint every this many steps (and after the last)."""
    resume: str | None = field(default=None, metadata={"metavar": "DIR"})
    """Directory to resume from: its newest committed save, or a step folder named directly. Any
    layout may resume it (the checkpoint is resharded on load); the model, seed and batch size may not change."""
    trace: str | None = field(default=None, metadata={"metavar": "FILE"})
    """Write a Chrome trace-event JSON of every rank's compute and communication to this file
    (open it in Perfetto or chrome://tracing)."""
    timeout_s: float = field(default=60.0, metadata={"flag": "--timeout", "metavar": "SECONDS"})
    """How long any collective may wait for its peers before the run fails."""
    experts: int = field(default=0, metadata={"metavar": "E"})
    """Mixture of experts: every block's MLP becomes E expert MLPs behind a learned router
    (dtlab/parallel/moe/); 0 keeps the dense model."""
    top_k: int = field(default=1, metadata={"metavar": "K"})
    """Experts each token is routed to, 1 to E (1: Switch Transformer; 2: GShard, Mixtral)."""
    ep: int = field(default=1, metadata={"metavar": "N"})
    """Expert-parallel degree: E/N experts per rank, tokens sent to them by all-to-all. Like dp it
    multiplies the ranks (dp x ep x tp x pp) and splits the batch (over dp x ep)."""
    capacity_factor: float | None = field(default=1.25, metadata={"parse": parse_capacity, "metavar": "X|none"})
    """An expert takes at most ceil(X x seq_len x top_k / E) tokens of each sequence; the rest are
    dropped ('none': no limit)."""
    aux_loss_coef: float = field(default=0.01, metadata={"metavar": "ALPHA"})
    """Weight of the Switch Transformer load-balancing loss added per MoE layer (0: none)."""

    @classmethod
    def choices(cls, name: str) -> tuple | None:
        """The values a ``Literal``-typed field accepts, e.g. ``('gpipe', '1f1b')``; None for others.
        Where the type is ``Literal[...] | None`` (``attention``), unset (None) is allowed too."""
        hint = field_types(cls)[name]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
        return typing.get_args(hint) if typing.get_origin(hint) is Literal else None

    @property
    def masters(self) -> str | None:
        """Where this run keeps the fp32 master weights: ``master_weights``, or unset its default
        (:func:`dtlab.config.layout.default_master_weights`); None for fp32 and fp8 left unset."""
        return self.master_weights or default_master_weights(self.precision, offload=self.offload, ep=self.ep)

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.ep * self.tp * self.pp

    @property
    def data_ranks(self) -> int:
        """Ranks that each read their own slice of the batch: dp x ep (CP ranks share sequences)."""
        return self.dp * self.ep

    @property
    def layout(self) -> Layout:
        """This job's :class:`dtlab.config.layout.Layout` (what :func:`dtlab.planner.plan` takes): every field
        the two share by name, and the bool ``recompute`` (whole blocks) as ``"full"`` or ``"none"``."""
        shared = {f.name for f in dataclasses.fields(Layout)} & {f.name for f in dataclasses.fields(self)}
        values = {name: getattr(self, name) for name in shared - {"recompute"}}
        return Layout(**values, recompute="full" if self.recompute else "none")

    def model_config(self, device: str = "cpu") -> ModelConfig:
        """The model this job trains, its attention kernel the one it runs on ``device`` (:func:`attention_for`)."""
        base = dataclasses.replace(MODEL_PRESETS[self.model], attention=attention_for(self, device))
        base = base if self.seq_len is None else dataclasses.replace(base, seq_len=self.seq_len)
        if not self.experts:
            return base
        return dataclasses.replace(
            base,
            n_experts=self.experts,
            top_k=self.top_k,
            capacity_factor=self.capacity_factor,
            aux_loss_coef=self.aux_loss_coef,
        )

    def validate(
        self, *, max_world_size: int | None = None, limit_reason: tuple[str, str] | None = None
    ) -> "TrainConfig":
        """Check every field; raise a bilingual ConfigError naming the first bad value.

        ``max_world_size``: the most ranks the job may have (None: the local pool's ``DTLAB_MAX_RANKS``);
        ``limit_reason``: where that number comes from, (English, Chinese), to follow "but" in a refusal.
        """
        limit = max_world_size or local_rank_limit()
        reason = limit_reason or (pool_limit_reason(limit) if max_world_size else local_limit_reason(limit))
        check_numbers(self, max_ranks=limit, limit_reason=reason)  # types, finite, ranges (dtlab/config/limits.py)
        if self.model not in MODEL_PRESETS:
            raise bad("model", self.model, f"one of {sorted(MODEL_PRESETS)}", f"{sorted(MODEL_PRESETS)} 之一")
        for option in dataclasses.fields(self):
            allowed = self.choices(option.name)
            value = getattr(self, option.name)
            if allowed is not None and value not in allowed and not (value is None and option.default is None):
                shown = [repr(choice) for choice in allowed]
                raise bad(option.name, value, ", ".join(shown[:-1]) + " or " + shown[-1], "、".join(shown) + " 之一")
        check_experts(self)
        if not (self.lr > 0 and self.lr < 10):
            raise bad("lr", self.lr, "a number in (0, 10)", "(0, 10) 之间的数")
        if self.betas is not None and not (
            isinstance(self.betas, tuple) and len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas)
        ):
            raise bad(
                "betas",
                self.betas,
                "two numbers (beta1, beta2), each in [0, 1)",
                "两个数 (beta1, beta2)，每个都在 [0, 1) 之内",
            )
        if self.world_size > limit:
            axes = ["dp", *(["cp"] if self.cp > 1 else []), *(["ep"] if self.ep > 1 else []), "tp", "pp"]
            product = f"{' x '.join(axes)} = {' x '.join(str(getattr(self, a)) for a in axes)}"
            raise ConfigError(
                f"{product} = {self.world_size} ranks, but {reason[0]}",
                f"{product} = {self.world_size} 个 rank，但{reason[1]}",
            )
        per_rank = self.data_ranks * self.grad_accum
        if self.batch_size % per_rank:
            raise ConfigError(
                f"batch_size {self.batch_size} must split evenly over dp x ep x grad_accum = "
                f"{self.dp} x {self.ep} x {self.grad_accum} = {per_rank} (allowed: a multiple of {per_rank})",
                f"batch_size {self.batch_size} 必须能被 dp x ep x grad_accum = {self.dp} x {self.ep} x "
                f"{self.grad_accum} = {per_rank} 整除（允许：{per_rank} 的倍数）",
            )
        if self.straggler is not None:
            check_straggler(self)
        check_layout(self)
        check_combinations(self)
        check_fast_path(self)
        if self.save is not None:  # before step 0, not at the first save (dtlab/config/output_paths.py)
            check_save_target(
                self.save, needed_bytes=checkpoint_bytes(self.model_config().param_count()), resume=self.resume
            )
        return self


def attention_for(config: TrainConfig, device) -> Attention:
    """The attention kernel ``config`` runs on ``device`` (a torch.device, or its name: 'cuda:0', 'cpu'):
    ``config.attention``, or, unset, 'sdpa' on CUDA (fused kernels, no T x T scores in memory) and 'eager'
    on the CPU (the lessons' readable one). Under context parallelism ring attention replaces either."""
    if config.attention is not None:
        return config.attention
    kind = getattr(device, "type", str(device).split(":")[0])
    return "sdpa" if kind == "cuda" else "eager"


@functools.cache
def field_types(cls: type) -> dict:
    """A config class's field annotations as types (this module postpones them: they are strings)."""
    return typing.get_type_hints(cls)
