"""A small GPT (decoder-only transformer, GPT-2 layout) and the single-process reference.

Small enough to train on a laptop's CPU in seconds, large enough to have every
part the parallelisms split: embeddings, attention heads, an MLP, a stack of
blocks and an output head. Dropout is off by default so runs on different
layouts are exactly comparable.

Shapes use B = batch, T = sequence length, C = d_model, nh = heads, hs = C / nh.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from dtlab.config import ModelConfig
from dtlab.measure.memory import note_moment, tensor_bytes
from dtlab.parallel.moe.layer import MoE


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: nn.Module | None = None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs)) v, each position attending to itself and earlier ones.

    q, k, v: (B, nh, T, hs) -> (B, nh, T, hs). ``dropout`` acts on the attention weights.
    The eager kernel (``--attention eager``): every step written out, and the (B, nh, T, T)
    weights kept for backward.
    """
    T, hs = q.shape[-2], q.shape[-1]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)  # (B, nh, T, T)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return (att if dropout is None else dropout(att)) @ v  # (B, nh, T, hs)


def fused_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: nn.Module | None = None
) -> torch.Tensor:
    """:func:`causal_attention`'s numbers from PyTorch's fused kernel (``--attention sdpa``).

    ``F.scaled_dot_product_attention`` picks FlashAttention (Dao et al. 2022) or the
    memory-efficient kernel on CUDA, which compute the softmax block by block and never
    write the (B, nh, T, T) scores to memory (backward recomputes them); on the CPU, a
    fused kernel or the math path. q, k, v: (B, nh, T, hs) -> (B, nh, T, hs).
    """
    p = dropout.p if dropout is not None and dropout.training else 0.0
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)  # (B, nh, T, hs)


ATTENTION_KERNELS = {"eager": causal_attention, "sdpa": fused_attention}
"""``ModelConfig.attention`` (``--attention``) -> the function an attention layer calls."""


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.attention = cfg.attention
        """The kernel (a key of :data:`ATTENTION_KERNELS`); tensor parallelism keeps it."""
        self.core: nn.Module | None = None
        """The attention itself, when not this rank's kernel over its own q, k, v: context parallelism
        (dtlab.parallel.context_parallel) puts ring attention here, q/k/v -> y of the same shapes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        y = attend(self, q, k, v)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.proj(y)


def attend(layer: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """An attention layer's (dense or tensor-parallel) attention of its heads: its ``core`` where it has
    one, else its kernel. q, k, v: (B, nh, T, hs) -> (B, nh, T, hs)."""
    if layer.core is not None:
        return layer.core(q, k, v)
    return ATTENTION_KERNELS[layer.attention](q, k, v, layer.dropout)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)  # C -> 4C
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)  # 4C -> C
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x)).

    With ``n_experts`` the MLP is a mixture of experts (:class:`dtlab.parallel.moe.MoE`), still called ``mlp``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = (
            MLP(cfg)
            if not cfg.n_experts
            else MoE(
                cfg.d_model,
                [MLP(cfg) for _ in range(cfg.n_experts)],
                top_k=cfg.top_k,
                capacity_factor=cfg.capacity_factor,
                aux_loss_coef=cfg.aux_loss_coef,
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)
        # GPT-2: scale the residual projections by 1/sqrt(2 * n_layer) so the
        # residual stream's variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits
        return next_token_loss(logits, targets)


def build_model(cfg: ModelConfig, *, seed: int) -> GPT:
    """The same initial weights for the same seed, on every rank and in every process."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = GPT(cfg)
    torch.random.set_rng_state(generator_state)
    return model


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (B, T, V) logits against (B, T) targets.

    The logits are not saved for backward (the softmax keeps its own output),
    but they are alive beside everything saved when the loss is computed: a
    moment of the memory accountant's ``peak`` (:func:`dtlab.measure.memory.note_moment`).
    """
    B, T, V = logits.shape
    loss = F.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T))
    note_moment("logits", tensor_bytes(logits))
    return loss
