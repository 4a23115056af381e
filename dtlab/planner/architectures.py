"""What the planner plans for: model architectures, and where their parameters live.

An :class:`Architecture` is a decoder-only transformer described by numbers,
and it can count its own parameters tensor by tensor. The count is split into
what tensor parallelism divides across ranks and what every rank keeps whole;
:func:`params_per_rank` adds which pipeline stage holds what (the blocks per
stage are :func:`dtlab.parallel.pipeline.schedule.stage_layers`, the runtime's own
split). That is exactly what the planner needs for memory per rank.

Two layouts cover the presets:

* GPT-2 / GPT-3 (and dtlab's own small GPT): learned position embeddings,
  LayerNorm with weight and bias, a 4h GELU MLP, biases on every Linear.
* Llama 3: rotary positions (no parameters), RMSNorm (weight only), grouped-
  query attention (fewer K/V heads than Q heads), a SwiGLU MLP with three
  matrices, no biases at all.

Either may be a mixture of experts (``experts`` > 0, dtlab/parallel/moe/): each
block's MLP becomes E experts behind a router (h x E), of which a token uses
``top_k``. The experts are not split by TP (dtlab keeps a mixture of experts
whole on every TP rank) but spread by expert parallelism, E/ep per rank.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dtlab.config import MODEL_PRESETS as DTLAB_MODELS
from dtlab.config import ModelConfig
from dtlab.config.layout import check_positive_int
from dtlab.i18n import ConfigError
from dtlab.parallel.pipeline.schedule import stage_layers
from dtlab.planner.presets import preset


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
    vocab_parallel: bool = False
    """Under TP, split the token table and the LM head by vocabulary, ceil(V/t) rows per rank, as
    Megatron-LM does (Shoeybi et al. 2019, Sec. 3); False keeps them whole on every TP rank, as
    dtlab's own TP runtime (dtlab/parallel/tensor_parallel.py) does."""
    experts: int = 0
    """Experts per block's MLP (a mixture of experts, behind a router); 0: a dense MLP."""
    top_k: int = 1
    """Experts each token goes through, with ``experts``."""

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
        """Weights of the block's matrix multiplies a token goes through (each costs 2 FLOPs per
        token): with experts, k MLPs and the router, not all E (the *active* weights)."""
        h, f = self.hidden, self.ffn
        attention = h * h + 2 * h * self.kv_dim + h * h  # Q, K, V, output projection
        mlp = (3 if self.mlp == "swiglu" else 2) * h * f
        return attention + (mlp if not self.experts else self.top_k * mlp + h * self.experts)

    def mlp_params(self) -> int:
        """One MLP (or one expert): its matrices and, with ``bias``, their biases."""
        h, f = self.hidden, self.ffn
        matrices = (3 if self.mlp == "swiglu" else 2) * h * f
        return matrices + ((2 if self.mlp == "swiglu" else 1) * f + h if self.bias else 0)

    def expert_layer_params(self) -> int:
        """A block's experts, E x one MLP (0 when dense): whole on every TP rank, E/ep per EP rank."""
        return self.experts * self.mlp_params()

    def layer_params(self) -> tuple[int, int]:
        """One block's parameters as ``(split, replicated)`` under tensor parallelism.

        Megatron-LM (Shoeybi et al. 2019, Sec. 3, Fig. 3): Q/K/V and the MLP's
        first matrices are column-parallel, so their weights *and biases* are
        split; the attention output and MLP down projections are row-parallel,
        so their weights are split but their biases (added after the
        all-reduce) are kept whole, as are the norms. ``split`` is the total
        over all TP ranks; each rank holds ``split / tp`` of it. With experts,
        the MLP's part is in neither (:meth:`expert_layer_params`) and the
        router (h x E) is replicated.
        """
        h, f = self.hidden, self.ffn
        split = h * h + 2 * h * self.kv_dim + h * h  # Q, K, V, output projection
        replicated = 2 * self.norm_params()  # one norm before attention, one before the MLP
        if self.bias:
            split += h + 2 * self.kv_dim  # column-parallel biases of Q, K, V
            replicated += h  # row-parallel bias: attention out
        if self.experts:
            return split, replicated + h * self.experts
        split += (3 if self.mlp == "swiglu" else 2) * h * f
        if self.bias:
            split += (2 if self.mlp == "swiglu" else 1) * f  # column-parallel MLP biases
            replicated += h  # row-parallel bias: MLP down
        return split, replicated

    def embedding_params(self) -> int:
        """Token table (V x h) plus, if learned, the position table (s x h)."""
        positions = self.seq_len * self.hidden if self.learned_positions else 0
        return self.vocab * self.hidden + positions

    def head_params(self) -> int:
        """The final norm and the LM head (h x V, no bias); 0 for a tied head."""
        head = 0 if self.tied_embeddings else self.hidden * self.vocab
        return self.norm_params() + head

    def vocab_rows(self, tp: int = 1) -> int:
        """Rows of the token table (and of an untied head) one TP rank holds: ceil(V/t) when
        ``vocab_parallel`` (Megatron pads V so that t divides it), else all V."""
        return -(-self.vocab // tp) if self.vocab_parallel else self.vocab

    def param_count(self) -> int:
        """Every parameter, each counted once (every expert included)."""
        split, replicated = self.layer_params()
        return (
            self.layers * (split + replicated + self.expert_layer_params())
            + self.embedding_params()
            + self.head_params()
        )

    def active_param_count(self) -> int:
        """The parameters one token uses: all but the E - k experts of each block it skips."""
        idle = max(0, self.experts - self.top_k) * self.mlp_params()
        return self.param_count() - self.layers * idle


def from_model_config(config: ModelConfig, *, name: str = "custom") -> Architecture:
    """dtlab's small GPT as an Architecture (GPT-2 layout, untied head), its experts included."""
    return Architecture(
        name=name,
        layers=config.n_layer,
        hidden=config.d_model,
        heads=config.n_head,
        vocab=config.vocab_size,
        seq_len=config.seq_len,
        experts=config.n_experts,
        top_k=config.top_k if config.n_experts else 1,
    )


def _llama3(name: str, *, layers: int, hidden: int, heads: int, ffn_hidden: int) -> Architecture:
    # Llama 3 (Grattafiori et al. 2024, "The Llama 3 Herd of Models", Table 3 for
    # the shapes): 8 KV heads; the released models' vocabulary is 128,256 tokens
    # and their pre-training context 8,192 tokens.
    return Architecture(
        name=name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=8,
        ffn_hidden=ffn_hidden,
        vocab=128_256,
        seq_len=8192,
        mlp="swiglu",
        norm="rmsnorm",
        bias=False,
        learned_positions=False,
        vocab_parallel=True,
    )


ARCHITECTURES: dict[str, Architecture] = {
    **{name: from_model_config(cfg, name=name) for name, cfg in DTLAB_MODELS.items()},
    # GPT-3 175B (Brown et al. 2020, Table 2.1): 96 layers, d_model 12288,
    # 96 heads, context 2048; GPT-2's tokenizer (50,257) and tied embeddings.
    # The published models are planned as Megatron-LM trains them: vocabulary-
    # parallel under TP; dtlab's own (above) as dtlab's TP runs them, whole.
    "gpt3-175b": Architecture(
        name="gpt3-175b",
        layers=96,
        hidden=12288,
        heads=96,
        vocab=50257,
        seq_len=2048,
        tied_embeddings=True,
        vocab_parallel=True,
    ),
    "llama3-8b": _llama3("llama3-8b", layers=32, hidden=4096, heads=32, ffn_hidden=14336),
    "llama3-70b": _llama3("llama3-70b", layers=80, hidden=8192, heads=64, ffn_hidden=28672),
    "llama3-405b": _llama3("llama3-405b", layers=126, hidden=16384, heads=128, ffn_hidden=53248),
}


def get_architecture(name: str) -> Architecture:
    return preset(ARCHITECTURES, name, what="model", what_zh="模型")


# --- model parallelism: who holds which parameters ----------------------------


@dataclass(frozen=True)
class RankParams:
    """Parameters one (pipeline stage, TP rank) holds, by how TP treats them."""

    split: int
    """This rank's 1/t share of the tensors TP splits (every TP rank holds as many)."""
    replicated: int
    """Tensors every TP rank keeps whole: norms, row-parallel biases, embeddings, head, routers."""
    experts: int = 0
    """This rank's experts (E/ep per block, whole on every TP rank); 0 for a dense model."""

    @property
    def total(self) -> int:
        return self.split + self.replicated + self.experts


def params_per_rank(
    model: str | Architecture | ModelConfig,
    *,
    tp: int = 1,
    pp: int = 1,
    stage: int = 0,
    ep: int = 1,
    virtual_stages: int = 1,
) -> RankParams:
    """Parameters held by every TP rank of pipeline stage ``stage``.

    Stage 0 also holds the embeddings, the last stage the final norm and LM
    head; with tied embeddings and pp > 1 the last stage keeps its own copy of
    the token table (Narayanan et al. 2021 do the same and all-reduce the two
    copies' gradients). Inside a block, TP splits the matrices and column-
    parallel biases (Shoeybi et al. 2019, Sec. 3). With ``vocab_parallel``
    (the published presets) it also splits the token table and an untied head
    (or the last stage's copy of a tied one) by vocabulary, ceil(V/t) rows per
    rank, as Megatron-LM does; the position table and norms stay whole.
    Without it (dtlab's own models, as dtlab's TP runtime runs them) the
    embeddings and head are whole on every TP rank. With experts, each EP
    rank keeps E/ep of every block's experts. With ``virtual_stages`` v (interleaved), pipeline rank
    ``stage`` holds the blocks of its v chunks of the model cut into pp x v (virtual stages stage,
    stage + pp, ...); the embeddings and the head stay on the first and last rank.
    """
    arch = as_architecture(model)
    check_model_parallel(arch, tp=tp, pp=pp)
    if not 0 <= stage < pp:
        raise ConfigError(
            f"stage must be in 0..{pp - 1}, got {stage!r}", f"stage 必须在 0..{pp - 1} 之间，收到的是 {stage!r}"
        )
    split, replicated = arch.layer_params()
    blocks = sum(len(chunk) for chunk in stage_layers(arch.layers, pp * virtual_stages)[stage::pp])
    # Token tables here: stage 0's, and the last stage's head (a copy of a tied table when pp > 1).
    tables = (stage == 0) + (stage == pp - 1 and (not arch.tied_embeddings or pp > 1))
    table_params = tables * arch.vocab_rows(tp) * arch.hidden
    outer = (arch.seq_len * arch.hidden if arch.learned_positions and stage == 0 else 0) + (
        arch.norm_params() if stage == pp - 1 else 0
    )
    by_vocab = table_params if arch.vocab_parallel else 0
    return RankParams(
        split=blocks * split // tp + by_vocab,
        replicated=blocks * replicated + outer + table_params - by_vocab,
        experts=blocks * arch.expert_layer_params() // ep,
    )


# --- checks ----------------------------------------------------------------------


def check_model_parallel(arch: Architecture, *, tp: int, pp: int) -> None:
    check_positive_int("tp", tp)
    check_positive_int("pp", pp)
    sizes = (("heads", arch.heads), ("kv_heads", arch.kv_heads or arch.heads), ("ffn_hidden", arch.ffn))
    for what, size in sizes:
        if size % tp:
            allowed = [d for d in range(1, arch.heads + 1) if all(n % d == 0 for _, n in sizes)]
            raise ConfigError(
                f"tp = {tp} must divide {what} = {size} of model {arch.name!r} (allowed: {allowed})",
                f"tp = {tp} 必须整除模型 {arch.name!r} 的 {what} = {size}（允许：{allowed}）",
            )
    if pp > arch.layers:
        raise ConfigError(
            f"pp = {pp} must not exceed layers = {arch.layers} of model {arch.name!r} (allowed: 1 to {arch.layers})",
            f"pp = {pp} 不能超过模型 {arch.name!r} 的层数 layers = {arch.layers}（允许：1 到 {arch.layers}）",
        )


def as_architecture(model: str | Architecture | ModelConfig, *, seq_len: int | None = None) -> Architecture:
    """A preset name, an Architecture or a ModelConfig as an Architecture, with its
    context length replaced by ``seq_len`` if given."""
    if isinstance(model, Architecture):
        arch = model
    elif isinstance(model, ModelConfig):
        arch = from_model_config(model)
    else:
        arch = get_architecture(model)
    if seq_len is None:
        return arch
    check_positive_int("seq_len", seq_len)
    return dataclasses.replace(arch, seq_len=seq_len)


def with_options(arch: Architecture | None, **options: bool | None) -> Architecture | None:
    """``arch`` with the boolean fields in ``options`` replaced (None leaves one as it is).

    A bare parameter count (``arch`` None) has no embeddings to tie or split:
    giving any of them for it is a ConfigError, as is a value that is not a bool.
    """
    given = {name: value for name, value in options.items() if value is not None}
    for name, value in given.items():
        if not isinstance(value, bool):
            raise ConfigError(
                f"{name} must be True, False or None, got {value!r}",
                f"{name} 必须是 True、False 或 None，收到的是 {value!r}",
            )
    if given and arch is None:
        names = ", ".join(given)
        raise ConfigError(
            f"{names} needs a model with a shape (a preset or --layers ...), not only --params",
            f"{names} 需要一个有形状的模型（预设或 --layers ……），不能只给 --params",
        )
    return dataclasses.replace(arch, **given) if given else arch


def by_shape(
    *, layers: int, hidden: int, heads: int, vocab: int, seq_len: int, tied_embeddings: bool = False
) -> Architecture:
    """A model of dtlab's own (GPT-2) layout given by its shape, every number checked.

    dtlab's GPT has its own LM head; ``tied_embeddings`` shares the token
    table instead, as GPT-2, GPT-3 and Megatron-LM's GPTs were published.
    """
    for name, value in dict(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq_len=seq_len).items():
        check_positive_int(name, value)
    if hidden % heads:
        raise ConfigError(
            f"heads = {heads} must divide hidden = {hidden}", f"heads = {heads} 必须整除 hidden = {hidden}"
        )
    return Architecture(
        name="custom",
        layers=layers,
        hidden=hidden,
        heads=heads,
        vocab=vocab,
        seq_len=seq_len,
        tied_embeddings=bool(tied_embeddings),
    )
