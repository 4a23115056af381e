# %% [markdown]
# # Lesson 03 — Mixed precision
# # 第 03 课 —— 混合精度
#
# **What you will see.** Training in 16-bit numbers halves the bytes of every
# activation and, on a GPU, runs matrix multiplications on tensor cores several
# times faster. The price is a smaller number format. You will read the three
# formats side by side (**fp32**, **fp16**, **bf16**), see why an update added to
# a 16-bit weight can vanish (the reason for fp32 **master weights**), find out
# which gradients fp16 turns into zero and how **loss scaling** rescues them,
# step a real dynamic loss scaler through overflows and skipped steps, and
# finally train the small GPT in fp32, bf16 and fp16 and watch the loss scale
# of the fp16 run. The recipe comes from *Mixed Precision Training*
# (Micikevicius et al., 2017).
#
# **你将看到什么。** 用 16 位浮点数训练，每个激活值占用的字节减半；在 GPU 上，矩阵乘法还能用
# Tensor Core 跑得快好几倍。代价是数值格式变小了。你会并排比较三种格式（**fp32**、**fp16**、
# **bf16**），看到为什么加到 16 位权重上的更新量会消失（这就是需要 fp32 **主权重** 的原因），
# 找出哪些梯度会被 fp16 变成 0、**损失缩放** 又如何把它们救回来，一步一步地驱动一个真实的动态损失
# 缩放器经历上溢和被跳过的步，最后分别用 fp32、bf16 和 fp16 训练小 GPT，观察 fp16 那次训练的
# 损失缩放系数。这套做法出自论文 *Mixed Precision Training*（Micikevicius 等，2017）。

# %%
import torch

import dtlab
from dtlab import TrainConfig
from dtlab.lab import Dashboard, check, human_bytes
from dtlab.lab.loss_scaling_view import LossScaleFigure, LossScalerStepper
from dtlab.numerics.precision import describe_formats, format_table, overflows_in, underflows_in
from dtlab.course.exercises import grade

# %% [markdown]
# ## 1. Three formats / 三种格式
#
# A floating-point number is sign × 2^exponent × 1.mantissa. The **exponent
# bits** decide the range: how large a number can be before it becomes `inf`,
# and how small before it becomes 0. The **mantissa bits** decide the precision:
# how many neighbours a number has between 1 and 2. Below the smallest *normal*
# number the format still has *subnormals*, which give up mantissa bits to reach
# a little further down; the smallest subnormal is the last stop before 0.
#
# * fp32: 8 exponent bits, 23 mantissa bits.
# * fp16 (IEEE half precision): 5 exponent bits, 10 mantissa bits.
# * bf16 (bfloat16): keeps fp32's 8 exponent bits and cuts the mantissa.
#
# **Predict:** fp16's largest finite value; its smallest subnormal (as a power
# of two: 10 mantissa bits below the smallest normal, 2^-14); how many exponent
# and mantissa bits bf16 has; and how bf16's largest value compares with
# fp32's (as a ratio, to two decimals).
#
# 浮点数的形式是 符号 × 2^指数 × 1.尾数。**指数位** 决定范围：一个数能多大才变成 `inf`，
# 能多小才变成 0。**尾数位** 决定精度：1 和 2 之间能放下多少个相邻的数。在最小的 *规格化数*
# 之下，格式里还有 *非规格化数*（subnormal），它们牺牲尾数位来表示更小的数；最小的非规格化数
# 就是变成 0 之前的最后一站。
#
# * fp32：8 位指数，23 位尾数。
# * fp16（IEEE 半精度）：5 位指数，10 位尾数。
# * bf16（bfloat16）：保留 fp32 的 8 位指数，砍短尾数。
#
# **预测：** fp16 最大的有限值是多少？它最小的非规格化数是多少（写成 2 的幂：在最小规格化数
# 2^-14 之下再往下 10 个尾数位）？bf16 有几位指数、几位尾数？bf16 的最大值和 fp32 的最大值相比
# 是多少（写成比值，保留两位小数）？

# %%
# ← your prediction: {"fp16 max": x, "fp16 smallest subnormal": x, "bf16 exponent bits": n,
#                     "bf16 mantissa bits": n, "bf16 max / fp32 max": x} / 你的预测
my_prediction = None

# %%
print(describe_formats())
print()
rows = {row["format"]: row for row in format_table()}   # read from torch.finfo: the formats' definitions
spec = {"fp16 max": rows["fp16"]["max"], "fp16 smallest subnormal": rows["fp16"]["smallest_subnormal"],
            "bf16 exponent bits": rows["bf16"]["exponent_bits"], "bf16 mantissa bits": rows["bf16"]["mantissa_bits"],
            "bf16 max / fp32 max": round(rows["bf16"]["max"] / rows["fp32"]["max"], 2)}
ok = check("03.formats", my_prediction, spec, source="spec")

# %% [markdown]
# fp16 gives up range for precision; bf16 gives up precision for range. bf16's
# epsilon (the gap between 1 and the next number) is 2^-7 = 0.0078: it keeps two
# to three decimal digits, fp16 about three, fp32 about seven.
#
# fp16 用范围换精度；bf16 用精度换范围。bf16 的 epsilon（1 与下一个可表示数之间的间隔）是
# 2^-7 = 0.0078：它只有两到三位十进制有效数字，fp16 大约三位，fp32 大约七位。
#
# ## 2. Why the weights stay in fp32 / 为什么权重要留在 fp32
#
# An optimizer step changes a weight by a tiny amount: with a learning rate of
# 1e-3, often 1e-4 or less. Add 0.0001 to a weight of 1.0. The next number above
# 1.0 is 1 + epsilon and the next below is 1 − epsilon/2 (the spacing halves
# under 1), so an increase smaller than half of epsilon rounds away and the
# weight does not move at all (a decrease, below a quarter of epsilon). That is why mixed precision keeps an fp32
# **master** copy of the weights that the optimizer updates (Micikevicius et al.,
# Sec. 3.1), and computes each layer on a 16-bit copy of it. dtlab does exactly
# this: the model's parameters stay fp32, and each layer casts them as it runs
# (`dtlab/numerics/precision.py`).
#
# **Predict:** does 1.0 + 0.0001 differ from 1.0 in fp32, in fp16, in bf16?
#
# 优化器每一步对权重的改动都很小：学习率为 1e-3 时，常常只有 1e-4 甚至更小。把 0.0001 加到一个
# 值为 1.0 的权重上。比 1.0 大的下一个数是 1 + epsilon，比它小的上一个数是 1 − epsilon/2（1 以下的间隔减半），所以小于
# 半个 epsilon 的增量会被舍入掉，权重纹丝不动（减量则是小于四分之一个 epsilon 时）。这就是混合精度要保留一份由优化器更新的 fp32 **主权重** 的原因（Micikevicius 等，
# 第 3.1 节），每一层则在它的 16 位副本上计算。dtlab 正是这样做的：模型参数始终是 fp32，每一层
# 在运行时才把它们转换成 16 位（`dtlab/numerics/precision.py`）。
#
# **预测：** 1.0 + 0.0001 在 fp32、fp16、bf16 中分别与 1.0 不同吗？

# %%
my_prediction = None  # ← your prediction: {"fp32": bool, "fp16": bool, "bf16": bool} / 你的预测

moved = {}
for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
    weight = torch.tensor(1.0, dtype=dtype)
    moved[name] = bool(weight + torch.tensor(1e-4, dtype=dtype) != weight)
ok_master = check("03.master", my_prediction, moved)

# %% [markdown]
# ## 3. Which gradients vanish in fp16 / 哪些梯度会在 fp16 中消失
#
# Gradients flowing back through a network are often tiny. In fp16 anything
# smaller than half of the smallest subnormal (2^-25 ≈ 3e-8) rounds to 0: that
# gradient, and every weight update that depends on it, is lost. The paper's
# Figure 3 shows it for a real network (an SSD detector): many activation
# gradients lie below fp16's smallest value, while most of the range above them
# is unused. **Loss scaling** multiplies the loss by a factor S before backward.
# Backward is linear, so every gradient comes out S times larger and moves up
# into fp16's range; the gradients are divided by S again in fp32, before the
# optimizer uses them (Micikevicius et al., Sec. 3.2). The danger flips: a
# gradient times S may pass 65504 and become `inf`.
#
# **Predict,** for the gradients below, which become 0 in fp16 without scaling,
# which still become 0 with S = 2^16 = 65536 (the dynamic scaler's starting
# value), and which *overflow* with that S.
#
# 反向传播中流动的梯度往往非常小。在 fp16 里，任何小于最小非规格化数一半（2^-25 ≈ 3e-8）的值
# 都会舍入成 0：这个梯度，以及依赖它的所有权重更新，都丢失了。论文的图 3 用一个真实网络（SSD
# 检测器）展示了这一点：许多激活梯度落在 fp16 最小值之下，而它们上方的大部分范围却没被用上。
# **损失缩放** 在反向传播前把损失乘以系数 S。反向传播是线性的，所以每个梯度都放大 S 倍，进入
# fp16 的表示范围；在优化器使用之前，再在 fp32 中把梯度除以 S（Micikevicius 等，第 3.2 节）。
# 危险随之反转：梯度乘以 S 之后可能超过 65504，变成 `inf`。
#
# **预测：** 对下面这些梯度，哪些在不缩放时会在 fp16 中变成 0？哪些在 S = 2^16 = 65536（动态
# 缩放器的初始值）时仍会变成 0？哪些在这个 S 下会 *上溢*？

# %%
gradients = [4.0, 1e-3, 1e-5, 1e-7, 1e-9, 1e-11, 1e-13]
my_prediction_zero = None         # ← your prediction: 7 booleans, one per gradient / 你的预测：7 个布尔值
my_prediction_zero_scaled = None  # ← your prediction: 7 booleans / 你的预测：7 个布尔值
my_prediction_inf_scaled = None   # ← your prediction: 7 booleans / 你的预测：7 个布尔值

# %%
S = 2.0 ** 16
zero = underflows_in(gradients, torch.float16).tolist()
zero_scaled = underflows_in(gradients, torch.float16, scale=S).tolist()
inf_scaled = overflows_in(gradients, torch.float16, scale=S).tolist()
print(f"{'gradient':>9} {'fp16':>12} {'x S in fp16':>12} {'bf16':>12}   (梯度 / fp16 / 乘以 S 后的 fp16 / bf16)")
for g in gradients:
    as_fp16 = torch.tensor(g).to(torch.float16).item()
    scaled = torch.tensor(g * S).to(torch.float16).item()
    as_bf16 = torch.tensor(g).to(torch.bfloat16).item()
    print(f"{g:>9.0e} {as_fp16:>12.4g} {scaled:>12.4g} {as_bf16:>12.4g}")
ok_zero = check("03.zero", my_prediction_zero, zero)
ok_zero_scaled = check("03.zero_scaled", my_prediction_zero_scaled, zero_scaled)
ok_inf_scaled = check("03.inf_scaled", my_prediction_inf_scaled, inf_scaled)
bf16_loses_none = not any(underflows_in(gradients, torch.bfloat16).tolist())
print("bf16 keeps every one of them without scaling / bf16 不缩放也一个不丢:", bf16_loses_none)

# %% [markdown]
# Notice the last column: bf16 keeps every gradient, because its range is
# fp32's. That is why bf16 training needs no loss scaling at all (dtlab refuses
# `loss_scale` with bf16 and says why).
#
# 注意最后一列：bf16 保留了所有梯度，因为它的范围和 fp32 一样。这就是 bf16 训练根本不需要损失
# 缩放的原因（dtlab 会拒绝在 bf16 下设置 `loss_scale`，并说明理由）。
#
# ## 4. Dynamic loss scaling, step by step / 动态损失缩放，一步一步来
#
# No single S suits a whole run: too small and gradients vanish, too large and
# they overflow. Micikevicius et al. (Sec. 3.2) scale by a constant, chosen
# from the gradients' statistics, and skip a step whose gradients overflow.
# Adjusting S as training goes is a later rule, from NVIDIA's mixed-precision
# training guide, which PyTorch's `GradScaler` follows: it starts high, at
# S = 2^16, and after every step:
#
# * if any gradient is `inf` or `NaN`: **skip** the step (the weights and Adam's
#   moments stay as they were) and halve S;
# * after `growth_interval` clean steps in a row: double S.
#
# (PyTorch waits 2,000 clean steps; the stepper below waits 4 so that you can
# see it grow.) Each press of **Step** feeds one step's largest gradient to a
# real `dtlab.numerics.loss_scaling.LossScaler`: multiply by S, store in fp16, unscale and
# check, update. The script is: 0.5, 0.5, then 3.0 three times, then 0.5 seven
# times.
#
# **Predict:** which steps are skipped, and what is S after the last step?
#
# 没有哪个固定的 S 能适合整次训练：太小，梯度会消失；太大，梯度会上溢。Micikevicius 等（第 3.2 节）用的是
# 一个常数，根据梯度的统计值选定，梯度上溢的那一步则跳过。在训练过程中自动调整 S 是后来的规则，出自 NVIDIA
# 的混合精度训练指南，PyTorch 的 `GradScaler` 也照此实现：从较高的 S = 2^16 开始，每一步之后：
#
# * 只要有任何梯度是 `inf` 或 `NaN`：**跳过** 这一步（权重和 Adam 的动量都保持原样），并把 S 减半；
# * 连续 `growth_interval` 步都正常之后：把 S 翻倍。
#
# （PyTorch 要等 2,000 个正常步；下面的演示只等 4 步，好让你看到它增长。）每按一次
# **Step**（前进一步），就把这一步最大的梯度送进一个真实的 `dtlab.numerics.loss_scaling.LossScaler`：乘以 S、
# 以 fp16 存储、除回 S 并检查、更新。脚本是：0.5、0.5，然后三次 3.0，再七次 0.5。
#
# **预测：** 哪几步会被跳过？最后一步之后 S 是多少？

# %%
# NBVAL_IGNORE_OUTPUT
script = [0.5, 0.5, 3.0, 3.0, 3.0] + [0.5] * 7
stepper = LossScalerStepper(script, growth_interval=4)
stepper

# %%
my_prediction = None  # ← your prediction: {"skipped steps": [steps], "final scale": S} / 你的预测

stepper.reset()
while stepper.step() is not None:
    pass
for row in stepper.rows:
    print(stepper.row_text(row, "en"))
    print("  " + stepper.row_text(row, "zh"))
scripted = {"skipped steps": [r["step"] for r in stepper.rows if r["skipped"]],
            "final scale": stepper.scaler.loss_scale}
ok_script = check("03.script", my_prediction, scripted, source="simulated")

# %% [markdown]
# 3.0 × 65536 and 3.0 × 32768 are both above 65504, so two steps are skipped
# and S halves twice; 3.0 × 16384 = 49152 fits. Four clean steps later S doubles,
# and four more later it doubles again, back to where it started.
#
# 3.0 × 65536 和 3.0 × 32768 都超过 65504，所以有两步被跳过，S 连续减半两次；
# 3.0 × 16384 = 49152 放得下。四个正常步之后 S 翻倍，再过四步又翻倍，回到起点。
#
# ## 5. A real run in fp32, bf16 and fp16 / 真实训练：fp32、bf16 与 fp16
#
# Now the small GPT trains three times with the same seed and data: in fp32, in
# bf16 and in fp16 with dynamic loss scaling. The learning rate is 10 times the
# default (1e-2). It does not touch step 0's gradient, but it makes the first
# updates large, so the gradients of the next steps grow. In the bf16 and fp16
# runs the parameters and their gradients are 16-bit, and the optimizer keeps the
# fp32 master weights beside Adam's moments (dtlab's default, as Megatron-LM and
# DeepSpeed do; section 6 compares the other place a master can live).
#
# **Predict:** will the fp16 run skip any steps? Each time it does, what happens
# to the scale of the next step? Will bf16 skip any? Will the three runs end at
# about the same loss (within 2% of fp32's)?
#
# 现在用相同的随机种子和数据把小 GPT 训练三次：fp32、bf16，以及带动态损失缩放的 fp16。学习率是
# 默认值的 10 倍（1e-2）。它不影响第 0 步的梯度，但会让最初几次更新很大，于是接下来几步的梯度随之变大。bf16 和 fp16
# 的运行中，参数及其梯度都是 16 位，优化器在 Adam 的动量旁边保存 fp32 主权重（dtlab 的默认做法，Megatron-LM 和
# DeepSpeed 也这样做；第 6 节比较主权重的另一种放法）。
#
# **预测：** fp16 的运行会跳过某些步吗？每跳过一次，下一步的缩放系数会怎样？bf16 会跳过吗？
# 三次运行最终的损失是否差不多（与 fp32 相差在 2% 以内）？

# %%
# NBVAL_IGNORE_OUTPUT
dash = Dashboard()
dash

# %%
# ← your prediction: {"fp16 skips some steps": bool, "each skip halves the next scale": bool,
#                     "bf16 skips none": bool, "final losses within 2% of fp32": bool} / 你的预测
my_prediction = None

runs = {}
for precision in ("fp32", "bf16", "fp16"):
    config = TrainConfig(precision=precision, lr=1e-2, steps=20, seed=0)
    runs[precision] = dash.watch(dtlab.train(config), label=precision)

fp16 = runs["fp16"].records
skipped = [r["step"] for r in fp16 if r["skipped"]]
print("fp16 skipped steps / fp16 被跳过的步:", skipped)
print("fp16 loss scale, steps 0-5 / fp16 第 0-5 步的缩放系数:", [r["loss_scale"] for r in fp16[:6]])
print("fp16 events / fp16 事件:", [(r["step"], e["kind"]) for r in fp16 for e in r["events"] if e["kind"] == "overflow"])
print("bf16 loss scale / bf16 缩放系数:", {r["loss_scale"] for r in runs["bf16"].records})
final = {p: run.losses()[-1] for p, run in runs.items()}
measured = {
    "fp16 skips some steps": len(skipped) > 0,
    "each skip halves the next scale": bool(skipped) and all(
        fp16[s + 1]["loss_scale"] == fp16[s]["loss_scale"] / 2 for s in skipped),
    "bf16 skips none": not any(r["skipped"] for r in runs["bf16"].records),
    "final losses within 2% of fp32": all(abs(final[p] - final["fp32"]) / final["fp32"] < 0.02 for p in final),
}
ok_runs = check("03.runs", my_prediction, measured)

# %% [markdown]
# The loss scale of the fp16 run, read from its step records (`loss_scale`, and
# `skipped` for the crosses):
#
# fp16 运行的损失缩放系数，取自它的每步记录（`loss_scale`，叉号来自 `skipped`）：

# %%
# NBVAL_IGNORE_OUTPUT
scale_plot = LossScaleFigure()
scale_plot.draw_records(runs["fp16"].records)
scale_plot

# %% [markdown]
# Activations are what a 16-bit forward pass saves for backward, so they shrink;
# not quite by half, because LayerNorm and the loss (its softmax and
# cross-entropy, on fp32 logits) still compute in fp32. The model states do
# not shrink at all: fp32 training holds 4Ψ of parameters, 4Ψ of gradients and
# 8Ψ of Adam's moments; bf16 holds 2Ψ of 16-bit parameters, 2Ψ of 16-bit
# gradients, 4Ψ of fp32 master weights (`master`) and the same 8Ψ, the ZeRO
# paper's (2 + 2 + K)Ψ with K = 12. 16Ψ either way. What mixed precision
# saves is activations and compute time, not the weights' memory; lesson 04
# shows how ZeRO shards that K.
#
# 激活值是 16 位前向计算为反向保存下来的张量，所以会变小；但不到一半，因为 LayerNorm 和损失（在 fp32
# logits 上的 softmax 与交叉熵）仍在 fp32 中计算。模型状态则完全没有变小：fp32 训练保存 4Ψ 参数、4Ψ 梯度和
# 8Ψ 的 Adam 动量；bf16 保存 2Ψ 的 16 位参数、2Ψ 的 16 位梯度、4Ψ 的 fp32 主权重（`master`）和同样的 8Ψ，
# 即 ZeRO 论文中的 (2 + 2 + K)Ψ，K = 12。两种情况都是 16Ψ。混合精度省下的是激活值和计算时间，而不是权重
# 占的显存；第 04 课会展示 ZeRO 如何切分这个 K。

# %%
mem = {p: run.records[-1]["ranks"][0]["mem"] for p, run in runs.items()}
STATES = ("params", "grads", "master", "optimizer")
for p in ("fp32", "bf16", "fp16"):
    print(f"{p}: " + ", ".join(f"{c} {human_bytes(mem[p].get(c, 0))}" for c in STATES)
          + f", activations / 激活值 {human_bytes(mem[p]['activations'])}")
activation_ratio = round(mem["fp16"]["activations"] / mem["fp32"]["activations"], 2)
print("activations fp16 / fp32 / 激活值 fp16 / fp32:", activation_ratio)
totals = {p: sum(mem[p].get(c, 0) for c in STATES) for p in mem}
print("model states, bytes / 模型状态字节数:", totals)
same_states = len(set(totals.values())) == 1
print("16Ψ in every precision / 每种精度都是 16Ψ:", same_states)


# %% [markdown]
# ## 6. Where the master weights live / 主权重放在哪里
#
# There are two places for the fp32 master copy, and both are in use:
#
# * **in the optimizer** (`--master-weights optimizer`, dtlab's default for fp16
#   and bf16; Megatron-LM, DeepSpeed, the ZeRO paper): the module's parameters
#   and gradients are 16-bit, and the optimizer keeps an fp32 master of every
#   parameter beside Adam's moments. After each step it rounds the masters into
#   the 16-bit parameters.
# * **in the module** (`--master-weights model`; PyTorch AMP, FSDP's
#   `MixedPrecision`): the parameters stay fp32, each layer casts them to 16
#   bits as it runs, and the gradients come back fp32 through the cast.
#
# **Predict** the bf16 run's model states per rank, in bytes, for each layout:
# `[params, grads, master, optimizer]` (Ψ = 236,928).
#
# fp32 主权重可以放在两个地方，两种做法都有人用：
#
# * **放在优化器里**（`--master-weights optimizer`，dtlab 对 fp16 和 bf16 的默认做法；Megatron-LM、
#   DeepSpeed、ZeRO 论文都这样做）：模块的参数和梯度是 16 位，优化器在 Adam 的动量旁边为每个参数保存一份
#   fp32 主权重，每步更新后再把主权重舍入回 16 位参数。
# * **放在模块里**（`--master-weights model`；PyTorch AMP、FSDP 的 `MixedPrecision`）：参数保持 fp32，
#   每层运行时把它们转成 16 位，梯度经过这次转换以 fp32 回来。
#
# **预测：** 对每种放法，bf16 运行中每个 rank 的模型状态各是多少字节：`[params, grads, master, optimizer]`
# （Ψ = 236,928）。

# %%
# ← your prediction: {"optimizer": [params, grads, master, optimizer], "model": [...]} in bytes / 你的预测（字节）
my_prediction_layouts = None

in_module = dash.watch(dtlab.train(TrainConfig(precision="bf16", master_weights="model", lr=1e-2, steps=20, seed=0)),
                       label="bf16, master in the module / 主权重在模块里")
layouts = {"optimizer": runs["bf16"], "model": in_module}
held = {name: [run.records[-1]["ranks"][0]["mem"].get(c, 0) for c in STATES] for name, run in layouts.items()}
ok_layouts = check("03.master_layouts", my_prediction_layouts, held)
gap = max(abs(a - b) / b for a, b in zip(in_module.losses(), runs["bf16"].losses()))
print("largest loss gap between the layouts / 两种放法的最大损失差:", f"{gap:.2%}")
layouts_agree = sum(held["optimizer"]) == sum(held["model"]) and gap < 0.02

# %% [markdown]
# Both hold 16Ψ, and both train the same curve to within a rounding of the
# 16-bit gradients. They differ in what the rest of the course can do with it:
# ZeRO stage 1 shards the optimizer's state. With the master in the optimizer
# that is K = 12 of the 16 bytes per parameter; with it in the module only
# Adam's 8. Lesson 04 measures the difference. (The module layout also keeps a
# 16-bit cast of each weight for backward, `copies`, per micro-batch in flight.)
#
# 两种放法都是 16Ψ，训练出的曲线也只相差 16 位梯度的舍入。区别在于后面的课程能拿它做什么：ZeRO 阶段 1
# 切分的是优化器状态。主权重在优化器里时，这是每个参数 16 字节中的 K = 12；主权重在模块里时只有 Adam 的 8
# 字节。第 04 课会测量这个差别。（放在模块里时，每个在途微批次还要为反向保留一份权重的 16 位副本，即 `copies`。）

# %% [markdown]
# ## 7. Exercise: the scaler's update / 练习：缩放系数的更新
#
# Write `update_scale(scale, clean_steps, overflow_here, growth_interval)` for
# one rank of a data-parallel group: return `(scale, clean_steps, skip)` after
# this step. `overflow_here` says whether *this rank's* gradients held an inf or
# NaN, but the ranks must take the same decision: vote first (with a collective
# of your choice on a small tensor). Then an overflow skips the step, halves the
# scale and sets `clean_steps` back to 0; `growth_interval` clean steps in a
# row double the scale and set `clean_steps` back to 0 too. `grade` plays a script on 2 real ranks in which rank 1 alone
# overflows twice, and compares each step with dtlab's `LossScaler`.
#
# 为数据并行组中的一个 rank 写出 `update_scale(scale, clean_steps, overflow_here, growth_interval)`：返回
# 这一步之后的 `(scale, clean_steps, skip)`。`overflow_here` 只说明 *本 rank* 的梯度里有没有 inf 或 NaN，
# 但各个 rank 必须做出同样的决定：先投票（用一个小张量做一次你选择的集合通信）。然后，上溢就跳过这一步、
# 把缩放系数减半，并把 `clean_steps` 归零；连续 `growth_interval` 个正常步就把缩放系数翻倍，同样把
# `clean_steps` 归零。`grade` 会在 2 个真实 rank
# 上运行一个脚本，其中只有 rank 1 上溢两次，并把每一步与 dtlab 的 `LossScaler` 比较。

# %%
def update_scale(scale, clean_steps, overflow_here, growth_interval):
    # return (scale, clean_steps, skip) after this step / 返回这一步之后的 (scale, clean_steps, skip)
    raise NotImplementedError  # your code here / 在这里写你的代码


solved = grade("03.update_scale", update_scale)

# %% [markdown]
# ## 8. Try this / 动手试试
#
# 1. A static scale: `TrainConfig(precision="fp16", loss_scale="1024", lr=1e-2, steps=20)`.
#    Does any step overflow now? Then try `loss_scale="1e6"`: a static scaler
#    never backs off, so what happens to every step?
# 2. **Task:** feed the stepper twelve gradients of 0.5 with `growth_interval=2`:
#    S grows until it overflows, halves, and grows again. Which steps are skipped?
# 3. Try `TrainConfig(precision="bf16", loss_scale="1024")`: dtlab refuses it,
#    in both languages, and says why.
#
# 1. 固定的缩放系数：`TrainConfig(precision="fp16", loss_scale="1024", lr=1e-2, steps=20)`。
#    现在还有步会上溢吗？再试试 `loss_scale="1e6"`：固定的缩放器从不退让，每一步会怎样？
# 2. **任务：** 以 `growth_interval=2` 给演示器输入 12 个 0.5 的梯度：S 会一直增长直到上溢，减半，再增长。
#    哪几步会被跳过？
# 3. 试试 `TrainConfig(precision="bf16", loss_scale="1024")`：dtlab 会用两种语言拒绝它，并说明理由。

# %%
my_answer_skipped = None  # ← your answer: a list of steps / 你的答案：步的列表

# %%
settle = LossScalerStepper([0.5] * 12, growth_interval=2)
while settle.step() is not None:
    pass
ok = check("03.try_settle", my_answer_skipped, [r["step"] for r in settle.rows if r["skipped"]], source="simulated")

# %% [markdown]
# ## Check / 检查
#
# The last cell repeats this lesson's results as one deterministic summary.
# 最后一个单元格把本课的结果汇总成一个确定的结论。

# %%
results = {
    "fp16: max 65504, smallest subnormal 2^-24; bf16: 8 exponent and 7 mantissa bits"
    " / fp16：最大值 65504，最小非规格化数 2^-24；bf16：8 位指数、7 位尾数":
        (rows["fp16"]["max"], rows["fp16"]["smallest_subnormal"], rows["bf16"]["exponent_bits"],
         rows["bf16"]["mantissa_bits"]) == (65504.0, 2.0 ** -24, 8, 7),
    "an update of 1e-4 survives in fp32 only / 1e-4 的更新只在 fp32 中保留": moved == {"fp32": True, "fp16": False, "bf16": False},
    "S = 2^16 saves 1e-9 and 1e-11, loses 1e-13, overflows 4.0 / S = 2^16 救回 1e-9 和 1e-11，丢掉 1e-13，4.0 上溢":
        zero == [False] * 4 + [True] * 3 and zero_scaled == [False] * 6 + [True] and inf_scaled == [True] + [False] * 6,
    "the scaler skips two steps, halves twice and grows back to 2^16 / 缩放器跳过两步、减半两次、再长回 2^16":
        scripted == {"skipped steps": [2, 3], "final scale": 65536.0},
    "fp16 skips steps and halves its scale; bf16 needs no scaling / fp16 会跳步并减半缩放系数；bf16 不需要缩放":
        all(measured.values()),
    "model states stay 16Ψ, activations shrink / 模型状态仍是 16Ψ，激活值变小": same_states and activation_ratio < 0.75,
    "the master in the optimizer or in the module: 16Ψ, the same losses / 主权重放在优化器或模块里：都是 16Ψ，损失相同":
        layouts_agree,
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 03:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
