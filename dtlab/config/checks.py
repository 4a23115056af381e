"""The checks ``TrainConfig.validate()`` runs: what the components can split, which options combine.

Each refusal is a :class:`~dtlab.i18n.ConfigError` in both languages that names the value and what would be
accepted; ``dtlab plan`` runs the layout's checks (ZeRO-3 with a pipeline, the schedule) on a
:class:`~dtlab.config.layout.Layout` too.
"""

from __future__ import annotations

from dtlab.config.layout import check_dp_shard, default_master_weights
from dtlab.config.output_paths import check_output_file
from dtlab.config.safe_paths import check_name_lengths
from dtlab.i18n import ConfigError
from dtlab.parallel.pipeline.schedule import check_interleaved, check_kind


def check_straggler(config) -> None:
    """A rank that exists, a delay from 0 to 60 s, and shorter than the collective timeout: the
    straggler's peers wait for it in every step's collectives, and a wait of ``timeout_s`` fails the run."""
    rank, seconds = config.straggler
    if not (0 <= rank < config.world_size) or not (0 <= seconds <= 60):
        raise bad(
            "straggler",
            f"{rank}:{seconds}",
            f"RANK:SECONDS with 0 <= RANK < {config.world_size} and 0 <= SECONDS <= 60",
            f"RANK:SECONDS，其中 0 <= RANK < {config.world_size}，0 <= SECONDS <= 60",
        )
    if seconds >= config.timeout_s:
        raise ConfigError(
            f"straggler={rank}:{seconds} with timeout_s={config.timeout_s}: rank {rank} sleeps {seconds} s in "
            f"every step and its peers wait for it in a collective that fails after {config.timeout_s} s "
            f"(allowed: SECONDS below --timeout, or a --timeout above {seconds})",
            f"straggler={rank}:{seconds} 与 timeout_s={config.timeout_s} 不能同时使用：rank {rank} 每一步睡眠 "
            f"{seconds} 秒，其他 rank 在集合通信中等待它，而集合通信等待 {config.timeout_s} 秒后就会失败"
            f"（允许：SECONDS 小于 --timeout，或 --timeout 大于 {seconds}）",
        )


def check_layout(config) -> None:
    """What the components can split: heads over TP, blocks over PP, the batch over both."""
    cfg = config.model_config()
    if cfg.n_head % config.tp:
        allowed = [d for d in range(1, cfg.n_head + 1) if cfg.n_head % d == 0]
        raise ConfigError(
            f"tp={config.tp} does not divide the {cfg.n_head} attention heads of model "
            f"{config.model!r} (allowed: {allowed})",
            f"tp={config.tp} 不能整除模型 {config.model!r} 的 {cfg.n_head} 个注意力头（允许：{allowed}）",
        )
    if config.pp > cfg.n_layer:
        raise ConfigError(
            f"pp={config.pp} is more stages than the {cfg.n_layer} blocks of model {config.model!r} "
            f"(allowed: 1 to {cfg.n_layer})",
            f"pp={config.pp} 超过了模型 {config.model!r} 的 {cfg.n_layer} 个 block（允许：1 到 {cfg.n_layer}）",
        )
    check_pipeline_schedule(config, cfg.n_layer, config.model)
    check_sequence_split(config, cfg.seq_len)
    per_dp = config.batch_size // config.data_ranks
    pieces = config.micro_batches * config.grad_accum
    if per_dp % pieces:
        raise ConfigError(
            f"micro_batches={config.micro_batches} x grad_accum={config.grad_accum} = {pieces} must divide "
            f"the {per_dp} sequences each data-parallel rank gets (batch_size {config.batch_size} / "
            f"dp x ep {config.data_ranks}); allowed: a product that divides {per_dp}",
            f"micro_batches={config.micro_batches} x grad_accum={config.grad_accum} = {pieces} 必须整除每个"
            f"数据并行 rank 分到的 {per_dp} 条序列（batch_size {config.batch_size} / dp x ep {config.data_ranks}）",
        )


def check_sequence_split(config, seq_len: int) -> None:
    """SP and CP cut the sequence: SP needs TP; CP's zigzag needs 2 x cp equal chunks, and SP
    then splits each rank's T/cp tokens over tp."""
    if config.sp and config.tp == 1:
        raise ConfigError(
            "sp=True needs tp > 1: sequence parallelism splits, over the TP ranks, "
            "what tensor parallelism leaves whole (allowed: --sp with --tp 2 or more)",
            "sp=True 需要 tp > 1：序列并行是在 TP 的各 rank 之间切分张量并行未切分的部分"
            "（允许：--sp 与 --tp 2 或更大同时使用）",
        )
    if seq_len % (2 * config.cp) and config.cp > 1:
        raise ConfigError(
            f"cp={config.cp} does not divide the sequence: seq_len {seq_len} must cut into 2 x cp = "
            f"{2 * config.cp} equal chunks (zigzag: each rank holds two); allowed: a seq_len that is "
            f"a multiple of {2 * config.cp}",
            f"cp={config.cp} 无法整除序列：seq_len {seq_len} 必须能切成 2 x cp = {2 * config.cp} 个等长的块"
            f"（zigzag：每个 rank 持有两块）；允许：{2 * config.cp} 的倍数的 seq_len",
        )
    local = seq_len // config.cp
    if config.sp and local % config.tp:
        raise ConfigError(
            f"sp with tp={config.tp}: the {local} tokens each rank holds (seq_len {seq_len} / cp "
            f"{config.cp}) do not split over tp (allowed: a seq_len that is a multiple of "
            f"{config.cp * config.tp * (2 if config.cp > 1 else 1)})",
            f"sp 与 tp={config.tp}：每个 rank 持有的 {local} 个 token（seq_len {seq_len} / cp {config.cp}）"
            f"无法在 tp 上平均切分（允许：{config.cp * config.tp * (2 if config.cp > 1 else 1)} 的倍数的 seq_len）",
        )


def check_combinations(config) -> None:
    """Options that exist but do not combine, refused with the reason."""
    check_fp8(config)
    if config.loss_scale != "dynamic":  # a valid number by now (dtlab/config/limits.py)
        if config.precision != "fp16":
            raise ConfigError(
                f"loss_scale={config.loss_scale!r} only applies to fp16 (precision is "
                f"{config.precision!r}: bf16 and fp32 have fp32's range and need no scaling)",
                f"loss_scale={config.loss_scale!r} 只用于 fp16（当前精度为 {config.precision!r}："
                f"bf16 与 fp32 的数值范围和 fp32 相同，不需要损失缩放）",
            )
    if config.spike is not None and not (isinstance(config.spike, int) and 0 <= config.spike < config.steps):
        raise bad("spike", config.spike, f"a step from 0 to {config.steps - 1}", f"0 到 {config.steps - 1} 之间的步数")
    if config.trace is not None:
        check_output_file("trace", config.trace)
    if isinstance(config.resume, str):
        check_name_lengths("resume", config.resume)
    if config.offload and config.zero == 0:
        raise ConfigError(
            "offload=True needs a ZeRO stage (1, 2 or 3): offloading moves the sharded optimizer state to the CPU side",
            "offload=True 需要配合 ZeRO 阶段（1、2 或 3）：卸载的是分片后的优化器状态",
        )
    default_bucket = type(config).__dataclass_fields__["bucket_mb"].default
    if config.zero in (1, 3) and config.bucket_mb != default_bucket:
        raise ConfigError(
            f"bucket_mb={config.bucket_mb!r} with zero={config.zero}: --bucket-mb sizes the buckets of DP's "
            f"all-reduces and ZeRO-2's reduce-scatters; ZeRO-1 keeps the whole gradient and reduce-scatters "
            f"it once after backward, ZeRO-3 one unit at a time: neither has a bucket (allowed: "
            f"bucket_mb={default_bucket} with zero 1 or 3, any with zero=0, > 0 with zero=2)",
            f"bucket_mb={config.bucket_mb!r} 与 zero={config.zero} 不能同时使用：--bucket-mb 决定数据并行全归约和 "
            f"ZeRO-2 归约散射的桶大小；ZeRO-1 保留整个梯度、在反向传播后归约散射一次，ZeRO-3 逐单元进行，"
            f"二者都没有桶（允许：zero 为 1 或 3 时 bucket_mb={default_bucket}，zero=0 时任意值，zero=2 时大于 0）",
        )
    if config.zero == 2 and not config.bucket_mb > 0:
        raise ConfigError(
            f"bucket_mb={config.bucket_mb!r} with zero=2: ZeRO-2's buckets are windows of the flat "
            f"gradient, reduce-scattered one by one during backward, and need a size (allowed: "
            f"bucket_mb > 0 with zero=2; 0, one bucket per parameter, is DP's, zero=0)",
            f"bucket_mb={config.bucket_mb!r} 与 zero=2 不能同时使用：ZeRO-2 的桶是扁平梯度中的窗口，"
            f"在反向传播中逐个归约散射，需要一个大小（允许：zero=2 时 bucket_mb 大于 0；"
            f"0 即每个参数一个桶，只用于数据并行 zero=0）",
        )
    check_dp_shard(config)  # hybrid sharding's K (dtlab/config/layout.py: the planner's check too)
    check_unused(config)
    check_zero3_with_pipeline(config)
    check_zero3_precision(config)
    check_master_weights(config)


def check_fp8(config) -> None:
    """``--fp8-amax-history`` only with ``--precision fp8``, which takes no loss scale: it scales each
    tensor itself, the gradients in e5m2 with their own amax (dtlab/numerics/fp8.py)."""
    if config.fp8_amax_history and config.precision != "fp8":
        raise ConfigError(
            f"fp8_amax_history={config.fp8_amax_history!r} (--fp8-amax-history) with precision="
            f"{config.precision!r}: the amax history sets the scales of fp8 matmuls, and this run has none "
            f"(allowed: --fp8-amax-history N with --precision fp8, or fp8_amax_history=0, the default)",
            f"fp8_amax_history={config.fp8_amax_history!r}（--fp8-amax-history）与 precision={config.precision!r} "
            f"不能同时使用：amax 历史决定 fp8 矩阵乘法的缩放因子，而这次运行没有 fp8 矩阵乘法"
            f"（允许：--fp8-amax-history N 与 --precision fp8 同时使用，或 fp8_amax_history=0，即默认值）",
        )
    if config.precision == "fp8" and config.loss_scale != "dynamic":
        raise ConfigError(
            f"loss_scale={config.loss_scale!r} with precision='fp8': fp8 scales every tensor of its matmuls "
            f"itself, the gradients too (e5m2, each by its own amax), so a loss scale would change nothing "
            f"(allowed: --loss-scale with --precision fp16; no --loss-scale with fp8)",
            f"loss_scale={config.loss_scale!r} 与 precision='fp8' 不能同时使用：fp8 自己为矩阵乘法的每个张量"
            f"（包括梯度：e5m2，各按自己的 amax）计算缩放因子，损失缩放不会改变任何东西"
            f"（允许：--loss-scale 与 --precision fp16 同时使用；fp8 时不给 --loss-scale）",
        )


def check_unused(config) -> None:
    """An option set away from its default where the rest of the job would ignore it: refused, so that
    a flag never silently does nothing (a default is not a choice, and passes)."""
    if config.zero3_prefetch and config.zero != 3:
        raise ConfigError(
            f"zero3_prefetch={config.zero3_prefetch!r} with zero={config.zero}: only ZeRO-3 gathers parameters "
            f"before use (allowed: zero3_prefetch=0, or --zero 3)",
            f"zero3_prefetch={config.zero3_prefetch!r} 与 zero={config.zero} 不能同时使用：只有 ZeRO-3 在使用前"
            f"收集参数（允许：zero3_prefetch=0，或 --zero 3）",
        )
    if config.zero3_shard != "all" and config.zero != 3:
        raise ConfigError(
            f"zero3_shard={config.zero3_shard!r} with zero={config.zero}: a sharding policy chooses what "
            f"ZeRO-3 shards (allowed: zero3_shard='all', or --zero 3)",
            f"zero3_shard={config.zero3_shard!r} 与 zero={config.zero} 不能同时使用：切分策略决定的是 ZeRO-3 "
            f"切分哪些参数（允许：zero3_shard='all'，或 --zero 3）",
        )
    default = type(config).__dataclass_fields__["save_every"].default
    if config.save is None and config.save_every != default:
        raise ConfigError(
            f"save_every={config.save_every!r} (--save-every) needs save (--save DIR): it sets how often "
            f"checkpoints are written, and without a save directory none is (allowed: --save-every with "
            f"--save DIR, or save_every={default}, the default)",
            f"save_every={config.save_every!r}（--save-every）需要配合 save（--save DIR）使用：它决定多久写一次"
            f"检查点，而没有保存目录就不写检查点（允许：--save-every 与 --save DIR 同时使用，"
            f"或 save_every={default}，即默认值）",
        )
    default = type(config).__dataclass_fields__["dp_mode"].default
    if config.zero and config.dp_mode != default:
        raise ConfigError(
            f"dp_mode={config.dp_mode!r} (--dp-mode) with zero={config.zero}: ZeRO averages the gradients "
            f"itself (its reduce-scatter), so data parallelism's dp_mode is not used (allowed: "
            f"dp_mode={default!r}, the default, with zero 1-3; any dp_mode with zero=0)",
            f"dp_mode={config.dp_mode!r}（--dp-mode）与 zero={config.zero} 不能同时使用：ZeRO 用自己的归约散射"
            f"平均梯度，不使用数据并行的 dp_mode（允许：zero 为 1-3 时 dp_mode={default!r}，即默认值；"
            f"zero=0 时任意 dp_mode）",
        )


def check_fast_path(config) -> None:
    """``--attention sdpa`` and ``--compile`` where the rest of the job can honour them.

    Context parallelism computes attention as ring attention, its own online-softmax merge of the
    blocks that arrive (dtlab/parallel/ring_attention.py): an SDPA kernel would not run, so asking for
    one is refused rather than ignored. ``--compile`` compiles each block's forward: it is refused where
    the blocks' forward does what dtlab has not compiled and tested (a pipeline's stages, ring
    attention's sends, the experts' all-to-all, ZeRO-3's gathers of each unit's parameters) or what
    torch.compile does not trace (dtlab's recompute): :data:`COMPILE_REFUSED` says why, in both languages.
    """
    if config.attention == "sdpa" and config.cp > 1:
        raise ConfigError(
            f"attention='sdpa' with cp={config.cp}: context parallelism computes attention as ring attention, "
            f"which merges the blocks of keys and values with its own online softmax, so no SDPA kernel would "
            f"run (allowed: --attention eager or no --attention with cp > 1; 'sdpa' with cp=1)",
            f"attention='sdpa' 与 cp={config.cp} 不能同时使用：上下文并行用环形注意力计算注意力，"
            f"以自己的在线 softmax 合并依次到达的键值块，不会运行 SDPA 内核（允许：cp > 1 时用 --attention eager "
            f"或不给 --attention；cp=1 时可用 'sdpa'）",
        )
    if not config.compile:
        return
    refused = [name for name, (_, _, applies) in COMPILE_REFUSED.items() if applies(config)]
    if refused:
        name, value = refused[0], getattr(config, refused[0])
        why_en, why_zh, _ = COMPILE_REFUSED[name]
        raise ConfigError(
            f"compile=True with {name}={value!r}: --compile is not combined with {why_en} here (allowed: "
            f"--compile with pp, cp and ep 1, zero 0-2 and no --recompute; or {name}={value!r} without --compile)",
            f"compile=True 与 {name}={value!r} 不能同时使用：这里的 --compile 不与{why_zh}组合（允许：pp、cp、ep 为 1，"
            f"zero 为 0-2 且不加 --recompute 时使用 --compile；或不加 --compile 使用 {name}={value!r}）",
        )


COMPILE_REFUSED = {
    "pp": (
        "pipeline parallelism (each stage's sends and receives between blocks)",
        "流水线并行（各 stage 之间的收发）",
        lambda config: config.pp > 1,
    ),
    "cp": (
        "context parallelism (ring attention's sends inside every block)",
        "上下文并行（每个 block 内环形注意力的收发）",
        lambda config: config.cp > 1,
    ),
    "ep": (
        "expert parallelism (the experts' all-to-all inside every block)",
        "专家并行（每个 block 内专家的全对全通信）",
        lambda config: config.ep > 1,
    ),
    "zero": (
        "ZeRO-3 (each unit's parameters gathered by hooks around its forward)",
        "ZeRO-3（在前向前后由钩子收集每个单元的参数）",
        lambda config: config.zero == 3,
    ),
    "recompute": (
        "dtlab's recompute, an autograd.Function that saves the random state and reruns the block in "
        "backward (dtlab/numerics/gradient_checkpointing.py), which torch.compile does not trace",
        "dtlab 的激活重计算（一个保存随机数状态、在反向传播中重算 block 的 autograd.Function，"
        "dtlab/numerics/gradient_checkpointing.py），torch.compile 无法追踪它",
        lambda config: config.recompute,
    ),
}
"""What ``--compile`` is refused with: the option -> (why in English, in Chinese, whether ``config`` sets it)."""


def check_zero3_with_pipeline(layout) -> None:
    """ZeRO-3 with pp > 1 is refused (``layout``: a TrainConfig or a :class:`~dtlab.config.layout.Layout`;
    ``dtlab plan`` refuses it too)."""
    if layout.zero == 3 and layout.pp > 1:
        raise ConfigError(
            f"zero=3 with pp={layout.pp}: ZeRO-3 is not combined with pipeline "
            f"parallelism here (DeepSpeed does not combine them either); allowed: "
            f"zero 0-2 with pp > 1, or pp=1 with zero 3",
            f"zero=3 与 pp={layout.pp} 不能同时使用（DeepSpeed 也不支持二者组合）；"
            f"允许：pp > 1 时 zero 为 0-2，或 zero=3 时 pp=1",
        )


def check_pipeline_schedule(layout, n_layer: int, model: str) -> None:
    """The schedule and its virtual stages (``layout``: a TrainConfig or a :class:`~dtlab.config.layout.Layout`):
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
            f"{model!r} 的 {n_layer} 个 block（允许：pp x virtual_stages <= {n_layer}）",
        )


def check_zero3_precision(layout, master_weights: str | None = None) -> None:
    """dtlab's ZeRO-3 with the fp32 masters in the model computes in bf16 or fp32, not fp16 (``dtlab plan``
    flags it in a note: other trainers run it); with the masters in the optimizer it runs fp16 too."""
    masters = (
        master_weights
        or getattr(layout, "master_weights", None)
        or default_master_weights(layout.precision, offload=getattr(layout, "offload", False), ep=layout.ep)
    )
    if layout.zero == 3 and layout.precision == "fp16" and masters != "optimizer":
        raise ConfigError(
            "zero=3 with precision='fp16': ZeRO-3 with the fp32 master weights in the model computes in bf16 "
            "or fp32 here (allowed: 'fp32' or 'bf16', or fp16 with --master-weights optimizer)",
            "zero=3 与 precision='fp16' 不能同时使用：主权重放在模型里时，这里的 ZeRO-3 只支持 bf16 或 fp32 计算"
            "（允许：'fp32' 或 'bf16'，或者 fp16 配合 --master-weights optimizer）",
        )


def check_master_weights(config) -> None:
    """``--master-weights optimizer``: 16-bit parameters with fp32 masters in the optimizer
    (dtlab/numerics/master_weights.py), for fp16 and bf16, on the device's optimizer of DP and ZeRO."""
    if config.master_weights != "optimizer":  # unset resolves to what runs (TrainConfig.masters)
        return
    if config.precision not in ("fp16", "bf16"):
        raise ConfigError(
            f"master_weights='optimizer' with precision={config.precision!r}: the optimizer keeps fp32 masters "
            f"of 16-bit parameters, and {config.precision} parameters have none "
            f"(allowed: --master-weights optimizer with --precision fp16 or bf16; 'model' otherwise)",
            f"master_weights='optimizer' 与 precision={config.precision!r} 不能同时使用：优化器保存的是 16 位参数的 "
            f"fp32 主权重，而 {config.precision} 参数没有主权重"
            f"（允许：--master-weights optimizer 配合 --precision fp16 或 bf16；其他情况用 'model'）",
        )
    if config.offload:
        raise ConfigError(
            "master_weights='optimizer' with offload=True: an offloaded optimizer keeps its fp32 masters on the "
            "host already (allowed: --offload with --master-weights model)",
            "master_weights='optimizer' 与 offload=True 不能同时使用：卸载的优化器本来就在主机端保存 fp32 主权重"
            "（允许：--offload 配合 --master-weights model）",
        )
    if config.ep > 1:
        raise ConfigError(
            f"master_weights='optimizer' with ep={config.ep}: expert parallelism's optimizer keeps the masters "
            f"in the model here (allowed: --master-weights optimizer with ep=1)",
            f"master_weights='optimizer' 与 ep={config.ep} 不能同时使用：这里专家并行的优化器把主权重放在模型里"
            f"（允许：--master-weights optimizer 配合 ep=1）",
        )


def bad(name: str, value, allowed_en: str, allowed_zh: str) -> ConfigError:
    return ConfigError(
        f"{name}={value!r} is not allowed; expected {allowed_en}", f"{name}={value!r} 不合法；应为{allowed_zh}"
    )
