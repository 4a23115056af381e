"""The small GPT's shape as data, and the presets a run picks by name (``--model``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Attention = Literal["eager", "sdpa"]
"""How an attention layer computes softmax(q k^T / sqrt(hs)) v: 'eager' writes the (B, nh, T, T) scores out
(dtlab.model.causal_attention), 'sdpa' calls PyTorch's fused kernel (dtlab.model.fused_attention)."""


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
    (dtlab/parallel/moe/). 0 keeps the dense MLP."""
    top_k: int = 1
    """Experts each token is sent to (1: Switch Transformer; 2: GShard, Mixtral)."""
    capacity_factor: float | None = 1.25
    """An expert takes at most ceil(factor x seq_len x top_k / n_experts) tokens per sequence;
    the rest are dropped. None drops nothing."""
    aux_loss_coef: float = 0.01
    """Weight alpha of the load-balancing loss (Switch Transformer's 0.01); 0 turns it off."""
    attention: Attention = "eager"
    """The attention kernel (:data:`Attention`): the same numbers either way, not the same memory or
    speed. Not a shape: a checkpoint saved with one resumes with the other."""

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
