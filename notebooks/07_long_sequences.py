# %% [markdown]
# # Lesson 07 — Long sequences: sequence and context parallelism
# # 第 07 课 —— 长序列：序列并行与上下文并行
#
# **What you will see.** Activation memory grows with the sequence length — and
# attention's part of it with its *square*. Two ways of cutting the sequence
# itself keep long sequences trainable. **Sequence parallelism** (SP;
# Korthikanti et al., 2022) splits, along the sequence, the parts of a block
# that tensor parallelism leaves whole on every rank. **Context parallelism**
# (CP) splits every sequence across ranks through the whole model; attention
# becomes **ring attention** (Liu et al., 2023), where blocks of keys and values
# travel round a ring of ranks. You will measure what SP saves on real ranks,
# step through ring attention, train with CP and compare with one process, move
# a slider to see the memory per GPU at 128K tokens, and write the piece of
# ring attention that makes it exact: the online-softmax merge.
#
# **你将看到什么。** 激活内存随序列长度增长——其中注意力那部分随长度的 *平方* 增长。有两种切分序列本身的
# 方法能让长序列依然可以训练。**序列并行**（SP；Korthikanti 等，2022）沿序列方向切分张量并行在每个
# rank 上都完整保留的那部分。**上下文并行**（CP）把每条序列切分到多个 rank 上，贯穿整个模型；注意力则变成
# **环形注意力**（Liu 等，2023）：键和值的块沿着 rank 组成的环传递。你会在真实的 rank 上测量 SP 节省了多少，
# 一步步走完环形注意力，用 CP 训练并与单进程比较，拖动滑块看 128K token 时每张 GPU 的内存，最后亲手写出让
# 环形注意力精确成立的那一块：在线 softmax 合并。

# %%
import dtlab
from dtlab import TrainConfig
from dtlab.launch import run
from dtlab.lab import check, human_bytes
from dtlab.course.experiments import long_sequences as lesson
from dtlab.course.exercises import grade
from dtlab.parallel.ring_attention import ring_schedule

# %% [markdown]
# ## 1. What tensor parallelism leaves whole / 张量并行没有切分的部分
#
# Korthikanti et al. (2022, Table 2) count the bytes one transformer layer keeps
# for backward, with s = sequence length, b = micro-batch, h = hidden size,
# a = heads, t = TP degree and 2-byte activations:
#
# | layout | bytes per layer |
# |---|---|
# | no parallelism | sbh (34 + 5as/h) |
# | tensor parallel | sbh (10 + 24/t + 5as/(ht)) |
# | tensor + sequence parallel | sbh (34/t + 5as/(ht)) |
#
# The **10** are the LayerNorms' inputs, the dropout masks and the inputs of the
# first linear layer of attention and of the MLP: tensors of shape (b, s, h)
# that every TP rank holds whole and identical. They work token by token, so SP
# gives each TP rank s/t of the tokens there. TP's all-reduce after a block
# becomes a **reduce-scatter** along the sequence, and an **all-gather** brings
# the whole sequence back before the next block — the same bytes on the wire,
# since an all-reduce *is* a reduce-scatter followed by an all-gather.
#
# The small GPT computes in fp32 (4 bytes) and has no dropout, so its "10" is
# four fp32 (B, T, C) tensors per layer: the inputs of both LayerNorms, of QKV
# and of the MLP's first layer (plus each LayerNorm's per-token mean and
# 1/std, one float each per token).
#
# **Predict:** for B = 2, T = 256, C = 64 and 2 layers at TP = 2, how many bytes
# of activations does SP save on each rank? Write a number (an expression is fine).
#
# Korthikanti 等（2022，表 2）统计了一个 Transformer 层为反向传播保存的字节数，其中 s 为序列长度、b 为微批次
# 大小、h 为隐藏维度、a 为注意力头数、t 为 TP 并行度，激活值每个占 2 字节：
#
# | 布局 | 每层字节数 |
# |---|---|
# | 不并行 | sbh (34 + 5as/h) |
# | 张量并行 | sbh (10 + 24/t + 5as/(ht)) |
# | 张量并行 + 序列并行 | sbh (34/t + 5as/(ht)) |
#
# 其中的 **10** 是 LayerNorm 的输入、dropout 掩码，以及注意力和 MLP 第一个线性层的输入：这些形状为 (b, s, h)
# 的张量在每个 TP rank 上都完整且相同。它们都是逐 token 计算的，所以 SP 让每个 TP rank 在这些区域只保留 s/t
# 个 token。块之后 TP 的全归约变成沿序列方向的 **归约散射**，进入下一个块之前再用 **全收集**
# 拼回整条序列——线上传输的字节数不变，因为全归约本来 *就是* 归约散射加全收集。
#
# 小 GPT 用 fp32（4 字节）计算且没有 dropout，所以它的“10”是每层四个 fp32 的 (B, T, C) 张量：两个 LayerNorm
# 的输入、QKV 的输入和 MLP 第一层的输入（另外每个 LayerNorm 为每个 token 保存一个均值和一个 1/标准差）。
#
# **预测：** B = 2、T = 256、C = 64、共 2 层、TP = 2 时，SP 在每个 rank 上节省多少字节的激活？写一个数
# （写算式也可以）。

# %%
my_prediction = None  # ← your prediction (bytes) / 你的预测（字节）

# %%
sp = run(lesson.activations_per_rank, 2, seq_len=256, d_model=64, n_layer=2, batch=2)
for r in sp:
    print(f"rank {r['rank']}: dense {r['dense']:,} B, TP 2 {r['tp']:,} B, TP 2 + SP {r['tp_sp']:,} B "
          f"of activations; loss {r['tp_sp_loss']:.6f} (dense {r['dense_loss']:.6f})")
saved = sp[0]["tp"] - sp[0]["tp_sp"]
ok = check("07.sp_saved_bytes", my_prediction, saved)
print("SP computes the same loss as the dense model / SP 的损失与稠密模型相同:",
      all(r["losses_agree"] for r in sp))

# %% [markdown]
# ## 2. Ring attention / 环形注意力
#
# Context parallelism gives each of N ranks T/N tokens of every sequence,
# everywhere in the model. Embeddings, LayerNorms, the MLP, the projections and
# the loss work token by token and need nothing. Attention needs, for each
# query, the keys and values (K/V) of every earlier token — and those live on
# other ranks.
#
# Ring attention never gathers them. Each rank keeps its queries and passes its
# block of K/V to the next rank round a ring; at step s, rank r holds the block
# of rank r − s and computes attention against it. Each block gives a partial
# result that the **online softmax** merges exactly (section 5). With a causal
# mask, a query chunk sees earlier key chunks whole, its own chunk under a
# triangular mask, and later chunks not at all: those tiles are skipped.
#
# **Predict:** at CP = 4, how many times does each rank send a K/V block in one
# forward pass, and is ring attention's output (and gradient) equal to full
# attention's on the whole sequence?
#
# 上下文并行让 N 个 rank 中的每一个在模型的每个位置都只持有每条序列的 T/N 个 token。嵌入、LayerNorm、MLP、
# 各个投影和损失都是逐 token 计算的，不需要其他 rank 的数据。注意力则需要每个查询之前所有 token 的键和值（K/V）——而它们
# 在别的 rank 上。
#
# 环形注意力从不把它们收集起来。每个 rank 保留自己的查询，把自己的 K/V 块沿环传给下一个 rank；在第 s 步，
# rank r 持有 rank r − s 的块，并与它计算注意力。每个块给出一个部分结果，由 **在线 softmax** 精确合并（第 5 节）。
# 在因果掩码下，一个查询分块完整地看到更早的键分块，对自己的分块使用三角掩码，完全看不到更晚的分块：这些小块
# （tile）直接跳过。
#
# **预测：** CP = 4 时，每个 rank 在一次前向传播中发送几次 K/V 块？环形注意力的输出（以及梯度）是否与在整条
# 序列上计算的完整注意力相同？

# %%
my_prediction = None  # ← your prediction, e.g. {"kv_passes": ..., "equal": ...} / 你的预测

# %%
ring = run(lesson.ring_attention_run, 4, seq_len=64)
for r in ring:
    print(f"rank {r['rank']}: K/V passes forward {r['kv_passes_forward']}, backward {r['kv_passes_backward']}, "
          f"tiles computed {r['tiles']}, equal to full attention {r['equal']}, "
          f"followed the schedule {r['trace_is_schedule']}")
measured = {"kv_passes": ring[0]["kv_passes_forward"], "equal": all(r["equal"] for r in ring)}
ok = check("07.ring_kv", my_prediction, measured)
print("backward: N − 1 = 3 passes of K/V with their dK/dV, then one more hop that brings dK/dV home\n"
      "反向：K/V 连同其 dK/dV 传 N − 1 = 3 次，再多一跳把 dK/dV 送回它的主人")

# %% [markdown]
# Step through it. Each **Step** runs one step of the ring on every rank at
# once: the table shows whose K/V each rank holds, the matrix which tiles of
# the attention matrix are done and by which rank. Then switch **zigzag** off.
#
# **Predict:** with one contiguous chunk per rank (zigzag off) at CP = 4, how
# many tiles does each rank compute in total? And with zigzag (rank r holds
# chunks r and 2N − 1 − r of 2N)? Mind the sizes: without zigzag a chunk is T/N
# tokens and a tile (T/N)²; with zigzag a chunk is T/2N and a tile (T/2N)², a
# quarter of the other, so the two counts are not the same unit of work. (The
# cell after the check turns both into work: a diagonal tile, under the triangular
# mask, is half a tile's scores.)
#
# 一步步地走一遍。每按一次 **Step**（前进一步），所有 rank 同时执行环上的一步：表格显示每个 rank 持有谁的 K/V，
# 矩阵显示注意力矩阵中哪些小块（tile）已经算完、由哪个 rank 计算。然后关闭 **zigzag**。
#
# **预测：** 每个 rank 只持有一个连续分块（关闭 zigzag）、CP = 4 时，每个 rank 一共计算多少个小块？使用
# zigzag（rank r 持有 2N 个分块中的第 r 个和第 2N − 1 − r 个）时呢？注意大小：不用 zigzag 时每个分块有 T/N 个
# token，一个小块是 (T/N)²；用 zigzag 时每个分块只有 T/2N 个 token，一个小块是 (T/2N)²，只有前者的四分之一，
# 所以两组小块数不是同一个计算量单位。（检查之后的输出把两者都换算成计算量：对角线上的小块在三角
# 掩码下只有一半的分数。）

# %%
# NBVAL_IGNORE_OUTPUT
from dtlab.lab.ring_attention_view import RingAttentionView

RingAttentionView(4)

# %%
my_prediction = None  # ← your prediction, e.g. {"contiguous": [...], "zigzag": [...]} / 你的预测


# %%
def tiles_per_rank(n, zigzag):
    counts = [0] * n
    for s in ring_schedule(n, zigzag=zigzag):
        counts[s.rank] += len(s.tiles)
    return counts

schedule = {"contiguous": tiles_per_rank(4, False), "zigzag": tiles_per_rank(4, True)}
ok = check("07.tiles", my_prediction, schedule, source="simulated")
# Work, in full (T/N)² tiles: a diagonal tile is a triangle (half a tile's scores), and a zigzag
# tile is (T/2N)², a quarter of a contiguous one.
def work_per_rank(n, zigzag):
    work = [0.0] * n
    for s in ring_schedule(n, zigzag=zigzag):
        work[s.rank] += sum(0.5 if t.kind == "diagonal" else 1.0 for t in s.tiles) / (4 if zigzag else 1)
    return work

work = {"contiguous": work_per_rank(4, False), "zigzag": work_per_rank(4, True)}
print(f"work per rank, in full (T/N)² tiles: contiguous {work['contiguous']}, zigzag {work['zigzag']}; "
      f"total {sum(work['contiguous'])} and {sum(work['zigzag'])} = N²/2")
print(f"每个 rank 的计算量（以完整的 (T/N)² 小块计）：连续 {work['contiguous']}，zigzag {work['zigzag']}；"
      f"合计 {sum(work['contiguous'])} 与 {sum(work['zigzag'])} = N²/2")

# %% [markdown]
# ## 3. Training with context parallelism / 用上下文并行训练
#
# `--cp N` puts N ranks on each sequence. The weights are replicated, as under
# data parallelism, and each rank's loss is the mean over its own tokens, so the
# gradient of the whole sequence is the *average* over the CP ranks: dtlab
# averages gradients over the data- and context-parallel ranks together
# (Megatron-LM does the same). Each rank's record carries its `cp` coordinate.
#
# **Predict:** (a) over 10 steps, will CP = 2 give the same losses as one
# process (within 10⁻⁴ relative)? (b) At T = 512, will the activation bytes per
# rank at CP = 2 be more or less than half of those at CP = 1? (Hint: which part
# of the activations grows with T², and does ring attention keep it?)
#
# `--cp N` 让 N 个 rank 共同处理每条序列。权重像数据并行那样被复制，每个 rank 的损失是它自己那些 token 上的
# 平均值，所以整条序列的梯度是各 CP rank 梯度的 *平均*：dtlab 在数据并行和上下文并行的 rank 之间一起平均梯度
# （Megatron-LM 也是这样做的）。每个 rank 的记录都带有它的 `cp` 坐标。
#
# **预测：** (a) 10 步之内，CP = 2 的损失是否与单进程相同（相对误差 10⁻⁴ 以内）？(b) T = 512 时，CP = 2 下
# 每个 rank 的激活字节数比 CP = 1 时的一半多还是少？（提示：激活中哪一部分随 T² 增长？环形注意力保存它吗？）

# %%
my_prediction = None  # ← your prediction, e.g. {"same_losses": ..., "less_than_half": ...} / 你的预测

# %%
base = dict(steps=10, seq_len=512, batch_size=4, seed=0)
one = dtlab.train(TrainConfig(**base)).wait()
cp2 = dtlab.train(TrainConfig(cp=2, **base)).wait()
for step, (a, b) in enumerate(zip(one.losses(), cp2.losses())):
    print(f"step {step}: one process {a:.6f}   CP 2 {b:.6f}")
same = all(abs(a - b) <= 1e-4 * abs(a) for a, b in zip(one.losses(), cp2.losses()))
act_one = one.records[-1]["ranks"][0]["mem"]["activations"]
ranks = sorted(cp2.records[-1]["ranks"], key=lambda r: r["rank"])
for r in ranks:
    print(f"rank {r['rank']}: cp={r['cp']} dp={r['dp']} activations / 激活值 {human_bytes(r['mem']['activations'])}")
print(f"one process: activations {human_bytes(act_one)} / 单进程：激活值 {human_bytes(act_one)}")
measured = {"same_losses": same, "less_than_half": max(r["mem"]["activations"] for r in ranks) < act_one / 2}
ok = check("07.cp_training", my_prediction, measured)

# %% [markdown]
# **What CP sends.** In every layer each rank passes its K/V block, 2·b·(s/N)·h_kv
# values (h_kv: the width of K, h here; less under grouped-query attention), to
# its neighbour N − 1 times: **2·b·s·h_kv·(N − 1)/N values per rank per layer**
# in forward. Backward sends K/V with their gradients and then the gradients home
# once more: 2 + 1/(N − 1) times the forward's volume, 3 times at N = 2.
# TP + SP moves, per layer in forward, two all-gathers and two reduce-scatters
# of the (b, s, h) activations: 4·b·s·h·(t − 1)/t per rank. At N = t that is
# twice what CP sends with h_kv = h, and 8 times with Llama 3's 8 K/V heads of
# 64. And TP's collectives sit between the matrix multiplies that wait for
# them, while ring attention sends the next block while it computes on this
# one. It hides when a step's attention takes longer than a block's trip:
# 4·b·c²·h FLOPs for a full tile of c = s/N queries and keys against
# 2·b·c·h_kv values on the link, so c ≥ (h_kv/h)·β·F/(2B) tokens per rank, for
# F FLOP/s, B bytes/s and β bytes per value; the causal mask halves the work
# of a step (zigzag), which doubles that.
#
# **Predict:** section 3's run at CP 2 (4 layers, b = 4 sequences, s = 512,
# h = 64, fp32): how many bytes of K/V did each rank send in one step's
# forward passes? The tracer counted every call of that run (the records'
# `comm`); the next cell reads them.
#
# **CP 发送了什么。** 每一层里，每个 rank 把自己的 K/V 块（2·b·(s/N)·h_kv 个值；h_kv 是 K 的宽度，这里等于 h，
# 分组查询注意力下更小）传给邻居 N − 1 次：前向中 **每个 rank 每层 2·b·s·h_kv·(N − 1)/N 个值**。反向传的是
# K/V 连同它们的梯度，最后再把梯度送回一次：是前向的 2 + 1/(N − 1) 倍，N = 2 时为 3 倍。TP + SP 在前向中每层做两次全收集和两次归约散射，对象是 (b, s, h) 的激活：
# 每个 rank 4·b·s·h·(t − 1)/t。N = t 时，这是 h_kv = h 时 CP 发送量的两倍；按 Llama 3 的 64 个头中 8 个 K/V 头
# 算则是 8 倍。而且 TP 的集合通信夹在等待它们的矩阵乘法之间，环形注意力却是在计算这一块的同时发送下一块。
# 只要一步的注意力计算比一块数据在链路上走一趟更久，通信就被隐藏：c = s/N 个查询和键组成的完整小块需要
# 4·b·c²·h 次浮点运算，链路上要传 2·b·c·h_kv 个值，所以每个 rank 需要 c ≥ (h_kv/h)·β·F/(2B) 个 token
# （F 为每秒浮点运算数，B 为每秒字节数，β 为每个值的字节数）；因果掩码让每一步的计算量减半（zigzag），
# 这个门槛随之翻倍。
#
# **预测：** 第 3 节 CP 2 的那次运行（4 层，b = 4 条序列，s = 512，h = 64，fp32）：一步的前向中每个 rank
# 发送了多少字节的 K/V？追踪器（tracer）记录了那次运行的每一次调用（记录中的 `comm`），下一个单元格读取它们。

# %%
my_prediction = None  # ← your prediction (bytes) / 你的预测（字节）

# %%
from dtlab.planner.hardware import GPUS, LINKS

kv = [r["comm"]["send_recv.kv"] for r in ranks]
for r, sent in zip(ranks, kv):
    print(f"rank {r['rank']}: K/V forward {sent['count']} passes, {sent['wire_bytes']:,} bytes; "
          f"backward {r['comm']['send_recv.kv_grad']['wire_bytes']:,} bytes")
ok = check("07.cp_kv_bytes", my_prediction, kv[0]["wire_bytes"])
b, s, h, layers = 4, 512, 64, 4
tp_sp = layers * 4 * b * s * h * (2 - 1) // 2 * 4
print(f"TP 2 + SP on the same model and batch: {tp_sp:,} bytes in forward, "
      f"{tp_sp / kv[0]['wire_bytes']:.0f}x CP 2's / 同样模型与批次下 TP 2 + SP 的前向发送量")
peak = GPUS["H100"].peak_flops["bf16"]
for name in ("nvlink", "infiniband"):
    for label, ratio in (("h_kv = h", 1.0), ("h_kv = h/8", 1 / 8)):
        c = 2 * ratio * 2 * peak / (2 * LINKS[name].bandwidth_Bps)  # x2: causal, zigzag
        print(f"H100 bf16, {name:<10} {label:<10}: hidden from about {c:,.0f} tokens per rank / 每个 rank 约 {c:,.0f} 个 token 起可隐藏")

# %% [markdown]
# The small GPT's attention keeps the (T × T) attention weights of every head
# for backward: a·T²·B numbers per layer, more than everything else together once
# T is long. Ring attention never forms them: each step works on one tile and
# keeps only its output and one log-sum-exp per query. That is the blockwise
# online softmax of FlashAttention, and it is what removes the T² part, not the
# splitting across ranks: FlashAttention on one GPU, or selective recomputation,
# removes it at CP = 1 just as well. What CP itself does is divide the per-token
# part, sbh·34/t per layer, by N. That part is why long-context training needs
# CP: for Llama-3-8B at 131,072 tokens with TP 8, sequence parallelism and
# selective recomputation (no T² scores at all), in bf16, the planner still puts
# 73 GB of activations on each GPU (its GPT-layout formula: approximate for Llama), and with weights, gradients, optimizer state
# and logits the step peaks at 99 GB, more than an 80 GB H100 holds; at CP 8 the
# activations are 9.1 GB and the peak 28 GB.
#
# 小 GPT 的注意力为反向传播保存每个头的 (T × T) 注意力权重：每层 a·T²·B 个数，T 较长时比其余所有部分加起来
# 还多。环形注意力从不构造它们：每一步只处理一个小块，只保存输出和每个查询的一个 log-sum-exp。这正是
# FlashAttention 的分块在线 softmax；去掉 T² 部分的是它，而不是跨 rank 的切分：单卡上的 FlashAttention 或
# 选择性重计算在 CP = 1 时同样能去掉这一项。CP 本身做的，是把逐 token 的部分（每层 sbh·34/t）除以 N。长上下文
# 训练离不开 CP，原因就在这一部分：Llama-3-8B 在 131,072 个 token、TP 8 + 序列并行 + 选择性重计算（完全不存
# T² 的分数）、bf16 下，规划器给出的激活仍是每张 GPU 73 GB（按 GPT 结构的公式，对 Llama 是近似值），再加上权重、梯度、优化器状态和 logits，
# 一步的峰值达到 99 GB，超过一张 80 GB 的 H100；CP 8 时激活降到 9.1 GB，峰值 28 GB。

# %% [markdown]
# ## 4. At scale: memory per GPU against sequence length / 大规模：每张 GPU 的内存与序列长度
#
# The planner (`dtlab plan --cp N --sequence-parallel`) uses Korthikanti et al.'s
# formula, with every sequence-sized term divided by CP and, under CP, the
# attention scores left out (ring attention does not store them); it is the
# GPT layout's formula, so for Llama's SwiGLU MLP and grouped-query attention the
# figures are approximate. Move the sliders: the lines are activation memory per
# GPU for each CP degree, the dot is your choice, and the dashed line is the
# GPU's memory. The **recompute** buttons choose what is kept for backward:
# with "selective" the scores are recomputed, so no line has a T² term; with
# "none" the CP 1 line keeps them and bends up with T², while the CP lines do
# not, because ring attention never stores them (FlashAttention would remove
# them at CP 1 as well, as section 3 said).
#
# 规划器（`dtlab plan --cp N --sequence-parallel`）使用 Korthikanti 等的公式：所有与序列长度成正比的项都除以
# CP，并且在 CP 下不计注意力分数（环形注意力不保存它们）；这是按 GPT 结构推出的公式，对 Llama 的 SwiGLU MLP
# 和分组查询注意力只是近似。拖动滑块：每条线是某个 CP 并行度下每张 GPU 的激活内存，圆点是你的选择，虚线是 GPU
# 的显存容量。**recompute（重计算）** 按钮选择为反向传播保存什么：选 "selective" 时注意力分数会被重新计算，所以
# 每条线都没有 T² 项；选 "none" 时 CP 1 的线保留它们，随 T² 向上弯，而 CP 的各条线不会，因为环形注意力从不保存
# 分数（正如第 3 节所说，FlashAttention 在 CP 1 时同样能去掉它们）。

# %%
# NBVAL_IGNORE_OUTPUT
from dtlab.lab.long_context_view import LongContextMemoryView

LongContextMemoryView()

# %% [markdown]
# ## 5. Exercise: the online-softmax merge / 练习：在线 softmax 合并
#
# Attention of one query over a set of keys is a weighted sum of their values,
# with weights e^{s_j} / Σ_j e^{s_j}. Computed over one block of keys, it gives
# an output `o` (normalised over that block only) and the log of the block's
# normaliser, `lse = log Σ_{j in block} e^{s_j}`. Write
# `my_merge(o_a, lse_a, o_b, lse_b)` returning `(o, lse)`: attention over the
# union of both blocks' keys. Shapes: `o_*` is (B, heads, queries, head size),
# `lse_*` is (B, heads, queries). Avoid `exp(lse)` on its own: it overflows for
# large scores — subtract the larger of the two first.
#
# The grader plugs your function into dtlab's ring attention on 2 real ranks and
# compares outputs and gradients with full attention, with and without zigzag.
#
# 一个查询对一组键的注意力，是这些值的加权和，权重为 e^{s_j} / Σ_j e^{s_j}。在一个键块上计算时，得到一个输出
# `o`（只在该块内归一化）以及该块归一化因子的对数 `lse = log Σ_{j in block} e^{s_j}`。请写出
# `my_merge(o_a, lse_a, o_b, lse_b)`，返回 `(o, lse)`：在两个块所有键上的注意力。形状：`o_*` 为
# (B, 头数, 查询数, 头维度)，`lse_*` 为 (B, 头数, 查询数)。不要单独计算 `exp(lse)`：分数很大时会溢出——先减去
# 两者中较大的那个。
#
# 评分程序会把你的函数放进 dtlab 在 2 个真实 rank 上运行的环形注意力中，并在使用和不使用 zigzag 两种情况下，
# 把输出和梯度与完整注意力比较。

# %%
import torch

def my_merge(o_a, lse_a, o_b, lse_b):
    # your code here / 在这里写你的代码
    raise NotImplementedError


# %%
passed = grade("07.merge", my_merge)

# %% [markdown]
# ## Try this / 试一试
#
# 1. In section 3, run `TrainConfig(cp=2, tp=2, sp=True, **base)` (4 ranks).
#    Is the loss still that of one process, and which ranks share a `cp` group?
#    (Answer: yes; ranks 0 and 2, 1 and 3 — TP is innermost.)
# 2. `dtlab plan --model llama3-8b --seq-len 131072 --tp 8 --sequence-parallel --cp 8 --recompute selective --precision bf16`
#    on the command line: how do the activations compare with `--cp 1`?
#    (Answer: exactly 8 times smaller, 73 GB against 9.1 GB per GPU: selective
#    recomputation already leaves the attention scores out at `--cp 1`, so every
#    remaining term is per-token, and CP divides each by 8.)
# 3. Switch zigzag off to see the imbalance it removes: in the Step view at
#    N = 8 without zigzag, how many tiles does the last rank compute while rank 0
#    computes one? (Answer: 8, each of (T/N)²: 7 full ones and its own diagonal
#    one, 7.5 tiles of work against rank 0's 0.5; with zigzag every rank computes
#    17 tiles of (T/2N)², 15 full and 2 diagonal, the work of 4 full (T/N)² tiles:
#    N²/2 = 32 in all, as without zigzag.)
#
# 1. 在第 3 节运行 `TrainConfig(cp=2, tp=2, sp=True, **base)`（4 个 rank）。损失是否仍与单进程相同？哪些 rank
#    同属一个 `cp` 组？（答案：相同；rank 0 和 2、1 和 3——TP 在最内层。）
# 2. 在命令行运行 `dtlab plan --model llama3-8b --seq-len 131072 --tp 8 --sequence-parallel --cp 8 --recompute selective --precision bf16`：激活与 `--cp 1`
#    相比如何？（答案：恰好小 8 倍，每张 GPU 73 GB 对 9.1 GB：选择性重计算在 `--cp 1` 时就已经不存注意力分数，
#    剩下的每一项都是逐 token 的，CP 把每一项都除以 8。）
# 3. 关掉 zigzag，看看它消除的不均衡：在 Step 视图中 N = 8 且关闭 zigzag 时，rank 0 计算 1 个小块，最后一个
#    rank 计算多少个？（答案：8 个，每个 (T/N)²：7 个完整的加上它自己对角线上的 1 个，计算量 7.5 个小块，而
#    rank 0 只有 0.5 个；打开 zigzag 时每个 rank 计算 17 个 (T/2N)² 的小块，15 个完整、2 个在对角线上，相当于
#    4 个完整的 (T/N)² 小块：合计 N²/2 = 32，与不用 zigzag 时相同。）

# %% [markdown]
# ## Check / 检查
#
# The last cell repeats this lesson's results as one deterministic summary.
# 最后一个单元格把本课的结果汇总成一个确定的结论。

# %%
results = {
    "sequence parallelism: the same loss as the dense model, fewer activations than TP alone"
    " / 序列并行：损失与稠密模型相同，激活值比单用 TP 少":
        all(r["losses_agree"] for r in sp) and saved > 0,
    "ring attention on 4 ranks equals full attention and follows its schedule"
    " / 4 个 rank 上的环形注意力等于完整注意力，并按调度执行":
        all(r["equal"] and r["trace_is_schedule"] for r in ring),
    "zigzag gives every rank the same number of tiles / zigzag 让每个 rank 计算的块数相同":
        len(set(tiles_per_rank(4, True))) == 1 and len(set(tiles_per_rank(4, False))) > 1,
    "CP 2 trains the losses of one process / CP 2 的损失与单进程相同": same,
    "CP 2 sends 2·b·s·h·(N−1)/N K/V values per layer forward / CP 2 每层前向发送 2·b·s·h·(N−1)/N 个 K/V 值":
        all(k["wire_bytes"] == layers * 2 * b * s * h // 2 * 4 for k in kv),
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 07:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
