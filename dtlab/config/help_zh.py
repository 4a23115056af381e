"""The Chinese help of ``dtlab train``'s flags: one entry per TrainConfig field that is a flag.

The English help is the docstring under each field in dtlab/config/train_config.py (read by
dtlab/config/field_docs.py); this is its Chinese, written for a reader rather than word
for word, with the glossary's terms (glossary/*.json: 数据并行, 张量并行,
流水线并行, 微批次, 梯度累积, 激活重计算, ...). dtlab/config/flags.py shows the
two as "English / 中文". A field given a flag without an entry here fails
tests/test_cli_help.py; its help would be English only.
"""

from __future__ import annotations

HELP_ZH: dict[str, str] = {
    "dp": "数据并行度：模型副本的个数，每个副本处理 batch 中属于自己的那一份。",
    "dp_mode": "数据并行如何平均梯度：'overlapped'（像 DDP 那样，反向传播还在进行时就按桶发起全归约）、"
    "'bucketed'（反向传播结束后，每个桶一次全归约）或 'per_parameter'（反向传播结束后，每个参数一次全归约）。",
    "bucket_mb": "数据并行和 ZeRO-2 的梯度桶大小，单位 MiB（即 DDP 的 bucket_cap_mb；DeepSpeed 的 reduce_bucket_size "
    "也换算成它）。数据并行：桶里攒够这么多梯度就封口（DDP 的规则），所以 0.25 把小 GPT 的 0.9 MiB 梯度"
    "分成 4 个桶，前三个在反向传播仍在计算时就开始全归约；DDP 默认的 25 会把它们全装进一个桶，"
    "等反向传播结束才发出；0 表示每个参数一个桶。ZeRO-2（DeepSpeed 的 overlap_comm）：把扁平梯度按这个大小"
    "切成窗口，窗口里的梯度一算完就在反向传播中归约散射，因此每个 rank 只持有自己的 1/N 分片和至多两个桶，"
    "从不持有完整梯度；此时必须大于 0。ZeRO-1（保留完整梯度）和 ZeRO-3（逐个单元处理）没有桶："
    "与 --zero 1 或 3 同时使用时，非默认值会被拒绝。",
    "collectives": "数据并行、ZeRO 和张量并行的集合通信由谁来做：'torch'（torch.distributed 自带的实现）、'ring'"
    "（dtlab 用收发拼成的环，dtlab/comm/collectives.py，也就是第 01 课动手搭建的那个）或 'dtlab'"
    "（由 dtlab 像 NCCL 那样选择传输方式和算法：所有 rank 在同一台机器上时，任何大小都经共享内存"
    "运行环形算法，dtlab/comm/shared_memory.py；跨机器时不超过 1 MiB 的全归约用递归倍增，"
    "dtlab/comm/recursive_doubling.py，其余用环）。'ring' 和 'dtlab' 只能在 gloo 后端上运行。",
    "tp": "张量并行度，1 表示不启用。",
    "sp": "Megatron 序列并行（需要 tp > 1）：LayerNorm、dropout 和残差连接在每个 rank 上只保留 1/tp 的序列；"
    "张量并行的全归约换成全收集加归约散射。",
    "cp": "上下文并行度：每条序列沿长度方向切分到这么多个 rank 上，注意力用环形注意力计算（zigzag 分块）。"
    "1 表示不启用。",
    "pp": "流水线并行度（stage 数），1 表示不启用。",
    "micro_batches": "每步的流水线微批次数（GPipe 论文中的 m）。",
    "schedule": "流水线调度：'gpipe'（先做完全部前向，再做全部反向）、'1f1b'（前向、反向交替进行，"
    "同时保存的激活更少）或 'interleaved'（Megatron-LM 的交错调度：每个 rank 持有 --virtual-stages 个"
    "模型块，按 1F1B 执行；流水线气泡更小，但消息更多；需要 pp >= 2，且 micro_batches 是 pp 的倍数）。",
    "virtual_stages": "使用 --schedule interleaved 时每个流水线 rank 持有的模型块数（Megatron-LM 的 v，至少为 2）："
    "全部 block 切成 pp x V 块，rank r 持有第 r、r + pp……块；pp x V 不能超过模型的 block 数。"
    "'gpipe' 和 '1f1b' 时为 1。",
    "zero": "ZeRO（零冗余优化器）阶段：0（普通数据并行）、1（切分优化器状态）、2（再切分梯度）、3（再切分参数）。",
    "offload": "卸载：把优化器状态放在 CPU 一侧，优化器的更新也在 CPU 上做（需要配合某个 ZeRO 阶段）。",
    "master_weights": "fp16 与 bf16 把 fp32 主权重放在哪里：'model'（模块参数仍为 fp32，每层计算时转成 16 位副本："
    "PyTorch AMP、FSDP 的 MixedPrecision 都这样做）或 'optimizer'（参数及其梯度都是 16 位，优化器在 Adam 的两个矩之外"
    "再保存一份 fp32 主权重，每个参数 K = 12 字节，从 ZeRO 第 1 阶段起一并切分：即 ZeRO 论文图 1、Megatron-LM 与 DeepSpeed "
    "的做法）。'optimizer' 需要 fp16 或 bf16，且不能与 --offload 或 ep > 1 同时使用",
    "zero3_shard": "ZeRO-3 的切分策略（即 FSDP 的包装策略）：'all' 切分全部参数；'linear' 只切分 Linear 与 Embedding 的权重"
    "（含张量并行的层），其余参数（LayerNorm）在每个 rank 上保持完整，梯度做全归约。仅用于 --zero 3。",
    "zero3_prefetch": "ZeRO-3 预取的单元数：前向时（反向时倒过来）趁前一个单元还在计算，提前对后面这么多个单元"
    "发起全收集，与 FSDP2 的预取相同（它默认取 1）；这样最多同时收集这个数加一个单元。"
    "0 表示每个单元要用时才收集。仅用于 --zero 3。",
    "dp_shard": "混合分片（HSDP，即 FSDP2 的混合分片；DeepSpeed 的 hpZ 对参数做的也是这件事），配合 --zero 2 或 3："
    "模型状态只在每 K 个相邻的数据并行 rank 组成的组内分片（K 取一个节点上的 rank 数），各组之间互为副本："
    "全收集和归约散射都留在组内，组与组之间只有一次对梯度分片的全归约。K 必须整除 dp；K = dp 就是普通 ZeRO。"
    "不设置时在全部 dp 个 rank 上分片。",
    "precision": "计算精度：'fp32'、'bf16'、'fp16'（后两者即混合精度）或 'fp8'（与 bf16 相同，只是各 block 的线性层"
    "用 float8 输入做矩阵乘法，每个张量一个缩放因子：权重和激活用 e4m3，梯度用 e5m2；见 dtlab/numerics/fp8.py）。",
    "loss_scale": "fp16 的损失缩放：'dynamic'（动态调整）或一个固定的数。",
    "fp8_amax_history": "配合 --precision fp8：0 表示即时缩放（每个张量按它自己的 amax，即最大绝对值，来缩放）；"
    "1 到 1024 之间的 N 表示延迟缩放（取同一个张量在最近 N 步中最大的 amax）。",
    "grad_accum": "梯度累积：每个优化器步分成几个微步（每步只通信一次）。",
    "recompute": "激活重计算（梯度检查点），以 Transformer block 为单位。",
    "attention": "注意力内核：'eager'（把 softmax(QK^T)V 逐步写出来，为反向传播保存 (B, nh, T, T) 的注意力分数："
    "也就是课程逐步讲解的那个，dtlab/model.py）或 'sdpa'（PyTorch 的融合内核 scaled_dot_product_attention："
    "在 CUDA 上是 FlashAttention 或省显存的内核，不保存 T x T 的分数）。两者算出的数相同。不设置时："
    "CUDA 上用 'sdpa'，CPU 上用 'eager'。cp > 1 时无论设置哪个，注意力都是环形注意力"
    "（dtlab/parallel/ring_attention.py），因此那时拒绝 'sdpa'。",
    "compile": "在每个 rank 上用 torch.compile 编译每个 Transformer block 的前向，时机在改写 block 的各种并行之后"
    "（dtlab/train/rank.py 说明了位置）；编译期间最初几步较慢。不能与 pp、cp 或 ep > 1、--zero 3 或 --recompute 同时使用（会被拒绝，dtlab/config/checks.py 说明了原因）。",
    "lr": "峰值学习率（AdamW）。",
    "warmup": "学习率线性预热的步数，之后按余弦衰减。",
    "steps": "要运行的优化器步数。",
    "seed": "随机种子，决定权重初始化和数据顺序；种子相同，运行结果也相同。",
    "seq_len": "每条序列的 token 数（2 到 1024）；不设置时用模型预设的值。",
    "model": "模型预设，按大小区分（见 MODEL_PRESETS）。",
    "batch_size": "每个优化器步的序列总数（全局 batch），分摊到各个数据并行 rank 和各个梯度累积微步上，"
    "所以同一个 batch 在任何并行布局下得到相同的结果。",
    "betas": "AdamW 的 (beta1, beta2)，都在 [0, 1) 之内；不设置时用 dtlab 的 (0.9, 0.95)，见 dtlab/reference.py。",
    "eps": "AdamW 的 epsilon，取 0 到 1；不设置时用 dtlab 的 1e-8，见 dtlab/reference.py。",
    "clip_grad": "梯度裁剪：把梯度缩放到不超过这个全局 L2 范数，范数在所有 rank 的所有分片上一起计算"
    "（相当于单进程的 torch.nn.utils.clip_grad_norm_，即 DeepSpeed 的 gradient_clipping）。"
    "不设置则不裁剪。",
    "straggler": "制造一个慢节点：(rank, seconds) 让这个 rank 在每一步的计算中多睡这么多秒。",
    "spike": "在这一步喂入一个损坏的 batch（制造一次损失尖峰，供检测）。",
    "spike_policy": "检测到损失尖峰时怎么办：'skip' 跳过这个 batch，或 'rollback' 回滚到最近的快照。",
    "save": "训练检查点的写入目录。",
    "save_every": "配合 --save：每隔这么多步写一次训练检查点（最后一步之后也写）。",
    "resume": "从这个目录恢复训练：用其中最新一次完整写完的保存，也可以直接指定某一步的文件夹。可以换任何并行布局恢复"
    "（加载时重新切分检查点）；但模型、随机种子和 batch 大小不能变。",
    "trace": "把每个 rank 的计算和通信写成 Chrome trace-event JSON 文件（用 Perfetto 或 chrome://tracing 打开）。",
    "timeout_s": "集合通信等待其他 rank 的最长时间，超时则整个运行失败。",
    "experts": "混合专家：每个 block 的 MLP 变成 E 个专家 MLP，由一个可学习的路由器分派 token（dtlab/parallel/moe/）；"
    "0 表示保持稠密模型。",
    "top_k": "每个 token 路由到的专家数，1 到 E（1：Switch Transformer；2：GShard、Mixtral）。",
    "ep": "专家并行度：每个 rank 持有 E/N 个专家，token 通过全对全发给它们。与 dp 一样，它既让 rank 数成倍增加"
    "（dp x ep x tp x pp），也切分 batch（在 dp x ep 上）。",
    "capacity_factor": "容量因子：一个专家最多接收每条序列的 ceil(X x seq_len x top_k / E) 个 token，超出的被丢弃"
    "（'none'：不设上限）。",
    "aux_loss_coef": "每个 MoE 层加上的 Switch Transformer 负载均衡损失的权重（0：不加）。",
}
