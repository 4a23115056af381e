# %% [markdown]
# # Lesson 06 — Tensor parallelism
# # 第 06 课 —— 张量并行
#
# **What you will see.** Data parallelism copies the whole model onto every rank.
# **Tensor parallelism** (TP) does the opposite inside each layer: it cuts the
# layer's weight matrices into pieces, gives one piece to each rank, and lets the
# ranks compute one layer *together*. It is one form of **model parallelism**.
# You will print the piece of the small GPT's matrices each rank holds at TP 2 and
# TP 4, check that the pieces compute exactly what the whole layer computes, count
# the all-reduces one transformer block needs, and see from the planner why TP
# groups are kept inside one machine. The recipe is Megatron-LM's (Shoeybi et al.,
# 2019).
#
# **你将看到什么。** 数据并行把整个模型复制到每个 rank 上。**张量并行**（tensor
# parallelism，TP）在每一层内部反其道而行之：它把这一层的权重矩阵切成几块，每个 rank
# 拿一块，大家 *一起* 算完这一层。它是 **模型并行** 的一种。你会打印出小 GPT 的矩阵在
# TP 2 和 TP 4 时每个 rank 各持有哪一块，检验这些分块算出的结果与整层完全相同，数一数一个
# Transformer block 需要几次 all-reduce，并借助规划器看清为什么 TP 组要放在同一台机器之内。
# 这套做法来自 Megatron-LM（Shoeybi 等，2019）。

# %%
import dtlab
from dtlab.config import MODEL_PRESETS
from dtlab import Layout, TrainConfig
from dtlab.lab.timeline import StepTimeline
from dtlab.launch import run
from dtlab.lab import check, human_bytes
from dtlab.course.experiments import tensor_parallel as tp_lesson
from dtlab.course.exercises import grade

cfg = MODEL_PRESETS["small"]
print(f"small GPT: d_model C = {cfg.d_model}, heads = {cfg.n_head}, blocks = {cfg.n_layer}, "
      f"sequence length T = {cfg.seq_len}")

# %% [markdown]
# ## 1. Two ways to cut a matrix / 切分矩阵的两种方式
#
# A block's MLP is two linear layers in a row: `Y = GELU(X A)`, then `Z = Y B`,
# with A of shape C × 4C and B of shape 4C × C.
#
# * **Column-parallel** (A): each rank keeps some *columns* of A, i.e. some of
#   the output features. From the whole input X it computes its own slice of Y —
#   no communication needed, and GELU works on each slice separately.
# * **Row-parallel** (B): each rank keeps the *rows* of B that match its slice of
#   Y. Its product is a **partial sum** of Z; adding the partial sums of all ranks
#   (one all-reduce) gives Z.
#
# Attention is cut the same way: the Q, K, V projection is column-parallel *by
# heads* (each rank runs whole heads), the output projection is row-parallel.
#
# One warning about shapes: PyTorch stores a linear layer's weight transposed, as
# `(out_features, in_features)`. So a column-parallel layer cuts the **first**
# dimension of `weight`, and a row-parallel one cuts the **second**. The bias of
# a row-parallel layer is not cut: it is added once, after the sum.
#
# **Predict first:** with C = 64, what shapes does each rank hold at TP 2 and at
# TP 4 for the MLP's `fc` (C → 4C, column-parallel) and `proj` (4C → C,
# row-parallel), and how many attention heads does each rank run?
#
# 一个 block 里的 MLP 是两个连在一起的线性层：先 `Y = GELU(X A)`，再 `Z = Y B`，其中 A 的形状
# 是 C × 4C，B 是 4C × C。
#
# * **列并行**（A）：每个 rank 保留 A 的一部分 *列*，也就是一部分输出特征。它用完整的输入 X
#   算出自己那一片 Y——不需要任何通信，GELU 也可以在各自的分片上单独计算。
# * **行并行**（B）：每个 rank 保留 B 中与自己那片 Y 对应的 *行*。它的乘积是 Z 的一个
#   **部分和**；把所有 rank 的部分和加起来（一次 all-reduce）就得到 Z。
#
# 注意力层也照此切分：Q、K、V 投影 *按注意力头* 做列并行（每个 rank 负责若干个完整的头），
# 输出投影做行并行。
#
# 关于形状要提醒一句：PyTorch 把线性层的权重按转置存放，形状是 `(out_features, in_features)`。
# 所以列并行切的是 `weight` 的 **第一** 维，行并行切的是 **第二** 维。行并行层的偏置不切：
# 它在求和之后只加一次。
#
# **先预测：** C = 64 时，在 TP 2 和 TP 4 下，每个 rank 持有的 MLP `fc`（C → 4C，列并行）和
# `proj`（4C → C，行并行）是什么形状？每个 rank 运行几个注意力头？

# %%
# the form / 形式: {2: {"mlp.fc.weight": [out, in], "mlp.fc.bias": [n],
#                     "mlp.proj.weight": [out, in], "mlp.proj.bias": [n], "heads": n}, 4: {the same keys / 同样的键}}
my_prediction = None  # ← your prediction, in the form above / 你的预测，形式如上

# %%
layers = {tp: run(tp_lesson.split_one_layer, tp) for tp in (2, 4)}
for tp, ranks in layers.items():
    C = cfg.d_model
    print(f"TP {tp}: the dense block has fc.weight [{4 * C}, {C}], proj.weight [{C}, {4 * C}], "
          f"qkv.weight [{3 * C}, {C}], {cfg.n_head} heads / 稠密 block 的权重形状如左，共有 {cfg.n_head} 个注意力头")
    for r in ranks:
        shapes = ", ".join(f"{name} {shape}" for name, shape in r["shapes"].items())
        print(f"  rank {r['rank']}: {shapes}, heads / 注意力头 {r['heads']}")
measured = {tp: {**{k: v for k, v in ranks[0]["shapes"].items() if k.startswith("mlp.")}, "heads": ranks[0]["heads"]}
            for tp, ranks in layers.items()}
ok = check("06.shapes", my_prediction, measured)
same_on_every_rank = all(r["shapes"] == ranks[0]["shapes"] for ranks in layers.values() for r in ranks)
print("every rank of a group holds the same shapes / 同组每个 rank 形状相同:", same_on_every_rank)

# %% [markdown]
# ## 2. The pieces compute the whole layer / 分块算出的就是整层
#
# Each rank ran the same input through its pieces and compared with the dense
# (uncut) block built from the same seed:
#
# * its slice of `fc`'s output against the matching columns of the dense output;
# * the MLP's and the attention's output, after the all-reduce, against the dense ones.
#
# Floating-point sums in a different order can differ in the last bits, so
# "equal" here means a largest absolute difference below 10⁻⁵.
#
# **Predict:** will every rank at TP 2 and TP 4 agree with the dense layer?
#
# 每个 rank 把同一个输入送进自己的分块，再和用同一个随机种子构建的稠密（未切分）block 比较：
#
# * 它那一片 `fc` 输出，与稠密输出中对应的那些列比较；
# * MLP 和注意力在 all-reduce 之后的输出，与稠密版本的输出比较。
#
# 浮点数换一种顺序相加，最后几位可能不同，所以这里的“相等”是指最大绝对误差小于 10⁻⁵。
#
# **预测：** TP 2 和 TP 4 下的每个 rank 都会与稠密层一致吗？

# %%
my_prediction = None  # ← your prediction: True or False / 你的预测：True 或 False

TOL = 1e-5
for tp, ranks in layers.items():
    for r in ranks:
        print(f"TP {tp} rank {r['rank']}: fc slice equal / fc 分片一致 {r['column_slice_diff'] < TOL}, "
              f"MLP equal / MLP 一致 {r['mlp_diff'] < TOL}, attention equal / 注意力一致 {r['attention_diff'] < TOL}")
layer_equal = all(max(r["column_slice_diff"], r["mlp_diff"], r["attention_diff"]) < TOL
                  for ranks in layers.values() for r in ranks)
ok = check("06.layer_equal", my_prediction, layer_equal)

# %% [markdown]
# ## 3. Communication per block: f and g / 每个 block 的通信：f 与 g
#
# Megatron-LM names the two places where a block communicates:
#
# * **g** sits where the partial sums leave a row-parallel layer: an all-reduce
#   in the forward pass, nothing in the backward pass.
# * **f** sits where the replicated input enters a column-parallel layer: nothing
#   in the forward pass, an all-reduce in the backward pass. Every rank's slice
#   used the whole input, so the input's gradient is the sum of every rank's share.
#
# A block has two such regions, attention and the MLP. Each all-reduce carries the
# block's whole activation, shape (B, T, C).
#
# **Predict:** for one block at TP 4, how many all-reduces in the forward pass,
# how many in the backward pass, and how many bytes does each one carry for
# B = 2, T = 64, C = 64 in fp32 (4 bytes per number)? And for the whole model
# of 4 blocks?
#
# Megatron-LM 给 block 中通信的两个位置起了名字：
#
# * **g** 位于部分和离开行并行层的地方：前向传播时做一次 all-reduce，反向传播时什么都不做。
# * **f** 位于复制的输入进入列并行层的地方：前向传播时什么都不做，反向传播时做一次 all-reduce。
#   因为每个 rank 的那一片都用到了完整的输入，所以输入的梯度是所有 rank 的贡献之和。
#
# 一个 block 有两个这样的区域：注意力和 MLP。每次 all-reduce 传输的都是这个 block 的完整激活值，
# 形状为 (B, T, C)。
#
# **预测：** TP 4 下的一个 block，前向传播有几次 all-reduce，反向传播有几次？B = 2、T = 64、
# C = 64、fp32（每个数 4 字节）时，每次传输多少字节？由 4 个 block 组成的整个模型又是多少次？

# %%
my_prediction = None        # ← your prediction: {"forward": n, "backward": n, "bytes": n} / 你的预测
my_prediction_model = None  # ← your prediction: {"forward": n, "backward": n} / 你的预测

# %%
comm = run(tp_lesson.block_communication, 4)
block = comm[0]["block"]
print(f"one block, rank 0 of TP 4: {block['forward']} all-reduces forward, {block['backward']} backward, "
      f"{human_bytes(block['bytes_per_all_reduce'])} each / 一个 block：前向 {block['forward']} 次、反向 "
      f"{block['backward']} 次 all-reduce，每次 {human_bytes(block['bytes_per_all_reduce'])}")
ok = check("06.block_comm", my_prediction,
           {"forward": block["forward"], "backward": block["backward"], "bytes": block["bytes_per_all_reduce"]})
model = comm[0]["model"]
ok = check("06.model_comm", my_prediction_model, {"forward": model["forward"], "backward": model["backward"]})
counts_agree = all((r["block"]["forward"], r["block"]["backward"], r["block"]["bytes_per_all_reduce"],
                    r["model"]["forward"], r["model"]["backward"])
                   == (block["forward"], block["backward"], block["bytes_per_all_reduce"],
                       model["forward"], model["backward"]) for r in comm)
tp_equal = all(max(value for part in (r["block"], r["model"]) for key, value in part.items()
                   if key.endswith("_diff")) < TOL for r in comm)
print("every rank counts the same / 每个 rank 计数相同:", counts_agree)
print("TP model: same loss and same gradients as the dense model / 损失与梯度和稠密模型一致:", tp_equal)

# %% [markdown]
# ### f and g inside a training step / 训练步里的 f 与 g
#
# Now the whole training loop at TP 4: `dtlab.train(TrainConfig(tp=4))`, a batch of
# B = 8 sequences. Every f and g goes through the tracer (`dtlab/comm/tracer.py`): in
# the step record, `comm["all_reduce.forward"]` counts the g's and
# `comm["all_reduce.backward"]` the f's, with their bytes and the seconds the rank
# was blocked in them. Those seconds are communication, not compute, although
# they happen in the middle of forward and backward. The timeline shows them as
# red bars between the compute.
#
# **Predict:** per training step, how many g and f all-reduces on each rank, and
# how many bytes each for B = 8?
#
# 现在看 TP 4 下完整的训练循环：`dtlab.train(TrainConfig(tp=4))`，批次为 B = 8 条序列。每一个 f 和 g 都经过
# 追踪器（`dtlab/comm/tracer.py`）：在每步记录中，`comm["all_reduce.forward"]` 统计 g，`comm["all_reduce.backward"]`
# 统计 f，并记下字节数和 rank 阻塞在其中的秒数。这些时间算作通信而不是计算，尽管它们发生在前向和反向传播
# 的中间。时间线把它们画成夹在计算之间的红色条。
#
# **预测：** 每个训练步里，每个 rank 有多少次 g 和 f 的 all-reduce？B = 8 时每次多少字节？

# %%
my_prediction_step = None  # ← your prediction: {"g (forward)": n, "f (backward)": n, "bytes each": n} / 你的预测

tp_run = dtlab.train(TrainConfig(tp=4, steps=3, seed=0)).wait()
traced = tp_run.records[-1]["ranks"][0]["comm"]
g, f = traced["all_reduce.forward"], traced["all_reduce.backward"]
ok = check("06.step_comm", my_prediction_step,
           {"g (forward)": g["count"], "f (backward)": f["count"], "bytes each": g["bytes"] // g["count"]})
step_counts_agree = all((r["comm"]["all_reduce.forward"]["count"], r["comm"]["all_reduce.backward"]["count"]) == (8, 8)
                        for rec in tp_run.records for r in rec["ranks"])
blocked = all(r["comm"]["all_reduce.forward"]["seconds"] + r["comm"]["all_reduce.backward"]["seconds"] > 0
              for rec in tp_run.records for r in rec["ranks"])
print("every rank, every step: 8 g and 8 f / 每个 rank、每一步：8 次 g 和 8 次 f:", step_counts_agree)
print("every rank spent time blocked in them (booked as communication) / 每个 rank 都有阻塞在其中的时间（计为通信）:",
      blocked)

# %%
# NBVAL_IGNORE_OUTPUT
StepTimeline(tp_run.records)

# %% [markdown]
# ## 4. Why TP stays inside one node / 为什么 TP 留在一台机器之内
#
# Those all-reduces are not rare: four per block, for every block and every
# micro-batch, and each one sits on the critical path — the next matmul cannot
# start until the sum has arrived. Inside one machine, GPUs talk over NVLink
# (about 450 GB/s per direction on an H100); between machines, over InfiniBand
# (about 50 GB/s per GPU). That is why Megatron-LM keeps the TP group within one
# 8-GPU node and uses pipeline parallelism across nodes (Narayanan et al., 2021),
# and why dtlab numbers the ranks with TP innermost.
#
# The planner puts numbers on it for GPT-3 175B on H100s (8 per node). We keep
# PP 16 and DP 8 and go from TP 8 (1,024 GPUs) to TP 16 (2,048 GPUs). These are
# predictions from formulas, not measurements.
#
# **Predict:** which link does the TP group use at TP 16? Does the step get
# faster with twice the GPUs?
#
# 这些 all-reduce 次数可不少：每个 block 四次，每个 block、每个微批次都要做，而且每一次都在关键路径上——
# 求和结果到达之前，下一个矩阵乘法无法开始。同一台机器内，GPU 之间通过 NVLink 通信（H100 上每个方向
# 约 450 GB/s）；跨机器则走 InfiniBand（每张 GPU 约 50 GB/s）。所以 Megatron-LM 把 TP 组限制在
# 一个 8 卡节点之内，跨节点则用流水线并行（Narayanan 等，2021）；dtlab 给 rank 编号时也
# 把 TP 放在最内层。
#
# 规划器为 GPT-3 175B 在 H100（每节点 8 张）上给出了具体数字。我们保持 PP 16、DP 8 不变，把 TP 8
# （1,024 张 GPU）改成 TP 16（2,048 张 GPU）。这些都是公式给出的预测，不是测量结果。
#
# **预测：** TP 16 时 TP 组走的是哪种链路？GPU 翻倍之后，单步会变快吗？

# %%
my_prediction_link = None    # ← your prediction: "nvlink" or "infiniband" / 你的预测
my_prediction_faster = None  # ← your prediction: True or False / 你的预测：True 或 False

plans = {tp: dtlab.plan("gpt3-175b", Layout(tp=tp, pp=16, dp=8, micro_batches=96, zero=1, precision="bf16",
                                             recompute="selective"), gpu="H100", batch_size=1536)
         for tp in (8, 16)}
print(f"{'':>6} {'GPUs':>6} {'TP link':>11} {'TP comm s':>10} {'compute s':>10} {'step s':>8} {'MFU':>6}"
      "   (GPU 数 / TP 链路 / TP 通信秒 / 计算秒 / 单步秒 / MFU)")
for tp, p in plans.items():
    print(f"TP {tp:<3} {p.gpus:>6} {p.links['tp']:>11} {p.comm_time_s['tp']:>10.2f} {p.compute_time_s:>10.2f} "
          f"{p.step_time_s:>8.2f} {p.mfu:>6.1%}")
tp_comm_ratio = plans[16].comm_time_s["tp"] / plans[8].comm_time_s["tp"]
print(f"TP communication grows {tp_comm_ratio:.1f}x / TP 通信增长到 {tp_comm_ratio:.1f} 倍")
ok = check("06.tp16_link", my_prediction_link, plans[16].links["tp"], source="planner")
ok = check("06.tp16_faster", my_prediction_faster, plans[16].step_time_s < plans[8].step_time_s, source="planner")

# %% [markdown]
# Doubling the GPUs halves the compute time, but the TP group now spans two nodes:
# its all-reduces move to InfiniBand and cost about ten times more, which eats the
# gain and more. Scaling further is done with the other axes: more pipeline
# stages or more data-parallel replicas, whose communication is rarer.
#
# GPU 翻倍让计算时间减半，但 TP 组现在横跨两个节点：它的 all-reduce 改走 InfiniBand，开销大约
# 变成原来的十倍，把收益吃掉还不止。要继续扩展，应当用另外两个维度：更多流水线阶段或更多数据并行
# 副本，它们的通信要少得多。
#
# ## 5. Exercise: f and g / 练习：f 与 g
#
# Write `parallel_mlp(x, fc, proj, rank, size)`: the small GPT's MLP,
# `proj(gelu(fc(x)))`, as one rank of a TP group of `size` computes it. `fc` and
# `proj` are the *dense* `nn.Linear` layers (every rank has the whole weights):
# take this rank's slices yourself (`fc` by columns, `proj` by rows, remembering
# that PyTorch stores `(out, in)`), use `F.linear` and `F.gelu`, and put
# Megatron's `f(...)` and `g(...)` (already imported) where the replicated input
# enters and where the partial sums leave. `grade` runs it on 2 real ranks and
# compares with the dense layer: the output, the gradient of `x`, and each
# weight's gradient summed over the ranks.
#
# 写出 `parallel_mlp(x, fc, proj, rank, size)`：TP 组（共 `size` 个 rank）中一个 rank 计算的小 GPT 的 MLP，
# 即 `proj(gelu(fc(x)))`。`fc` 和 `proj` 是 *稠密* 的 `nn.Linear` 层（每个 rank 都有完整权重）：自己取出
# 本 rank 的分片（`fc` 按列、`proj` 按行，记住 PyTorch 按 `(out, in)` 存储），用 `F.linear` 和 `F.gelu`，
# 并在复制的输入进入处和部分和离开处放上 Megatron 的 `f(...)` 与 `g(...)`（已导入）。`grade` 在 2 个真实
# rank 上运行它并与稠密层比较：输出、`x` 的梯度，以及各权重梯度在所有 rank 上的和。

# %%
import torch.nn.functional as F
from dtlab.parallel.tensor_parallel import f, g


def parallel_mlp(x, fc, proj, rank, size):
    # x: (B, T, C) on every rank; fc: Linear(C, 4C); proj: Linear(4C, C) (dense weights)
    # x：每个 rank 上都是 (B, T, C)；fc：Linear(C, 4C)；proj：Linear(4C, C)（稠密权重）
    raise NotImplementedError  # your code here / 在这里写你的代码


solved = grade("06.parallel_mlp", parallel_mlp)

# %% [markdown]
# ## 6. Try this / 动手试试
#
# 1. Run `run(tp_lesson.split_one_layer, 3)`: 4 heads and 256 MLP features cannot
#    be split over 3 ranks. Read the error in both languages.
# 2. **Task:** at TP 2 with a batch of 8 sequences, how many all-reduces does a
#    block make forward and backward, and how many bytes does each carry? (Which
#    of B, T, C and TP do the bytes depend on?) The cell runs
#    `block_communication` on 2 ranks to check.
# 3. In the planner, keep the 1,024 GPUs and try TP 4 with PP 32 (DP 8): is the
#    step faster than TP 8 with PP 16? (Answer, planner: no. TP communication
#    falls from 0.98 to 0.43 s, but the bubble grows from 13.5% to 24.4% of the
#    step, which takes 9.85 s against 9.27 s: TP 8, a whole node, is the balance.
#    `gpu="H200"` changes nothing here: the planner's H200 has the H100's compute
#    and links, and more memory.)
#
# 1. 运行 `run(tp_lesson.split_one_layer, 3)`：4 个注意力头和 256 个 MLP 特征无法平均分给 3 个
#    rank。读一读中英文两种错误信息。
# 2. **任务：** TP 2、批大小为 8 条序列时，一个 block 前向、反向各有几次 all-reduce？每次传多少字节？
#    （字节数取决于 B、T、C 和 TP 中的哪几个？）单元格会在 2 个 rank 上运行 `block_communication` 来检查。
# 3. 在规划器中保持 1,024 张 GPU，试试 TP 4 配 PP 32（DP 8）：单步比 TP 8 配 PP 16 更快吗？（答案，规划器：
#    不会。TP 通信从 0.98 秒降到 0.43 秒，但气泡在单步中的占比从 13.5% 增加到 24.4%，单步用时 9.85 秒，而前者
#    是 9.27 秒：TP 8，也就是一整个节点，才是平衡点。`gpu="H200"` 在这里没有变化：规划器中的 H200 与 H100 的
#    算力和链路相同，只是显存更大。）

# %%
my_answer_batch_8 = None  # ← your answer: {"forward": n, "backward": n, "bytes": n} / 你的答案

# %%
two = run(tp_lesson.block_communication, 2, batch=8)[0]["block"]
ok = check("06.try_batch_8", my_answer_batch_8,
           {"forward": two["forward"], "backward": two["backward"], "bytes": two["bytes_per_all_reduce"]})

# %% [markdown]
# ## Check / 检查
#
# The last cell repeats this lesson's results as one deterministic summary.
# 最后一个单元格把本课的结果汇总成一个确定的结论。

# %%
results = {
    "column-parallel fc holds [256/tp, 64], row-parallel proj holds [64, 256/tp]"
    " / 列并行 fc 持有 [256/tp, 64]，行并行 proj 持有 [64, 256/tp]":
        all(r["shapes"]["mlp.fc.weight"] == [256 // tp, 64] and r["shapes"]["mlp.proj.weight"] == [64, 256 // tp]
            for tp, ranks in layers.items() for r in ranks),
    "every TP layer equals the dense layer / 每个 TP 层都等于稠密层": layer_equal,
    "2 all-reduces forward and 2 backward per block / 每个 block 前向 2 次、反向 2 次 all-reduce":
        (block["forward"], block["backward"]) == (2, 2) and counts_agree,
    "a training step at TP 4: 8 g and 8 f on every rank, time blocked in them / TP 4 的一个训练步：每个 rank 8 次 g、8 次 f，并在其中阻塞":
        step_counts_agree and blocked,
    "the TP model's loss and gradients equal the dense model's / TP 模型的损失和梯度等于稠密模型": tp_equal,
    "TP 16 crosses nodes (InfiniBand) and slows the step / TP 16 跨节点（InfiniBand）并拖慢单步":
        plans[16].links["tp"] == "infiniband" and plans[8].links["tp"] == "nvlink"
        and plans[16].step_time_s > plans[8].step_time_s,
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 06:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
