"""Configuration as data: frozen, keyword-only dataclasses, validated once.

``TrainConfig.validate()`` runs in the caller's process before any rank starts,
so a bad value is reported in English and Chinese, naming the value and what
would be accepted, instead of as a traceback from four processes.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from dtlab.i18n import ConfigError


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

    def param_count(self) -> int:
        """Parameters of :class:`dtlab.model.GPT` with this shape, counted by formula.

        Per block: 2 LayerNorms (4d), QKV (3d^2 + 3d), attention out (d^2 + d),
        MLP up (4d^2 + 4d) and down (4d^2 + d) = 12d^2 + 13d. Plus token and
        position embeddings (V d + T d), a final LayerNorm (2d) and the head (d V).
        """
        d, v, t, n = self.d_model, self.vocab_size, self.seq_len, self.n_layer
        return n * (12 * d * d + 13 * d) + v * d + t * d + 2 * d + d * v


MODEL_PRESETS: dict[str, ModelConfig] = {
    # A few thousand parameters: fast enough for any test on two cores.
    "tiny": ModelConfig(vocab_size=256, seq_len=16, n_layer=4, n_head=4, d_model=8),
    # The default: about 0.24M parameters; heads and blocks are multiples of 4.
    "small": ModelConfig(vocab_size=256, seq_len=64, n_layer=4, n_head=4, d_model=64),
    # A few million parameters: memory and communication become visible.
    "medium": ModelConfig(vocab_size=256, seq_len=128, n_layer=8, n_head=8, d_model=192),
}


DP_MODES = ("overlapped", "bucketed", "per_parameter")
SCHEDULES = ("gpipe", "1f1b")
PRECISIONS = ("fp32", "bf16", "fp16")
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training job of the small GPT: layout, optimisation and fault injection.

    ``batch_size`` is the *global* batch in sequences per optimizer step: it is
    split across data-parallel ranks and then across accumulation micro-steps,
    so the same batch size gives the same result on any layout.
    """

    dp: int = 1
    """Data-parallel degree: replicas of the model, each on its slice of the batch."""
    dp_mode: str = "overlapped"
    """How DP averages gradients (dtlab/data_parallel.py): 'overlapped' (bucketed all-reduces
    started during backward, as DDP does), 'bucketed' (one all-reduce per bucket after
    backward) or 'per_parameter' (one all-reduce per parameter after backward)."""
    tp: int = 1
    """Tensor-parallel degree. 1 means disabled."""
    pp: int = 1
    """Pipeline-parallel degree (stages). 1 means disabled."""
    micro_batches: int = 1
    """Pipeline micro-batches per step (GPipe's m)."""
    schedule: str = "1f1b"
    """Pipeline schedule: 'gpipe' or '1f1b'."""
    zero: int = 0
    """ZeRO stage: 0 (plain DP), 1 (optimizer state), 2 (+gradients), 3 (+parameters)."""
    offload: bool = False
    """Keep optimizer state, and run the optimizer step, on the CPU side."""
    precision: str = "fp32"
    """Compute precision: 'fp32', 'bf16' or 'fp16'."""
    loss_scale: str = "dynamic"
    """fp16 loss scale: 'dynamic' or a fixed number."""
    grad_accum: int = 1
    """Accumulation micro-steps per optimizer step (communicates once per step)."""
    recompute: bool = False
    """Activation (gradient) checkpointing per transformer block."""
    lr: float = 1e-3
    """Peak learning rate (AdamW)."""
    warmup: int = 0
    """Linear warmup steps before cosine decay."""
    steps: int = 20
    """Optimizer steps to run."""
    seed: int = 0
    """Seeds the weights and the data order; the same seed gives the same run."""
    seq_len: int | None = None
    """Tokens per sequence; None uses the model preset's."""
    model: str = "small"
    """Model preset: one of MODEL_PRESETS."""
    batch_size: int = 8
    """Sequences per optimizer step in total (global batch)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    straggler: tuple[int, float] | None = None
    """(rank, seconds): that rank sleeps this long in every step's compute."""
    spike: int | None = None
    """Feed one corrupted batch at this step."""
    save: str | None = None
    """Directory to write training checkpoints to."""
    resume: str | None = None
    """Directory to resume from."""
    timeout_s: float = 60.0
    """How long any collective may wait for its peers before the run fails."""

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def model_config(self) -> ModelConfig:
        base = MODEL_PRESETS[self.model]
        return base if self.seq_len is None else dataclasses.replace(base, seq_len=self.seq_len)

    def validate(self, *, max_world_size: int | None = None) -> "TrainConfig":
        """Check every field; raise a bilingual ConfigError naming the first bad value."""
        for name in ("dp", "tp", "pp", "micro_batches", "grad_accum", "steps", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise _bad(name, value, "a positive integer (1, 2, 3, ...)", "正整数（1、2、3……）")
        if self.model not in MODEL_PRESETS:
            raise _bad("model", self.model, f"one of {sorted(MODEL_PRESETS)}",
                       f"{sorted(MODEL_PRESETS)} 之一")
        if self.seq_len is not None and (not isinstance(self.seq_len, int) or self.seq_len < 2
                                         or self.seq_len > 1024):
            raise _bad("seq_len", self.seq_len, "an integer from 2 to 1024", "2 到 1024 之间的整数")
        if self.dp_mode not in DP_MODES:
            raise _bad("dp_mode", self.dp_mode, f"one of {DP_MODES}", f"{DP_MODES} 之一")
        if self.schedule not in SCHEDULES:
            raise _bad("schedule", self.schedule, f"one of {SCHEDULES}", f"{SCHEDULES} 之一")
        if self.precision not in PRECISIONS:
            raise _bad("precision", self.precision, f"one of {PRECISIONS}", f"{PRECISIONS} 之一")
        if self.zero not in ZERO_STAGES:
            raise _bad("zero", self.zero, "0, 1, 2 or 3", "0、1、2 或 3")
        if not (self.lr > 0 and self.lr < 10):
            raise _bad("lr", self.lr, "a number in (0, 10)", "(0, 10) 之间的数")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise _bad("warmup", self.warmup, "an integer >= 0", ">= 0 的整数")
        if not self.timeout_s > 0:
            raise _bad("timeout_s", self.timeout_s, "a number of seconds > 0", "大于 0 的秒数")
        limit = max_world_size or int(os.environ.get("DTLAB_MAX_RANKS", "8"))
        if self.world_size > limit:
            raise ConfigError(
                f"dp x tp x pp = {self.dp} x {self.tp} x {self.pp} = {self.world_size} ranks, "
                f"but the local pool allows at most {limit}",
                f"dp x tp x pp = {self.dp} x {self.tp} x {self.pp} = {self.world_size} 个 rank，"
                f"但本地进程池最多允许 {limit} 个",
            )
        per_rank = self.dp * self.grad_accum
        if self.batch_size % per_rank:
            raise ConfigError(
                f"batch_size {self.batch_size} must split evenly over dp x grad_accum = "
                f"{self.dp} x {self.grad_accum} = {per_rank} (allowed: a multiple of {per_rank})",
                f"batch_size {self.batch_size} 必须能被 dp x grad_accum = {self.dp} x "
                f"{self.grad_accum} = {per_rank} 整除（允许：{per_rank} 的倍数）",
            )
        if self.straggler is not None:
            rank, seconds = self.straggler
            if not (0 <= rank < self.world_size) or not (0 <= seconds <= 60):
                raise _bad("straggler", f"{rank}:{seconds}",
                           f"RANK:SECONDS with 0 <= RANK < {self.world_size} and 0 <= SECONDS <= 60",
                           f"RANK:SECONDS，其中 0 <= RANK < {self.world_size}，0 <= SECONDS <= 60")
        self._reject_unbuilt()
        return self

    def _reject_unbuilt(self) -> None:
        """Options whose component is not in this version: refuse, never ignore silently."""
        unbuilt = [
            ("tp", self.tp != 1, "1", "tensor parallelism", "张量并行"),
            ("pp", self.pp != 1, "1", "pipeline parallelism", "流水线并行"),
            ("micro_batches", self.micro_batches != 1, "1", "pipeline micro-batches", "流水线微批次"),
            ("zero", self.zero != 0, "0", "ZeRO", "ZeRO"),
            ("offload", self.offload, "False", "offloading", "卸载（offload）"),
            ("precision", self.precision != "fp32", "'fp32'", "mixed precision", "混合精度"),
            ("loss_scale", self.loss_scale != "dynamic", "'dynamic'", "loss scaling", "损失缩放"),
            ("recompute", self.recompute, "False", "activation checkpointing", "激活重计算"),
            ("spike", self.spike is not None, "None", "loss-spike injection", "损失尖峰注入"),
            ("save", self.save is not None, "None", "training checkpoints", "训练检查点"),
            ("resume", self.resume is not None, "None", "training checkpoints", "训练检查点"),
        ]
        for name, requested, allowed, what_en, what_zh in unbuilt:
            if requested:
                value = getattr(self, name)
                raise ConfigError(
                    f"{name}={value!r}: {what_en} is not available in this version of dtlab yet "
                    f"(allowed: {allowed})",
                    f"{name}={value!r}：此版本的 dtlab 还没有{what_zh}（允许的值：{allowed}）",
                )


def _bad(name: str, value, allowed_en: str, allowed_zh: str) -> ConfigError:
    return ConfigError(f"{name}={value!r} is not allowed; expected {allowed_en}",
                       f"{name}={value!r} 不合法；应为{allowed_zh}")
