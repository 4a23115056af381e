# %% [markdown]
# # Lesson 13 — One GPU, fast
# # 第 13 课 —— 单卡，快起来
#
# **What you will see.** Before you split a model over many GPUs, make one GPU
# fast. This lesson measures how far a training step is from what the chip
# could do, with **MFU** (model FLOPs utilization, PaLM's Appendix B), and
# takes a GPT of about 100M parameters from 9% to 46% of an H200's peak one
# change at a time: PyTorch's fused attention (**FlashAttention**, Dao et al.,
# 2022) in place of the explicit softmax(QKᵀ)V, a fused AdamW, `torch.compile`
# (**kernel fusion** by a compiler), and a larger batch. You predict which change
# gains most, then measure the same steps here: live on a CUDA GPU if you have
# one, and on the CPU otherwise, beside the table `tools/gpu_check.py` stored from
# an H200. Then you measure why the explicit attention is slow: the T × T scores
# it keeps, and how their bytes grow with the sequence length.
#
# **你将看到什么。** 在把模型切到许多 GPU 上之前，先让一张 GPU 快起来。本课用 **MFU**（模型 FLOPs 利用率，
# PaLM 附录 B）衡量一个训练步离芯片的能力还有多远，并把一个约 1 亿参数的 GPT 一次改一处，从 H200 峰值的 9%
# 提到 46%：用 PyTorch 的融合注意力（**FlashAttention**，Dao 等，2022）代替显式的 softmax(QKᵀ)V、
# 融合的 AdamW、`torch.compile`（由编译器完成的 **内核融合**），以及更大的批次。你先预测哪一处改动提升最大，
# 再在本机测量同样的几步：有 CUDA GPU 就在 GPU 上实时测量，否则在 CPU 上测，并与 `tools/gpu_check.py`
# 在一张 H200 上测得并存档的表格并列。最后你会测量显式注意力慢在哪里：它保存的 T × T 分数，以及这些分数的
# 字节数如何随序列长度增长。

# %%
import torch

from dtlab.course.exercises import grade
from dtlab.course.experiments import one_gpu
from dtlab.course.experiments.attention_memory import activations_by_seq_len, attention_saved_bytes
from dtlab.lab import check, human_bytes
from dtlab.lab.one_gpu_view import AttentionMemoryFigure, StepGainsFigure
from dtlab.planner.formulas import model_flops_per_token

# %% [markdown]
# ## 1. What MFU counts / MFU 数的是什么
#
# A GPU's datasheet gives its peak: an H100 or H200 does 989 TFLOP/s of dense
# bf16 matrix multiplication. **MFU** is the share of that peak a training step
# spends on the model's own arithmetic:
#
#     MFU = model FLOPs per token × tokens per second / peak FLOP/s
#
# The model FLOPs per token are counted from the model's shape, not from what
# the kernels happen to do (Chowdhery et al., 2022, PaLM, Appendix B): 6N for N
# parameters (each weight is multiplied once in the forward pass, 2 FLOPs,
# and twice in the backward, 4 FLOPs), plus 12 · L · d · T for the attention's
# scores and weighted sum, which multiply activations, not weights (L layers,
# width d, sequence length T). Work the implementation adds (recomputation, a
# slow kernel) does not count, so MFU compares implementations honestly.
#
# The GPT below is dtlab's model class at GPT-2 small's width: 14 blocks,
# d = 768, 12 heads, T = 1024, a byte vocabulary.
#
# **Predict:** its model FLOPs per token.
#
# GPU 的数据手册给出它的峰值：H100 或 H200 的稠密 bf16 矩阵乘法为 989 TFLOP/s。**MFU** 是一个训练步里
# 花在模型自身计算上的那部分占峰值的比例：
#
#     MFU = 每个 token 的模型 FLOPs × 每秒 token 数 / 峰值 FLOP/s
#
# 每个 token 的模型 FLOPs 由模型的形状算出，而不是由内核实际做了什么算出（Chowdhery 等，2022，PaLM 附录 B）：
# N 个参数贡献 6N（每个权重在前向被乘一次，2 次浮点运算；在反向被乘两次，4 次），再加上注意力的分数和加权求和的
# 12 · L · d · T，它们乘的是激活而不是权重（L 为层数，d 为宽度，T 为序列长度）。实现额外增加的工作（重计算、
# 慢的内核）不计入，所以 MFU 能公平地比较不同的实现。
#
# 下面的 GPT 是 dtlab 的模型类，宽度与 GPT-2 small 相同：14 个 block，d = 768，12 个头，T = 1024，字节级词表。
#
# **预测：** 它每个 token 的模型 FLOPs。

# %%
cfg = one_gpu.GPT_100M
params = cfg.param_count()
print(f"layers / 层数 {cfg.n_layer}, d_model {cfg.d_model}, heads / 头数 {cfg.n_head}, T {cfg.seq_len}, "
      f"parameters / 参数 {params:,}")

# %%
my_prediction = None  # ← your prediction: FLOPs per token, a number / 你的预测：每个 token 的 FLOPs

flops_per_token = model_flops_per_token(params, layers=cfg.n_layer, hidden=cfg.d_model, seq_len=cfg.seq_len)
ok_flops = check("13.flops_per_token", my_prediction, flops_per_token, source="formula")

# %% [markdown]
# ## 2. Five rows, one change each / 五行，每行只改一处
#
# `tools/gpu_check.py` trains that GPT in a plain PyTorch loop (dtlab's model
# class, nothing else of dtlab: `dtlab.course.experiments.one_gpu.plain_loop`) in
# bf16 autocast, batch 8 × 1024 tokens, and changes one thing a row:
#
# 1. **eager**: dtlab's `causal_attention`, every step written out: QKᵀ gives
#    (B, heads, T, T) scores, the mask and the softmax make two more such
#    tensors, and autograd keeps the softmax's output for backward.
# 2. **sdpa**: `F.scaled_dot_product_attention(q, k, v, is_causal=True)`, which on
#    a GPU runs FlashAttention: it computes the softmax block by block in the
#    chip's on-chip memory and never writes the T × T scores out.
# 3. **fused**: AdamW with `fused=True`, the whole update in one kernel launch
#    instead of several per parameter tensor.
# 4. **compile**: `torch.compile(model)`, which fuses the small element-wise
#    kernels (LayerNorm, GELU, the residual adds) into fewer, larger ones.
# 5. **batch**: 64 sequences a step instead of 8, so that each kernel has more
#    work per launch.
#
# The eager row took **65.7 ms** a step on the H200 (989 TFLOP/s peak).
#
# **Predict:** (a) the eager row's MFU; (b) which of the four changes gains
# most on that GPU (tokens/s over the row before it); (c) which gains most on
# *this* machine, where the lesson is about to measure the same steps (on a
# CPU: dtlab's small GPT in fp32, a few steps a row, without compiling).
#
# `tools/gpu_check.py` 用一个朴素的 PyTorch 训练循环（dtlab 的模型类，除此之外不用 dtlab 的任何东西：
# `dtlab.course.experiments.one_gpu.plain_loop`）以 bf16 autocast 训练这个 GPT，批次为 8 × 1024 个 token，
# 每行只改一处：
#
# 1. **eager**：dtlab 的 `causal_attention`，每一步都写出来：QKᵀ 得到 (B, 头数, T, T) 的分数，掩码和
#    softmax 又产生两个这样的张量，autograd 还要为反向保存 softmax 的输出。
# 2. **sdpa**：`F.scaled_dot_product_attention(q, k, v, is_causal=True)`，它在 GPU 上运行 FlashAttention：
#    在芯片的片上存储里逐块计算 softmax，从不把 T × T 的分数写出去。
# 3. **fused**：`fused=True` 的 AdamW，整个更新只启动一次内核，而不是每个参数张量启动好几次。
# 4. **compile**：`torch.compile(model)`，把小的逐元素内核（LayerNorm、GELU、残差相加）融合成更少、更大的内核。
# 5. **batch**：每步 64 条序列而不是 8 条，让每次内核启动有更多的工作。
#
# eager 这一行在 H200（峰值 989 TFLOP/s）上每步 **65.7 毫秒**。
#
# **预测：**（a）eager 这一行的 MFU；（b）四处改动中哪一处在那张 GPU 上提升最大（相对上一行的 tokens/s）；
# （c）在 *本机* 上哪一处提升最大——本课马上就要在本机测量同样的几步（在 CPU 上：dtlab 的小 GPT，fp32，
# 每行只跑几步，不编译）。

# %%
my_prediction_mfu = None   # ← your prediction: a fraction between 0 and 1 / 你的预测：0 到 1 之间的比例
my_prediction_gpu = None   # ← your prediction: "sdpa", "fused", "compile" or "batch" / 你的预测
my_prediction_here = None  # ← your prediction: "sdpa", "fused", "compile" or "batch" / 你的预测

# %% [markdown]
# ## 3. Measure / 测量
#
# First the steps on this machine. On a CUDA GPU this is the ~100M GPT itself,
# about a minute with compiling; on a CPU, the small GPT, a few seconds. These
# are timings: they change from run to run (a shared CPU most of all), and a CPU
# has no datasheet bf16 peak in the table, so its MFU is shown as "?".
#
# 先在本机测量这几步。在 CUDA GPU 上测的就是这个约 1 亿参数的 GPT，算上编译约需一分钟；在 CPU 上测小 GPT，
# 只需几秒。这些都是计时：每次运行都会变（在与别的程序共用的 CPU 上变化最大），而且表中没有 CPU 的 bf16 峰值，
# 所以它的 MFU 显示为 "?"。

# %%
# NBVAL_IGNORE_OUTPUT
here = one_gpu.live_table()
print(f"measured on this machine: {here['device']}, {here['model']}")
print(f"本机实测：{here['device']}，{here['model']}")
print(one_gpu.text_table(here["rows"]))
ok_here = check("13.here_gains_most", my_prediction_here, one_gpu.gains_most(here["rows"]))

# %% [markdown]
# And the GPU table: the same five rows, measured by `tools/gpu_check.py` on an
# H200 and stored in `notebooks/gpu_check.json` with the device and the date.
# Predictions (a) and (b) are about that GPU and are checked against this table;
# on a GPU of your own, the cell above has just measured the same rows there.
#
# 然后是 GPU 的表格：同样的五行，由 `tools/gpu_check.py` 在一张 H200 上测得，连同设备和日期存放在
# `notebooks/gpu_check.json` 里。预测（a）和（b）问的是那张 GPU，检查的对象就是这张表；如果你自己有 GPU，
# 上一个单元格刚刚在它上面测了同样的几行。

# %%
stored = one_gpu.stored_report("gpu_check.json")
print(f"measured on {stored['device']}, {stored['date']}, by tools/gpu_check.py (torch {stored['torch']}, "
      f"CUDA {stored['cuda']}), not on this machine")
print(f"于 {stored['date']} 在 {stored['device']} 上由 tools/gpu_check.py 实测（torch {stored['torch']}，"
      f"CUDA {stored['cuda']}），不是在本机")
print(f"~100M GPT, bf16 autocast, T = 1024; peak: {stored['peak_source']}")
print(one_gpu.text_table(stored["rows"]))
eager_row = stored["rows"][0]
ok_mfu = check("13.eager_mfu", my_prediction_mfu, round(eager_row["mfu"], 4))
ok_gpu = check("13.gains_most", my_prediction_gpu, one_gpu.gains_most(stored["rows"]))

# %%
# NBVAL_IGNORE_OUTPUT
StepGainsFigure(one_gpu.gains(stored["rows"]), one_gpu.gains(here["rows"]), gpu_name=stored["device"],
                date=stored["date"], here_name=f"{here['device']}, {here['model']}")

# %% [markdown]
# The explicit attention alone made the GPU nearly three times slower: its
# (B, heads, T, T) scores are written to and read from the GPU's memory several
# times per layer, forward and backward, and that traffic, not arithmetic, sets
# the pace. FlashAttention does the same arithmetic without it. The fused
# optimizer and the compiler each remove many small kernels (3 to 4 ms each, of
# a step of about 20 ms); the larger batch fills the GPU between launches.
# Together: MFU from 0.09 to 0.46, five times the tokens per second on the same
# chip. In the same report, dtlab's own training loop with the last row's
# settings (`dtlab.train` on one rank: sdpa, compile, bf16, batch 64, that GPT)
# ran at 1.01 times the plain loop's tokens per second.
#
# On another GPU, or the same GPU in another machine, the order can differ. At
# batch 8 each kernel is short, and where the CPU that launches them is slower
# (a virtual machine's, say), launching sets the pace: then the fused optimizer,
# the compiler and the larger batch, which all launch fewer kernels per token,
# gain more, and the attention less. On a CPU the order differs too: there are
# no tensor cores, the small GPT's matrices are tiny and PyTorch's CPU attention
# is fused as well, so much of a step is Python and kernel overhead, and a busy
# machine's timings jump around. What you measured is real for your machine; the
# table above is the H200's.
#
# 单是显式注意力就让 GPU 慢了将近三倍：它的 (B, 头数, T, T) 分数在每一层的前向和反向中都要在显存里写入、读出好几次，
# 决定速度的是这些访存，而不是算术。FlashAttention 做同样的算术，却没有这些访存。融合的优化器和编译器各自去掉了
# 许多小内核（在约 20 毫秒的一步里各省 3 到 4 毫秒）；更大的批次则让 GPU 在两次启动之间更满。合起来：MFU 从 0.09
# 升到 0.46，同一块芯片上每秒的 token 数变成五倍。在同一份报告里，dtlab 自己的训练循环用最后一行的设置
# （`dtlab.train` 在一个 rank 上：sdpa、compile、bf16、批大小 64、同一个 GPT）达到了朴素循环每秒 token 数的
# 1.01 倍。
#
# 换一张 GPU，或者同样的 GPU 装在另一台机器里，顺序都可能不同。批大小为 8 时每个内核都很短，如果负责启动内核的 CPU
# 更慢（比如虚拟机里的 CPU），速度就由启动决定：这时融合的优化器、编译器和更大的批次（它们都减少了每个 token 要启动的
# 内核数）提升更大，注意力的提升更小。在 CPU 上顺序也不同：没有 Tensor Core，小 GPT 的矩阵很小，PyTorch 在 CPU 上的
# 注意力也是融合的，所以一步中很大一部分是 Python 和内核启动的开销，而繁忙机器上的计时会跳来跳去。你测到的对你的机器
# 是真实的；上面的表格是那张 H200 的。
#
# ## 4. The memory of the scores / 分数占用的内存
#
# The eager kernel keeps one (B, heads, T, T) tensor per layer for backward:
# it grows as T², while everything else a block keeps grows as T. dtlab's memory
# accountant (`dtlab.measure.memory.ActivationMeter`, the one behind every
# step record's `activations`) counts what autograd saves; here it measures one
# forward and backward of the small GPT (4 layers, 4 heads, d = 64, batch 1) at
# T = 64, 128 and 256, with each kernel.
#
# eager 内核每一层都为反向保存一个 (B, 头数, T, T) 的张量：它随 T² 增长，而 block 保存的其他东西都只随 T 增长。
# dtlab 的显存记账器（`dtlab.measure.memory.ActivationMeter`，也就是每步记录中 `activations` 的来源）统计
# autograd 保存的张量；这里用它测量小 GPT（4 层、4 个头、d = 64、批大小 1）在 T = 64、128、256 时、分别用两种
# 内核做一次前向和反向的激活值。

# %%
mem = {kernel: activations_by_seq_len((64, 128, 256), attention=kernel, batch=1) for kernel in ("eager", "sdpa")}
for T in (64, 128, 256):
    print(f"T = {T:>4}: eager {human_bytes(mem['eager'][T]):>10}, sdpa {human_bytes(mem['sdpa'][T]):>10}")

# %% [markdown]
# **Predict:** by what factor do the activations of each kernel grow from
# T = 256 to T = 512?
#
# **预测：** 从 T = 256 到 T = 512，两种内核的激活值各自增长多少倍？

# %%
my_prediction = None  # ← your prediction: {"eager": a factor, "sdpa": a factor} / 你的预测

# %%
for kernel in ("eager", "sdpa"):
    mem[kernel].update(activations_by_seq_len((512,), attention=kernel, batch=1))
print(f"T =  512: eager {human_bytes(mem['eager'][512]):>10}, sdpa {human_bytes(mem['sdpa'][512]):>10}")
growth = {kernel: round(mem[kernel][512] / mem[kernel][256], 2) for kernel in ("eager", "sdpa")}
ok_growth = check("13.growth", my_prediction, growth)

# %%
# NBVAL_IGNORE_OUTPUT
AttentionMemoryFigure(mem, batch=1)

# %% [markdown]
# On log-log axes sdpa's line rises one step for each doubling of T; eager's
# bends towards twice that slope as its scores take over. At T = 256 its
# scores were about as large as everything else, so doubling T gave
# (2 + 4) / 2 = 3 times the bytes; at longer T it approaches 4.
#
# 在对数坐标上，T 每翻一倍，sdpa 的线上升一格；eager 的线则随着分数占据主导而弯向两倍的斜率。T = 256 时它的
# 分数与其余部分差不多大，所以 T 翻倍带来 (2 + 4) / 2 = 3 倍的字节；T 更长时趋近 4 倍。
#
# ## 5. Exercise: the bytes of the scores / 练习：分数的字节数
#
# Write `scores_bytes(batch, heads, seq_len, dtype)`: the bytes of the
# attention scores the eager kernel keeps for backward in one layer, for a
# `torch.dtype` (`torch.float32`, `torch.bfloat16`, `torch.float16`). `grade`
# runs dtlab's eager kernel on real q, k and v tensors of four shapes and dtypes
# on a real rank, counts the bytes of the scores autograd saved, and compares.
# One of those measurements, to check yours by hand:
#
# 写出 `scores_bytes(batch, heads, seq_len, dtype)`：eager 内核在一层中为反向保存的注意力分数的字节数，
# `dtype` 是一个 `torch.dtype`（`torch.float32`、`torch.bfloat16`、`torch.float16`）。`grade` 会在一个
# 真实的 rank 上用四种形状和数据类型的真实 q、k、v 张量运行 dtlab 的 eager 内核，统计 autograd 保存的分数的
# 字节数，再与你的结果比较。下面是其中一种测量，可以用来手工核对你的函数：

# %%
saved = attention_saved_bytes(2, 4, 128, torch.bfloat16)
print(f"batch 2, 4 heads, T = 128, bfloat16: scores saved / 保存的分数 {saved['scores']:,} bytes / 字节")

# %%
def scores_bytes(batch, heads, seq_len, dtype):
    # bytes of one layer's attention scores / 一层注意力分数的字节数
    raise NotImplementedError  # your code here / 在这里写你的代码


solved = grade("13.scores_bytes", scores_bytes)

# %% [markdown]
# With your function: the ~100M GPT at batch 32 in bf16 keeps 768 MiB of scores
# per layer, 10.5 GiB over its 14 layers, and under autocast the softmax's fp32
# output and its bf16 copy make it three times that. FlashAttention keeps
# instead, per head, one fp32 log-sum-exp per query, and recomputes the scores
# block by block in backward.
#
# 用你的函数算一算：约 1 亿参数的 GPT 在批大小 32、bf16 下，每层保存 768 MiB 的分数，14 层共 10.5 GiB；
# 在 autocast 下，softmax 的 fp32 输出和它的 bf16 副本还会让这个数变成三倍。FlashAttention 则只为每个头的每个
# 查询保存一个 fp32 的 log-sum-exp，反向时再逐块重新计算分数。
#
# ## 6. Try this / 动手试试
#
# 1. **Task:** at T = 1024, how many times more bytes does the eager kernel keep
#    for one head's bf16 scores than sdpa keeps for that head's fp32
#    log-sum-exp? The cell below measures both on real tensors.
# 2. Run `one_gpu.live_table(compile_on_cpu=True)` on a CPU: how long does the
#    compiled row take, and is a step faster afterwards?
# 3. With a CUDA GPU: `dtlab train --attention eager --precision bf16` against
#    `--attention sdpa --compile`, and compare the step records' `tokens_per_s`
#    and `mem.activations`.
#
# 1. **任务：** 在 T = 1024 时，eager 内核为一个头保存的 bf16 分数，是 sdpa 为这个头保存的 fp32 log-sum-exp
#    的多少倍？下面的单元格在真实张量上测量这两者。
# 2. 在 CPU 上运行 `one_gpu.live_table(compile_on_cpu=True)`：编译的那一行要多久？之后每一步变快了吗？
# 3. 如果有 CUDA GPU：比较 `dtlab train --attention eager --precision bf16` 与 `--attention sdpa --compile`，
#    看每步记录中的 `tokens_per_s` 和 `mem.activations`。

# %%
my_answer_ratio = None  # ← your answer: a factor / 你的答案：倍数

# %%
eager_scores = attention_saved_bytes(1, 1, 1024, torch.bfloat16)["scores"]
sdpa_per_query = attention_saved_bytes(1, 1, 1024, torch.bfloat16, attention="sdpa")["per_query"]
print(f"eager: {eager_scores:,} bytes of scores / 字节的分数; sdpa: {sdpa_per_query:,} bytes of log-sum-exp / "
      "字节的 log-sum-exp")
lse_ratio = eager_scores // sdpa_per_query
ok_ratio = check("13.try_lse_ratio", my_answer_ratio, lse_ratio)

# %% [markdown]
# ## Check / 检查
#
# The last cell repeats this lesson's results as one deterministic summary.
# 最后一个单元格把本课的结果汇总成一个确定的结论。

# %%
stored_gains = one_gpu.gains(stored["rows"])
results = {
    "model FLOPs per token of the ~100M GPT: 6N + 12·L·d·T = 734,588,928 / 约 1 亿参数 GPT 每个 token 的模型 FLOPs":
        flops_per_token == 734_588_928,
    "the stored H200 table: MFU 0.09 eager, 0.46 after all four steps / 存档的 H200 表：eager 的 MFU 0.09，四步之后 0.46":
        (round(eager_row["mfu"], 2), round(stored["rows"][-1]["mfu"], 2)) == (0.09, 0.46),
    "there, sdpa gains most (more than 2.5x) / 在那里 sdpa 提升最大（超过 2.5 倍）":
        one_gpu.gains_most(stored["rows"]) == "sdpa" and stored_gains["sdpa"] > 2.5,
    "eager's activations grow about 3x from T = 256 to 512, sdpa's 2x / eager 的激活值从 T = 256 到 512 约增长 3 倍，sdpa 的 2 倍":
        2.8 < growth["eager"] < 3.2 and growth["sdpa"] == 2.0,
    "bf16 scores are T / 2 = 512 times one head's fp32 log-sum-exp / bf16 分数是一个头 fp32 log-sum-exp 的 T / 2 = 512 倍":
        lse_ratio == 512,
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 13:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
