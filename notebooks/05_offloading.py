# %% [markdown]
# # Lesson 05 — Offloading: the optimizer on the CPU
# # 第 05 课 —— 卸载：把优化器放到 CPU 上
#
# **What you will see.** Adam's state is the biggest part of the model states,
# and the update touches each value only once per step: work the host CPU can do
# in its own, much larger memory. **Offloading** moves the optimizer state and
# the optimizer step there (ZeRO-Offload, Ren et al., 2021). The price is a copy
# over **PCIe** every step: the gradients go down to the host, the updated
# parameters come back up. You will predict those bytes and measure them on real
# ranks, see the device and host memory pools side by side, and then work out,
# with the bandwidth of PCIe, from how much work per step the copy stops costing
# anything.
#
# **你将看到什么。** Adam 的状态是模型状态中最大的一块，而参数更新每一步只把每个值碰一次：这正是主机
# CPU 可以在它自己那块大得多的内存里完成的工作。**卸载**（offloading）把优化器状态和优化器的更新
# 步骤都搬到主机上（ZeRO-Offload，Ren 等，2021）。代价是每一步都要经过 **PCIe 总线** 拷贝一次：
# 梯度下行到主机，更新后的参数再上行回来。你会先预测这些字节数，再在真实的 rank 上测量它们，
# 并排查看设备内存池和主机内存池；最后用 PCIe 的带宽算一算：每一步的工作量达到多少时，
# 这次拷贝就不再有任何代价。

# %%
import math

import dtlab
from dtlab import TrainConfig
from dtlab.config import MODEL_PRESETS
from dtlab.launch import run
from dtlab.lab import Dashboard, check
from dtlab.lab.offload_view import MemoryPools, OffloadCost, offload_cost
from dtlab.course.experiments import offload as offload_lesson
from dtlab.course.exercises import grade
from dtlab.planner import ACHIEVABLE_FRACTION, GPUS, LINKS

PSI = MODEL_PRESETS["small"].param_count()   # Ψ: parameters of the small GPT
print(f"Ψ = {PSI:,} parameters / 个参数")

# %% [markdown]
# ## 1. What moves, and where things live / 搬运什么，东西放在哪里
#
# `dtlab/parallel/zero/offload.py` wraps any torch optimizer in an `OffloadOptimizer`. One step:
#
# ```
# device                                   host (CPU)
# parameters p  ---- gradients g  -->      copy of g              (d2h: device → host)
#                                          master p32 ← Adam(p32, g), state m, v
# parameters p  <--- updated p    ----     p32                    (h2d: host → device)
# ```
#
# The host keeps an fp32 master copy of the parameters, a buffer for the
# gradients, and Adam's two moments; the device keeps only what forward and
# backward need. On a CPU-only machine such as the course's, "device" and
# "host" are both main memory, but the two pools are still separate tensors and
# the copies still happen, so they can be counted the same way as over PCIe. dtlab trains in fp32 here: 4 bytes per value.
#
# **Predict:** training the whole small GPT on one rank, how many bytes go down
# (d2h) and how many come up (h2d) in one step?
#
# `dtlab/parallel/zero/offload.py` 用 `OffloadOptimizer` 包装任意一个 torch 优化器。一步的过程如上图：主机保存一份
# fp32 的参数主副本、一块存放梯度的缓冲区以及 Adam 的两个动量；设备上只保留前向和反向需要的东西。
# 在只有 CPU 的机器上（比如本课程所用的机器），“设备”和“主机”其实都是内存，但两个内存池仍然是各自
# 独立的张量，拷贝也真的发生，所以可以像走 PCIe 时一样计数。这里 dtlab 用 fp32 训练：每个值 4 字节。
#
# **预测：** 在一个 rank 上训练整个小 GPT，一步之内有多少字节下行（d2h）、多少字节上行（h2d）？

# %%
my_prediction = None  # ← your prediction: {"d2h": bytes, "h2d": bytes} / 你的预测：{"d2h": 字节, "h2d": 字节}

one = run(offload_lesson.offload_step, 1)[0]
print(f"{'':>10} {'device':>10} {'host':>10}   (bytes / 字节; device / 设备, host / 主机)")
for category in ("params", "grads", "optimizer"):
    print(f"{category:>10} {one['device'][category]:>10,} {one['host'][category]:>10,}")
ok = check("05.one_rank_bytes", my_prediction, one["transfer_bytes"])

# %% [markdown]
# The device's optimizer column is 0: Adam's 8Ψ bytes now live on the host, next
# to the 4Ψ fp32 master and a 4Ψ gradient buffer. In fp32 training the master
# duplicates the device's parameters; in mixed precision it does not, because the
# fp32 master exists anyway (it is part of K = 12) — so there the host takes the
# 12Ψ the device gives up, plus a buffer for the 16-bit gradients it receives
# (2Ψ), which ZeRO-Offload also keeps on the host.
#
# 设备那一列的优化器状态是 0：Adam 的 8Ψ 字节现在放在主机上，旁边还有 4Ψ 的 fp32 主副本和 4Ψ 的
# 梯度缓冲区。在 fp32 训练中，主副本与设备上的参数重复；而在混合精度训练中并不重复，因为 fp32 主权重
# 本来就要存在（它属于 K = 12 的一部分）——所以那时主机接手设备让出来的 12Ψ，另外还要一块缓冲区
# 存放收到的 16 位梯度（2Ψ），ZeRO-Offload 同样把梯度放在主机上。
#
# ## 2. Offloading with ZeRO on 4 ranks / 在 4 个 rank 上与 ZeRO 一起卸载
#
# In the trainer, offloading needs a ZeRO stage (`TrainConfig(offload=True)`
# requires `zero >= 1`): each rank offloads only the shard of the optimizer it
# owns. Two runs follow, ZeRO-2 on DP = 4 with and without offloading.
#
# **Predict:** per rank with offloading, the device's optimizer bytes, the
# host's total bytes (master shard + gradient shard + Adam's state for the shard),
# and whether the loss curve stays exactly the same (True or False).
#
# 在训练器中，卸载需要配合 ZeRO 阶段（`TrainConfig(offload=True)` 要求 `zero >= 1`）：每个 rank 只
# 卸载自己负责的那一片优化器。下面有两次运行：DP = 4 的 ZeRO-2，分别不卸载和卸载。
#
# **预测：** 卸载时每个 rank 设备上的优化器字节数、主机上的总字节数（主副本分片 + 梯度分片 + 该分片
# 的 Adam 状态），以及损失曲线是否完全不变（True 或 False）。

# %%
# NBVAL_IGNORE_OUTPUT
dash = Dashboard()
dash

# %%
my_prediction_device_optimizer = None  # ← your prediction: bytes / 你的预测：字节数
my_prediction_host = None              # ← your prediction: bytes / 你的预测：字节数
my_prediction_same_loss = None         # ← your prediction: True or False / 你的预测：True 或 False

kept = dash.watch(dtlab.train(TrainConfig(dp=4, zero=2, steps=3, seed=0)), label="ZeRO-2")
offloaded = dash.watch(dtlab.train(TrainConfig(dp=4, zero=2, offload=True, steps=3, seed=0)),
                       label="ZeRO-2 + offload / 卸载")
print(f"{'':>22} {'params':>9} {'grads':>9} {'optimizer':>9}   (参数 / 梯度 / 优化器)")
kept_device, _ = MemoryPools.pools(kept.records[-1])                 # rank 0: (device, host) bytes
device, host = MemoryPools.pools(offloaded.records[-1])
for label, pool in (("ZeRO-2, device", kept_device), ("+ offload, device", device), ("+ offload, host", host)):
    print(f"{label:>22} {pool['params']:>9,} {pool['grads']:>9,} {pool['optimizer']:>9,}")
ranks = offloaded.records[-1]["ranks"]
ok = check("05.device_optimizer", my_prediction_device_optimizer, max(r["mem"]["optimizer"] for r in ranks))
ok = check("05.host_bytes", my_prediction_host, sum(ranks[0]["host_mem"].values()))
same_host = all(r["host_mem"] == ranks[0]["host_mem"] for r in ranks)
same_loss = offloaded.losses() == kept.losses()
ok = check("05.same_loss", my_prediction_same_loss, same_loss)

# %% [markdown]
# The two memory pools, on one scale: the device (left) and the host (right). They
# are different memories and are never added together: the point of offloading is
# that the left one is the scarce one.
#
# 两个内存池，使用同一个刻度：左边是设备，右边是主机。它们是不同的内存，不能相加：卸载的意义就在于
# 左边那个才是稀缺的。

# %%
# NBVAL_IGNORE_OUTPUT
pools = MemoryPools({"ZeRO-2": kept, "ZeRO-2 + offload": offloaded})
pools

# %% [markdown]
# The step records carry `host_mem` but not the bytes copied, so the next cell
# builds the offloaded ZeRO-2 optimizer directly on 4 ranks
# (`dtlab/course/experiments/offload.py`) and reads its `transfer_bytes` after one step.
#
# **Predict:** bytes each rank copies down and up per step.
#
# 步骤记录里有 `host_mem`，却没有拷贝的字节数，所以下一个单元格直接在 4 个 rank 上构建卸载的 ZeRO-2
# 优化器（`dtlab/course/experiments/offload.py`），并在一步之后读取它的 `transfer_bytes`。
#
# **预测：** 每个 rank 每步下行、上行各拷贝多少字节？

# %%
my_prediction = None  # ← your prediction: {"d2h": bytes, "h2d": bytes} / 你的预测

four = run(offload_lesson.offload_step, 4, zero=2)
for r in four:
    print(f"rank {r['rank']}: copied / 拷贝 {r['transfer_bytes']}, host / 主机 {r['host']}")
ok = check("05.zero2_bytes", my_prediction, four[0]["transfer_bytes"])
same_everywhere = all(r["transfer_bytes"] == four[0]["transfer_bytes"] for r in four)
host_matches_trainer = all(r["host"] == ranks[0]["host_mem"] for r in four)
print("every rank copies the same / 每个 rank 拷贝量相同:", same_everywhere)
print("host pool equals the trainer's host_mem / 主机内存池与训练器的 host_mem 一致:", host_matches_trainer)

# %% [markdown]
# How fast were the copies here? On a CPU-only machine such as the course's they
# go from memory to memory, not over a bus, and the figure says little about a
# GPU; on a machine with GPUs they cross PCIe (this cell's numbers change from
# run to run).
#
# 这里的拷贝有多快？在只有 CPU 的机器上（比如本课程所用的机器），拷贝是从内存到内存，并不经过总线，
# 这个数字对 GPU 来说参考意义不大；在有 GPU 的机器上，拷贝则真的经过 PCIe（这个单元格的数字每次
# 运行都会变）。

# %%
# NBVAL_IGNORE_OUTPUT
seconds = one["seconds"]["d2h"] + one["seconds"]["h2d"]
print(f"one rank / 单个 rank: {sum(one['transfer_bytes'].values()):,} bytes / 字节, {seconds * 1e3:.2f} ms "
      f"= {sum(one['transfer_bytes'].values()) / seconds / 1e9:.1f} GB/s")

# %% [markdown]
# ## 3. What the copy costs / 拷贝的代价
#
# Now a real GPU, by arithmetic. ZeRO-Offload trains in mixed precision: the
# device sends 16-bit gradients down (2Ψ bytes) and receives 16-bit parameters
# (2Ψ bytes) each step, and gives up the KΨ = 12Ψ bytes of fp32 master weights,
# momentum and variance. (ZeRO-Offload also streams each 16-bit gradient down as
# backward produces it, so the paper counts 14Ψ freed, leaving the device only
# its 2Ψ of 16-bit parameters; the figure below counts the 12Ψ of optimizer
# state alone.) `dtlab/planner/hardware.py`'s PCIe preset is Gen5 x16:
# 64 GB/s each way, 2 µs of latency per message. The two copies run one after
# the other: the gradients before the host's step, the parameters after it.
#
# **Predict** for Ψ = 7.5 billion on one H100: the seconds per step the two copies
# take, rounded to 3 decimals.
#
# 现在换成真正的 GPU，用算术来算。ZeRO-Offload 用混合精度训练：每一步设备把 16 位梯度下行送出（2Ψ
# 字节），再接收 16 位参数（2Ψ 字节），同时让出 KΨ = 12Ψ 字节的 fp32 主权重、动量和方差。（ZeRO-Offload 还会在反向传播产生每个 16 位梯度时就把它送下去，
# 所以论文算作腾出 14Ψ，设备上只剩 2Ψ 的 16 位参数；下面的数字只算 12Ψ 的优化器状态。）
# `dtlab/planner/hardware.py` 中的 PCIe 预设是 Gen5 x16：每个方向 64 GB/s，每条消息 2 微秒延迟。
# 两次拷贝先后进行：梯度在主机更新之前，参数在主机更新之后。
#
# **预测：** Ψ = 75 亿、一张 H100：两次拷贝每步共需多少秒（保留 3 位小数）？

# %%
my_prediction_copy_s = None  # ← your prediction: seconds / 你的预测：秒

big = 7_500_000_000
pcie = LINKS["pcie"]
each_way = 2 * big                                   # bytes: bf16 gradients down, bf16 parameters up
copy_s = pcie.time(each_way) + pcie.time(each_way)   # alpha + n / beta, twice
print(f"PCIe: {pcie.bandwidth_Bps / 1e9:.0f} GB/s, {pcie.latency_s * 1e6:.0f} µs")
print(f"frees {12 * big / 1e9:.0f} GB of optimizer state ({14 * big / 1e9:.0f} GB with the gradients, the paper's "
      f"count); moves {each_way / 1e9:.0f} GB each way per step")
print(f"            / 腾出 {12 * big / 1e9:.0f} GB 显存；每步每个方向搬运 {each_way / 1e9:.0f} GB")
ok = check("05.copy_s", my_prediction_copy_s, round(copy_s, 3), source="formula")

# %% [markdown]
# ## 4. The host's step / 主机上的那一步
#
# The copies are not the whole price. The optimizer step now runs on the CPU,
# and the ZeRO-Offload paper (Ren et al., 2021) shows that this step, not PCIe,
# is what dominates: it touches every parameter's fp32 master, gradient,
# momentum and variance. At best it is limited by the host's memory bandwidth:
# 16 bytes read and 12 written per parameter, 28 bytes. A stock CPU optimizer
# is far from that bound: the cell after the check prints torch's AdamW time per
# parameter on this machine beside the bound of a 100 GB/s server (part of that
# gap is this machine's slower memory, the rest is the optimizer). That is why the paper wrote **CPU-Adam**
# (vectorized, parallel over cores), which it reports 5 to 6 times faster than
# PyTorch's CPU Adam, and added the **delayed parameter update**: the host's step for step t runs while the GPU already
# computes step t + 1, with the parameters one step old.
#
# **Predict** the host's step for Ψ = 7.5 billion on a server whose memory
# moves 100 GB/s, in seconds (rounded to 2 decimals).
#
# 拷贝并不是全部的代价。优化器的一步现在在 CPU 上运行，ZeRO-Offload 论文（Ren 等，2021）指出，
# 占主导的正是这一步，而不是 PCIe：它要读写每个参数的 fp32 主权重、梯度、动量和方差。最好的情况下
# 它受主机内存带宽限制：每个参数读 16 字节、写 12 字节，共 28 字节。现成的 CPU 优化器离这个上限很远：检查之后的那个单元格
# 会打印本机 torch AdamW 每个参数的耗时，并与 100 GB/s 服务器的上限并列（差距中有一部分来自本机更慢的内存，其余来自优化器本身）。所以论文写了 **CPU-Adam**（向量化、多核并行），
# 据论文报告比 PyTorch 的 CPU Adam 快 5 到 6 倍，并加入了 **延迟参数更新**：第 t 步在
# 主机上的更新与 GPU 上第 t + 1 步的计算同时进行，参数晚一步生效。
#
# **预测：** Ψ = 75 亿、服务器内存带宽 100 GB/s 时，主机上的一步需要多少秒（保留 2 位小数）？

# %%
my_prediction_host_s = None  # ← your prediction: seconds / 你的预测：秒

host_s = offload_cost(big, tokens=1, precision="bf16", gpu="H100")["host_step_s"]
print(f"host step / 主机更新: {host_s:.2f} s; the two copies / 两次拷贝: {copy_s:.3f} s; "
      f"together / 合计: {host_s + copy_s:.2f} s")
ok = check("05.host_step_s", my_prediction_host_s, round(host_s, 2), source="formula")

# %%
# NBVAL_IGNORE_OUTPUT
measured_host = offload_lesson.host_adam_seconds()
print(f"torch AdamW on this machine's CPU / 本机 CPU 上的 torch AdamW: "
      f"{measured_host['seconds'] / measured_host['numel'] * 1e9:.2f} ns per parameter / 每个参数; "
      f"at the memory bound / 内存带宽上限下: {28 / 100e9 * 1e9:.2f} ns at 100 GB/s")

# %% [markdown]
# ## 5. When offloading pays / 卸载何时划算
#
# The copies and the host's step, together the total printed above, are only a
# cost if the GPU has nothing else to do. ZeRO-Offload overlaps the gradient copy with the backward pass, the
# parameter copy with the next forward and, with the delayed update, the host's
# step with the next step's compute; what decides is whether the step's compute
# lasts longer than copies and host step together. Compute is about 6Ψ FLOPs per
# token (forward and backward); the planner assumes 50% of the GPU's peak (989
# TFLOP/s in bf16 for an H100).
#
# **Predict:** the fewest tokens per GPU per step for which the compute lasts as
# long as the copies alone (the break-even the copies set), then with the host's
# step added, and whether these numbers depend on the model size Ψ.
#
# 拷贝加主机更新（合计见上面输出的总数），只有在 GPU 无事可做时才算代价。ZeRO-Offload 让梯度拷贝与反向传播重叠，
# 让参数拷贝与下一步的前向重叠，借助延迟更新，还让主机上的更新与下一步的计算重叠；关键在于这一步的
# 计算是否比拷贝加主机更新更久。每个 token 的计算量约为 6Ψ FLOPs（前向加反向）；规划器假设能达到
# GPU 峰值的 50%（H100 的 bf16 峰值为 989 TFLOP/s）。
#
# **预测：** 每张 GPU 每步至少要处理多少个 token，计算时间才能与单独的拷贝时间相当？加上主机更新后
# 又是多少？这两个数与模型大小 Ψ 有关吗？

# %%
my_prediction_breakeven = None            # ← your prediction: tokens / 你的预测：token 数
my_prediction_breakeven_with_step = None  # ← your prediction: tokens / 你的预测：token 数
my_prediction_depends_on_size = None      # ← your prediction: True or False / 你的预测：True 或 False

flops_per_s = GPUS["H100"].peak_flops["bf16"] * ACHIEVABLE_FRACTION
breakeven = math.ceil(copy_s / (6 * big / flops_per_s))
print(f"break-even, copies only / 只算拷贝的盈亏平衡点: {breakeven:,} tokens per GPU per step / 每张 GPU 每步的 token 数")
print(f"{'Ψ':>6} {'frees':>8} {'copy s':>8} {'host s':>8} {'copies':>8} {'+ host':>8}   (腾出 / 拷贝 / 主机 / 盈亏平衡 token)")
table, table_with_step = {}, {}
for name, params in (("1.3B", 1_300_000_000), ("7.5B", big), ("13B", 13_000_000_000), ("175B", 175_000_000_000)):
    cost = offload_cost(params, tokens=breakeven, precision="bf16", gpu="H100")
    table[name], table_with_step[name] = cost["breakeven_tokens"], cost["breakeven_with_step_tokens"]
    print(f"{name:>6} {cost['freed_bytes'] / 1e9:>6.1f}GB {cost['copy_s']:>8.3f} {cost['host_step_s']:>8.2f} "
          f"{cost['breakeven_tokens']:>8,} {cost['breakeven_with_step_tokens']:>8,}")
ok = check("05.breakeven", my_prediction_breakeven, breakeven, source="formula")
ok = check("05.breakeven_with_step", my_prediction_breakeven_with_step, table_with_step["7.5B"], source="formula")
ok = check("05.depends_on_size", my_prediction_depends_on_size,
           len(set(table.values()) | set(table_with_step.values())) > 2, source="formula")

# %% [markdown]
# Ψ cancels: copies, host step and compute all grow with the model, so the
# break-even is a property of the hardware. The copies alone would set it at
# about 5,000 tokens, some 2.5 sequences of 2,048 tokens per GPU per step; the
# host's step, even at the memory bound, raises it more than fivefold, to about
# 28,000 tokens (14 sequences). Below it, every step the GPU waits on PCIe and
# the CPU; above it, offloading is free memory. A CPU Adam slower than the bound
# pushes the break-even further out, and without the delayed update the host's
# step cannot hide at all: it adds to every step (Ren et al., 2021).
#
# Move the sliders: the bars are one step's copy, the host's step and the
# compute (predictions), and the verdict under them asks the compute to cover
# copies and host step together, as ZeRO-Offload's delayed update allows.
#
# Ψ 被约掉了：拷贝、主机更新和计算都随模型增大，所以盈亏平衡点只取决于硬件。单看拷贝，它大约是
# 5,000 个 token，相当于每张 GPU 每步 2.5 条长度为 2,048 的序列；算上主机更新，即使达到内存带宽上限，
# 它也要提高到原来的五倍多，到约 28,000 个 token（14 条序列）。低于它时，每一步 GPU 都要等 PCIe 和 CPU；高于
# 它时，卸载等于白得内存。比上限更慢的 CPU Adam 会让盈亏平衡点更远；而没有延迟更新时，主机上的更新
# 根本无法隐藏：每一步都要加上它（Ren 等，2021）。
#
# 拖动滑块：三根柱子分别是一步的拷贝时间、主机更新时间和计算时间（预测值）；下面的结论要求计算时间
# 盖得住拷贝加主机更新的总和，这正是 ZeRO-Offload 的延迟更新所允许的。

# %%
# NBVAL_IGNORE_OUTPUT
cost_view = OffloadCost(params=7_500_000_000, tokens=4096)
cost_view


# %% [markdown]
# ## 6. Exercise: the offloaded step / 练习：卸载后的一步
#
# Write `offloaded_step(params, masters, host_grads, optimizer)`, the three moves
# of the picture in section 1: each device parameter's gradient into its host
# buffer (`host_grads`), given to its fp32 master as `.grad`; the host
# `optimizer`'s step (it holds the masters); each updated master back into its
# device parameter. Return the bytes moved, `{"d2h": ..., "h2d": ...}`. `grade`
# trains 3 data-parallel steps of a small model on 2 real ranks with your step
# and with dtlab's `OffloadOptimizer`, and compares the device parameters, the
# masters and the bytes after every step.
#
# 写出 `offloaded_step(params, masters, host_grads, optimizer)`，也就是第 1 节图中的三步：把每个设备
# 参数的梯度拷进它的主机缓冲区（`host_grads`），并作为 `.grad` 交给对应的 fp32 主权重；在主机上执行
# `optimizer`（它持有主权重）的一步；再把每个更新后的主权重拷回对应的设备参数。返回搬运的字节数
# `{"d2h": ..., "h2d": ...}`。`grade` 会在 2 个真实 rank 上分别用你的函数和 dtlab 的 `OffloadOptimizer`
# 训练一个小模型 3 步数据并行，每一步之后比较设备参数、主权重和字节数。

# %%
def offloaded_step(params, masters, host_grads, optimizer):
    # params: device parameters (with .grad); masters: their fp32 host copies; host_grads: host buffers
    # params：设备参数（带 .grad）；masters：主机上的 fp32 副本；host_grads：主机缓冲区
    raise NotImplementedError  # your code here / 在这里写你的代码


solved = grade("05.offload_step", offloaded_step)

# %% [markdown]
# ## 7. Try this / 动手试试
#
# 1. In the cost view, slide PCIe down to 32 GB/s (Gen4): where does the
#    break-even move? Then raise DP: each GPU offloads only its shard, Ψ / N_d,
#    so the copy shrinks while the tokens per GPU stay. (Answer, copies only:
#    10,303 tokens at Gen4, twice Gen5's 5,152; at DP = 8 on Gen5, 644, about
#    1/N_d of it.)
# 2. **Task:** in fp32 the copy doubles (4 bytes each way) but the compute slows
#    far more (67 TFLOP/s peak). What is the copies-only break-even in fp32?
# 3. **Task:** with ZeRO-3 and offloading on DP = 2, the device keeps only
#    shards. How many bytes of parameters does each rank's device hold? The cell
#    trains 2 steps to check.
#
# 1. 在代价视图中把 PCIe 带宽降到 32 GB/s（Gen4）：盈亏平衡点会移到哪里？再提高 DP：每张 GPU 只卸载
#    自己那一片 Ψ / N_d，拷贝变小，而每张 GPU 的 token 数不变。（答案，只算拷贝：Gen4 时 10,303 个 token，是 Gen5
#    的 5,152 的两倍；Gen5 上 DP = 8 时为 644，约为原来的 1/N_d。）
# 2. **任务：** fp32 下拷贝翻倍（每个方向 4 字节），但计算慢得更多（峰值 67 TFLOP/s）。只算拷贝时，
#    fp32 的盈亏平衡点是多少？
# 3. **任务：** DP = 2 的 ZeRO-3 加卸载时，设备上只保留分片。每个 rank 的设备上有多少字节参数？
#    单元格会训练 2 步来检查。

# %%
my_answer_fp32 = None     # ← your answer: tokens / 你的答案：token 数
my_answer_stage3 = None   # ← your answer: bytes / 你的答案：字节数

# %%
ok = check("05.try_fp32", my_answer_fp32, offload_cost(big, tokens=1, precision="fp32", gpu="H100")["breakeven_tokens"],
           source="formula")
stage3 = dtlab.train(TrainConfig(dp=2, zero=3, offload=True, steps=2, seed=0)).wait()
ok = check("05.try_stage3_device", my_answer_stage3, stage3.records[-1]["ranks"][0]["mem"]["params"])

# %% [markdown]
# ## Check / 检查
#
# The last cell repeats this lesson's measurements as one deterministic result.
# 最后一个单元格把本课的测量结果汇总成一个确定的结论。

# %%
results = {
    "one rank copies 4Ψ down and 4Ψ up per step / 单个 rank 每步下行 4Ψ、上行 4Ψ":
        one["transfer_bytes"] == {"d2h": 4 * PSI, "h2d": 4 * PSI},
    "offloaded: no optimizer state on the device / 卸载后设备上没有优化器状态": all(r["mem"]["optimizer"] == 0 for r in ranks),
    "offloaded: the host holds 16Ψ/N per rank / 卸载后每个 rank 的主机持有 16Ψ/N":
        sum(ranks[0]["host_mem"].values()) == 4 * PSI and same_host,
    "ZeRO-2 on 4 ranks copies 4Ψ/N bytes each way per rank / 4 个 rank 的 ZeRO-2 每个 rank 每个方向拷贝 4Ψ/N 字节":
        same_everywhere and four[0]["transfer_bytes"] == {"d2h": PSI, "h2d": PSI},
    "offloading leaves the loss curve unchanged / 卸载不改变损失曲线": same_loss,
    "7.5B in bf16 over PCIe Gen5: 0.469 s of copies per step / 75 亿参数 bf16 经 PCIe Gen5：每步拷贝 0.469 秒":
        round(copy_s, 3) == 0.469,
    "the host's step (2.1 s at 100 GB/s) outweighs the copies / 主机更新（100 GB/s 时 2.1 秒）超过拷贝": host_s > 4 * copy_s,
    "break-even about 5,152 tokens for the copies, 28,228 with the host's step, whatever Ψ"
    " / 盈亏平衡点：拷贝约 5,152 个 token，加上主机更新 28,228 个，与 Ψ 无关":
        set(table.values()) == {breakeven} == {5152} and set(table_with_step.values()) == {28228},
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 05:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
