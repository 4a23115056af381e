# %% [markdown]
# # Lesson 15 — Planning at scale
# # 第 15 课 —— 大规模训练规划
#
# **What you will see.** Before anyone books a thousand GPUs, someone predicts
# whether the model fits and how long a step takes. dtlab's **planner**
# (`dtlab.plan`, `dtlab plan` on the command line) does this with formulas from the
# papers — each one cited in the `dtlab/planner/` package — and no processes at all. You will
# check it against published numbers, explore layouts with sliders, and then put
# its prediction beside a real run on your machine.
#
# Everything the planner prints is a **prediction**. It counts model states and
# stored activations as the papers do; it assumes matmuls reach 50% of the GPU's
# peak and that communication does not overlap with compute. For this machine
# (section 5) it uses what `dtlab calibrate` measured here instead.
#
# **你将看到什么。** 在有人预订一千张 GPU 之前，总得有人先预测：模型放不放得下？一步要多久？
# dtlab 的 **规划器**（`dtlab.plan`，命令行里是 `dtlab plan`）用论文里的公式完成这件事——每个公式
# 的出处都写在 `dtlab/planner/` 包里——完全不需要启动进程。你会先拿它和论文里公布的数字对照，
# 再用滑块探索各种布局，最后把它的预测和你机器上的一次真实运行放在一起比较。
#
# 规划器给出的一切都是 **预测值**。它像论文那样只统计模型状态和保存的激活值；并假设矩阵乘法能达到
# GPU 峰值的 50%，且通信不与计算重叠。对本机（第 5 节），它改用 `dtlab calibrate` 在这里测得的数字。

# %%
import statistics
from fractions import Fraction

import dtlab
from dtlab import Layout, TrainConfig
from dtlab.lab import Dashboard, check, human_bytes
from dtlab.lab.layout_race import LayoutRace, layout_label
from dtlab.lab.planner_widget import PlannerExplorer
from dtlab.parallel.pipeline.schedule import ideal_bubble_fraction
from dtlab.planner import flops_per_iteration, model_flops_per_token, model_states_bytes
from dtlab.planner.architectures import as_architecture
from dtlab.planner.hardware import GPUS

# %% [markdown]
# ## 1. ZeRO's Figure 1 / ZeRO 论文的图 1
#
# Mixed-precision Adam keeps (2 + 2 + K)Ψ bytes of model states per GPU, K = 12:
# 16-bit parameters, 16-bit gradients, and fp32 master weights, momentum and
# variance (Rajbhandari et al., 2019, Sec. 3 and Fig. 1). Stage 1 shards the KΨ
# across the N_d data-parallel GPUs, stage 2 also the gradients, stage 3 also the
# parameters.
#
# **Predict** the model-state memory per GPU for Ψ = 7.5B parameters on N_d = 64
# GPUs, for stages 0, 1, 2 and 3 (in GB).
#
# 混合精度 Adam 在每张 GPU 上保存 (2 + 2 + K)Ψ 字节的模型状态，K = 12：16 位参数、16 位梯度，
# 以及 fp32 的主权重、动量和方差（Rajbhandari 等，2019，第 3 节与图 1）。阶段 1 把 KΨ 切分到
# N_d 个数据并行 GPU 上，阶段 2 再切分梯度，阶段 3 连参数也切分。
#
# **预测：** Ψ = 75 亿参数、N_d = 64 张 GPU 时，阶段 0、1、2、3 每张 GPU 的模型状态各是多少 GB？

# %%
my_prediction_gb = None  # ← your prediction: [stage 0, 1, 2, 3] in GB / 你的预测：[阶段 0, 1, 2, 3]，单位 GB

formula_gb = [round(sum(model_states_bytes(7_500_000_000, dp=64, zero=stage, precision="bf16").values()) / 1e9, 1)
              for stage in range(4)]
ok = check("15.figure1_gb", my_prediction_gb, formula_gb, source="formula")

# %% [markdown]
# ## 2. Does GPT-3 175B fit? / GPT-3 175B 放得下吗？
#
# Take 1,024 H100s (80 GB each) with TP = 8 inside a node, PP = 16 stages,
# DP = 8, ZeRO-1, bf16, 96 micro-batches of 2 sequences (a global batch of 1,536
# sequences of 2,048 tokens, the batch of Megatron-LM's 175B estimate, Narayanan et
# al., 2021, Sec. 5.1; the GPT-3 paper itself used 3.2M tokens, about 1,560 such
# sequences), the 1F1B schedule (the default: stage 0 holds p = 16 micro-batches'
# activations at once) and selective recomputation (Korthikanti et al., 2022).
# All of that but the model, the GPU and the batch is one value, a `dtlab.Layout`;
# `dtlab.plan(model, layout, ...)` predicts it.
#
# Model states are counted as the ZeRO paper counts them (`states="paper"`:
# 16-bit weights and gradients, the fp32 master weights inside the optimizer's K),
# which is also how dtlab's own trainer keeps them for bf16 (lessons 03 and 04).
# With the master in the fp32 module instead (`states="dtlab"`, `--master-weights
# model`: 18Ψ instead of 16Ψ, and, with pipelining, a 16-bit copy of the stage's
# weights for every micro-batch in flight) this layout would need 119.5 GB, too
# much for 80.
#
# **Predict:** does it fit in 80 GB per GPU? Where does most of the memory go?
#
# 取 1,024 张 H100（每张 80 GB）：节点内 TP = 8，PP = 16 个流水线阶段，DP = 8，ZeRO-1，bf16，
# 96 个微批次、每个 2 条序列（全局批大小 1,536 条、每条 2,048 个 token，即 Megatron-LM 估算 175B 模型训练时间时的批大小，
# 见 Narayanan 等，2021，第 5.1 节；GPT-3 论文本身用的是 320 万 token，约合 1,560 条这样的序列），1F1B 调度（默认值：
# 阶段 0 同时保存 p = 16 个微批次的激活值），并使用选择性重计算（Korthikanti 等，2022）。
# 除了模型、GPU 型号和批大小，这些设置合起来是一个值：`dtlab.Layout`；`dtlab.plan(model, layout, ...)`
# 对它做出预测。
#
# 模型状态按 ZeRO 论文的方式计算（`states="paper"`：16 位权重和梯度，fp32 主权重算在优化器的 K 里），
# dtlab 自己的训练器在 bf16 下也是这样保存的（见第 03、04 课）。如果把主权重放在 fp32 模块里（`states="dtlab"`，
# 即 `--master-weights model`：18Ψ 而不是 16Ψ；使用流水线时，每个在途微批次还各存一份本阶段权重的 16 位副本），
# 这个布局会需要 119.5 GB，80 GB 放不下。
#
# **预测：** 每张 GPU 80 GB 放得下吗？大部分显存花在了哪里？

# %%
my_prediction_fits = None  # ← your prediction: True or False / 你的预测：True 或 False

layout = Layout(dp=8, tp=8, pp=16, micro_batches=96, zero=1, precision="bf16", recompute="selective")
p = dtlab.plan("gpt3-175b", layout, gpu="H100", batch_size=1536, states="paper")
for category in ("params", "grads", "optimizer", "copies", "activations", "total"):
    print(f"{category:>12}: {p.memory[category] / 1e9:7.2f} GB (planner / 规划器)")
print(f"parameters per GPU before ZeRO / ZeRO 之前每卡参数: {p.params_per_gpu / 1e9:.2f}B")
ok = check("15.fits", my_prediction_fits, p.fits, source="planner")

# %% [markdown]
# The planner counts the published models as Megatron-LM trains them: the
# **embedding** (and the head) is split by vocabulary over the TP group (a
# vocabulary-parallel embedding, ⌈V/t⌉ rows per rank), so of GPT-3's
# 50,257 × 12,288 table each stage-0 GPU keeps 6,283 rows, about 77 million
# parameters instead of 0.6 billion. dtlab's own TP runtime keeps the embedding and
# head whole on every TP rank, so the planner counts dtlab's small GPTs that way, to
# predict what a local run measures (`vocab_parallel` in `dtlab.plan` and
# `--vocab-parallel` in `dtlab plan` choose). One thing in that count is still
# simpler than Megatron-LM since Korthikanti et al. (2022): the **activations** are counted without
# **sequence parallelism**: TP splits the matrices of a block, but the LayerNorm
# and dropout activations between them stay whole on every TP rank; sequence
# parallelism splits those along the sequence too (Korthikanti et al., 2022,
# Table 2: sbh(10 + 24/t + 5as/(ht)) per layer with TP alone, sbh(34/t + 5as/(ht))
# with TP and SP; lesson 07 ran it). Selective recomputation stores none
# of the a×s×s attention scores, so with it the 5as/(ht) term drops out of both.
#
# **Predict:** with `sp=True` in the same layout, how many GB of activations per
# GPU does the planner count?
#
# 规划器按 Megatron-LM 训练这些已发表模型的方式计数：**嵌入层**（以及输出头）按词表切分到 TP 组上（词表并行的
# 嵌入层，每个 rank ⌈V/t⌉ 行），所以 GPT-3 的 50,257 × 12,288 嵌入表在阶段 0 的每张 GPU 上只保存 6,283 行，约
# 7,700 万个参数，而不是 6 亿。dtlab 自己的 TP 运行时让嵌入层和输出头在每个 TP rank 上保持完整，所以规划器也这样计算
# dtlab 的小 GPT，以便预测本地运行测得的结果（`dtlab.plan` 的 `vocab_parallel` 和 `dtlab plan` 的 `--vocab-parallel`
# 可以选择）。这个计数仍有一处比 Korthikanti 等（2022）之后的 Megatron-LM 简单：**激活值** 的计数没有使用 **序列并行**：TP 切分了
# block 中的矩阵，但它们之间的 LayerNorm 和 dropout 激活值在每个 TP rank 上都是完整的；序列并行把它们也沿序列
# 切开（Korthikanti 等，2022，表 2：仅用 TP 时每层 sbh(10 + 24/t + 5as/(ht))，TP 加 SP 时 sbh(34/t + 5as/(ht))；
# 第 07 课已真的运行过它）。选择性重计算不保存 a×s×s 的注意力分数，所以用它时两式中的 5as/(ht) 项都去掉。
#
# **预测：** 在同一布局里加上 `sp=True`，规划器算出的每张 GPU 激活值是多少 GB？

# %%
my_prediction_sp = None  # ← your prediction: GB / 你的预测：GB

with_sp = dtlab.plan("gpt3-175b", Layout(dp=8, tp=8, pp=16, micro_batches=96, zero=1, precision="bf16",
                                         recompute="selective", sp=True), gpu="H100", batch_size=1536, states="paper")
print(f"activations / 激活值: {p.memory['activations'] / 1e9:.2f} GB without SP / 不用 SP, "
      f"{with_sp.memory['activations'] / 1e9:.2f} GB with SP / 使用 SP (planner / 规划器)")
ok = check("15.sp_activations", my_prediction_sp, round(with_sp.memory["activations"] / 1e9, 2), source="planner")

# %% [markdown]
# **Step time.** The planner prices a step as the GPUs' arithmetic at 50% of
# their peak, stretched by the pipeline's bubble, plus the communication of each
# parallel dimension, none of it overlapped.
#
# **Predict** the compute part of one step of this layout, in seconds: 6Ψ FLOPs
# per token (Ψ = 175B; forward and backward of every weight) for the step's
# 1,536 × 2,048 tokens, shared by 1,024 GPUs at 50% of an H100's 989 TFLOP/s
# (bf16, dense), then stretched because every stage idles for the bubble,
# (p − 1)/(m + p − 1) = 15/111 of the step (section 3).
#
# **单步时间。** 规划器这样估算一步：GPU 的运算按峰值的 50% 计，再按流水线气泡拉长，然后加上每个并行维度的通信，
# 且都不与计算重叠。
#
# **预测：** 这个布局一步中计算部分要多少秒：每个 token 6Ψ 次浮点运算（Ψ = 1750 亿；每个权重的前向加反向），
# 一步有 1,536 × 2,048 个 token，由 1,024 张 GPU 分担，每张按 H100 峰值 989 TFLOP/s（bf16，稠密）的 50% 计；
# 再因为每个阶段都有气泡的空闲，即一步中的 (p − 1)/(m + p − 1) = 15/111（见第 3 节），把它拉长。

# %%
my_prediction_compute_s = None  # ← your prediction: seconds / 你的预测：秒

print(f"compute / 计算: {p.compute_time_s:.2f} s; communication / 通信: "
      + ", ".join(f"{dim} {s:.2f} s" for dim, s in p.comm_time_s.items())
      + f"; step / 单步: {p.step_time_s:.2f} s (planner / 规划器)")
ok = check("15.step_compute", my_prediction_compute_s, round(p.compute_time_s, 2), source="planner")

# %% [markdown]
# The planner's compute is a little more than 6Ψ: it adds attention's 12·l·h·s
# FLOPs per token (the scores and their weighted sum, which no weight counts)
# and the attention that selective recomputation runs again.
#
# **MFU**, model FLOPs utilization (Chowdhery et al., 2022, the PaLM paper), is
# the share of the GPUs' peak that the *model's* arithmetic uses: the model's
# FLOPs per token (about 6Ψ plus attention's 12·l·h·s, PaLM's count; the
# planner counts each of the model's matmuls once, `dtlab/planner/formulas.py`)
# times the tokens per second, over the number of
# GPUs times each GPU's peak FLOP/s. Only the FLOPs the model needs count, not
# whatever else the hardware runs. Published MFUs of large runs are 38-46%
# (Llama 3 405B 38-43%, Grattafiori et al., 2024; PaLM 540B 46.2%).
#
# **Predict:** for this GPT-3 layout, is the planner's MFU with *full*
# recomputation higher, lower or the same as with selective recomputation?
#
# 规划器的计算量比 6Ψ 略多：它加上了注意力每个 token 的 12·l·h·s 次浮点运算（注意力分数及其加权求和，不对应任何权重），
# 以及选择性重计算重新执行的那部分注意力。
#
# **MFU**（模型 FLOPs 利用率，Chowdhery 等，2022，PaLM 论文）是 *模型本身* 的运算占 GPU 峰值的比例：模型每个
# token 的浮点运算量（FLOPs：约为 6Ψ 再加注意力的 12·l·h·s，这是 PaLM 的计数；规划器把模型的每个矩阵乘法各计一次，
# 见 `dtlab/planner/formulas.py`）乘以每秒处理的 token 数，再除以 GPU 数乘以每张 GPU 的峰值 FLOP/s。只计入模型需要的
# FLOPs，硬件额外做的不算。已发表的大规模训练 MFU 在 38-46% 之间（Llama 3 405B 为 38-43%，Grattafiori 等，2024；
# PaLM 540B 为 46.2%）。
#
# **预测：** 对这个 GPT-3 布局，*完全* 重计算时规划器给出的 MFU 比选择性重计算时更高、更低，还是相同？

# %%
my_prediction_mfu = None  # ← your prediction: "higher", "lower" or "same" / 你的预测："更高"、"更低" 或 "相同"（半角引号）

full = dtlab.plan("gpt3-175b", Layout(dp=8, tp=8, pp=16, micro_batches=96, zero=1, precision="bf16",
                                      recompute="full"), gpu="H100", batch_size=1536, states="paper")
for name, plan in (("selective", p), ("full", full)):
    print(f"{name:>9}: step {plan.step_time_s:.2f} s, MFU {plan.mfu:.1%} (planner / 规划器)")
mfu_full = "lower" if full.mfu < p.mfu else "higher" if full.mfu > p.mfu else "same"
ok = check("15.mfu_recompute", my_prediction_mfu, mfu_full, source="planner")

# %% [markdown]
# Recomputed forwards are work the hardware does but not work the model needs:
# they make the step longer without adding to MFU's numerator. Hardware FLOPs
# utilization (HFU) counts them, and barely moves: the extra forward is work
# done, at the same rate.
#
# 重计算的前向是硬件做了、模型却并不需要的工作：它们让单步变长，却不增加 MFU 的分子。硬件 FLOPs 利用率（HFU）
# 会计入它们，所以几乎不变：多出来的前向也是按同样速率完成的工作。

# %%
for name, plan in (("selective", p), ("full", full)):
    hfu = plan.flops_per_iteration / (plan.step_time_s * plan.gpus * GPUS[plan.gpu].peak_flops["bf16"])
    print(f"{name:>9}: MFU {plan.mfu:.1%}, HFU {hfu:.1%} (planner / 规划器)")

# %% [markdown]
# ## 3. The pipeline bubble / 流水线气泡
#
# With p stages and m micro-batches, GPipe's schedule leaves every stage idle for
# (p − 1)/(m + p − 1) of the time (Huang et al., 2018). (Megatron-LM writes the
# same bubble as (p − 1)/m of the *ideal* time; dtlab reports the first.) The
# formula is written once, in `dtlab/parallel/pipeline/schedule.py`, beside the schedules
# the pipeline runtime executes; the planner imports it from there.
#
# **Predict** the bubble fraction for p = 4 with m = 4 and with m = 16.
#
# 有 p 个阶段、m 个微批次时，GPipe 调度让每个阶段有 (p − 1)/(m + p − 1) 的时间处于空闲
# （Huang 等，2018）。（Megatron-LM 把同一个气泡写成 *理想* 时间的 (p − 1)/m；dtlab 报告前者。）
# 这个公式只写了一次，就在 `dtlab/parallel/pipeline/schedule.py` 里，和流水线运行时执行的调度放在一起；规划器从那里导入它。
#
# **预测：** p = 4 时，m = 4 和 m = 16 的气泡比例各是多少？

# %%
my_prediction_bubbles = None  # ← your prediction: [m = 4, m = 16] / 你的预测：[m = 4, m = 16]

rounded = None if my_prediction_bubbles is None else [round(float(b), 4) for b in my_prediction_bubbles]
ok = check("15.bubbles", rounded, [round(float(ideal_bubble_fraction(4, m)), 4) for m in (4, 16)], source="formula")

# %% [markdown]
# ## 4. Explore / 自己探索
#
# Move the sliders: the bars are memory per GPU, the black mark is the GPU's
# capacity, the memory budget every layout has to come in under. The explorer
# starts at section 2's layout and counts model states as section 2 did (the
# ZeRO paper's 16Ψ). Try TP = 1 (the model no longer fits), ZeRO stage 3, full
# recomputation, or Llama 3 405B on H200s.
#
# 拖动滑块：柱子是每张 GPU 的显存，黑色标记是 GPU 的容量，也就是每个布局都不能超出的显存预算。探索器从第 2 节的布局开始，
# 并像第 2 节那样计算模型状态（ZeRO 论文的 16Ψ）。试试 TP = 1（模型就放不下了）、ZeRO 阶段 3、完全重计算，或者把
# Llama 3 405B 放到 H200 上。

# %%
# NBVAL_IGNORE_OUTPUT
explorer = PlannerExplorer(states="paper")
explorer

# %% [markdown]
# ## 5. Prediction beside measurement, on this machine / 在本机上把预测和实测并排
#
# A step time can only be checked on the machine it is for, so first measure
# this one. `calibrate` runs on the same warm ranks as the trainings below and
# times what a step is made of: the small GPT's forward and backward and one
# matmul at its shapes with 1, 2 and 4 ranks running at once (on a 2-core
# machine, 4 ranks get half a core each), AdamW's step, and gloo's collectives at a few message
# sizes, fitted to α + β·n. `quick=True` measures fewer sizes and repeats (about
# 20 s; `dtlab calibrate` in a terminal measures more carefully). This quick
# profile is saved beside the one `dtlab calibrate` writes, as
# `lesson15_machine.json` (yours is left as it is), and the cells below give the
# planner its path (`gpu=str(profile_path)`). How
# busy the machine is moves every number, so this cell's output changes from run
# to run.
#
# 一个单步时间只能在它所针对的机器上检验，所以先测量这台机器。`calibrate` 在下面训练所用的同一组预热好的
# rank 上运行，测出一步由哪些部分组成：小 GPT 的前向和反向、按它的形状做的一次矩阵乘法（分别在 1、2、4 个
# rank 同时运行时测；在 2 核的机器上，4 个 rank 每个只分到半个核）、AdamW 的一步，以及 gloo 集合通信在几种消息
# 大小下的耗时，拟合成 α + β·n。`quick=True` 测的大小和重复次数更少（约 20 秒；在终端里运行
# `dtlab calibrate` 会测得更仔细）。这份快速配置文件保存在 `dtlab calibrate` 写出的文件旁边，名为
# `lesson15_machine.json`（你自己的配置文件保持不变），下面的单元格把它的路径交给规划器（`gpu=str(profile_path)`）。
# 机器有多忙会影响每个数字，所以这个单元格的输出每次运行都不同。

# %%
# NBVAL_IGNORE_OUTPUT
from dtlab.planner.calibrate import calibrate, format_profile
from dtlab.launch import default_pool
from dtlab.planner.profile import default_path, save_profile

machine = calibrate(quick=True, pool=default_pool())   # the warm ranks every run below reuses
profile_path = save_profile(machine, default_path().with_name("lesson15_machine.json"))
print(format_profile(machine, profile_path))

# %% [markdown]
# Now the small GPT with DP = 4: `config.layout` is the run's own `Layout`,
# passed to the planner unchanged. Parameters, gradients and Adam's moments are
# exact counts, so the planner and dtlab's memory accountant must agree to the
# byte. Activations are a formula for a GPU kernel set (Korthikanti et al. count
# dropout masks, which this model does not have), so expect them to differ, and
# look at the ratio.
#
# **Predict:** the bytes of optimizer state per rank (236,928 parameters, Adam's
# two fp32 moments).
#
# 现在是 DP = 4 的小 GPT：`config.layout` 就是这次运行自己的 `Layout`，原样交给规划器。参数、梯度和
# Adam 的动量与方差（两个 fp32 状态）都是精确的计数，所以规划器和 dtlab 的内存统计必须逐字节一致。激活值则是针对 GPU 内核
# 写出的公式（Korthikanti 等人计入了 dropout 掩码，而这个模型没有 dropout），所以会有差别，请看两者的比值。
#
# **预测：** 每个 rank 的优化器状态有多少字节（236,928 个参数，Adam 的动量与方差，两个 fp32 状态）？

# %%
my_prediction_optimizer = None  # ← your prediction: bytes, an integer / 你的预测：字节数（整数）

config = TrainConfig(dp=4, steps=5, seed=0)
run = dtlab.train(config).wait()
measured = run.records[-1]["ranks"][0]["mem"]
planner_memory = dtlab.plan("small", config.layout, batch_size=config.batch_size).memory
print(f"{'':>22} {'planner':>12} {'measured':>12}   (规划器 / 实测)")
for category, zh in (("params", "参数"), ("grads", "梯度"), ("optimizer", "优化器"), ("activations", "激活值")):
    print(f"{category + ' / ' + zh:>22} {planner_memory[category]:>12,} {measured[category]:>12,}")
ok = check("15.optimizer", my_prediction_optimizer, measured["optimizer"])
same_states = all(planner_memory[c] == measured[c] for c in ("params", "grads", "optimizer"))
ratio = measured["activations"] / planner_memory["activations"]
print(f"activations, measured / planner = {ratio:.2f} / 激活值，实测 / 规划器 = {ratio:.2f}")

# %% [markdown]
# With the profile, the planner prices the same layout on this machine
# (`gpu=str(profile_path)`, or `gpu="local"` for the one `dtlab calibrate` wrote) instead of on an H100 at 50% of its peak: each rank's forward
# and backward at the FLOP/s one rank reached while four ran, AdamW's step, and
# each all-reduce DP issues at its fitted α + β·n. Beside it, the run's median
# step (the first step, which warms up, left out).
#
# 有了配置文件，规划器就按本机（`gpu=str(profile_path)`；`gpu="local"` 则用 `dtlab calibrate` 写出的那份）而不是按达到峰值 50% 的 H100 来估算同一个布局：每个 rank 的
# 前向和反向按 4 个 rank 同时运行时单个 rank 测得的 FLOP/s 计，再加上 AdamW 的一步，以及 DP 发出的每次
# 全归约按拟合出的 α + β·n 计。旁边是这次运行的单步时间中位数（不计用于预热的第一步）。

# %%
# NBVAL_IGNORE_OUTPUT
local = dtlab.plan("small", config.layout, batch_size=config.batch_size, gpu=str(profile_path))
step_times = [r["step_time_s"] for r in run.records[1:]]
step_measured_s = statistics.median(step_times)
print(f"planner, this machine's profile: {local.step_time_s * 1e3:.1f} ms per step"
      f" / 规划器（本机配置文件）：每步 {local.step_time_s * 1e3:.1f} 毫秒")
print(f"measured here: {step_measured_s * 1e3:.1f} ms per step (median of {len(step_times)} steps)"
      f" / 本机实测：每步 {step_measured_s * 1e3:.1f} 毫秒（{len(step_times)} 步的中位数）")
print(f"measured / planner = {step_measured_s / local.step_time_s:.2f} / 实测 / 规划器 = "
      f"{step_measured_s / local.step_time_s:.2f}")

# %% [markdown]
# **MFU on this machine.** Section 2's definition with this machine's numbers:
# the model's FLOPs per step over the step time times the peak. PaLM's count
# of the model's FLOPs, 6N per token for forward and backward plus 12·l·h·s
# for attention, also counts weights that are looked up or added, not
# multiplied: the 20,480 of the token and position tables, the LayerNorms and
# biases. For a model this small that is about 10% more than its matmuls do
# (for GPT-3, well under 1%), so the planner counts the matmuls themselves:
# the hardware's FLOPs without recomputation. The peak is what `calibrate` measured for one matmul at
# the model's shapes with 4 ranks running, times 4: the rate 4 ranks' matmuls
# reached together. That "peak" is an achieved rate, not a hardware peak from a
# datasheet: the cores' theoretical FLOP/s are higher, so an MFU against them
# would be lower than the one printed here. The planner's MFU (`local.mfu`) is
# the same ratio with its own step time.
#
# **本机的 MFU。** 用第 2 节的定义，代入本机的数字：模型每步的 FLOPs，除以单步时间乘以峰值。PaLM 对模型 FLOPs 的计数（每个 token 前向加反向 6N，
# 再加注意力的 12·l·h·s）也把只被查表或只做加法、不参与乘法的权重算了进去：token 表和位置表的 20,480 个参数、
# LayerNorm 和偏置。对这么小的模型，这比它的矩阵乘法实际做的多出约 10%（对 GPT-3 则远小于 1%），所以规划器
# 直接数矩阵乘法本身：即不含重计算的硬件 FLOPs。峰值是 `calibrate` 在 4 个 rank 同时运行时测得的单个 rank 按模型
# 形状做矩阵乘法的 FLOP/s，乘以 4：即 4 个 rank 的矩阵乘法合计达到的速率。这个“峰值”是实际跑出来的速率，
# 而不是规格表上的硬件峰值：这些核的理论 FLOP/s 更高，按它算出的 MFU 会比这里打印的低。规划器的 MFU（`local.mfu`）是同一个比值，只是用它
# 自己算出的单步时间。

# %%
cfg = config.model_config()
tokens = config.batch_size * cfg.seq_len
palm_flops = model_flops_per_token(cfg.param_count(), layers=cfg.n_layer, hidden=cfg.d_model,
                                   seq_len=cfg.seq_len) * tokens
model_flops = flops_per_iteration(as_architecture(cfg), batch_size=config.batch_size)   # every matmul, once
print(f"PaLM's 6N + 12lhs: (6 x {cfg.param_count():,} + 12 x {cfg.n_layer} x {cfg.d_model} x {cfg.seq_len})"
      f" x {tokens} tokens = {palm_flops:,} / PaLM 的 6N + 12lhs：{palm_flops:,} (formula / 公式)")
print(f"the matmuls themselves: {model_flops:,} / 矩阵乘法本身：{model_flops:,}; "
      f"6N + 12lhs / matmuls = {palm_flops / model_flops:.2f} (formula / 公式)")
print("the planner counts the matmuls / 规划器按矩阵乘法计数:", model_flops == local.model_flops_per_iteration)

# %%
# NBVAL_IGNORE_OUTPUT
peak = config.world_size * machine.compute_at(config.world_size).matmul_flop_s
mfu_here = model_flops / (step_measured_s * peak)
print(f"peak, {config.world_size} ranks' matmuls (calibrated): {peak / 1e9:.1f} GFLOP/s"
      f" / 峰值，{config.world_size} 个 rank 的矩阵乘法（校准值）：{peak / 1e9:.1f} GFLOP/s")
print(f"MFU from the measured step time: {mfu_here:.1%} / MFU（按实测单步时间）：{mfu_here:.1%}")
print(f"MFU, planner's step for this machine: {local.mfu:.1%} / MFU（规划器的本机单步）：{local.mfu:.1%}")

# %% [markdown]
# Far below the 38-46% of large GPU runs. The peak is already the rate of these
# tiny matmuls; what is missing is the rest of the step: each block's fixed
# costs (LayerNorm, softmax, the Python around them: calibrate's "per block"),
# AdamW's step, and gloo's collectives, which run on the same cores as the
# compute.
#
# **The layout search, checked here.** `dtlab plan --search --model small --gpus 4
# --batch-size 8 --gpu PATH`, with the profile's path printed above, ranks every
# layout of 4 ranks on this profile. `LayoutRace` takes its top
# four that `dtlab train` runs (the fastest of each way of splitting 4 ranks into
# dp × tp × pp), runs each for a few steps on the same warm ranks, twice in turn
# so that a change in the machine's load falls on all of them, and sets the
# measured order beside the planner's. Kendall's τ scores the two orders: each
# pair of layouts counts +1 if both put them in the same order and −1 if not,
# divided by the number of pairs (1: the same order, −1: reversed).
#
# **Predict:** the planner's four are printed below. Which of them (its rank: 1,
# 2, 3 or 4) will be fastest when measured?
#
# 远低于大型 GPU 训练的 38-46%。峰值本身就是这些小矩阵乘法的速率；差距来自一步中的其余部分：每个 block 的固定开销
# （LayerNorm、softmax 以及它们周围的 Python 代码，即 calibrate 报告的 “per block”）、AdamW 的一步，以及和计算
# 挤在同样 CPU 核上的 gloo 集合通信。
#
# **在本机检验布局搜索。** `dtlab plan --search --model small --gpus 4 --batch-size 8 --gpu PATH`（PATH 为上面打印的
# 配置文件路径）按这个配置文件给 4 个 rank 的所有布局排序。`LayoutRace` 取出其中 `dtlab train` 能运行的前四名（把 4 个 rank 切成 dp × tp × pp 的每种方式里最快
# 的那个），在同一组预热好的 rank 上把每个布局各跑几步，轮流跑两遍，使机器负载的变化落在所有布局上，再把实测
# 的顺序和规划器的顺序并排。Kendall 的 τ 给两个顺序打分：每一对布局，两边顺序相同记 +1，不同记 −1，再除以
# 布局对的总数（1：顺序相同，−1：完全相反）。
#
# **预测：** 下面列出了规划器的四个布局。实测时哪一个最快（填它在规划器里的名次：1、2、3 或 4）？

# %%
# NBVAL_IGNORE_OUTPUT
race = LayoutRace(ranks=4, top=4, profile=str(profile_path))
for i, plan in enumerate(race.layouts, 1):
    print(f"#{i} {layout_label(plan):<28} planner: {plan.step_time_s * 1e3:6.1f} ms per step"
          f" / 规划器：每步 {plan.step_time_s * 1e3:.1f} 毫秒")

# %%
my_prediction_fastest = None  # ← your prediction: 1, 2, 3 or 4 / 你的预测：1、2、3 或 4

# %%
# NBVAL_IGNORE_OUTPUT
result = race.run()
ok = check("15.race_fastest", my_prediction_fastest, result.fastest)
print(f"Kendall tau, the planner's order against the measured one: {result.kendall_tau:.2f}"
      f" / 规划器排序与实测排序的 Kendall tau：{result.kendall_tau:.2f}")
race

# %% [markdown]
# Where the order breaks, the ratio column says which prediction was off. The
# profile was measured under whatever load there was then; layouts whose
# predicted times differ by less than the run-to-run noise swap places; and the
# planner's costs are fitted to a few sizes and extrapolated to the rest. Run
# the race again and see which swaps come back. `dtlab bench planner` does the
# same for eleven fixed layouts.
#
# 顺序被打乱的地方，看比值那一列就知道哪个预测偏了。配置文件是在当时的负载下测的；预测时间相差小于每次运行
# 之间波动的布局会互换位置；规划器的开销是用几种大小拟合出来、再外推到其他大小的。再跑一次比赛，看看哪些
# 互换还会出现。`dtlab bench planner` 对十一个固定布局做同样的事。

# %% [markdown]
# ## Try this / 动手试试
#
# 1. **Task:** Llama 3 70B with ZeRO-3 and no TP or PP, bf16, full
#    recomputation, one sequence per GPU: what is the smallest power-of-two
#    number of H100s on which it fits? Try it in the explorer, then write it below.
# 2. Switch recompute between none, selective and full for GPT-3: which term of
#    the memory changes, and what does it cost in step time? (Planner: only the
#    activations change: none 111.1 GB per GPU, which does not fit, and 9.20 s
#    per step; selective 62.8 GB, 9.27 s; full 9.7 GB, 12.23 s, a third slower.)
# 3. Llama 3 405B on 2,048 GPUs: `dtlab.plan("llama3-405b", Layout(dp=16, tp=8,
#    pp=16, micro_batches=128, zero=1, precision="bf16", recompute="selective",
#    sp=True), gpu="H100", batch_size=2048, states="paper")`. Does it fit on an
#    H100, and on an H200? (Planner: 89.4 GB per GPU, so not on an H100's 80 GB
#    but on an H200's 141; 57 s per step, MFU 38.1%, bubble 10.5%.) In a
#    terminal, `dtlab plan --model llama3-405b --gpus 2048 --dp 16 --tp 8 --pp 16
#    --micro-batches 128 --zero 1 --precision bf16 --recompute selective
#    --sequence-parallel --batch-size 2048` prints it as a table, counting the states the same
#    way (its default, `--master-weights optimizer`).
# 4. `LayoutRace(ranks=8, top=6, profile=str(profile_path))` races six layouts of 8 ranks (they share this
#    machine's cores). Does the planner's order hold better or worse than with 4?
#
# 1. **任务：** Llama 3 70B 使用 ZeRO-3、不用 TP 和 PP、bf16、完全重计算、每张 GPU 一条序列：最少需要多少张
#    （2 的幂）H100 才放得下？先在探索器里试一试，再把答案写在下面。
# 2. 对 GPT-3 在 none、selective、full 三种重计算之间切换：显存里哪一项变了？单步时间要付出多少代价？
#    （规划器：只有激活值变化：none 每张 GPU 111.1 GB，放不下，每步 9.20 秒；selective 62.8 GB，9.27 秒；
#    full 9.7 GB，12.23 秒，慢了三分之一。）
# 3. 在 2,048 张 GPU 上训练 Llama 3 405B：`dtlab.plan("llama3-405b", Layout(dp=16, tp=8, pp=16, micro_batches=128,
#    zero=1, precision="bf16", recompute="selective", sp=True), gpu="H100", batch_size=2048, states="paper")`。
#    H100 放得下吗？H200 呢？（规划器：每张 GPU 89.4 GB，H100 的 80 GB 放不下，H200 的 141 GB 放得下；每步 57 秒，
#    MFU 38.1%，气泡 10.5%。）在终端里，`dtlab plan --model llama3-405b --gpus 2048 --dp 16 --tp 8 --pp 16
#    --micro-batches 128 --zero 1 --precision bf16 --recompute selective --sequence-parallel --batch-size 2048` 会以表格形式打印它，
#    模型状态的计算方式相同（它的默认值 `--master-weights optimizer`）。
# 4. `LayoutRace(ranks=8, top=6, profile=str(profile_path))` 让 8 个 rank 的六个布局比赛（它们共享本机的 CPU 核）。规划器的顺序比 4 个
#    rank 时更准还是更不准？

# %%
my_answer_gpus = None  # ← your answer: a number of GPUs / 你的答案：GPU 数量

# %%
fits_at = next(n for n in (2 ** k for k in range(12))
               if dtlab.plan("llama3-70b", Layout(dp=n, zero=3, precision="bf16", recompute="full"),
                             gpu="H100", batch_size=n).fits)
ok = check("15.try_llama_gpus", my_answer_gpus, fits_at, source="planner")

# %% [markdown]
# ## Check / 检查
#
# The last cell repeats this lesson's results as one deterministic summary.
# 最后一个单元格把本课的结果汇总成一个确定的结论。

# %%
results = {
    "ZeRO Fig. 1 reproduced / 复现 ZeRO 图 1": [round(sum(model_states_bytes(7_500_000_000, dp=64, zero=s,
        precision="bf16").values()) / 1e9, 1) for s in range(4)] == [120.0, 31.4, 16.6, 1.9],
    "GPT-3 175B fits on 1,024 H100s with TP8 x PP16 x DP8 / GPT-3 175B 能以 TP8 x PP16 x DP8 放进 1,024 张 H100": p.fits,
    "sequence parallelism cuts its activations / 序列并行减少了它的激活值":
        with_sp.memory["activations"] < p.memory["activations"] / 2,
    "full recomputation lowers MFU / 完全重计算降低 MFU": full.mfu < p.mfu,
    "bubble 3/7 and 3/19 / 气泡 3/7 与 3/19":
        (ideal_bubble_fraction(4, 4), ideal_bubble_fraction(4, 16)) == (Fraction(3, 7), Fraction(3, 19)),
    "planner model states equal the accountant's / 规划器的模型状态等于内存统计": same_states,
    "model FLOPs per step as the planner counts them / 每步模型 FLOPs 与规划器的计数相同":
        model_flops == local.model_flops_per_iteration,
    "the race ran each of its layouts / 比赛真的运行了它的每个布局":
        all(len(r.runs) == race.passes and r.step_times for r in result.rows),
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 15:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
