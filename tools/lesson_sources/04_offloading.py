CELLS = [
("md", r"""
# Lesson 04 — Offloading: the optimizer on the CPU
# 第 04 课 —— 卸载：把优化器放到 CPU 上

**What you will see.** Adam's state is the biggest part of the model states,
and the update touches each value only once per step: work the host CPU can do
in its own, much larger memory. **Offloading** moves the optimizer state and
the optimizer step there (ZeRO-Offload, Ren et al., 2021). The price is a copy
over **PCIe** every step: the gradients go down to the host, the updated
parameters come back up. You will predict those bytes and measure them on real
ranks, see the device and host memory pools side by side, and then work out,
with the bandwidth of PCIe, from how much work per step the copy stops costing
anything.

**你将看到什么。** Adam 的状态是模型状态中最大的一块，而参数更新每一步只把每个值碰一次：这正是主机
CPU 可以在它自己那块大得多的内存里完成的工作。**卸载**（offloading）把优化器状态和优化器的更新
步骤都搬到主机上（ZeRO-Offload，Ren 等，2021）。代价是每一步都要经过 **PCIe 总线** 拷贝一次：
梯度下行到主机，更新后的参数再上行回来。你会先预测这些字节数，再在真实的 rank 上测量它们，
并排查看设备内存池和主机内存池；最后用 PCIe 的带宽算一算：每一步的工作量达到多少时，
这次拷贝就不再有任何代价。
"""),
("code", r"""
import math

import dtlab
from dtlab import TrainConfig
from dtlab.config import MODEL_PRESETS
from dtlab.launch import run
from dtlab.lab import Dashboard, check
from dtlab.lab.offload_view import MemoryPools, OffloadCost, offload_cost
from dtlab.course.experiments import offload as offload_lesson
from dtlab.planner import ACHIEVABLE_FRACTION, GPUS, LINKS

PSI = MODEL_PRESETS["small"].param_count()   # Ψ: parameters of the small GPT
print(f"Ψ = {PSI:,} parameters / 个参数")
"""),
("md", r"""
## 1. What moves, and where things live / 搬运什么，东西放在哪里

`dtlab/zero/offload.py` wraps any torch optimizer in an `OffloadOptimizer`. One step:

```
device                                   host (CPU)
parameters p  ---- gradients g  -->      copy of g              (d2h: device → host)
                                         master p32 ← Adam(p32, g), state m, v
parameters p  <--- updated p    ----     p32                    (h2d: host → device)
```

The host keeps an fp32 master copy of the parameters, a buffer for the
gradients, and Adam's two moments; the device keeps only what forward and
backward need. On this CPU-only machine "device" and "host" are both main
memory, but the two pools are still separate tensors and the copies still
happen, so they can be counted. dtlab trains in fp32 here: 4 bytes per value.

**Predict:** training the whole small GPT on one rank, how many bytes go down
(d2h) and how many come up (h2d) in one step?

`dtlab/zero/offload.py` 用 `OffloadOptimizer` 包装任意一个 torch 优化器。一步的过程如上图：主机保存一份
fp32 的参数主副本、一块存放梯度的缓冲区以及 Adam 的两个动量；设备上只保留前向和反向需要的东西。
在这台只有 CPU 的机器上，“设备”和“主机”其实都是内存，但两个内存池仍然是各自独立的张量，拷贝也
真的发生，所以可以计数。这里 dtlab 用 fp32 训练：每个值 4 字节。

**预测：** 在一个 rank 上训练整个小 GPT，一步之内有多少字节下行（d2h）、多少字节上行（h2d）？
"""),
("code", r"""
my_prediction = {"d2h": 4 * PSI, "h2d": 4 * PSI}  # ← your prediction / 你的预测

one = run(offload_lesson.offload_step, 1)[0]
print(f"{'':>10} {'device':>10} {'host':>10}   (bytes / 字节)")
for category in ("params", "grads", "optimizer"):
    print(f"{category:>10} {one['device'][category]:>10,} {one['host'][category]:>10,}")
ok = check("bytes copied per step, one rank", my_prediction, one["transfer_bytes"], name_zh="每步拷贝的字节数，单个 rank")
"""),
("md", r"""
The device's optimizer column is 0: Adam's 8Ψ bytes now live on the host, next
to the 4Ψ fp32 master and a 4Ψ gradient buffer. In fp32 training the master
duplicates the device's parameters; in mixed precision it does not, because the
fp32 master exists anyway (it is part of K = 12) — so there the host takes
exactly the 12Ψ the device gives up.

设备那一列的优化器状态是 0：Adam 的 8Ψ 字节现在放在主机上，旁边还有 4Ψ 的 fp32 主副本和 4Ψ 的
梯度缓冲区。在 fp32 训练中，主副本与设备上的参数重复；而在混合精度训练中并不重复，因为 fp32 主权重
本来就要存在（它属于 K = 12 的一部分）——所以那时主机接手的正好是设备让出来的 12Ψ。

## 2. Offloading with ZeRO on 4 ranks / 在 4 个 rank 上与 ZeRO 一起卸载

In the trainer, offloading needs a ZeRO stage (`TrainConfig(offload=True)`
requires `zero >= 1`): each rank offloads only the shard of the optimizer it
owns. Two runs follow, ZeRO-2 on DP = 4 with and without offloading.

**Predict:** per rank with offloading, the device's optimizer bytes, the
host's total bytes (master shard + gradient shard + Adam's state for the shard),
and whether the loss curve changes.

在训练器中，卸载需要配合 ZeRO 阶段（`TrainConfig(offload=True)` 要求 `zero >= 1`）：每个 rank 只
卸载自己负责的那一片优化器。下面有两次运行：DP = 4 的 ZeRO-2，分别不卸载和卸载。

**预测：** 卸载时每个 rank 设备上的优化器字节数、主机上的总字节数（主副本分片 + 梯度分片 + 该分片
的 Adam 状态），以及损失曲线会不会改变。
"""),
("code", r"""
# NBVAL_IGNORE_OUTPUT
dash = Dashboard()
dash
"""),
("code", r"""
my_prediction_device_optimizer = 0            # ← your prediction / 你的预测
my_prediction_host = (4 + 4 + 8) * PSI // 4   # ← your prediction / 你的预测
my_prediction_same_loss = True                # ← your prediction / 你的预测

kept = dash.watch(dtlab.train(TrainConfig(dp=4, zero=2, steps=3, seed=0)), label="ZeRO-2")
offloaded = dash.watch(dtlab.train(TrainConfig(dp=4, zero=2, offload=True, steps=3, seed=0)),
                       label="ZeRO-2 + offload / 卸载")
print(f"{'':>22} {'params':>9} {'grads':>9} {'optimizer':>9}")
kept_device, _ = MemoryPools.pools(kept.records[-1])                 # rank 0: (device, host) bytes
device, host = MemoryPools.pools(offloaded.records[-1])
for label, pool in (("ZeRO-2, device", kept_device), ("+ offload, device", device), ("+ offload, host", host)):
    print(f"{label:>22} {pool['params']:>9,} {pool['grads']:>9,} {pool['optimizer']:>9,}")
ranks = offloaded.records[-1]["ranks"]
ok = check("device optimizer bytes per rank, offloaded", my_prediction_device_optimizer,
           max(r["mem"]["optimizer"] for r in ranks), name_zh="卸载后每个 rank 设备上的优化器字节数")
ok = check("host bytes per rank, offloaded", my_prediction_host, sum(ranks[0]["host_mem"].values()),
           name_zh="卸载后每个 rank 的主机字节数")
same_host = all(r["host_mem"] == ranks[0]["host_mem"] for r in ranks)
same_loss = offloaded.losses() == kept.losses()
ok = check("offloading leaves the loss curve unchanged", my_prediction_same_loss, same_loss,
           name_zh="卸载不改变损失曲线")
"""),
("md", r"""
The two memory pools, on one scale: the device (left) and the host (right). They
are different memories and are never added together: the point of offloading is
that the left one is the scarce one.

两个内存池，使用同一个刻度：左边是设备，右边是主机。它们是不同的内存，不能相加：卸载的意义就在于
左边那个才是稀缺的。
"""),
("code", r"""
# NBVAL_IGNORE_OUTPUT
pools = MemoryPools({"ZeRO-2": kept, "ZeRO-2 + offload": offloaded})
pools
"""),
("md", r"""
The step records carry `host_mem` but not the bytes copied, so the next cell
builds the offloaded ZeRO-2 optimizer directly on 4 ranks
(`dtlab/course/experiments/offload.py`) and reads its `transfer_bytes` after one step.

**Predict:** bytes each rank copies down and up per step.

步骤记录里有 `host_mem`，却没有拷贝的字节数，所以下一个单元格直接在 4 个 rank 上构建卸载的 ZeRO-2
优化器（`dtlab/course/experiments/offload.py`），并在一步之后读取它的 `transfer_bytes`。

**预测：** 每个 rank 每步下行、上行各拷贝多少字节？
"""),
("code", r"""
my_prediction = {"d2h": 4 * PSI // 4, "h2d": 4 * PSI // 4}  # ← your prediction / 你的预测

four = run(offload_lesson.offload_step, 4, zero=2)
for r in four:
    print(f"rank {r['rank']}: {r['transfer_bytes']}, host {r['host']}")
ok = check("bytes copied per step per rank, ZeRO-2 on 4 ranks", my_prediction, four[0]["transfer_bytes"],
           name_zh="每个 rank 每步拷贝的字节数，4 个 rank 上的 ZeRO-2")
same_everywhere = all(r["transfer_bytes"] == four[0]["transfer_bytes"] for r in four)
host_matches_trainer = all(r["host"] == ranks[0]["host_mem"] for r in four)
print("every rank copies the same / 每个 rank 拷贝量相同:", same_everywhere)
print("host pool equals the trainer's host_mem / 主机内存池与训练器的 host_mem 一致:", host_matches_trainer)
"""),
("md", r"""
How fast were the copies here? This machine copies from memory to memory, not
over a bus, so its figure says little about a GPU (this cell's numbers change
from run to run).

这里的拷贝有多快？这台机器是从内存拷贝到内存，并没有经过总线，所以这个数字对 GPU 来说参考意义不大
（这个单元格的数字每次运行都会变）。
"""),
("code", r"""
# NBVAL_IGNORE_OUTPUT
seconds = one["seconds"]["d2h"] + one["seconds"]["h2d"]
print(f"one rank: {sum(one['transfer_bytes'].values()):,} bytes in {seconds * 1e3:.2f} ms "
      f"= {sum(one['transfer_bytes'].values()) / seconds / 1e9:.1f} GB/s")
"""),
("md", r"""
## 3. What the copy costs / 拷贝的代价

Now a real GPU, by arithmetic. ZeRO-Offload trains in mixed precision: the
device sends 16-bit gradients down (2Ψ bytes) and receives 16-bit parameters
(2Ψ bytes) each step, and gives up the KΨ = 12Ψ bytes of fp32 master weights,
momentum and variance. `dtlab/planner/hardware.py`'s PCIe preset is Gen5 x16:
64 GB/s each way, 2 µs of latency per message. The two copies run one after
the other: the gradients before the host's step, the parameters after it.

**Predict** for Ψ = 7.5 billion on one H100: the seconds per step the two copies
take, rounded to 3 decimals.

现在换成真正的 GPU，用算术来算。ZeRO-Offload 用混合精度训练：每一步设备把 16 位梯度下行送出（2Ψ
字节），再接收 16 位参数（2Ψ 字节），同时让出 KΨ = 12Ψ 字节的 fp32 主权重、动量和方差。
`dtlab/planner/hardware.py` 中的 PCIe 预设是 Gen5 x16：每个方向 64 GB/s，每条消息 2 微秒延迟。
两次拷贝先后进行：梯度在主机更新之前，参数在主机更新之后。

**预测：** Ψ = 75 亿、一张 H100：两次拷贝每步共需多少秒（保留 3 位小数）？
"""),
("code", r"""
my_prediction_copy_s = 0.469  # ← your prediction / 你的预测

big = 7_500_000_000
pcie = LINKS["pcie"]
each_way = 2 * big                                   # bytes: bf16 gradients down, bf16 parameters up
copy_s = pcie.time(each_way) + pcie.time(each_way)   # alpha + n / beta, twice
print(f"PCIe: {pcie.bandwidth_Bps / 1e9:.0f} GB/s, {pcie.latency_s * 1e6:.0f} µs")
print(f"frees {12 * big / 1e9:.0f} GB of device memory; moves {each_way / 1e9:.0f} GB each way per step")
print(f"            / 腾出 {12 * big / 1e9:.0f} GB 显存；每步每个方向搬运 {each_way / 1e9:.0f} GB")
ok = check("PCIe copy seconds per step, 7.5B in bf16", my_prediction_copy_s, round(copy_s, 3),
           name_zh="每步 PCIe 拷贝秒数，75 亿参数，bf16", source="formula")
"""),
("md", r"""
Half a second per step is only a cost if the GPU has nothing else to do.
ZeRO-Offload overlaps the gradient copy with the backward pass and the
parameter copy with the next forward; what decides is whether the step's
compute lasts longer than the copy. Compute is about 6Ψ FLOPs per token
(forward and backward); the planner assumes 50% of the GPU's peak (989 TFLOP/s
in bf16 for an H100).

**Predict:** the fewest tokens per GPU per step for which the compute lasts as
long as the copy (the break-even), and whether that number depends on the model
size Ψ.

每步半秒只有在 GPU 无事可做时才算代价。ZeRO-Offload 让梯度拷贝与反向传播重叠，让参数拷贝与下一步的
前向重叠；关键在于这一步的计算是否比拷贝更久。每个 token 的计算量约为 6Ψ FLOPs（前向加反向）；
规划器假设能达到 GPU 峰值的 50%（H100 的 bf16 峰值为 989 TFLOP/s）。

**预测：** 每张 GPU 每步至少要处理多少个 token，计算时间才能与拷贝时间相当（盈亏平衡点）？这个数
与模型大小 Ψ 有关吗？
"""),
("code", r"""
my_prediction_breakeven = 4 * 0.5 * 989e12 / (6 * 64e9)  # ← your prediction / 你的预测
my_prediction_depends_on_size = False                    # ← your prediction / 你的预测

flops_per_s = GPUS["H100"].peak_flops["bf16"] * ACHIEVABLE_FRACTION
breakeven = math.ceil(copy_s / (6 * big / flops_per_s))
print(f"break-even / 盈亏平衡点: {breakeven:,} tokens per GPU per step / 每张 GPU 每步的 token 数")
print(f"{'Ψ':>6} {'frees':>8} {'copy s':>8} {'break-even tokens':>18}")
table = {}
for name, params in (("1.3B", 1_300_000_000), ("7.5B", big), ("13B", 13_000_000_000), ("175B", 175_000_000_000)):
    cost = offload_cost(params, tokens=breakeven, precision="bf16", gpu="H100")
    table[name] = cost["breakeven_tokens"]
    print(f"{name:>6} {cost['freed_bytes'] / 1e9:>6.1f}GB {cost['copy_s']:>8.3f} {cost['breakeven_tokens']:>18,}")
ok = check("break-even tokens per GPU per step (H100, bf16, PCIe Gen5)", round(my_prediction_breakeven),
           breakeven, rel_tol=0.01, name_zh="每张 GPU 每步的盈亏平衡 token 数（H100，bf16，PCIe Gen5）", source="formula")
ok = check("the break-even depends on the model size", my_prediction_depends_on_size,
           len(set(table.values())) > 1, name_zh="盈亏平衡点与模型大小有关", source="formula")
"""),
("md", r"""
Ψ cancels: the copy and the compute both grow with the model, so the
break-even is a property of the hardware — about 5,000 tokens, some 2.5
sequences of 2,048 tokens per GPU per step. Below it, the copy costs more than
the memory it frees is worth in time: every step the GPU waits on PCIe. Above
it, the copy hides behind compute and offloading is free memory. For very
small batches ZeRO-Offload can also delay the parameter update by one step so
that the host's update overlaps the next step (Ren et al., 2021).

Move the sliders: the bars are one step's copy and compute (predictions).

Ψ 被约掉了：拷贝和计算都随模型增大，所以盈亏平衡点只取决于硬件——大约 5,000 个 token，相当于每张
GPU 每步 2.5 条长度为 2,048 的序列。低于它时，拷贝花掉的时间超过它腾出的内存所值：每一步 GPU 都要
等 PCIe。高于它时，拷贝被计算掩盖，卸载等于白得内存。对于很小的批次，ZeRO-Offload 还可以把参数
更新推迟一步，让主机上的更新与下一步重叠（Ren 等，2021）。

拖动滑块：两根柱子分别是一步的拷贝时间和计算时间（预测值）。
"""),
("code", r"""
# NBVAL_IGNORE_OUTPUT
cost_view = OffloadCost(params=7_500_000_000, tokens=4096)
cost_view
"""),
("md", r"""
## 4. Try this / 动手试试

1. In the cost view, switch to fp32: the copy doubles (4 bytes each way), but
   the compute slows far more (67 TFLOP/s peak), so the break-even drops to
   about 700 tokens.
2. Slide PCIe down to 32 GB/s (Gen4): where does the break-even move? Then
   raise DP: each GPU offloads only its shard, Ψ / N_d, so the copy shrinks
   while the tokens per GPU stay.
3. Run `dtlab.train(TrainConfig(dp=2, zero=3, offload=True, steps=3)).wait()` and
   compare `records[-1]["ranks"][0]["mem"]` with `["host_mem"]`: with stage 3
   the device keeps only shards, and the host holds the rest.

1. 在代价视图中切换到 fp32：拷贝翻倍（每个方向 4 字节），但计算慢得更多（峰值 67 TFLOP/s），所以
   盈亏平衡点降到约 700 个 token。
2. 把 PCIe 带宽降到 32 GB/s（Gen4）：盈亏平衡点会移到哪里？再提高 DP：每张 GPU 只卸载自己那一片
   Ψ / N_d，拷贝变小，而每张 GPU 的 token 数不变。
3. 运行 `dtlab.train(TrainConfig(dp=2, zero=3, offload=True, steps=3)).wait()`，比较
   `records[-1]["ranks"][0]["mem"]` 和 `["host_mem"]`：在阶段 3 下设备只保留分片，其余都在主机上。

## Check / 检查

The last cell repeats this lesson's measurements as one deterministic result.
最后一个单元格把本课的测量结果汇总成一个确定的结论。
"""),
("code", r"""
results = {
    "one rank copies 4Ψ down and 4Ψ up per step": one["transfer_bytes"] == {"d2h": 4 * PSI, "h2d": 4 * PSI},
    "offloaded: no optimizer state on the device": all(r["mem"]["optimizer"] == 0 for r in ranks),
    "offloaded: the host holds 16Ψ/N per rank": sum(ranks[0]["host_mem"].values()) == 4 * PSI and same_host,
    "ZeRO-2 on 4 ranks copies 4Ψ/N bytes each way per rank": same_everywhere and four[0]["transfer_bytes"] == {"d2h": PSI, "h2d": PSI},
    "offloading leaves the loss curve unchanged": same_loss,
    "7.5B in bf16 over PCIe Gen5: 0.469 s of copies per step": round(copy_s, 3) == 0.469,
    "break-even about 5,152 tokens per GPU, whatever Ψ": set(table.values()) == {breakeven} == {5152},
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 04:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
"""),
]
