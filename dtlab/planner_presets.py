"""What the planner plans for: accelerators and transformer architectures.

An :class:`Architecture` is a decoder-only transformer described by numbers,
and it can count its own parameters tensor by tensor. The count is split into
what tensor parallelism divides across ranks and what every rank keeps whole,
because that split is exactly what the planner needs for memory per rank.

Two layouts cover the presets:

* GPT-2 / GPT-3 (and dtlab's own small GPT): learned position embeddings,
  LayerNorm with weight and bias, a 4h GELU MLP, biases on every Linear.
* Llama 3: rotary positions (no parameters), RMSNorm (weight only), grouped-
  query attention (fewer K/V heads than Q heads), a SwiGLU MLP with three
  matrices, no biases at all.
"""
from __future__ import annotations

from dataclasses import dataclass

from dtlab.config import MODEL_PRESETS as DTLAB_MODELS
from dtlab.config import ModelConfig
from dtlab.i18n import ConfigError


@dataclass(frozen=True, kw_only=True)
class GPU:
    """An accelerator, by its datasheet numbers (dense, no sparsity)."""

    name: str
    memory_bytes: int
    """HBM capacity."""
    peak_flops: dict[str, float]
    """Peak FLOP/s per training precision. fp32 is plain FP32 (PyTorch does not
    use TF32 for matmuls unless asked), bf16/fp16 are the tensor-core figures."""
    intra_node_link: str = "nvlink"
    """Link between GPUs of one node (a name in ``dtlab.interconnect.LINKS``)."""
    inter_node_link: str = "infiniband"
    """Link between nodes, one NIC per GPU."""
    gpus_per_node: int = 8


GPUS: dict[str, GPU] = {
    # NVIDIA A100 SXM 80GB datasheet: 312 TFLOP/s BF16/FP16 dense, 19.5 FP32.
    "A100": GPU(name="A100", memory_bytes=80 * 10**9,
                peak_flops={"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
    # NVIDIA H100 SXM datasheet: 989 TFLOP/s BF16/FP16 dense, 67 FP32.
    "H100": GPU(name="H100", memory_bytes=80 * 10**9,
                peak_flops={"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    # H200: the H100's compute with 141 GB of HBM3e.
    "H200": GPU(name="H200", memory_bytes=141 * 10**9,
                peak_flops={"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
}


def get_gpu(name: str) -> GPU:
    if name not in GPUS:
        raise ConfigError(
            f"unknown GPU {name!r}; known GPUs: {', '.join(GPUS)}",
            f"未知的 GPU {name!r}；可选的 GPU 有：{', '.join(GPUS)}",
        )
    return GPUS[name]


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """A decoder-only transformer, by numbers."""

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    """Context length (also the size of the position table when it is learned)."""
    kv_heads: int | None = None
    """Key/value heads for grouped-query attention; None means = heads (MHA)."""
    ffn_hidden: int | None = None
    """MLP inner width; None means 4 * hidden."""
    mlp: str = "gelu"
    """``"gelu"``: up, down (2 matrices). ``"swiglu"``: gate, up, down (3)."""
    norm: str = "layernorm"
    """``"layernorm"`` has weight and bias (2h), ``"rmsnorm"`` only a weight (h)."""
    bias: bool = True
    """Biases on the Linear layers of each block (never on the LM head)."""
    learned_positions: bool = True
    """A learned position table (seq_len x h); False for rotary embeddings."""
    tied_embeddings: bool = False
    """The LM head reuses the token embedding (GPT-2/3) instead of its own matrix."""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return (self.kv_heads or self.heads) * self.head_dim

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    def norm_params(self) -> int:
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    def layer_matmul_params(self) -> int:
        """Weights of the block's matrix multiplies (each costs 2 FLOPs per token)."""
        h, f = self.hidden, self.ffn
        attention = h * h + 2 * h * self.kv_dim + h * h  # Q, K, V, output projection
        mlp = (3 if self.mlp == "swiglu" else 2) * h * f
        return attention + mlp

    def layer_params(self) -> tuple[int, int]:
        """One block's parameters as ``(split, replicated)`` under tensor parallelism.

        Megatron-LM (Shoeybi et al. 2019, Sec. 3, Fig. 3): Q/K/V and the MLP's
        first matrices are column-parallel, so their weights *and biases* are
        split; the attention output and MLP down projections are row-parallel,
        so their weights are split but their biases (added after the
        all-reduce) are kept whole, as are the norms. ``split`` is the total
        over all TP ranks; each rank holds ``split / tp`` of it.
        """
        h, f = self.hidden, self.ffn
        split = self.layer_matmul_params()
        replicated = 2 * self.norm_params()  # one norm before attention, one before the MLP
        if self.bias:
            up_biases = (2 if self.mlp == "swiglu" else 1) * f
            split += h + 2 * self.kv_dim + up_biases  # column-parallel biases
            replicated += h + h  # row-parallel biases: attention out, MLP down
        return split, replicated

    def embedding_params(self) -> int:
        """Token table (V x h) plus, if learned, the position table (s x h)."""
        positions = self.seq_len * self.hidden if self.learned_positions else 0
        return self.vocab * self.hidden + positions

    def head_params(self) -> int:
        """The final norm and the LM head (h x V, no bias); 0 for a tied head."""
        head = 0 if self.tied_embeddings else self.hidden * self.vocab
        return self.norm_params() + head

    def param_count(self) -> int:
        """Every parameter, each counted once."""
        split, replicated = self.layer_params()
        return self.layers * (split + replicated) + self.embedding_params() + self.head_params()


def from_model_config(config: ModelConfig, *, name: str = "custom") -> Architecture:
    """dtlab's small GPT as an Architecture (GPT-2 layout, untied head)."""
    return Architecture(name=name, layers=config.n_layer, hidden=config.d_model,
                        heads=config.n_head, vocab=config.vocab_size, seq_len=config.seq_len)


def _llama3(name: str, *, layers: int, hidden: int, heads: int, ffn_hidden: int) -> Architecture:
    # Llama 3 (Grattafiori et al. 2024, "The Llama 3 Herd of Models", Table 3 for
    # the shapes): 8 KV heads; the released models' vocabulary is 128,256 tokens
    # and their pre-training context 8,192 tokens.
    return Architecture(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=8,
                        ffn_hidden=ffn_hidden, vocab=128_256, seq_len=8192, mlp="swiglu",
                        norm="rmsnorm", bias=False, learned_positions=False)


ARCHITECTURES: dict[str, Architecture] = {
    **{name: from_model_config(cfg, name=name) for name, cfg in DTLAB_MODELS.items()},
    # GPT-3 175B (Brown et al. 2020, Table 2.1): 96 layers, d_model 12288,
    # 96 heads, context 2048; GPT-2's tokenizer (50,257) and tied embeddings.
    "gpt3-175b": Architecture(name="gpt3-175b", layers=96, hidden=12288, heads=96,
                              vocab=50257, seq_len=2048, tied_embeddings=True),
    "llama3-8b": _llama3("llama3-8b", layers=32, hidden=4096, heads=32, ffn_hidden=14336),
    "llama3-70b": _llama3("llama3-70b", layers=80, hidden=8192, heads=64, ffn_hidden=28672),
    "llama3-405b": _llama3("llama3-405b", layers=126, hidden=16384, heads=128, ffn_hidden=53248),
}


def get_architecture(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise ConfigError(
            f"unknown model {name!r}; known models: {', '.join(ARCHITECTURES)}",
            f"未知的模型 {name!r}；可选的模型有：{', '.join(ARCHITECTURES)}",
        )
    return ARCHITECTURES[name]
