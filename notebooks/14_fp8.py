# %% [markdown]
# # Lesson 14 — FP8
# # 第 14 课 —— FP8 训练
#
# **What you will see.** The newest GPUs multiply 8-bit floats at twice their
# bf16 rate, and today's large runs (DeepSeek-V3's, torchtitan's float8
# recipe) use them for the matrix multiplies of training. Eight bits hold few
# numbers: you will look at every value of the two FP8 formats, **e4m3** and
# **e5m2** (Micikevicius et al., 2022, "FP8 Formats for Deep Learning"), see why a
# tensor must be multiplied by a **scale** before it fits, train the small GPT
# with `--precision fp8` beside bf16 on local ranks, and read from the step
# records, per layer, the tensor's **amax**, its scale, and the share of values
# that saturated or flushed to zero. You predict which tensor saturates first
# and what **delayed scaling** does after a loss spike. Then you write the
# scale and the cast yourself, graded on two real ranks.
#
# **你将看到什么。** 最新的 GPU 做 8 位浮点乘法的速度是 bf16 的两倍，如今的大规模训练（DeepSeek-V3、torchtitan
# 的 float8 方案）都把训练中的矩阵乘法放到 8 位上做。8 位能表示的数很少：你会看到两种 FP8 格式 **e4m3** 和
# **e5m2**（Micikevicius 等，2022，《FP8 Formats for Deep Learning》）的每一个值，弄清为什么张量必须先乘以一个
# **缩放因子** 才放得进去；再在本机的 rank 上用 `--precision fp8` 和 bf16 并排训练小 GPT，从每步记录中逐层读出张量的
# **amax**、缩放因子，以及饱和和被冲成零的数值所占的比例。你要预测哪个张量最先饱和，以及 **延迟缩放** 在一次损失尖峰
# 之后会怎样。最后你自己写出缩放因子和类型转换，在两个真实的 rank 上评分。

# %%
import dtlab
from dtlab import TrainConfig
from dtlab.course.exercises import grade
from dtlab.course.experiments import fp8 as fp8_lab
from dtlab.lab import Dashboard, check
from dtlab.numerics.fp8 import E4M3, E5M2, format_table

# %% [markdown]
# ## 1. Two number lines / 两条数轴
#
# Both formats are a sign bit and seven more. e4m3 gives four of them to the
# exponent and three to the mantissa; e5m2 five and two. The exponent sets
# the range, the mantissa the precision: in each power-of-two interval (a
# binade) there are 2^mantissa_bits values, so the gap between neighbours is
# 1/8 of the binade in e4m3 and 1/4 in e5m2. The forward pass uses e4m3 for
# weights and activations; the backward pass uses e5m2 for gradients, whose
# magnitudes spread over more decades.
#
# **Predict:** the largest finite value of each format.
#
# 两种格式都是 1 位符号加 7 位。e4m3 把其中 4 位给指数、3 位给尾数；e5m2 给指数 5 位、尾数 2 位。指数决定范围，
# 尾数决定精度：每个 2 的幂区间（一个 binade）里有 2^尾数位数 个值，所以相邻两个值的间隔在 e4m3 中是区间的 1/8，
# 在 e5m2 中是 1/4。前向用 e4m3 表示权重和激活；反向用 e5m2 表示梯度，因为梯度的大小分布在更多的数量级上。
#
# **预测：** 每种格式的最大有限值。

# %%
my_prediction = None  # ← your prediction: {"e4m3": a number, "e5m2": a number} / 你的预测

# %%
for row in format_table():
    print(f"{row['format']}: {row['exponent_bits']} exponent / 指数位, {row['mantissa_bits']} mantissa / 尾数位, "
          f"max / 最大值 {row['max']:g}, smallest normal / 最小正规数 {row['smallest_normal']:g}, "
          f"smallest subnormal / 最小次正规数 {row['smallest_subnormal']:g}, epsilon {row['epsilon']:g}, "
          f"{row['decades']} decades / 个数量级")
print("e4m3 values per binade [2^e, 2^(e+1)) / 每个 binade 中的值数:", fp8_lab.values_per_binade("e4m3"))
ok_max = check("14.max", my_prediction, {"e4m3": E4M3.max, "e5m2": E5M2.max}, source="spec")

# %% [markdown]
# e4m3 has eight values in every normal binade, from 2^-6 up to 448 (the top
# binade has seven: its last pattern is NaN, and e4m3 has no infinity), and
# the subnormals below thin out to one. Between 256 and 448 the gap is 32.
#
# 在每个正规 binade 里 e4m3 都有 8 个值，从 2^-6 一直到 448（最上面的 binade 只有 7 个：最后一个编码是 NaN，
# e4m3 没有无穷大），再往下的次正规数越来越稀，最后只剩一个。在 256 到 448 之间，相邻两个值相差 32。
#
# ## 2. Why a scale / 为什么需要缩放因子
#
# A small GPT's activation gradients are about 1e-5. e5m2's smallest
# subnormal is 2^-16 ≈ 1.5e-5, and a value below half of it rounds to zero.
#
# **Predict:** the share of 4,096 values drawn from N(0, 1e-5²) that flush to
# zero when cast to e5m2 without a scale.
#
# 小 GPT 的激活梯度大约是 1e-5。e5m2 最小的次正规数是 2^-16 ≈ 1.5e-5，小于它一半的值会舍入为零。
#
# **预测：** 从 N(0, 1e-5²) 中抽取 4,096 个值，不缩放直接转换为 e5m2，被冲成零的比例是多少？

# %%
my_prediction = None  # ← your prediction: a fraction between 0 and 1 / 你的预测：0 到 1 之间的比例

# %%
grads = fp8_lab.gradient_like(4096, std=1e-5)
unscaled = fp8_lab.cast_report(grads, "e5m2")
scaled = fp8_lab.cast_report(grads, "e5m2", unscaled["scaled"])
print(f"without a scale / 不缩放: flushed / 冲成零 {unscaled['flushed']:.3f}, saturated / 饱和 {unscaled['saturated']:.3f}")
print(f"scale = 57344 / amax = {scaled['scale']:.4g}: flushed / 冲成零 {scaled['flushed']:.3f}, "
      f"saturated / 饱和 {scaled['saturated']:.3f}")
ok_flush = check("14.flushed_unscaled", my_prediction, round(unscaled["flushed"], 3))

# %% [markdown]
# Multiplied by 57344 / amax, the largest gradient lands on e5m2's largest
# value and the whole tensor moves up into the range the format covers: none
# flush, none saturate. The matmul then divides by the two scales it was given
# (`torch._scaled_mm` takes them as arguments). This is fp16's loss scaling
# (lesson 03) made per tensor and recomputed all the time: with eight bits
# there is no room for one scale to suit every tensor.
#
# 乘以 57344 / amax 之后，最大的梯度正好落在 e5m2 的最大值上，整个张量被抬进这种格式覆盖的范围：没有值被冲成零，
# 也没有值饱和。矩阵乘法再除以传给它的两个缩放因子（`torch._scaled_mm` 把它们作为参数）。这就是第 03 课 fp16 的
# 损失缩放，只是变成了每个张量一个、随时重新计算：只有 8 位，一个缩放因子不可能适合所有张量。
#
# ## 3. fp8 against bf16 / fp8 与 bf16 对比
#
# `--precision fp8` makes the Linear layers of every block (attention's qkv
# and projection, the MLP's two layers) multiply e4m3 inputs in the forward
# pass and e5m2 gradients in the backward pass (`dtlab/numerics/fp8.py`); the
# embeddings, LayerNorms, the softmax and the head stay in bf16, the master
# weights and AdamW in fp32. Each tensor is scaled by its own amax (current
# scaling). Three runs of 40 steps: bf16, fp8, and fp8 with delayed scaling
# (next section) and a corrupted batch at step 20.
#
# **Predict:** after 40 steps, is fp8's loss within 3% of bf16's?
#
# `--precision fp8` 让每个 block 的线性层（注意力的 qkv 和输出投影、MLP 的两层）在前向用 e4m3 输入、在反向用
# e5m2 梯度做矩阵乘法（`dtlab/numerics/fp8.py`）；词嵌入、LayerNorm、softmax 和输出头仍用 bf16，主权重和 AdamW
# 用 fp32。每个张量按它自己的 amax 缩放（即时缩放）。下面跑三次，每次 40 步：bf16、fp8，以及使用延迟缩放
# （见下一节）并在第 20 步喂入一个损坏 batch 的 fp8。
#
# **预测：** 40 步之后，fp8 的损失与 bf16 相差在 3% 以内吗？

# %%
my_prediction = None  # ← your prediction: True or False / 你的预测

# %%
# NBVAL_IGNORE_OUTPUT
dash = Dashboard()
dash

# %%
common = dict(model="small", steps=40, lr=1e-2, seed=0)
configs = {
    "bf16": TrainConfig(precision="bf16", **common),
    "fp8": TrainConfig(precision="fp8", **common),
    "fp8 delayed": TrainConfig(precision="fp8", fp8_amax_history=8, spike=20, **common),
}
runs = {label: dash.watch(dtlab.train(config), label=label) for label, config in configs.items()}
final = {label: sum(run.losses()[-5:]) / 5 for label, run in runs.items()}  # the last five steps
for label, loss in final.items():
    print(f"{label:>12}: mean loss of the last 5 steps / 最后 5 步的平均损失 {loss:.2f}")
within = abs(final["fp8"] - final["bf16"]) / final["bf16"] < 0.03
ok_loss = check("14.within_3_percent", my_prediction, within)

# %% [markdown]
# Per layer, the fp8 run's step records hold each tensor's amax, its scale and
# the shares that saturated and flushed. Under current scaling nothing
# saturates: the amax is mapped to the format's max by construction.
#
# fp8 运行的每步记录里逐层保存着每个张量的 amax、缩放因子，以及饱和和被冲成零的比例。即时缩放下没有值会饱和：
# 按构造，amax 正好被映射到格式的最大值。

# %%
current = runs["fp8"].records
last = fp8_lab.layer_stats(current)[-1]
for layer in ("blocks.0.attn.qkv", "blocks.0.mlp.fc", "blocks.3.mlp.proj"):
    for role in fp8_lab.ROLES:
        s = last[layer][role]
        print(f"{layer:>18} {role:>6}: amax {s['amax']:.3g}, scale {s['scale']:.3g}")
print("any saturated under current scaling / 即时缩放下有饱和吗:", fp8_lab.first_saturation(current) is not None)

# %% [markdown]
# ## 4. Delayed scaling / 延迟缩放
#
# Current scaling reads each tensor twice: once for its amax, once to cast it.
# **Delayed scaling** (Transformer Engine's recipe) takes the scale from the
# largest amax the same tensor had over the last N steps, its **amax history**
# (`--fp8-amax-history 8` here), so the cast can start before the tensor is
# fully known. The price: a tensor larger than anything in its history
# saturates.
#
# **Predict:** (a) in the delayed run, which layer and which of its tensors
# (input, weight, grad) saturates first? (b) A corrupted batch at step 20 makes
# the gradients jump. For how many steps after step 20 is the scale of
# `blocks.0.attn.qkv`'s gradient the one step 20's amax gives?
#
# 即时缩放要把每个张量读两遍：一遍求 amax，一遍做转换。**延迟缩放**（Transformer Engine 的方案）用同一个张量在最近
# N 步中最大的 amax（它的 **amax 历史**，这里是 `--fp8-amax-history 8`）来算缩放因子，所以张量还没完全算出来时就能
# 开始转换。代价是：一个比历史中任何值都大的张量会饱和。
#
# **预测：**（a）在延迟缩放的运行中，哪一层的哪个张量（input、weight、grad）最先饱和？（b）第 20 步的损坏 batch
# 让梯度突然变大。第 20 步之后，有多少步 `blocks.0.attn.qkv` 梯度的缩放因子是由第 20 步的 amax 决定的？

# %%
my_prediction_first = None  # ← your prediction: ["blocks.L.name", "input" | "weight" | "grad"] / 你的预测
my_prediction_steps = None  # ← your prediction: a number of steps / 你的预测：步数

# %%
delayed = runs["fp8 delayed"].records
first = fp8_lab.first_saturation(delayed)
print("first saturated (step, layer, tensor) / 最先饱和（步、层、张量）:", first)
ok_first = check("14.first_saturated", my_prediction_first, None if first is None else [first[1], first[2]])
qkv_grad = fp8_lab.series(delayed, "blocks.0.attn.qkv", "grad", "amax")
print("blocks.0.attn.qkv grad amax, steps 18-22 / 梯度 amax，第 18-22 步:", [f"{a:.2g}" for a in qkv_grad[18:23]])
held = fp8_lab.steps_scaled_by(delayed, "blocks.0.attn.qkv", "grad", 20)
ok_steps = check("14.spike_steps", my_prediction_steps, held)

# %%
# NBVAL_IGNORE_OUTPUT
import plotly.graph_objects as go

figure = go.Figure()
for label in ("fp8", "fp8 delayed"):
    figure.add_scatter(y=fp8_lab.series(runs[label].records, "blocks.0.attn.qkv", "grad", "scale"), name=label)
figure.update_layout(title="blocks.0.attn.qkv: scale of the gradient / 梯度的缩放因子", yaxis_type="log",
                     xaxis_title="step / 步", height=320)
figure

# %% [markdown]
# The spike's amax stays the largest in the history for exactly as many steps
# as the history holds, and so long the scale is ten times smaller than the
# ordinary gradients need: they use fewer of e5m2's bits, and the smallest of
# them flush to zero sooner. Current scaling recovers at the next step. The
# tensors that saturate first are the ones that grow from one step to the
# next, faster than an eight-step history expects. Saturated and flushed
# shares per layer in the delayed run:
#
# 尖峰的 amax 在历史中保持最大的步数正好等于历史的长度，在这期间缩放因子比普通梯度需要的小十倍：它们只用上了 e5m2 的
# 一部分位，最小的那些更早被冲成零。即时缩放在下一步就恢复了。最先饱和的是那些一步比一步大、增长得比 8 步历史预料的更快的
# 张量。延迟缩放运行中每层饱和的最大比例：

# %%
for layer, roles in fp8_lab.saturated_per_layer(delayed).items():
    print(f"{layer:>18}: " + ", ".join(f"{role} {share:.1e}" for role, share in roles.items()))

# %% [markdown]
# ## 5. Exercise: the scale and the cast / 练习：缩放因子与转换
#
# Write `quantize_e4m3(x)` returning `(scale, q)`: the per-tensor scale that
# puts x's amax (its largest magnitude) at e4m3's 448 (1 for a tensor of zeros),
# and `q`, x times the scale cast to `torch.float8_e4m3fn` (clamp to ±448
# first: a cast does not saturate everywhere). `grade` runs it on two real
# ranks, each on tensors of its own, as each tensor-parallel rank scales its
# own shard, and compares the scale and every byte of `q` with dtlab's.
#
# 写出 `quantize_e4m3(x)`，返回 `(scale, q)`：把 x 的 amax（最大绝对值）放到 e4m3 的 448 上的逐张量缩放因子
# （全零张量用 1），以及 `q`：x 乘以缩放因子后转换成 `torch.float8_e4m3fn`（先截断到 ±448：转换并不是在所有地方都
# 会饱和）。`grade` 在两个真实的 rank 上运行它，每个 rank 用自己的张量（就像每个张量并行 rank 缩放自己的分片），
# 把缩放因子和 `q` 的每一个字节与 dtlab 的结果比较。

# %%
def quantize_e4m3(x):
    # the scale and the e4m3 tensor / 缩放因子和 e4m3 张量
    raise NotImplementedError  # your code here / 在这里写你的代码


solved = grade("14.quantize_e4m3", quantize_e4m3)

# %% [markdown]
# ## 6. Try this / 动手试试
#
# 1. Run `dtlab train --precision fp8 --dp 2 --tp 2 --sp --steps 20 --json` and
#    compare a rank's `fp8` stats with its TP partner's: each scales its own
#    shard of every weight.
# 2. `--fp8-amax-history 1` scales by the previous step's amax: what happens
#    at the spike step itself, and at the step after?
# 3. `dtlab plan --precision fp8 --gpu H100` against `--precision bf16`: which
#    numbers change, and why are the memory figures the same?
#
# 1. 运行 `dtlab train --precision fp8 --dp 2 --tp 2 --sp --steps 20 --json`，把一个 rank 的 `fp8` 统计与它的
#    张量并行伙伴比较：每个 rank 都缩放自己那一份权重分片。
# 2. `--fp8-amax-history 1` 按上一步的 amax 缩放：尖峰那一步本身会怎样？下一步呢？
# 3. 比较 `dtlab plan --precision fp8 --gpu H100` 与 `--precision bf16`：哪些数变了？为什么显存的数字一样？
#
# ## Check / 检查

# %%
results = {
    "e4m3's max is 448, e5m2's 57344 / e4m3 最大值 448，e5m2 为 57344": (E4M3.max, E5M2.max) == (448.0, 57344.0),
    "unscaled, about half of N(0, 1e-5²) flushes in e5m2; scaled, none / 不缩放时约一半被冲成零；缩放后没有":
        0.5 < unscaled["flushed"] < 0.6 and scaled["flushed"] == 0,
    "fp8 within 3% of bf16 after 40 steps / 40 步后 fp8 与 bf16 相差在 3% 以内": within,
    "current scaling saturates nothing / 即时缩放没有饱和": fp8_lab.first_saturation(current) is None,
    "the spike's amax sets the scale for the 8 steps of the history / 尖峰的 amax 决定之后 8 步的缩放因子": held == 8,
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 14:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
