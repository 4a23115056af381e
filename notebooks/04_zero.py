# %% [markdown]
# # Lesson 04 — ZeRO: data parallelism without the copies
# # 第 04 课 —— ZeRO：不再复制的数据并行
#
# **What you will see.** Plain data parallelism gives every rank the same
# **model states**: all the parameters, all the gradients and all of Adam's
# optimizer state. **ZeRO**, the Zero Redundancy Optimizer (Rajbhandari et al.,
# 2019), keeps the data-parallel training exactly as it is but stops the copying,
# one kind of state per stage: stage 1 shards the optimizer state over the N
# data-parallel ranks, stage 2 the gradients too, stage 3 the parameters too.
# You will reproduce the paper's Figure 1 with its formula, predict the bytes
# each of 4 ranks holds for the small GPT at every stage and measure them on real
# runs, count what each stage communicates, and step through stage 3 layer by
# layer: the idea PyTorch ships as **FSDP** (Fully Sharded Data Parallel).
#
# **你将看到什么。** 普通的数据并行让每个 rank 都保存同样的 **模型状态**（model states）：全部参数、
# 全部梯度以及 Adam 优化器的全部状态。**ZeRO**，即零冗余优化器（Zero Redundancy Optimizer，
# Rajbhandari 等，2019），让数据并行的训练过程保持原样，只是不再复制，每个阶段多切分一种状态：
# 阶段 1 把优化器状态切分到 N 个数据并行 rank 上，阶段 2 连梯度也切分，阶段 3 连参数也切分。
# 你会用论文的公式复现它的图 1，预测小 GPT 在每个阶段下 4 个 rank 各持有多少字节，并在真实运行中
# 测量；再统计每个阶段的通信量，最后逐层单步查看阶段 3 的执行过程——PyTorch 以 **FSDP**
# （全分片数据并行，Fully Sharded Data Parallel）的名字提供的正是这个思路。

# %%
import dtlab
from dtlab import TrainConfig
from dtlab.config import MODEL_PRESETS
from dtlab.planner.communication import ring_bytes_sent_per_rank
from dtlab.launch import run
from dtlab.lab import Dashboard, check
from dtlab.lab.zero_view import FigureOne, Stage3Stepper, ZeroExplorer
from dtlab.course.experiments import zero as zero_lesson
from dtlab.course.exercises import grade
from dtlab.planner import model_states_bytes

PSI = MODEL_PRESETS["small"].param_count()   # Ψ: parameters of the small GPT
print(f"Ψ = {PSI:,} parameters / 个参数")

# %% [markdown]
# ## 1. The formula: ZeRO's Figure 1 / 公式：ZeRO 论文的图 1
#
# For Ψ parameters trained with Adam in mixed precision, every data-parallel rank
# keeps 2Ψ bytes of 16-bit parameters, 2Ψ bytes of 16-bit gradients and KΨ bytes
# of optimizer state, K = 12: the fp32 master weights, momentum and variance
# (Sec. 3.1). With N_d ranks the stages divide them:
#
# | stage | parameters | gradients | optimizer state |
# |---|---|---|---|
# | 0 (plain DP) | 2Ψ | 2Ψ | KΨ |
# | 1 (P_os) | 2Ψ | 2Ψ | KΨ / N_d |
# | 2 (P_os+g) | 2Ψ | 2Ψ / N_d | KΨ / N_d |
# | 3 (P_os+g+p) | 2Ψ / N_d | 2Ψ / N_d | KΨ / N_d |
#
# `model_states_bytes(params, dp=, zero=, precision=)` in `dtlab/planner/formulas.py` is
# this table.
#
# dtlab keeps exactly this split for fp16 and bf16 (lesson 03: the fp32 master
# in the optimizer), and its memory record names the parts: `params` and `grads`
# (16-bit), `master` (the fp32 master, 4Ψ) and `optimizer` (Adam's moments, 8Ψ);
# master and optimizer together are the paper's K. Section 4 measures Figure 1
# on real ranks. With `--master-weights model` (PyTorch AMP, FSDP's
# MixedPrecision) the fp32 module is the master: 18Ψ at stage 0, the masters
# sharded only at stage 3 (`dtlab_model_states_bytes` is that split).
#
# **Predict** the model states per GPU, in GB, for Ψ = 7.5 billion on N_d = 64
# GPUs at stages 0, 1, 2 and 3 (the paper's Figure 1).
#
# 对于用 Adam 做混合精度训练的 Ψ 个参数，每个数据并行 rank 要保存 2Ψ 字节的 16 位参数、2Ψ 字节的
# 16 位梯度，以及 KΨ 字节的优化器状态，K = 12：fp32 主权重、动量和方差（第 3.1 节）。有 N_d 个 rank
# 时，各阶段按上表切分。`dtlab/planner/formulas.py` 里的 `model_states_bytes(params, dp=, zero=, precision=)`
# 就是这张表。
#
# dtlab 对 fp16 和 bf16 保存的正是这种划分（第 03 课：fp32 主权重放在优化器里），它的内存记录把各部分分别命名：
# `params` 和 `grads`（16 位）、`master`（fp32 主权重，4Ψ）和 `optimizer`（Adam 的动量和方差，8Ψ）；
# master 与 optimizer 合起来就是论文中的 K。第 4 节会在真实的 rank 上测量图 1。若用 `--master-weights model`
# （PyTorch AMP、FSDP 的 MixedPrecision 的做法），fp32 模块本身就是主权重：阶段 0 是 18Ψ，主权重只在阶段 3
# 才分片（`dtlab_model_states_bytes` 就是这种划分）。
#
# **预测：** Ψ = 75 亿、N_d = 64 张 GPU 时，阶段 0、1、2、3 每张 GPU 的模型状态各是多少 GB
# （论文的图 1）？

# %%
my_prediction_gb = None  # ← your prediction: [stage 0, 1, 2, 3] in GB / 你的预测：[阶段 0, 1, 2, 3]，单位 GB

figure1 = []
for stage in range(4):
    states = model_states_bytes(7_500_000_000, dp=64, zero=stage, precision="bf16")
    figure1.append(round(sum(states.values()) / 1e9, 1))
ok = check("04.figure1_gb", my_prediction_gb, figure1, source="formula")

# %% [markdown]
# ## 2. The small GPT on 4 ranks / 4 个 rank 上的小 GPT
#
# dtlab trains in fp32 here, so there is no separate master copy: 4 bytes per
# parameter, 4 per gradient and 8 for Adam's two moments, 16Ψ in all per rank
# under plain DP. Each stage shards one more of the three over the N = 4 ranks.
#
# A shard is ceil(Ψ / N) elements: ZeRO lays the values end to end in one flat
# buffer and pads it with zeros to a multiple of N, so that every rank gets an
# equal piece (the collectives need equal pieces). The padding sits in the last
# shard and is allocated, so it counts. For this model Ψ = 236,928 divides by 4
# exactly.
#
# **Predict** the bytes of model states (parameters + gradients + optimizer
# state) that each rank holds at stages 0, 1, 2 and 3 with DP = 4.
#
# 这里 dtlab 用 fp32 训练，所以没有单独的主权重副本：每个参数 4 字节，每个梯度 4 字节，Adam 的两个
# 动量共 8 字节；普通数据并行下每个 rank 总共 16Ψ。每个阶段多把其中一项切分到 N = 4 个 rank 上。
#
# 一个分片有 ceil(Ψ / N) 个元素：ZeRO 把所有值首尾相接放进一个扁平缓冲区，并用零填充到 N 的整数倍，
# 使每个 rank 分到同样大小的一块（集合通信需要大小相同的块）。填充位于最后一个分片中，并且真的分配了
# 内存，所以也要计入。对这个模型来说，Ψ = 236,928 正好能被 4 整除。
#
# **预测：** DP = 4 时，阶段 0、1、2、3 下每个 rank 持有的模型状态（参数 + 梯度 + 优化器状态）各是
# 多少字节？

# %%
my_prediction = None  # ← your prediction: [stage 0, 1, 2, 3] in bytes / 你的预测：[阶段 0, 1, 2, 3]，单位字节

# %% [markdown]
# Four real runs follow, one per stage, each 3 steps of DP = 4 on the warm pool.
# The memory plot shows each rank's states as the run streams.
#
# 下面是四次真实运行，每个阶段一次，每次在预热好的进程池上以 DP = 4 训练 3 步。内存图会在运行过程中
# 实时显示每个 rank 的状态。

# %%
# NBVAL_IGNORE_OUTPUT
dash = Dashboard()
dash

# %%
runs = {}
for stage in range(4):
    runs[stage] = dash.watch(dtlab.train(TrainConfig(dp=4, zero=stage, steps=3, seed=0)),
                             label=f"ZeRO-{stage} / ZeRO 阶段 {stage}")

measured, formula = [], []
print(f"{'stage':>5} {'params':>10} {'grads':>10} {'optimizer':>10} {'total':>10} {'formula':>10}"
      "   (阶段 / 参数 / 梯度 / 优化器 / 合计 / 公式)")
for stage, r in runs.items():
    ranks = r.records[-1]["ranks"]
    states = [{k: rank["mem"][k] for k in ("params", "grads", "optimizer")} for rank in ranks]
    assert all(s == states[0] for s in states), "every rank holds the same amount / 每个 rank 持有的量相同"
    measured.append(sum(states[0].values()))
    formula.append(sum(model_states_bytes(PSI, dp=4, zero=stage, precision="fp32").values()))
    print(f"{stage:>5} {states[0]['params']:>10,} {states[0]['grads']:>10,} {states[0]['optimizer']:>10,} "
          f"{measured[-1]:>10,} {formula[-1]:>10,}")
ok = check("04.states_bytes", my_prediction, measured)
print("measured equals the formula / 实测等于公式:", measured == formula)
losses_agree = max(abs(a - b) for s in (1, 2, 3) for a, b in zip(runs[s].losses(), runs[0].losses())) < 1e-4
print("every stage trains the same loss curve / 每个阶段的损失曲线相同:", losses_agree)

# %% [markdown]
# The loss curves lie on top of each other: ZeRO changes *where* the states
# live, not the arithmetic. Stage 3 ends at a quarter of plain DP: 16Ψ / N.
#
# 几条损失曲线重合在一起：ZeRO 改变的是状态 *存放在哪里*，而不是计算本身。阶段 3 最终只剩普通数据
# 并行的四分之一：16Ψ / N。
#
# ## 3. What each stage communicates / 每个阶段的通信量
#
# Count in units of one full gradient (Ψ values), as the paper does (Sec. 7):
# a reduce-scatter or an all-gather of the whole tensor counts Ψ, an all-reduce
# (a reduce-scatter plus an all-gather) 2Ψ. Work out which of them each stage
# needs: what must every rank have before its optimizer step, and, once the
# shards are updated, before the next forward? The cell below then counts the
# calls and bytes of each run above.
#
# **Predict** the volume per rank per step for stages 0 to 3 in units of Ψ, as
# dtlab implements them, and the ratio of stage 3 to plain DP.
#
# 按论文的方式（第 7 节），以一个完整梯度（Ψ 个值）为单位计数：对整个张量做一次归约散射（reduce-scatter）
# 或全收集（all-gather）记为 Ψ，做一次全归约（all-reduce，即归约散射加全收集）记为 2Ψ。
# 请推一推每个阶段各需要哪些集合通信：每个 rank 在优化器更新之前必须拿到什么？分片更新之后、下一次前向
# 之前又必须拿到什么？下面的单元格会统计上面每次运行的调用次数和字节数。
#
# **预测：** 按 dtlab 的实现，阶段 0 到 3 每个 rank 每步的通信量各是多少个 Ψ？阶段 3 与普通数据并行
# 之比是多少？

# %%
my_prediction_volume = None  # ← your prediction: [stage 0, 1, 2, 3] in Ψ / 你的预测：[阶段 0, 1, 2, 3]，单位 Ψ
my_prediction_ratio = None   # ← your prediction: a ratio / 你的预测：一个比值

# Paper's count: an all-reduce moves the tensor twice, a reduce-scatter or all-gather once.
TIMES = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}
volume = []
for stage, r in runs.items():
    comm = {kind: c for kind, c in r.records[-1]["ranks"][0]["comm"].items() if kind in TIMES}   # the DP/ZeRO traffic
    volume.append(sum(TIMES[kind] * c["bytes"] for kind, c in comm.items()) / (4 * PSI))
    sent = sum(ring_bytes_sent_per_rank(c["bytes"], 4, kind) for kind, c in comm.items())
    print(f"stage {stage} / 阶段 {stage}: calls / 调用 {({k: c['count'] for k, c in comm.items()})}, "
          f"bytes / 字节 {({k: c['bytes'] for k, c in comm.items()})}")
    print(f"         = {volume[-1]:g} Ψ; on a ring each rank sends (N-1)/N of it: {int(sent):,} bytes (formula) "
          f"/ 环形算法中每个 rank 发送其中的 (N-1)/N（公式）")
ok = check("04.volume", my_prediction_volume, volume)
ok = check("04.stage3_ratio", my_prediction_ratio, volume[3] / volume[0])

# %% [markdown]
# What the counts show:
#
# * plain DP all-reduces the gradient: a reduce-scatter plus an all-gather, **2Ψ**;
# * the paper's stages 1 and 2 reduce-scatter the gradient (Ψ), update their
#   shard, and all-gather the updated parameters (Ψ): **2Ψ, the same as DP**;
# * stage 3 all-gathers the parameters twice, in forward and again in
#   backward, and reduce-scatters the gradients once: **3Ψ, 1.5x DP**.
#
# Read `reduce_gradients` in `dtlab/parallel/zero/stage12.py` to see it: stage 1 keeps a whole
# gradient buffer on every rank (that memory is what stage 2 saves), yet it only
# reduce-scatters, because each rank's optimizer needs the averaged gradient of
# its own shard and nothing else.
#
# 这些计数说明：
#
# * 普通数据并行对梯度做全归约：一次归约散射加一次全收集，**2Ψ**；
# * 论文中的阶段 1 和 2 对梯度做归约散射（Ψ），更新自己的分片，再全收集更新后的参数（Ψ）：
#   **2Ψ，与数据并行相同**；
# * 阶段 3 在前向和反向中各全收集一次参数，再对梯度做一次归约散射：**3Ψ，是数据并行的
#   1.5 倍**。
#
# 读一读 `dtlab/parallel/zero/stage12.py` 里的 `reduce_gradients` 就能看到：阶段 1 在每个 rank 上保留一整块梯度缓冲区
# （阶段 2 省下的正是这块内存），但它只做归约散射，因为每个 rank 的优化器只需要自己那一片的平均梯度。
#
# Stage 3's 16 all-gathers and 8 reduce-scatters are per **unit**: each of the 8
# pieces of the model (the two embeddings, token and position; 4 blocks; the
# final LayerNorm; the head) is gathered
# once in forward and once in backward, and its gradient reduce-scattered once.
#
# 阶段 3 的 16 次全收集和 8 次归约散射是按 **单元**（unit）计的：模型的 8 个部分（两个
# 嵌入层，即词嵌入和位置嵌入；4 个 block；最后的 LayerNorm；输出头）在前向和反向中各被全收集一次，它的梯度被
# 归约散射一次。
#
# Stage 2's 4 reduce-scatters and 4 all-gathers are per **bucket**: `dtlab train`
# runs stage 2 as DeepSpeed's `overlap_comm` does. The flat gradient is cut into
# windows of `--bucket-mb` (0.25 MiB, so 4 windows for the small GPT's 0.9 MiB),
# each window sharded N ways on its own, and each is reduce-scattered during
# backward as soon as its gradients exist. A rank then holds its 1/N shard and at
# most two buckets, never the whole gradient, and the bytes are those of one
# reduce-scatter of the whole buffer. Stage 1 keeps the whole gradient anyway, so
# it sends it once, after backward.
#
# 阶段 2 的 4 次归约散射和 4 次全收集是按 **桶**（bucket）计的：`dtlab train` 像 DeepSpeed
# 的 `overlap_comm` 那样运行阶段 2。扁平梯度按 `--bucket-mb`（0.25 MiB，小 GPT 的 0.9 MiB 梯度因此分成
# 4 个窗口）切成若干窗口，每个窗口各自切成 N 份，一旦其梯度齐全就在反向传播中归约散射。于是一个 rank
# 只持有自己 1/N 的分片和至多两个桶，从不持有完整梯度，字节数与对整个缓冲区做一次归约散射相同。
# 阶段 1 本来就保留完整梯度，所以在反向传播之后一次发送。
#
# ## 4. Figure 1, measured: bf16 on 4 ranks / 实测图 1：4 个 rank 上的 bf16
#
# Section 2 trained in fp32. Now the same four stages train the small GPT in
# bf16, where the record holds the paper's four parts: 16-bit `params` and
# `grads`, the fp32 `master` and Adam's `optimizer` state, (2 + 2 + 4 + 8)Ψ.
# Stage 0 is 16Ψ again, as in fp32; but stage 1 now shards 12 of the 16 bytes
# (the master goes with Adam's moments), not 8.
#
# **Predict** rank 0's bytes of `[params, grads, master, optimizer]` at each
# stage, DP = 4, Ψ = 236,928: a list of four lists.
#
# 第 2 节用 fp32 训练。现在用 bf16 把同样的四个阶段再训练一遍，这时记录中正好是论文的四部分：16 位的
# `params` 和 `grads`、fp32 的 `master` 以及 Adam 的 `optimizer` 状态，共 (2 + 2 + 4 + 8)Ψ。阶段 0 和 fp32
# 一样是 16Ψ；但阶段 1 现在切分的是 16 字节中的 12 字节（主权重跟 Adam 的动量一起切分），而不是 8 字节。
#
# **预测：** DP = 4、Ψ = 236,928 时，每个阶段 rank 0 的 `[params, grads, master, optimizer]` 各是多少字节？
# 答案是由四个列表组成的列表。

# %%
my_prediction_figure1 = None  # ← your prediction: [[params, grads, master, optimizer] per stage] / 你的预测

bf16_runs = {}
for stage in range(4):
    bf16_runs[stage] = dash.watch(dtlab.train(TrainConfig(dp=4, zero=stage, precision="bf16", steps=3, seed=0)),
                                  label=f"ZeRO-{stage}, bf16")
figure_one = FigureOne(bf16_runs)
held = [list(figure_one.held[stage].values()) for stage in range(4)]
for stage, parts in enumerate(held):
    paper = sum(model_states_bytes(PSI, dp=4, zero=stage, precision="bf16").values())
    print(f"stage {stage} / 阶段 {stage}: {parts} = {sum(parts):,} bytes; the paper's formula {paper:,} / 论文公式")
ok = check("04.figure1_measured", my_prediction_figure1, held)
figure1_equal = all(sum(held[s]) == sum(model_states_bytes(PSI, dp=4, zero=s, precision="bf16").values())
                    for s in range(4))
print("every stage equals (2 + 2 + K)Ψ split N ways / 每个阶段都等于按 N 切分的 (2 + 2 + K)Ψ:", figure1_equal)

# %%
# NBVAL_IGNORE_OUTPUT
figure_one

# %% [markdown]
# The bars are the paper's Figure 1 for the small GPT, from the runs' own
# records: stage 1 cuts the yellow and green parts (K) to a quarter, stage 2 the
# gradients too, stage 3 everything. Against section 2's fp32 runs, stage 1 here
# holds 7Ψ instead of 10Ψ: the master weights are optimizer state, so P_os
# shards them.
#
# 这些柱子就是小 GPT 的论文图 1，数据来自运行自己的记录：阶段 1 把黄色和绿色部分（K）切成四分之一，阶段 2
# 再切梯度，阶段 3 切全部。和第 2 节的 fp32 运行相比，这里阶段 1 持有 7Ψ 而不是 10Ψ：主权重属于优化器状态，
# 所以 P_os 会切分它们。
#
# ## 5. Stage 3, layer by layer / 阶段 3，逐层查看
#
# Between layers, a stage-3 rank keeps only its 1/N shard of every unit. Just
# before a unit computes, an all-gather rebuilds its whole parameters; right
# after, they are freed. Backward runs the units in reverse: gather again,
# compute the gradients, reduce-scatter them so each rank keeps the averaged
# gradient of its own shard, free. PyTorch's FSDP (`fully_shard` applied per
# block) works the same way.
#
# **Predict:** at most how many bytes of *gathered* whole parameters does one
# rank hold at any moment? (A block has 12d² + 13d = 49,984 parameters for d = 64;
# the token embedding and the head have 16,384 each, the position embedding 4,096.)
#
# 在层与层之间，阶段 3 的 rank 只保留每个单元的 1/N 分片。某个单元计算之前，一次全收集把它的完整
# 参数拼回来；计算一结束就释放。反向按相反的顺序处理各个单元：再全收集一次，计算梯度，再用
# 归约散射让每个 rank 只保留自己那一片的平均梯度，然后释放。PyTorch 的 FSDP（对每个 block
# 应用 `fully_shard`）也是这样工作的。
#
# **预测：** 一个 rank 在任何时刻最多持有多少字节 *已收集的* 完整参数？（d = 64 时一个 block 有
# 12d² + 13d = 49,984 个参数；词嵌入和输出头各有 16,384 个，位置嵌入有 4,096 个。）

# %%
my_prediction_peak = None  # ← your prediction: bytes, an integer / 你的预测：字节数（整数）

traces = run(zero_lesson.stage3_trace, 4)
trace = traces[0]
print(f"{'unit / 单元':>11} {'Ψ_u':>7} {'shard S / 分片':>14}")
for u in trace["units"]:
    print(f"{u['name']:>11} {u['numel']:>7,} {u['shard']:>14,}")
print("order / 顺序:", " ".join(f"{e['action']}:{e['unit']}" for e in trace["events"][:4]), "...")
print(f"shards kept between layers / 层间保留的分片: {trace['shard_bytes']:,} bytes = 4Ψ/N: {trace['shard_bytes'] == PSI}")
ok = check("04.peak_gathered", my_prediction_peak, trace["peak"])
one_at_a_time = all(len(e["held_units"]) <= 1 for t_ in traces for e in t_["events"])
print("never more than one unit gathered at once / 任何时刻最多只收集一个单元:", one_at_a_time)

# %% [markdown]
# **Predict:** after 17 events (the forward pass is 16: a gather and a free for
# each of the 8 units), which unit is gathered — the first one backward needs?
#
# **预测：** 经过 17 个事件之后（前向传播占 16 个：8 个单元各一次 gather 和一次释放），哪个单元处于
# 已收集状态——也就是反向传播最先需要的那个？

# %%
my_prediction_first_backward = None  # ← your prediction: a list with one unit name / 你的预测：含一个单元名的列表

# %%
stepper = Stage3Stepper(trace)
for _ in range(17):
    stepper.step()
ok = check("04.first_backward", my_prediction_first_backward, stepper.held_now())
stepper.reset()

# %% [markdown]
# Now walk through it yourself: press **Step** to go through rank 0's events one
# at a time. The blue bars are the shards it always keeps, the orange bar the
# unit whose whole parameters exist at that moment. **Reset** starts again
# before the forward pass.
#
# 现在自己走一遍：按 **Step**（前进一步）逐个查看 rank 0 的事件。蓝色条是它一直保留的分片，橙色条是此刻
# 完整参数存在的那个单元。按 **Reset**（重置）回到前向传播之前。

# %%
# NBVAL_IGNORE_OUTPUT
stepper

# %% [markdown]
# **Prefetch.** Gathering each unit just before it computes, and waiting for
# it, leaves the network idle while a unit computes and the unit idle while the
# network works. FSDP2 overlaps the two: before a unit computes, it issues the
# *next* unit's all-gather asynchronously (in backward the unit before it: it
# records the forward order and prefetches in reverse). dtlab's `ZeroStage3`
# does the same with `prefetch=1` (`dtlab train --zero 3 --zero3-prefetch 1`;
# the figures above are `prefetch=0`). The price is memory: two units gathered
# at once. The all-gathers, their bytes and every gradient stay the same.
#
# **预取。** 每个单元在计算前才收集并等待，意味着单元计算时网络空闲、网络传输时单元空闲。FSDP2 让二者重叠：
# 一个单元计算之前，先异步发出 *下一个* 单元的全收集（反向时是它前面的单元：FSDP2 记录前向的顺序，
# 反向时按相反顺序预取）。dtlab 的 `ZeroStage3` 在 `prefetch=1` 时也这样做（`dtlab train --zero 3
# --zero3-prefetch 1`；上面的数字是 `prefetch=0` 的）。代价是内存：同时收集两个单元。全收集的次数、
# 字节数和每个梯度都不变。

# %%
ahead = run(zero_lesson.stage3_trace, 4, prefetch=1)[0]
print(f"prefetch 1: most gathered bytes at once / 同时收集的最多字节: {ahead['peak']:,} "
      f"= two blocks / 两个 block: {ahead['peak'] == 2 * trace['peak']}")
print("same all-gathers and bytes as prefetch 0 / 全收集次数与字节数和 prefetch 0 相同:",
      ahead["comm"] == trace["comm"])

# %% [markdown]
# ## 6. Sliders: any stage, any DP degree / 滑块：任意阶段、任意数据并行度
#
# Each slider move starts a 2-step run on the warm pool and draws every rank's
# measured parameters, gradients and optimizer state, with the paper's formula
# for the same model as the last, paler bar.
#
# At DP = 3 the two can differ by a few bytes. Stages 1 and 2 shard one flat
# buffer of Ψ values, but stage 3 pads **each unit** to a multiple of N, so a
# rank's shard of each unit is ceil(Ψ_u / N) elements, and the ranks before the
# last hold that many real values of every unit: more, in all, than ceil(Ψ / N).
# The last rank's shards end in the padding, allocated like any other memory.
# (Adam's two moments are kept per parameter shard, and padding belongs to no
# parameter: the last rank measures 8 bytes less for each padding element than
# it would for a real one.)
#
# **Predict** how many bytes rank 0 of stage 3 at DP = 3 measures above the
# formula (16 bytes per element held: parameter, gradient, two moments).
#
# 每次拖动滑块都会在预热好的进程池上启动一次 2 步的运行，并画出每个 rank 实测的参数、梯度和优化器
# 状态；最后一根颜色较浅的柱子是同一模型按论文公式算出的值。
#
# DP = 3 时两者可能相差几个字节。阶段 1 和 2 切分的是一个包含 Ψ 个值的扁平缓冲区，而阶段 3 把 **每个
# 单元** 分别填充到 N 的整数倍，所以每个单元的一个分片有 ceil(Ψ_u / N) 个元素，最后一个 rank 之前的各个 rank
# 持有每个单元这么多个真实的值：加起来比 ceil(Ψ / N) 多。最后一个 rank 的分片末尾是填充，它和其他内存一样
# 真实地被分配了。（Adam 的两个动量按参数分片保存，而填充不属于任何参数：每个填充元素让最后一个 rank 比真实
# 元素少测得 8 字节。）
#
# **预测：** DP = 3 的阶段 3 中，rank 0 实测比公式多出多少字节？（每个持有的元素占 16 字节：参数、
# 梯度、两个动量。）

# %%
my_prediction_padding = None  # ← your prediction: bytes, an integer / 你的预测：字节数（整数）

# %%
explorer = ZeroExplorer(stage=3, dp=3)
result = explorer.measure(3, 3)
per_rank = [sum(m.values()) for m in result["measured"]]
print("measured per rank / 每个 rank 实测:", per_rank)
print("formula / 公式:", sum(result["formula"].values()))
ok = check("04.padding", my_prediction_padding, per_rank[0] - sum(result["formula"].values()))

# %% [markdown]
# Now move the sliders yourself. / 现在自己拖动滑块试试。

# %%
# NBVAL_IGNORE_OUTPUT
explorer


# %% [markdown]
# ## 7. Exercise: a shard and its reduce-scatter / 练习：一个分片及其归约散射
#
# Write `zero_shard(flat_grad, rank, size)`. `flat_grad` is this rank's own
# gradient, all parameters end to end, Ψ values (not padded). Return
# `(start, stop, shard)`: the bounds of this rank's shard in the flat buffer
# padded with zeros to a multiple of `size` (equal shards, as above), and that
# shard of the gradient *averaged over the ranks*. One collective is enough, and
# it is not an all-reduce. `grade` runs it on 4 real ranks with Ψ = 1089 (so the
# last shard is padded) and compares with what dtlab's ZeRO stage 2 leaves in its
# shard's gradient for the same gradients.
#
# 写出 `zero_shard(flat_grad, rank, size)`。`flat_grad` 是本 rank 自己的梯度，所有参数首尾相接，共 Ψ 个值
# （未填充）。返回 `(start, stop, shard)`：本 rank 的分片在用零填充到 `size` 整数倍的扁平缓冲区中的边界
# （与上文一样是等大的分片），以及该分片 *在所有 rank 上平均后* 的梯度。一次集合通信就够了，而且不是
# 全归约。`grade` 在 4 个真实 rank 上以 Ψ = 1089 运行它（所以最后一个分片有填充），并与 dtlab 的
# ZeRO 阶段 2 在同样的梯度下留在其分片梯度中的结果比较。

# %%
def zero_shard(flat_grad, rank, size):
    # flat_grad: (Ψ,) this rank's gradient; return (start, stop, shard of the mean gradient)
    # flat_grad：(Ψ,) 本 rank 的梯度；返回 (start, stop, 平均梯度的分片)
    raise NotImplementedError  # your code here / 在这里写你的代码


solved = grade("04.shard", zero_shard)

# %% [markdown]
# ## 8. Try this / 动手试试
#
# 1. Slide DP to 1: every stage holds the same 16Ψ (sharding over one rank
#    divides by one). Then DP = 2 and stage 1: which bar shrank? (Answer: the
#    optimizer's, to half: stage 1 shards Adam's moments; the explorer trains
#    in fp32, which keeps no separate master.)
# 2. **Task:** stage 3 in bf16 shards, gathers and reduce-scatters the 16-bit
#    parameters and gradients, while the fp32 masters stay in the optimizer.
#    How many bytes does one step all-gather at DP = 4? The cell trains 2 steps
#    to check.
# 3. **Task:** PyTorch's `ZeroRedundancyOptimizer`, used beside DDP, all-reduces
#    the whole gradient (DDP does that), and after its step each rank broadcasts
#    its updated shard of the parameters to the others. How many Ψ is that per
#    step? (Then read `reduce_gradients` in `dtlab/parallel/zero/stage12.py`:
#    why can dtlab's stage 1 make do with a reduce-scatter?)
#
# 1. 把 DP 拖到 1：每个阶段都持有同样的 16Ψ（切分到一个 rank 上等于除以一）。再试 DP = 2、阶段 1：
#    哪根柱子变短了？（答案：优化器那一根，减半：阶段 1 切分 Adam 的动量；这个探索器用 fp32 训练，
#    没有单独的主权重。）
# 2. **任务：** bf16 的阶段 3 对 16 位参数和梯度做切分、全收集和归约散射，fp32 主权重则留在优化器里。
#    DP = 4 时一步全收集多少字节？单元格会训练 2 步来检查。
# 3. **任务：** PyTorch 的 `ZeroRedundancyOptimizer` 配合 DDP 使用时，先对整个梯度做全归约（这由 DDP
#    完成），优化器更新之后，每个 rank 再把自己更新好的那一片参数广播给其他 rank。每步一共是多少个 Ψ？（然后读一读 `dtlab/parallel/zero/stage12.py` 里的
#    `reduce_gradients`：为什么 dtlab 的阶段 1 只做一次归约散射就够了？）

# %%
my_answer_bf16 = None  # ← your answer: bytes, an integer / 你的答案：字节数（整数）
my_answer_zro = None   # ← your answer: a number, in Ψ / 你的答案：一个数，单位 Ψ

# %%
bf16 = dtlab.train(TrainConfig(dp=4, zero=3, precision="bf16", steps=2, seed=0)).wait()
ok = check("04.try_bf16_bytes", my_answer_bf16, bf16.records[-1]["ranks"][0]["comm"]["all_gather"]["bytes"])
# DDP's all-reduce, then N broadcasts of a 1/N shard each: Ψ in all, as one all-gather would move
zro = (TIMES["all_reduce"] * 4 * PSI + 4 * PSI) / (4 * PSI)
ok = check("04.try_zero_redundancy", my_answer_zro, zro, source="formula")

# %% [markdown]
# ## Check / 检查
#
# The last cell repeats this lesson's measurements as one deterministic result.
# 最后一个单元格把本课的测量结果汇总成一个确定的结论。

# %%
results = {
    "ZeRO Fig. 1 reproduced: 120 / 31.4 / 16.6 / 1.9 GB / 复现 ZeRO 图 1": figure1 == [120.0, 31.4, 16.6, 1.9],
    "model states per rank at DP = 4 equal the formula: 16Ψ, 10Ψ, 7Ψ, 4Ψ / DP = 4 时每个 rank 的模型状态等于公式":
        measured == formula == [16 * PSI, 10 * PSI, 7 * PSI, 4 * PSI],
    "ZeRO does not change the loss curve / ZeRO 不改变损失曲线": losses_agree,
    "Figure 1 measured in bf16: (2 + 2 + K)Ψ split N ways, to the byte / bf16 实测图 1：按 N 切分的 (2 + 2 + K)Ψ，精确到字节":
        figure1_equal,
    "stage 3 communicates 1.5x plain DP / 阶段 3 的通信量是普通数据并行的 1.5 倍": volume[3] / volume[0] == 1.5,
    "stages 1 and 2 communicate as much as plain DP / 阶段 1 和 2 的通信量与普通数据并行相同":
        volume[1] == volume[2] == volume[0],
    "stage 3 holds one unit's whole parameters at a time / 阶段 3 一次只持有一个单元的完整参数":
        one_at_a_time and trace["peak"] == 4 * 49_984,
    "stage 3 pads each unit: above the formula by less than 16 B per unit / 阶段 3 对每个单元填充：每单元比公式多不到 16 字节":
        0 <= per_rank[0] - sum(result["formula"].values()) < 16 * len(trace["units"]),
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 04:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
