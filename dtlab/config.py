"""Configuration as data: frozen, keyword-only dataclasses, validated once.

``TrainConfig.validate()`` runs in the caller's process before any rank starts,
so a bad value is reported in English and Chinese, naming the value and what
would be accepted, instead of as a traceback from four processes.

``TrainConfig`` is the one list of training options. Each field's type, default
and the docstring under it are all there is to say about an option (beside its
help's Chinese, dtlab/config_help_zh.py): the ``dtlab train`` flags and their
help (dtlab/config_flags.py), the control panel's widgets
(dtlab/lab/controls.py) and validation are derived from them. A choice is a
``Literal`` type (the layout's are in dtlab/layout.py), so its allowed values
are written once. What a docstring cannot say lives in the
field's ``metadata``:

    flag      the command-line flag, if not ``--`` + the name with dashes; None: no flag
    metavar   how ``--help`` shows the value (a Literal's choices are shown by default)
    parse     turns the flag's text into the field's value (raises ValueError)

This module is long because it is that one list: every option any component
adds (sequence, context and expert parallelism, clipping, tracing, ...) is a
field here with its docstring, by design, so that the list is never split.
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from typing import Literal

from dtlab.output_paths import check_output_file, check_save_target, checkpoint_bytes
from dtlab.config_limits import check_numbers
from dtlab.i18n import ConfigError
from dtlab.lr_schedule import DeepSpeedSchedule
# The layout's choices are its Literal types; the tuples are re-exported for callers.
from dtlab.layout import PRECISIONS, ZERO_STAGES, Layout, Precision, ZeroStage  # noqa: F401
from dtlab.layout import RUNTIME_SCHEDULES as SCHEDULES  # what dtlab train runs  # noqa: F401
from dtlab.layout import RuntimeScheduleName
from dtlab.pipeline.schedule import check_interleaved, check_kind
from dtlab.moe.options import check_experts, parse_capacity
from dtlab.rank_limit import local_limit_reason, local_rank_limit, pool_limit_reason


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The small GPT's shape (a decoder-only transformer, GPT-2 layout, untied head)."""

    vocab_size: int = 256
    """Byte-level vocabulary: every byte is a token, so no tokenizer is needed."""
    seq_len: int = 64
    """Context length in tokens (also the size of the learned position table)."""
    n_layer: int = 4
    """Transformer blocks. Pipeline stages split these, so keep it a multiple of PP."""
    n_head: int = 4
    """Attention heads. Tensor parallelism splits heads, so keep it a multiple of TP."""
    d_model: int = 64
    """Hidden size; the MLP is 4x wider."""
    dropout: float = 0.0
    """Off by default so that runs on different layouts are exactly comparable."""
    n_experts: int = 0
    """Mixture of experts: each block's MLP becomes this many expert MLPs behind a router
    (dtlab/moe/). 0 keeps the dense MLP."""
    top_k: int = 1
    """Experts each token is sent to (1: Switch Transformer; 2: GShard, Mixtral)."""
    capacity_factor: float | None = 1.25
    """An expert takes at most ceil(factor x seq_len x top_k / n_experts) tokens per sequence;
    the rest are dropped. None drops nothing."""
    aux_loss_coef: float = 0.01
    """Weight alpha of the load-balancing loss (Switch Transformer's 0.01); 0 turns it off."""

    def param_count(self) -> int:
        """Parameters of :class:`dtlab.model.GPT` with this shape, counted by formula.

        Per block: 2 LayerNorms (4d), QKV (3d^2 + 3d), attention out (d^2 + d),
        MLP up (4d^2 + 4d) and down (4d^2 + d) = 12d^2 + 13d. Plus token and
        position embeddings (V d + T d), a final LayerNorm (2d) and the head (d V).
        With E experts the MLP (8d^2 + 5d) is there E times, plus the router (d E).
        """
        d, v, t, n = self.d_model, self.vocab_size, self.seq_len, self.n_layer
        mlp = 8 * d * d + 5 * d
        if self.n_experts:
            mlp = self.n_experts * mlp + d * self.n_experts
        return n * (4 * d * d + 8 * d + mlp) + v * d + t * d + 2 * d + d * v


MODEL_PRESETS: dict[str, ModelConfig] = {
    # A few thousand parameters: fast enough for any test on two cores.
    "tiny": ModelConfig(vocab_size=256, seq_len=16, n_layer=4, n_head=4, d_model=8),
    # The default: about 0.24M parameters; heads and blocks are multiples of 4.
    "small": ModelConfig(vocab_size=256, seq_len=64, n_layer=4, n_head=4, d_model=64),
    # A few million parameters: memory and communication become visible.
    "medium": ModelConfig(vocab_size=256, seq_len=128, n_layer=8, n_head=8, d_model=192),
}


DpMode = Literal["overlapped", "bucketed", "per_parameter"]
Collectives = Literal["torch", "ring", "dtlab"]
SpikePolicy = Literal["skip", "rollback"]
DP_MODES: tuple[str, ...] = typing.get_args(DpMode)


def parse_straggler(text: str) -> tuple[int, float]:
    """``"1:0.2"`` -> ``(1, 0.2)``: the ``--straggler RANK:SECONDS`` flag's value."""
    try:
        rank, seconds = text.split(":")
        return int(rank), float(seconds)
    except ValueError:
        raise ConfigError(f"--straggler {text!r}: expected RANK:SECONDS, e.g. 1:0.2",
                          f"--straggler {text!r}：应为 RANK:SECONDS，例如 1:0.2") from None


def parse_betas(text: str) -> tuple[float, float]:
    """``"0.9,0.999"`` -> ``(0.9, 0.999)``: the ``--betas BETA1,BETA2`` flag's value."""
    try:
        beta1, beta2 = text.split(",")
        return float(beta1), float(beta2)
    except ValueError:
        raise ConfigError(f"--betas {text!r}: expected BETA1,BETA2, e.g. 0.9,0.95",
                          f"--betas {text!r}：应为 BETA1,BETA2，例如 0.9,0.95") from None


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
    (dtlab's ring of sends and receives, dtlab/collectives.py, the one lesson 01 builds) or 'dtlab'
    (transport and algorithm chosen as NCCL chooses them: ranks all on one machine run the ring at
    every size over shared memory, dtlab/shared_memory.py; across machines, recursive doubling for
    all-reduces of at most 1 MiB, dtlab/recursive_doubling.py, and the ring for the rest). 'ring'
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
    precision: Precision = "fp32"
    """Compute precision: 'fp32', 'bf16' or 'fp16'."""
    loss_scale: str = field(default="dynamic", metadata={"metavar": "dynamic|NUMBER"})
    """fp16 loss scale: 'dynamic' or a fixed number."""
    grad_accum: int = 1
    """Gradient accumulation micro-steps per optimizer step (communicates once per step)."""
    recompute: bool = False
    """Activation (gradient) checkpointing per transformer block."""
    lr: float = 1e-3
    """Peak learning rate (AdamW)."""
    warmup: int = 0
    """Linear warmup steps before cosine decay."""
    lr_schedule: DeepSpeedSchedule | None = field(default=None, metadata={"flag": None})
    """A DeepSpeed scheduler read from a ds_config (dtlab/lr_schedule.py), replacing the warmup and
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
    betas: tuple[float, float] | None = field(default=None, metadata={"parse": parse_betas,
                                                                      "metavar": "BETA1,BETA2"})
    """AdamW's (beta1, beta2), each in [0, 1); unset, dtlab's (0.9, 0.95: dtlab/reference.py)."""
    eps: float | None = None
    """AdamW's epsilon, from 0 to 1; unset, dtlab's (1e-8: dtlab/reference.py)."""
    clip_grad: float | None = field(default=None, metadata={"metavar": "NORM"})
    """Clip the gradient to this global L2 norm, taken over every shard on every rank (what
    torch.nn.utils.clip_grad_norm_ does on one process; DeepSpeed's gradient_clipping). Unset: no clipping."""
    straggler: tuple[int, float] | None = field(
        default=None, metadata={"parse": parse_straggler, "metavar": "RANK:SECONDS"})
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
    (dtlab/moe/); 0 keeps the dense model."""
    top_k: int = field(default=1, metadata={"metavar": "K"})
    """Experts each token is routed to, 1 to E (1: Switch Transformer; 2: GShard, Mixtral)."""
    ep: int = field(default=1, metadata={"metavar": "N"})
    """Expert-parallel degree: E/N experts per rank, tokens sent to them by all-to-all. Like dp it
    multiplies the ranks (dp x ep x tp x pp) and splits the batch (over dp x ep)."""
    capacity_factor: float | None = field(default=1.25, metadata={"parse": parse_capacity,
                                                                   "metavar": "X|none"})
    """An expert takes at most ceil(X x seq_len x top_k / E) tokens of each sequence; the rest are
    dropped ('none': no limit)."""
    aux_loss_coef: float = field(default=0.01, metadata={"metavar": "ALPHA"})
    """Weight of the Switch Transformer load-balancing loss added per MoE layer (0: none)."""

    @classmethod
    def choices(cls, name: str) -> tuple | None:
        """The values a ``Literal``-typed field accepts, e.g. ``('gpipe', '1f1b')``; None for others."""
        hint = field_types(cls)[name]
        return typing.get_args(hint) if typing.get_origin(hint) is Literal else None

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.ep * self.tp * self.pp

    @property
    def data_ranks(self) -> int:
        """Ranks that each read their own slice of the batch: dp x ep (CP ranks share sequences)."""
        return self.dp * self.ep

    @property
    def layout(self) -> Layout:
        """This job's :class:`dtlab.layout.Layout` (what :func:`dtlab.planner.plan` takes): every field
        the two share by name, and the bool ``recompute`` (whole blocks) as ``"full"`` or ``"none"``."""
        shared = {f.name for f in dataclasses.fields(Layout)} & {f.name for f in dataclasses.fields(self)}
        values = {name: getattr(self, name) for name in shared - {"recompute"}}
        return Layout(**values, recompute="full" if self.recompute else "none")

    def model_config(self) -> ModelConfig:
        base = MODEL_PRESETS[self.model]
        base = base if self.seq_len is None else dataclasses.replace(base, seq_len=self.seq_len)
        if not self.experts:
            return base
        return dataclasses.replace(base, n_experts=self.experts, top_k=self.top_k,
                                   capacity_factor=self.capacity_factor, aux_loss_coef=self.aux_loss_coef)

    def validate(self, *, max_world_size: int | None = None,
                 limit_reason: tuple[str, str] | None = None) -> "TrainConfig":
        """Check every field; raise a bilingual ConfigError naming the first bad value.

        ``max_world_size``: the most ranks the job may have (None: the local pool's ``DTLAB_MAX_RANKS``);
        ``limit_reason``: where that number comes from, (English, Chinese), to follow "but" in a refusal.
        """
        limit = max_world_size or local_rank_limit()
        reason = limit_reason or (pool_limit_reason(limit) if max_world_size else local_limit_reason(limit))
        check_numbers(self, max_ranks=limit, limit_reason=reason)   # types, finite, ranges (dtlab/config_limits.py)
        if self.model not in MODEL_PRESETS:
            raise _bad("model", self.model, f"one of {sorted(MODEL_PRESETS)}",
                       f"{sorted(MODEL_PRESETS)} 之一")
        for option in dataclasses.fields(self):
            allowed = self.choices(option.name)
            value = getattr(self, option.name)
            if allowed is not None and value not in allowed:
                shown = [repr(choice) for choice in allowed]
                raise _bad(option.name, value, ", ".join(shown[:-1]) + " or " + shown[-1],
                           "、".join(shown) + " 之一")
        check_experts(self)
        if not (self.lr > 0 and self.lr < 10):
            raise _bad("lr", self.lr, "a number in (0, 10)", "(0, 10) 之间的数")
        if self.betas is not None and not (isinstance(self.betas, tuple) and len(self.betas) == 2
                                           and all(0 <= b < 1 for b in self.betas)):
            raise _bad("betas", self.betas, "two numbers (beta1, beta2), each in [0, 1)",
                       "两个数 (beta1, beta2)，每个都在 [0, 1) 之内")
        if self.world_size > limit:
            axes = ["dp", *(["cp"] if self.cp > 1 else []), *(["ep"] if self.ep > 1 else []), "tp", "pp"]
            product = f"{' x '.join(axes)} = {' x '.join(str(getattr(self, a)) for a in axes)}"
            raise ConfigError(f"{product} = {self.world_size} ranks, but {reason[0]}",
                              f"{product} = {self.world_size} 个 rank，但{reason[1]}")
        per_rank = self.data_ranks * self.grad_accum
        if self.batch_size % per_rank:
            raise ConfigError(
                f"batch_size {self.batch_size} must split evenly over dp x ep x grad_accum = "
                f"{self.dp} x {self.ep} x {self.grad_accum} = {per_rank} (allowed: a multiple of {per_rank})",
                f"batch_size {self.batch_size} 必须能被 dp x ep x grad_accum = {self.dp} x {self.ep} x "
                f"{self.grad_accum} = {per_rank} 整除（允许：{per_rank} 的倍数）",
            )
        if self.straggler is not None:
            self._check_straggler()
        self._check_layout()
        self._check_combinations()
        if self.save is not None:   # before step 0, not at the first save (dtlab/output_paths.py)
            check_save_target(self.save, needed_bytes=checkpoint_bytes(self.model_config().param_count()),
                              resume=self.resume)
        return self

    def _check_straggler(self) -> None:
        """A rank that exists, a delay from 0 to 60 s, and shorter than the collective timeout: the
        straggler's peers wait for it in every step's collectives, and a wait of ``timeout_s`` fails the run."""
        rank, seconds = self.straggler
        if not (0 <= rank < self.world_size) or not (0 <= seconds <= 60):
            raise _bad("straggler", f"{rank}:{seconds}",
                       f"RANK:SECONDS with 0 <= RANK < {self.world_size} and 0 <= SECONDS <= 60",
                       f"RANK:SECONDS，其中 0 <= RANK < {self.world_size}，0 <= SECONDS <= 60")
        if seconds >= self.timeout_s:
            raise ConfigError(
                f"straggler={rank}:{seconds} with timeout_s={self.timeout_s}: rank {rank} sleeps {seconds} s in "
                f"every step and its peers wait for it in a collective that fails after {self.timeout_s} s "
                f"(allowed: SECONDS below --timeout, or a --timeout above {seconds})",
                f"straggler={rank}:{seconds} 与 timeout_s={self.timeout_s} 不能同时使用：rank {rank} 每一步睡眠 "
                f"{seconds} 秒，其他 rank 在集合通信中等待它，而集合通信等待 {self.timeout_s} 秒后就会失败"
                f"（允许：SECONDS 小于 --timeout，或 --timeout 大于 {seconds}）")

    def _check_layout(self) -> None:
        """What the components can split: heads over TP, blocks over PP, the batch over both."""
        cfg = self.model_config()
        if cfg.n_head % self.tp:
            allowed = [d for d in range(1, cfg.n_head + 1) if cfg.n_head % d == 0]
            raise ConfigError(
                f"tp={self.tp} does not divide the {cfg.n_head} attention heads of model "
                f"{self.model!r} (allowed: {allowed})",
                f"tp={self.tp} 不能整除模型 {self.model!r} 的 {cfg.n_head} 个注意力头（允许：{allowed}）")
        if self.pp > cfg.n_layer:
            raise ConfigError(
                f"pp={self.pp} is more stages than the {cfg.n_layer} blocks of model {self.model!r} "
                f"(allowed: 1 to {cfg.n_layer})",
                f"pp={self.pp} 超过了模型 {self.model!r} 的 {cfg.n_layer} 个 block（允许：1 到 {cfg.n_layer}）")
        check_pipeline_schedule(self, cfg.n_layer, self.model)
        self._check_sequence_split(cfg.seq_len)
        per_dp = self.batch_size // self.data_ranks
        pieces = self.micro_batches * self.grad_accum
        if per_dp % pieces:
            raise ConfigError(
                f"micro_batches={self.micro_batches} x grad_accum={self.grad_accum} = {pieces} must divide "
                f"the {per_dp} sequences each data-parallel rank gets (batch_size {self.batch_size} / "
                f"dp x ep {self.data_ranks}); allowed: a product that divides {per_dp}",
                f"micro_batches={self.micro_batches} x grad_accum={self.grad_accum} = {pieces} 必须整除每个"
                f"数据并行 rank 分到的 {per_dp} 条序列（batch_size {self.batch_size} / dp x ep {self.data_ranks}）")

    def _check_sequence_split(self, seq_len: int) -> None:
        """SP and CP cut the sequence: SP needs TP; CP's zigzag needs 2 x cp equal chunks, and SP
        then splits each rank's T/cp tokens over tp."""
        if self.sp and self.tp == 1:
            raise ConfigError("sp=True needs tp > 1: sequence parallelism splits, over the TP ranks, "
                              "what tensor parallelism leaves whole (allowed: --sp with --tp 2 or more)",
                              "sp=True 需要 tp > 1：序列并行是在 TP 的各 rank 之间切分张量并行未切分的部分"
                              "（允许：--sp 与 --tp 2 或更大同时使用）")
        if seq_len % (2 * self.cp) and self.cp > 1:
            raise ConfigError(
                f"cp={self.cp} does not divide the sequence: seq_len {seq_len} must cut into 2 x cp = "
                f"{2 * self.cp} equal chunks (zigzag: each rank holds two); allowed: a seq_len that is "
                f"a multiple of {2 * self.cp}",
                f"cp={self.cp} 无法整除序列：seq_len {seq_len} 必须能切成 2 x cp = {2 * self.cp} 个等长的块"
                f"（zigzag：每个 rank 持有两块）；允许：{2 * self.cp} 的倍数的 seq_len")
        local = seq_len // self.cp
        if self.sp and local % self.tp:
            raise ConfigError(
                f"sp with tp={self.tp}: the {local} tokens each rank holds (seq_len {seq_len} / cp "
                f"{self.cp}) do not split over tp (allowed: a seq_len that is a multiple of "
                f"{self.cp * self.tp * (2 if self.cp > 1 else 1)})",
                f"sp 与 tp={self.tp}：每个 rank 持有的 {local} 个 token（seq_len {seq_len} / cp {self.cp}）"
                f"无法在 tp 上平均切分（允许：{self.cp * self.tp * (2 if self.cp > 1 else 1)} 的倍数的 seq_len）")

    def _check_combinations(self) -> None:
        """Options that exist but do not combine, refused with the reason."""
        if self.loss_scale != "dynamic":   # a valid number by now (dtlab/config_limits.py)
            if self.precision != "fp16":
                raise ConfigError(
                    f"loss_scale={self.loss_scale!r} only applies to fp16 (precision is "
                    f"{self.precision!r}: bf16 and fp32 have fp32's range and need no scaling)",
                    f"loss_scale={self.loss_scale!r} 只用于 fp16（当前精度为 {self.precision!r}："
                    f"bf16 与 fp32 的数值范围和 fp32 相同，不需要损失缩放）")
        if self.spike is not None and not (isinstance(self.spike, int) and 0 <= self.spike < self.steps):
            raise _bad("spike", self.spike, f"a step from 0 to {self.steps - 1}", f"0 到 {self.steps - 1} 之间的步数")
        if self.trace is not None:
            check_output_file("trace", self.trace)
        if self.offload and self.zero == 0:
            raise ConfigError("offload=True needs a ZeRO stage (1, 2 or 3): offloading moves the "
                              "sharded optimizer state to the CPU side",
                              "offload=True 需要配合 ZeRO 阶段（1、2 或 3）：卸载的是分片后的优化器状态")
        default_bucket = TrainConfig.__dataclass_fields__["bucket_mb"].default
        if self.zero in (1, 3) and self.bucket_mb != default_bucket:
            raise ConfigError(
                f"bucket_mb={self.bucket_mb!r} with zero={self.zero}: --bucket-mb sizes the buckets of DP's "
                f"all-reduces and ZeRO-2's reduce-scatters; ZeRO-1 keeps the whole gradient and reduce-scatters "
                f"it once after backward, ZeRO-3 one unit at a time: neither has a bucket (allowed: "
                f"bucket_mb={default_bucket} with zero 1 or 3, any with zero=0, > 0 with zero=2)",
                f"bucket_mb={self.bucket_mb!r} 与 zero={self.zero} 不能同时使用：--bucket-mb 决定数据并行全归约和 "
                f"ZeRO-2 归约散射的桶大小；ZeRO-1 保留整个梯度、在反向传播后归约散射一次，ZeRO-3 逐单元进行，"
                f"二者都没有桶（允许：zero 为 1 或 3 时 bucket_mb={default_bucket}，zero=0 时任意值，zero=2 时大于 0）")
        if self.zero == 2 and not self.bucket_mb > 0:
            raise ConfigError(
                f"bucket_mb={self.bucket_mb!r} with zero=2: ZeRO-2's buckets are windows of the flat "
                f"gradient, reduce-scattered one by one during backward, and need a size (allowed: "
                f"bucket_mb > 0 with zero=2; 0, one bucket per parameter, is DP's, zero=0)",
                f"bucket_mb={self.bucket_mb!r} 与 zero=2 不能同时使用：ZeRO-2 的桶是扁平梯度中的窗口，"
                f"在反向传播中逐个归约散射，需要一个大小（允许：zero=2 时 bucket_mb 大于 0；"
                f"0 即每个参数一个桶，只用于数据并行 zero=0）")
        self._check_unused()
        check_zero3_with_pipeline(self)
        check_zero3_precision(self)

    def _check_unused(self) -> None:
        """An option set away from its default where the rest of the job would ignore it: refused, so that
        a flag never silently does nothing (a default is not a choice, and passes)."""
        if self.zero3_prefetch and self.zero != 3:
            raise ConfigError(
                f"zero3_prefetch={self.zero3_prefetch!r} with zero={self.zero}: only ZeRO-3 gathers parameters "
                f"before use (allowed: zero3_prefetch=0, or --zero 3)",
                f"zero3_prefetch={self.zero3_prefetch!r} 与 zero={self.zero} 不能同时使用：只有 ZeRO-3 在使用前"
                f"收集参数（允许：zero3_prefetch=0，或 --zero 3）")
        default = TrainConfig.__dataclass_fields__["save_every"].default
        if self.save is None and self.save_every != default:
            raise ConfigError(
                f"save_every={self.save_every!r} (--save-every) needs save (--save DIR): it sets how often "
                f"checkpoints are written, and without a save directory none is (allowed: --save-every with "
                f"--save DIR, or save_every={default}, the default)",
                f"save_every={self.save_every!r}（--save-every）需要配合 save（--save DIR）使用：它决定多久写一次"
                f"检查点，而没有保存目录就不写检查点（允许：--save-every 与 --save DIR 同时使用，"
                f"或 save_every={default}，即默认值）")
        default = TrainConfig.__dataclass_fields__["dp_mode"].default
        if self.zero and self.dp_mode != default:
            raise ConfigError(
                f"dp_mode={self.dp_mode!r} (--dp-mode) with zero={self.zero}: ZeRO averages the gradients "
                f"itself (its reduce-scatter), so data parallelism's dp_mode is not used (allowed: "
                f"dp_mode={default!r}, the default, with zero 1-3; any dp_mode with zero=0)",
                f"dp_mode={self.dp_mode!r}（--dp-mode）与 zero={self.zero} 不能同时使用：ZeRO 用自己的归约散射"
                f"平均梯度，不使用数据并行的 dp_mode（允许：zero 为 1-3 时 dp_mode={default!r}，即默认值；"
                f"zero=0 时任意 dp_mode）")


def check_zero3_with_pipeline(layout) -> None:
    """ZeRO-3 with pp > 1 is refused (``layout``: a TrainConfig or a :class:`~dtlab.layout.Layout`;
    ``dtlab plan`` refuses it too)."""
    if layout.zero == 3 and layout.pp > 1:
        raise ConfigError(f"zero=3 with pp={layout.pp}: ZeRO-3 is not combined with pipeline "
                          f"parallelism here (DeepSpeed does not combine them either); allowed: "
                          f"zero 0-2 with pp > 1, or pp=1 with zero 3",
                          f"zero=3 与 pp={layout.pp} 不能同时使用（DeepSpeed 也不支持二者组合）；"
                          f"允许：pp > 1 时 zero 为 0-2，或 zero=3 时 pp=1")


def check_pipeline_schedule(layout, n_layer: int, model: str) -> None:
    """The schedule and its virtual stages (``layout``: a TrainConfig or a :class:`~dtlab.layout.Layout`):
    ``virtual_stages`` only with 'interleaved', which needs v >= 2, pp >= 2, micro_batches a multiple of
    pp (the paper's schedule) and at least one block in each of the pp x v chunks (:func:`stage_layers`
    spreads them as evenly as it can). ``dtlab plan`` refuses the same."""
    check_kind(layout.schedule, layout.virtual_stages)
    if layout.schedule != "interleaved":
        return
    check_interleaved(layout.pp, layout.micro_batches, layout.virtual_stages)
    chunks = layout.pp * layout.virtual_stages
    if chunks > n_layer:
        raise ConfigError(
            f"pp x virtual_stages = {layout.pp} x {layout.virtual_stages} = {chunks} model chunks, more than "
            f"the {n_layer} blocks of model {model!r} (allowed: pp x virtual_stages <= {n_layer})",
            f"pp x virtual_stages = {layout.pp} x {layout.virtual_stages} = {chunks} 个模型块，超过了模型 "
            f"{model!r} 的 {n_layer} 个 block（允许：pp x virtual_stages <= {n_layer}）")


def check_zero3_precision(layout) -> None:
    """dtlab's ZeRO-3 computes in bf16 or fp32, not fp16 (``dtlab plan`` flags it in a note: other
    trainers run it)."""
    if layout.zero == 3 and layout.precision == "fp16":
        raise ConfigError("zero=3 with precision='fp16': ZeRO-3 computes in bf16 or fp32 here "
                          "(allowed: 'fp32' or 'bf16')",
                          "zero=3 与 precision='fp16' 不能同时使用：这里的 ZeRO-3 只支持 bf16 或 fp32 计算")


def _bad(name: str, value, allowed_en: str, allowed_zh: str) -> ConfigError:
    return ConfigError(f"{name}={value!r} is not allowed; expected {allowed_en}",
                       f"{name}={value!r} 不合法；应为{allowed_zh}")


@functools.cache
def field_types(cls: type) -> dict:
    """A config class's field annotations as types (this module postpones them: they are strings)."""
    return typing.get_type_hints(cls)
