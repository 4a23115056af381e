# %% [markdown]
# # Lesson 01 — All-reduce
# # 第 01 课 —— 全归约（all-reduce）
#
# **What you will see.** Every data-parallel step ends with an **all-reduce**: each
# rank gives a tensor, and every rank gets back the sum of all of them. You will
# step through the **ring** algorithm that NCCL and gloo use for large tensors, a
# **reduce-scatter** followed by an **all-gather**; predict how many bytes each
# rank sends and in how many steps, and measure both on four real ranks; check
# that dtlab's ring gives exactly the same result as `torch.distributed`; measure
# the **bus bandwidth** against message size the way nccl-tests reports it; and
# price the same all-reduce on four kinds of **interconnect** with the alpha-beta
# model.
#
# **你将看到什么。** 每一个数据并行的训练步都以一次 **全归约**（all-reduce）结束：每个 rank
# 交出一个张量，每个 rank 都拿回所有张量之和。你会一步一步地走一遍 NCCL 和 gloo 处理大张量时
# 使用的 **环形**（ring）算法——先做一次 **归约散射**（reduce-scatter），再做一次 **全收集**
# （all-gather）；预测每个 rank 要发送多少字节、需要多少步，并在四个真实的 rank 上测量；验证
# dtlab 的环形算法与 `torch.distributed` 的结果完全相同；像 nccl-tests 那样测量 **总线带宽**
# （bus bandwidth）随消息大小的变化；最后用 alpha-beta 模型估算同一次全归约在四种 **高速互联**
# （interconnect）上的耗时。

# %%
import torch

import dtlab
from dtlab import TrainConfig
from dtlab.bench import allreduce as bench
from dtlab.comm.collectives import ring_schedule
from dtlab.planner.communication import bus_bandwidth, ring_allreduce_time, ring_bytes_sent_per_rank
from dtlab.planner.hardware import LINKS
from dtlab.lab import Dashboard, check, human_bytes
from dtlab.lab.ring_view import RingView, busbw_figure, holdings
from dtlab.launch import pick_backend, run
from dtlab.course.experiments import all_reduce as ar_lesson
from dtlab.course.exercises import grade

# %% [markdown]
# ## 1. The ring, step by step / 一步一步地看环形算法
#
# Put the N ranks in a ring: rank r sends only to rank r + 1 and receives only
# from rank r − 1. Cut each rank's tensor into N **chunks**.
#
# * **Reduce-scatter**, N − 1 steps: in each step every rank sends one chunk to
#   its right neighbour, and *adds* the chunk arriving from its left into its own
#   copy. A chunk picks up one more rank's contribution at every hop.
# * **All-gather**, N − 1 more steps: the finished chunks go round the ring once
#   more, now *copied* instead of added, until every rank has all of them.
#
# The picture below is driven by `ring_schedule(N)`, the same plain data the real
# collective executes. Each cell lists whose contributions a rank's copy of a
# chunk holds. It comes after your prediction:
#
# **Predict:** after the N − 1 = 3 reduce-scatter steps on 4 ranks, which chunk
# does each rank hold fully reduced?
#
# 把 N 个 rank 排成一个环：rank r 只向 rank r + 1 发送，只从 rank r − 1 接收。把每个 rank 的张量
# 切成 N **块**（chunk）。
#
# * **归约散射**（reduce-scatter），N − 1 步：每一步里，每个 rank 把一块发给右边的邻居，并把从左边
#   收到的块 *加* 到自己那一份上。一个块每经过一跳，就多累加上一个 rank 的贡献。
# * **全收集**（all-gather），再走 N − 1 步：已经算完的块沿着环再转一圈，这次是 *复制* 而不是相加，
#   直到每个 rank 都拥有全部的块。
#
# 下面的图由 `ring_schedule(N)` 驱动，这正是真实集合通信所执行的调度表（以数据形式给出）。每个格子列出某个
# rank 手中某一块已经包含了哪些 rank 的贡献。它在你的预测之后出现：
#
# **预测：** 4 个 rank 上走完 N − 1 = 3 步归约散射之后，每个 rank 手里哪一块是完全归约好的？

# %%
my_prediction = None  # ← your prediction: chunk numbers per rank, e.g. [[1], [2], [3], [0]] / 你的预测：每个 rank 的块编号

# %%
view = RingView(ranks=4)
for _ in range(3):
    view.step()
ok = check("01.complete_chunks", my_prediction, view.complete_chunks(), source="simulated")
for _ in range(3):
    view.step()
gathered = view.complete_chunks() == [[0, 1, 2, 3]] * 4
print("after all-gather, every rank holds every chunk fully reduced / 全收集之后每个 rank 拥有全部归约好的块:",
      gathered)

# %% [markdown]
# Now step through it yourself: **Step** advances one ring step, **Reset** starts
# again. / 现在自己走一遍：按 **Step**（前进一步）推进一个环形步，按 **Reset**（重置）从头开始。

# %%
# NBVAL_IGNORE_OUTPUT
view.reset()
view

# %% [markdown]
# ## 2. Bytes sent per rank / 每个 rank 发送的字节数
#
# Count from the picture above: what does one rank send in one ring step, and
# how many steps do the two phases take together?
#
# We measure it on a 4 MiB float32 tensor (a 64 MiB one would only be slower on
# your machine) with a `CommMeter`, which counts the bytes this rank put on its
# point-to-point links, and scale up by 16.
#
# **Predict:** how many bytes does each rank send for 4 MiB, and in how many ring
# steps? (The cell then scales the bytes to 64 MiB.)
#
# 先从上面的图里数一数：一个 rank 在一个环形步里发送多少？两个阶段加起来一共多少步？
#
# 我们用一个 4 MiB 的 float32 张量来测量（64 MiB 的张量在你的机器上只会更慢），用 `CommMeter`
# 统计本 rank 在点对点链路上发出的字节数，再乘以 16 换算。
#
# **预测：** 对 4 MiB 的张量，每个 rank 发送多少字节、走多少个环形步？（单元格随后会把字节数换算到 64 MiB。）

# %%
N, nbytes = 4, 4 * 2**20
my_prediction_bytes = None  # ← your prediction: bytes, an integer / 你的预测：字节数（整数）
my_prediction_steps = None  # ← your prediction: ring steps, an integer / 你的预测：环形步数（整数）

ranks = run(ar_lesson.ring_versus_torch, N, nbytes)
sent = ranks[0]["bytes_sent"]
for r in ranks:
    print(f"rank {r['rank']}: tensor {human_bytes(r['nbytes'])}, sent {r['bytes_sent']:,} bytes "
          f"= {human_bytes(r['bytes_sent'])} in {r['steps']} ring steps / 张量 {human_bytes(r['nbytes'])}，"
          f"发送 {r['bytes_sent']:,} 字节，共 {r['steps']} 个环形步")
ok = check("01.bytes_sent", my_prediction_bytes, sent)
ok = check("01.ring_steps", my_prediction_steps, ranks[0]["steps"])
print(f"scaled to 64 MiB / 换算到 64 MiB: {human_bytes(sent * 16)}"
      f"  (formula / 公式: {human_bytes(ring_bytes_sent_per_rank(64 * 2**20, N, 'all_reduce'))})")
print("every rank sent the same / 每个 rank 发送的一样多:", len({r["bytes_sent"] for r in ranks}) == 1)
print("each rank followed ring_schedule(4) exactly / 每个 rank 都严格按 ring_schedule(4) 执行:",
      all(r["trace_is_schedule"] for r in ranks))
print(f"reduce-scatter alone sent {human_bytes(ranks[0]['reduce_scatter_sent'])}, "
      f"all-gather alone {human_bytes(ranks[0]['all_gather_sent'])}: (N-1)/N each / 各占 (N-1)/N")

# %% [markdown]
# Why: in every step each rank sends one chunk, 1/N of the tensor, and there are
# 2(N − 1) steps, so each rank sends **2(N − 1)/N** of the tensor in all: for a
# 64 MiB tensor on 4 ranks, 2 × 3/4 × 64 = 96 MiB. The factor stays below 2
# however many ranks there are (1.5 at N = 4, approaching 2 as N grows), and every link carries the same load — which is why the ring scales
# (Patarasuk and Yuan, 2009; nccl-tests, PERFORMANCE.md).
#
# 原因是：每一步里每个 rank 发送一块，也就是张量的 1/N，一共 2(N − 1) 步，所以每个 rank 总共发送张量的
# **2(N − 1)/N**：4 个 rank 上的 64 MiB 张量，就是 2 × 3/4 × 64 = 96 MiB。无论有多少个 rank，
# 这个系数都小于 2（N = 4 时为 1.5，N 越大越接近 2），而且每条链路承担的数据量一样——
# 这就是环形算法能够扩展的原因（Patarasuk 和 Yuan，2009；nccl-tests 的 PERFORMANCE.md）。

# %% [markdown]
# ## 3. The same answer as torch / 与 torch 的结果相同
#
# The same rank function also ran `torch.distributed.all_reduce` on an identical
# copy of the tensor. Its values are small whole numbers, so every sum is exact
# whatever order the additions happen in, and the two results can be compared for
# *equality*. It also checked that a reduce-scatter followed by an all-gather
# gives the all-reduce.
#
# **Predict:** is dtlab's ring all-reduce bit-for-bit equal to torch's?
#
# 同一个 rank 函数还在一份完全相同的张量副本上运行了 `torch.distributed.all_reduce`。张量里的值都是
# 小整数，所以无论加法顺序如何，每个和都是精确的，两个结果可以直接比较是否 *相等*。它还验证了先做
# 归约散射、再做全收集，得到的就是全归约。
#
# **预测：** dtlab 的环形全归约与 torch 的结果逐位相等吗？

# %%
my_prediction = None  # ← your prediction: True or False / 你的预测：True 或 False

ok = check("01.equals_torch", my_prediction, all(r["equal_to_torch"] for r in ranks))
print("reduce-scatter + all-gather == all-reduce / 归约散射 + 全收集 == 全归约:",
      all(r["halves_equal_whole"] for r in ranks))

# %% [markdown]
# ## 4. Bus bandwidth / 总线带宽
#
# nccl-tests reports two rates (PERFORMANCE.md). The **algorithm bandwidth** is
# the tensor size over the time, algbw = S / t. But an all-reduce moves
# 2(N − 1)/N × S through each rank's link, so nccl-tests also reports the **bus
# bandwidth**, busbw = algbw × 2(N − 1)/N: the rate each link really ran at,
# which can be compared with the hardware's peak whatever N is.
#
# **Predict:** an all-reduce of 64 MiB on 4 ranks takes 1 ms. What are algbw and
# busbw, in GB/s (10⁹ bytes per second)?
#
# nccl-tests 报告两种速率（PERFORMANCE.md）。**算法带宽**（algorithm bandwidth）是张量大小除以时间，
# algbw = S / t。但一次全归约让每个 rank 的链路传输 2(N − 1)/N × S 的数据，所以 nccl-tests 还报告
# **总线带宽**（bus bandwidth），busbw = algbw × 2(N − 1)/N：它是每条链路实际跑到的速率，无论 N 是多少，
# 都可以直接与硬件的峰值比较。
#
# **预测：** 4 个 rank 上 64 MiB 的全归约用时 1 毫秒。algbw 和 busbw 各是多少 GB/s（每秒 10⁹ 字节）？

# %%
my_prediction = None  # ← your prediction: {"algbw": GB/s, "busbw": GB/s} / 你的预测：{"algbw": GB/s, "busbw": GB/s}

algbw = 64 * 2**20 / 1e-3
bw_formula = {"algbw": round(algbw / 1e9, 3), "busbw": round(bus_bandwidth(algbw, 4, "all_reduce") / 1e9, 3)}
ok = check("01.bandwidths", my_prediction, bw_formula, source="formula")

# %% [markdown]
# Now a real sweep, as `dtlab bench allreduce` prints it: message sizes from
# 1 KiB to 64 MiB on 4 ranks, dtlab's ring beside `torch.distributed.all_reduce`
# (the median of 3 timings each; the cell takes about half a minute). Look at the shape, not the exact numbers,
# which depend on your machine and change from run to run: at small sizes the
# time hardly changes with size, because every message pays a fixed start-up
# cost — the transfer is **latency-bound** and busbw is tiny; at large sizes the
# time grows with the bytes — it is **bandwidth-bound** and busbw levels off.
# On a laptop-sized machine expect two departures from the textbook: 4 ranks
# sharing a few cores make every message wait for a core, a floor of several
# milliseconds far above the α of section 5's links; and at the largest sizes
# busbw can dip, as the ranks' copies compete for the same memory.
#
# The line **by size** (column "by size") is what `--collectives dtlab` runs between machines: up to 1 MiB
# it is not the ring but **recursive doubling** (`dtlab/comm/recursive_doubling.py`).
# At step k each rank swaps its *whole* tensor with the rank whose number
# differs in bit k and adds it in: log2 N messages instead of the ring's
# 2(N − 1), each carrying the whole tensor instead of 1/N of it. When time is
# messages, as it is at small sizes, fewer messages win; when time is bytes,
# the ring's 2(N − 1)/N of the tensor beats log2 N whole copies (from N = 3 on;
# at N = 2 both send the tensor once). Libraries choose by size too: MPICH
# all-reduces up to 2 KiB by recursive doubling (Thakur, Rabenseifner and
# Gropp, 2005) and NCCL picks a tree or a ring; here, where a message costs
# far more, the switch is at 1 MiB. Between ranks of one machine
# `--collectives dtlab` runs the ring at every size, over shared memory instead
# of gloo's TCP: the line "dtlab ring_all_reduce over shared memory" (column
# "ring, shm"; section 6 says how). Compare it with the others in your run.
#
# 现在做一次真实的扫描，就像 `dtlab bench allreduce` 输出的那样：在 4 个 rank 上，消息大小从 1 KiB 到
# 64 MiB，把 dtlab 的环形算法与 `torch.distributed.all_reduce` 放在一起比较（各取 3 次计时的中位数；这个单元格约需半分钟）。
# 请看曲线的形状，而不是具体数字——数字取决于你的机器，每次运行都会变：消息小时，耗时几乎不随大小
# 变化，因为每条消息都要付出固定的启动开销——这时传输是 **受延迟限制**（latency-bound）的，
# busbw 很低；消息大时，耗时随字节数增长——这时是 **受带宽限制**（bandwidth-bound）的，busbw 趋于平稳。
# 在笔记本电脑这样的机器上会看到两处与教科书不同：4 个 rank 共用少数几个核，每条消息都要等核，于是有几毫秒的
# 下限，远高于第 5 节各种链路的 α；在最大的几个尺寸上 busbw 还可能下降，因为各 rank 的拷贝在争用同一块内存。
#
# **by size（按大小选择）** 这条线（表中 "by size" 列）就是 `--collectives dtlab` 在不同机器之间运行的算法：不超过 1 MiB 时用的不是环，而是
# **递归倍增**（recursive doubling，`dtlab/comm/recursive_doubling.py`）。第 k 步，每个 rank 与编号只在第 k 位不同的
# rank 交换 *整个* 张量并累加：共 log2 N 条消息，而环要 2(N − 1) 条；但每条消息装的是整个张量，而不是它的 1/N。
# 小消息的时间花在消息条数上，条数少的算法赢；大消息的时间花在字节上，环只发送张量的 2(N − 1)/N，胜过
# log2 N 份完整拷贝（N ≥ 3 时；N = 2 时两者都只发送一次整个张量）。通信库也按大小选择算法：MPICH 对不超过 2 KiB
# 的全归约用递归倍增（Thakur、Rabenseifner 与 Gropp，2005），NCCL 在树和环之间选择；这里每条消息的代价高得多，
# 所以分界在 1 MiB。同一台机器上的 rank 之间，`--collectives dtlab` 在所有大小上都用环，只是改经共享内存、不走 gloo 的
# TCP：即 "dtlab 的环形全归约，经共享内存" 那条线（表中 "ring, shm" 列；做法见第 6 节）。请在你的运行结果里把它与其他几条线比较。

# %%
# NBVAL_IGNORE_OUTPUT
sizes = tuple(4 ** k for k in range(5, 14))          # 1 KiB, 4 KiB, ..., 64 MiB
seconds = run(bench.measure, 4, sizes, 3, timeout=300)[0]
nan = float("nan")               # no shared-memory column where the ranks run on NCCL
print(f"{'size / 大小':>12} {'ring (µs)':>10} {'by size (µs)':>13} {'ring, shm (µs)':>15} {'torch (µs)':>11} "
      f"{'busbw ring (GB/s)':>18}")
for b in sizes:
    s = seconds[b]
    print(f"{human_bytes(b):>12} {s['dtlab'] * 1e6:10.0f} {s['by_size'] * 1e6:13.0f} {s.get('shared', nan) * 1e6:15.0f} "
          f"{s['torch'] * 1e6:11.0f} {bus_bandwidth(b / s['dtlab'], 4, 'all_reduce') / 1e9:18.3f}")
busbw_figure(seconds, 4)

# %% [markdown]
# ## 5. The alpha-beta model and four interconnects / alpha-beta 模型与四种高速互联
#
# A message of n bytes over a link costs α + n/β: a fixed latency α plus the
# bytes over the bandwidth β. A ring all-reduce is 2(N − 1) steps of one chunk
# each, so it takes 2(N − 1)·α + 2(N − 1)/N · S/β. dtlab's presets use nominal
# per-GPU, one-direction figures (`dtlab/planner/hardware.py`): NVLink 4 at 450 GB/s,
# PCIe Gen5 x16 at 64 GB/s, InfiniBand NDR at 50 GB/s and 100 Gb Ethernet at
# 12.5 GB/s. These are predictions, not measurements.
#
# **Predict:** how long does an all-reduce of 64 MiB on 4 ranks take over
# Ethernet (α = 25 µs, β = 12.5 GB/s)? Work it out from the formula, and write
# the number of milliseconds.
#
# n 字节的消息在一条链路上的耗时是 α + n/β：固定的延迟 α，加上字节数除以带宽 β。环形全归约有
# 2(N − 1) 步，每步传一块，所以总耗时是 2(N − 1)·α + 2(N − 1)/N · S/β。dtlab 的预设使用每张 GPU、
# 单方向的标称数值（见 `dtlab/planner/hardware.py`）：NVLink 4 为 450 GB/s，PCIe Gen5 x16 为 64 GB/s，
# InfiniBand NDR 为 50 GB/s，100 Gb 以太网为 12.5 GB/s。这些都是预测值，不是实测值。
#
# **预测：** 4 个 rank 上 64 MiB 的全归约走以太网（α = 25 µs，β = 12.5 GB/s）要多久？请用公式算出来，
# 写下毫秒数。

# %%
S = 64 * 2**20
my_prediction_ms = None  # ← your prediction: milliseconds / 你的预测：毫秒

print(f"{'link / 链路':<12}{'alpha':>10}{'beta':>12}{'64 MiB, N=4':>14}{'64 MiB, N=8':>14}{'1 KiB, N=4':>13}")
for name, link in LINKS.items():
    print(f"{name:<12}{link.latency_s * 1e6:>8.0f}us{link.bandwidth_Bps / 1e9:>8.1f}GB/s"
          f"{ring_allreduce_time(S, 4, link) * 1e3:>11.3f} ms{ring_allreduce_time(S, 8, link) * 1e3:>11.3f} ms"
          f"{ring_allreduce_time(1024, 4, link) * 1e6:>10.2f} us")
ok = check("01.ethernet_ms", my_prediction_ms, round(ring_allreduce_time(S, 4, LINKS["ethernet"]) * 1e3, 4), source="formula")

# %% [markdown]
# The two terms cross where the latency part equals the bandwidth part: per
# step, α = (S/N)/β, so S = N·α·β. Below that size a link is latency-bound and
# its busbw is a small share of β; above it, busbw climbs towards β. In the model
# busbw/β = S / (S + N·α·β), exactly one half at the crossover.
#
# **Predict:** on NVLink (α = 1 µs, β = 450 GB/s) with 4 ranks, at what size is
# busbw half the peak? What share of the peak does a 1 KiB message reach?
#
# 两项在延迟部分等于带宽部分的地方相交：每一步里 α = (S/N)/β，所以 S = N·α·β。小于这个大小时链路
# 受延迟限制，busbw 只是 β 的一小部分；大于它时，busbw 逐渐接近 β。在模型里
# busbw/β = S / (S + N·α·β)，在交点处正好是一半。
#
# **预测：** 在 NVLink（α = 1 µs，β = 450 GB/s）上、4 个 rank 时，消息多大时 busbw 是峰值的一半？
# 1 KiB 的消息能达到峰值的百分之几？

# %%
my_prediction = None  # ← your prediction: {"half-peak size (bytes)": ..., "1 KiB share of peak (%)": ...} / 你的预测

nvlink = LINKS["nvlink"]
def model_busbw(size):
    return bus_bandwidth(size / ring_allreduce_time(size, 4, nvlink), 4, "all_reduce")
crossover = round(4 * nvlink.latency_s * nvlink.bandwidth_Bps)   # N·α·β bytes
nvlink_formula = {"half-peak size (bytes)": crossover,
            "1 KiB share of peak (%)": round(100 * model_busbw(1024) / nvlink.bandwidth_Bps, 4)}
ok = check("01.nvlink_half_peak", my_prediction, nvlink_formula, source="formula")
print(f"busbw at the crossover / 交点处的 busbw: {model_busbw(crossover) / 1e9:.1f} GB/s of 450")
print(f"busbw at 64 MiB / 64 MiB 时的 busbw: {100 * model_busbw(S) / nvlink.bandwidth_Bps:.1f}% of the peak / 峰值")

# %% [markdown]
# `ring_all_reduce(..., link=...)` can also *simulate* a slower wire on your
# machine: the bytes still travel over the real backend, and each transfer is
# then made to last at least α + n/β. Here a 1 Gb/s-class link (α = 1 ms,
# β = 125 MB/s) carries a 4 MiB all-reduce on 4 ranks. The time is measured, so
# the next cell's output is ignored by the tests. The check after it only
# confirms the simulator's floor (it stretches each transfer to at least
# α + n/β, so the run cannot beat the formula); what the run adds above the
# formula is the real transfers' own cost.
#
# `ring_all_reduce(..., link=...)` 还可以在你的机器上 *模拟* 一条更慢的链路：字节仍然通过真实的后端
# 传输，只是每次传输会被拉长到至少 α + n/β。下面用一条 1 Gb/s 级别的链路（α = 1 毫秒，β = 125 MB/s）
# 在 4 个 rank 上做一次 4 MiB 的全归约。时间是实测的，所以下一个单元格的输出不参与测试比较。再下一个单元格的
# 检查只是确认模拟器的下限（它把每次传输拉长到至少 α + n/β，所以运行不可能比公式更快）；运行比公式多出的
# 部分，是真实传输自身的开销。

# %%
# NBVAL_IGNORE_OUTPUT
from dtlab.planner.hardware import Link
slow = Link(name="1GbE-class", latency_s=1e-3, bandwidth_Bps=125e6)
model_s = ring_allreduce_time(4 * 2**20, 4, slow)
simulated_s = run(ar_lesson.simulated_link, 4, 4 * 2**20, slow.latency_s, slow.bandwidth_Bps)[0]
print(f"formula (alpha-beta model) {model_s * 1e3:.1f} ms, run over the simulated link {simulated_s * 1e3:.1f} ms"
      f" / 公式（alpha-beta 模型）{model_s * 1e3:.1f} 毫秒，在模拟链路上的运行 {simulated_s * 1e3:.1f} 毫秒")

# %%
print("the run over the simulated link takes at least the formula's time / 在模拟链路上的运行耗时不少于公式给出的时间:",
      simulated_s >= model_s)

# %% [markdown]
# ## 6. NCCL and gloo / NCCL 与 gloo
#
# A **backend** is the library that moves the bytes of a collective.
# **NCCL** (NVIDIA Collective Communications Library) runs collectives on GPU
# memory, over NVLink, PCIe and InfiniBand, with ring and tree algorithms tuned
# to the topology. **Gloo** is Meta's collective library for CPU tensors over
# TCP: slower, but it works on any machine. dtlab's `pick_backend` chooses NCCL
# when every rank can have a GPU of its own and gloo otherwise, so a laptop
# without a GPU runs the same code on gloo. dtlab's ring is built from
# `isend`/`irecv`, so it runs on either.
#
# A backend also needs a **transport**, the way bytes get from one rank to
# another. NCCL picks one by where the ranks are: between GPUs of one node it
# copies straight from GPU to GPU over NVLink or PCIe (its P2P transport) where
# it can, and through shared host memory (SHM) where it cannot, for example
# between GPUs under different CPU sockets; between nodes it uses the network
# (NET: InfiniBand or TCP sockets). `NCCL_DEBUG=INFO` prints its choice for
# each pair, as `via P2P/…`, `via SHM/…` or `via NET/…`. Gloo has no such
# choice: even two processes on one laptop talk over TCP, so each message is
# copied into the kernel, passed through the loopback interface and copied out
# again, with system calls and a hand-over between gloo's threads on both
# sides.
#
# `--collectives dtlab` runs the ring between ranks of one machine over
# **shared memory** (`dtlab/comm/shared_memory.py`). `/dev/shm` is a file system
# kept in RAM: when two processes map the same file there into their memory, a
# byte one of them writes is one the other can read, with no system call in
# between. Each rank has an **inbox** there: four 1 MiB **slots** that only its
# left neighbour writes into. To send, a rank copies the next piece of its
# chunk (at most 1 MiB, one slot) into a free slot of its right neighbour's
# inbox, then writes one byte on a pipe to wake that neighbour; the neighbour
# copies the piece out and writes one byte back on a second pipe to say the
# slot is free. A rank with nothing to read sleeps on its pipe instead of
# spinning, which matters when ranks outnumber cores. That is the line "dtlab
# ring_all_reduce over shared memory" in section 4's figure. (This part needs
# the lesson's ranks on gloo; under NCCL the cell says so and skips it.)
#
# **Predict:** on random floats, whose sums depend on the order of the
# additions, does the ring over shared memory give the same bits as the ring
# over gloo?
#
# **通信后端**（backend）是负责搬运集合通信数据的库。**NCCL**（NVIDIA 集合通信库）在 GPU 显存上
# 执行集合通信，走 NVLink、PCIe 和 InfiniBand，并使用针对拓扑调优的环形和树形算法。**Gloo** 是 Meta
# 的集合通信库，在 CPU 张量上通过 TCP 通信：速度较慢，但任何机器都能用。dtlab 的 `pick_backend`
# 在每个 rank 都能分到一张自己的 GPU 时选择 NCCL，否则选择 gloo，所以没有 GPU 的笔记本电脑用 gloo
# 运行同样的代码。dtlab 的环形算法由 `isend`/`irecv` 搭建，两种后端上都能运行。
#
# 通信后端还需要一种 **传输方式**（transport），也就是字节从一个 rank 到另一个 rank 的途径。NCCL 按 rank 所在的位置来选：
# 同一节点的 GPU 之间，能直连时就经 NVLink 或 PCIe 在 GPU 之间直接拷贝（P2P 传输），不能直连时（例如两张 GPU 挂在不同的
# CPU 插槽下）才经主机的共享内存（SHM）；节点之间走网络（NET：InfiniBand 或 TCP 套接字）。设置 `NCCL_DEBUG=INFO` 后，
# 它会为每一对 rank 打印所选的方式，如 `via P2P/…`、`via SHM/…` 或 `via NET/…`。Gloo 没有这种选择：即使是同一台笔记本上的
# 两个进程也通过 TCP 通信，每条消息都要拷进内核、经过回环接口、再拷出来，两端都有系统调用，还要在 gloo 的线程之间交接。
#
# `--collectives dtlab` 让同一台机器上的 rank 在 **共享内存**（shared memory）上运行环形算法（`dtlab/comm/shared_memory.py`）。
# `/dev/shm` 是放在内存里的文件系统；两个进程把其中同一个文件映射进各自的内存后，一方写入的字节另一方直接就能读到，
# 中间不经过任何系统调用。每个 rank 在那里有一个 **收件箱**（inbox）：4 个 1 MiB 的 **槽位**（slot），只有它的左邻居往里写。
# 发送时，rank 把自己那一块的下一段（至多 1 MiB，正好一个槽位）拷进右邻居收件箱的空槽位，再往一条管道里写一个字节唤醒对方；
# 对方把这一段拷出来，再经另一条管道回写一个字节，表示槽位空出来了。没有数据可读的 rank 在管道上睡眠，而不是空转；
# rank 比 CPU 核多时，这一点很重要。这就是第 4 节图中 "dtlab 的环形全归约，经共享内存" 那条线。（这一部分要求本课的
# rank 使用 gloo；在 NCCL 下单元格会说明并跳过。）
#
# **预测：** 对随机浮点数（它们的和取决于相加的顺序），经共享内存的环与经 gloo 的环结果逐位相同吗？

# %%
print("GPUs visible / 可见的 GPU:", torch.cuda.device_count())
print("dtlab picks for 4 ranks / dtlab 为 4 个 rank 选择:", pick_backend(4))

# %%
my_prediction = None  # ← your prediction: True or False / 你的预测：True 或 False

if all(r["shared_memory"] for r in ranks):
    print("the ranks used shared memory / 各 rank 用上了共享内存: True")
    ok = check("01.shared_memory_same_bits", my_prediction, all(r["shared_equals_gloo"] for r in ranks))
else:
    print(f"these ranks run on {pick_backend(N)}: dtlab's shared-memory ring is for gloo's CPU ranks, so this "
          f"check is skipped / 这些 rank 运行在 {pick_backend(N)} 上：dtlab 的共享内存环只用于 gloo 的 CPU rank，本项检查跳过")

# %% [markdown]
# The transport only moves bytes. Which chunk goes where, and which numbers
# are added in which order, is the ring's schedule, and none of it depends on
# timing: each step waits for its one chunk from the left; the ring never adds
# whatever happens to arrive first. A faster transport changes when a chunk
# arrives, not what is added to what, so the bits are the same. Only another
# order of additions, that is another algorithm, can change them: the ring
# accumulates chunk 0 along its path, ((a1 + a2) + a3) + a0, while recursive
# doubling pairs the terms, (a0 + a1) + (a2 + a3), and floating-point addition
# is not associative. That is why section 3 compared with torch on whole
# numbers.
#
# What differs is the time. Both transports copy each message twice: over TCP
# into the kernel's socket buffer and out again, over shared memory into the
# slot and out again. Shared memory drops everything around the copies: the
# TCP/IP stack's work on each packet, most of the system calls, and the
# wake-up of gloo's TCP thread on each side. What is left is a one-byte write
# per message in each direction, and a sleep in `poll` while there is nothing
# to read. Section 4's sweep shows what that is worth on your machine
# (`benchmarks/HISTORY.md` has the course machine's figures).
#
# 传输方式只负责搬运字节。哪一块发给谁、哪些数按什么顺序相加，都由环的调度决定，而调度与时机无关：每一步都等左邻居的那一块到了
# 才相加，从不“谁先到就先加谁”。所以更快的传输方式只改变数据何时到达，不改变谁与谁相加，结果逐位相同。能改变结果的只有换一种
# 相加顺序，也就是换一种算法：环沿着路径累加第 0 块，((a1 + a2) + a3) + a0；递归倍增则两两配对，(a0 + a1) + (a2 + a3)；
# 而浮点加法不满足结合律。这也是第 3 节用整数与 torch 比较的原因。
#
# 不同的只是时间。两种传输方式都把每条消息拷贝两次：经 TCP 是拷进内核的套接字缓冲区再拷出来，经共享内存是拷进槽位再拷出来。
# 共享内存省掉的是拷贝之外的开销：TCP/IP 协议栈对每个数据包的处理、大部分系统调用，以及两端对 gloo TCP 线程的唤醒。
# 剩下的只是每条消息每个方向一次一字节的写入，以及无数据可读时在 `poll` 里的睡眠。这在你的机器上值多少，请看第 4 节你自己的
# 扫描结果（课程机器上的数字见 `benchmarks/HISTORY.md`）。

# %% [markdown]
# ## 7. The all-reduce inside training / 训练中的全归约
#
# In data parallelism the tensor being all-reduced is the gradient: one float32
# per parameter. The small GPT has 236,928 parameters. Watch a 4-rank run below;
# each step's record counts the collective calls and the bytes they were called
# on. (The gradients travel in buckets of 0.25 MiB, several calls per step; with
# `TrainConfig(collectives="ring")`, or `dtlab train --collectives ring`, every
# one of them runs on the ring you built above instead of torch's.)
#
# **Predict:** how many bytes does each step all-reduce, and how many bytes
# would each rank send with a ring?
#
# 在数据并行中，被全归约的张量就是梯度：每个参数一个 float32。这个小 GPT 有 236,928 个参数。
# 下面观察一次 4 个 rank 的运行；每一步的记录都统计了集合通信的调用次数，以及调用时张量的字节数。
# （梯度装在 0.25 MiB 的桶里传输，每步调用若干次；用 `TrainConfig(collectives="ring")` 或
# `dtlab train --collectives ring` 时，每一次都改由你在上面搭建的环形算法完成，而不是 torch 的。）
#
# **预测：** 每一步全归约多少字节？用环形算法时每个 rank 发送多少字节？

# %%
# NBVAL_IGNORE_OUTPUT
dash = Dashboard()
dash

# %%
my_prediction = None       # ← your prediction: bytes, an integer / 你的预测：字节数（整数）
my_prediction_ring = None  # ← your prediction: bytes, an integer / 你的预测：字节数（整数）

training = dash.watch(dtlab.train(TrainConfig(dp=4, steps=8, seed=0)), label="dp=4")
comm = training.records[-1]["ranks"][0]["comm"]
print("backend of this run / 本次运行的通信后端:", training.summary["backend"])
print("collective calls per step / 每步的集合通信调用:", {kind: c["count"] for kind, c in sorted(comm.items())})
ok = check("01.gradient_bytes", my_prediction, comm["all_reduce"]["bytes"])
ring_wire = round(ring_bytes_sent_per_rank(comm["all_reduce"]["bytes"], 4, "all_reduce"))   # x 2(N-1)/N
ok = check("01.ring_bytes_per_step", my_prediction_ring, ring_wire, source="formula")

# %% [markdown]
# Now train the same model on the ring you built: `collectives="ring"` sends every bucket of
# every step through `ring_all_reduce` (sends and receives to the two neighbours) instead of
# torch's all-reduce. Same seed, same data, same 4 ranks.
#
# **Predict:** will its 8 losses equal the run above to the last bit? (True or False)
#
# 现在让同一个模型在你搭建的环上训练：`collectives="ring"` 让每一步的每个桶都经 `ring_all_reduce`
# （与两个邻居的收发）传输，而不是 torch 的全归约。同样的种子、同样的数据、同样的 4 个 rank。
#
# **预测：** 它的 8 个损失值会与上面那次运行逐位相同吗？（True 或 False）

# %%
my_prediction = None       # ← True or False / 填 True 或 False

on_ring = dash.watch(dtlab.train(TrainConfig(dp=4, steps=8, seed=0, collectives="ring")), label="dp=4, ring")
ring_gap = max(abs(a - b) for a, b in zip(on_ring.losses(), training.losses()))
print("the same loss within 1e-5 at every step / 每一步损失差都小于 1e-5:", ring_gap < 1e-5)
ok = check("01.ring_training_same_bits", my_prediction, on_ring.losses() == training.losses())


# %% [markdown]
# Measured on 4 ranks: not to the last bit, yet equal to about 1e-7, the rounding of one float32
# addition. Both runs add the same four gradients, but not in the same order: your ring adds
# chunk c as ((x₍c+1₎ + x₍c+2₎) + x₍c+3₎) + x₍c₎ going round (section 1), gloo's all-reduce in its own
# order, and floating-point addition is not associative, so a few last bits differ and the
# training carries them on. On 2 ranks every sum is a + b in one order or the other, which IEEE
# addition makes identical: there the two trainings agree exactly (`tests/test_collectives_ring.py`).
#
# 4 个 rank 上的实测结果：并非逐位相同，但相差约 1e-7，即一次 float32 加法的舍入误差。两次运行加的是同样的
# 4 份梯度，只是顺序不同：你的环沿着环按 ((x₍c+1₎ + x₍c+2₎) + x₍c+3₎) + x₍c₎ 的顺序累加第 c 块（第 1 节），
# gloo 的全归约有它自己的顺序；浮点加法不满足结合律，所以最后几位会有出入，并随训练传下去。2 个 rank 时，
# 每个和都是 a + b（顺序或正或反），IEEE 加法保证两者完全相同：那时两次训练逐位一致（见
# `tests/test_collectives_ring.py`）。

# %% [markdown]
# ## 8. Exercise: one step of the ring / 练习：环形算法的一步
#
# Write this rank's part in one **reduce-scatter** step: send one chunk to the
# right neighbour and add the chunk arriving from the left into your own copy,
# so that after N − 1 steps rank r holds chunk r summed over every rank (as
# `ring_reduce_scatter` leaves it). Which chunk is sent at step `step` is yours
# to work out from the picture in section 1. Post both transfers (`dist.isend`,
# `dist.irecv`) before waiting on either: a ring of blocking sends can wait on
# itself forever. `grade` sends your function's source to 4 real ranks, runs it
# N − 1 times there, and after every step compares each rank's chunks with the
# ring as `ring_schedule` plays it.
#
# 写出本 rank 在 **归约散射** 一步中的工作：向右邻居发送一块，把从左邻居收到的块 *加* 到自己的那一份上，
# 使得 N − 1 步之后 rank r 拥有对所有 rank 求和后的第 r 块（与 `ring_reduce_scatter` 的结果一致）。
# 第 `step` 步发送哪一块，请根据第 1 节的图自己推出来。先同时发起两个传输（`dist.isend`、`dist.irecv`），
# 再等待它们：全是阻塞发送的环可能会永远互相等待。`grade` 会把你的函数源码发到 4 个真实 rank 上，
# 在那里运行 N − 1 次，每一步之后都把每个 rank 的块与 `ring_schedule` 描述的环形过程比较。

# %%
def ring_step(chunks, step, rank, size):
    # This rank's part in reduce-scatter step `step` (0 .. size - 2) of a ring of `size` ranks.
    # chunks: this rank's `size` chunks (1-D tensors holding its partial sums), changed in place.
    # 本 rank 在 `size` 个 rank 的环中第 `step` 步（0 .. size - 2）归约散射里的工作；chunks 原地修改。
    raise NotImplementedError  # your code here / 在这里写你的代码


solved = grade("01.ring_step", ring_step)

# %% [markdown]
# ## 9. Try this / 动手试试
#
# Each task has an answer to write in the cell below it, checked like a prediction.
#
# 1. Set the view's slider to N = 8 and step through: how many ring steps does an
#    all-reduce take on 8 ranks?
# 2. How many bytes does each rank send for a 4 MiB tensor on N = 2 ranks? The
#    cell runs `ring_versus_torch` on 2 ranks to check.
# 3. At S = 1 GiB on InfiniBand, compare `ring_allreduce_time(S, N, link)` for
#    N = 8 and N = 1024: which term of the alpha-beta model grows linearly
#    with N, `"latency"` or `"bandwidth"`?
#
# 每个任务都要在下面的单元格里写下答案，像预测一样检查。
#
# 1. 把视图的滑块调到 N = 8，一步步走完：8 个 rank 上一次全归约要多少个环形步？
# 2. 4 MiB 的张量在 N = 2 个 rank 上，每个 rank 发送多少字节？单元格会在 2 个 rank 上运行
#    `ring_versus_torch` 来检查。
# 3. 在 S = 1 GiB、InfiniBand 上比较 N = 8 和 N = 1024 的 `ring_allreduce_time(S, N, link)`：
#    alpha-beta 模型中哪一项随 N 线性增长，`"latency"`（延迟）还是 `"bandwidth"`（带宽）？

# %%
my_answer_steps_8 = None     # ← your answer: an integer / 你的答案：整数
my_answer_bytes_2 = None     # ← your answer: bytes / 你的答案：字节数
my_answer_term = None        # ← your answer: "latency" or "bandwidth" / 你的答案："延迟" 或 "带宽"（半角引号）

# %%
ok = check("01.try_steps_8", my_answer_steps_8, len({(s.phase, s.step) for s in ring_schedule(8)}),
           source="simulated")
two = run(ar_lesson.ring_versus_torch, 2, 4 * 2**20)
ok = check("01.try_bytes_2", my_answer_bytes_2, two[0]["bytes_sent"])
ib, GiB = LINKS["infiniband"], 2**30
latency = {n: 2 * (n - 1) * ib.latency_s for n in (8, 1024)}
growth = {"latency": latency[1024] / latency[8],
          "bandwidth": (ring_allreduce_time(GiB, 1024, ib) - latency[1024]) / (ring_allreduce_time(GiB, 8, ib) - latency[8])}
print({k: round(v, 2) for k, v in growth.items()}, "(N = 1024 over N = 8 / N = 1024 与 N = 8 之比)")
ok = check("01.try_term", my_answer_term, max(growth, key=growth.get), source="formula")

# %% [markdown]
# ## Check / 检查
#
# The last cell repeats this lesson's results as one deterministic summary.
# 最后一个单元格把本课的结果汇总成一个确定的结论。

# %%
results = {
    "after reduce-scatter rank r holds chunk r complete; after all-gather, all of them"
    " / 归约散射后 rank r 拥有完整的第 r 块；全收集后拥有全部":
        [[c for c, h in enumerate(row) if len(h) == 4] for row in holdings(4, 3)] == [[0], [1], [2], [3]]
        and gathered,
    "each rank sends 2(N-1)/N of the tensor (6 MiB for 4 MiB, 96 MiB for 64 MiB) in 2(N-1) = 6 steps"
    " / 每个 rank 在 2(N-1) = 6 步内发送张量的 2(N-1)/N":
        all(r["bytes_sent"] == 6 * 2**20 and r["steps"] == 6 for r in ranks) and sent * 16 == 96 * 2**20,
    "dtlab's ring equals torch.distributed.all_reduce / dtlab 的环等于 torch.distributed.all_reduce":
        all(r["equal_to_torch"] and r["halves_equal_whole"] for r in ranks),
    "over shared memory the ring gives the bits it gives over gloo (gloo ranks) / 经共享内存的环与经 gloo 的环逐位相同（gloo 的 rank）":
        all(r["shared_equals_gloo"] for r in ranks) if all(r["shared_memory"] for r in ranks) else pick_backend(N) != "gloo",
    "busbw = algbw x 2(N-1)/N; half the peak at N·α·β on NVLink / busbw = algbw x 2(N-1)/N；NVLink 上在 N·α·β 处达到峰值一半":
        bw_formula == {"algbw": 67.109, "busbw": 100.663}
        and nvlink_formula == {"half-peak size (bytes)": crossover, "1 KiB share of peak (%)": 0.0569}
        and bus_bandwidth(1.0, 4, "all_reduce") == 1.5,
    "a simulated slow link takes at least the alpha-beta time / 模拟的慢链路耗时不少于 alpha-beta 时间":
        simulated_s >= model_s,
    "training all-reduces 4 bytes per parameter each step / 训练每步对每个参数全归约 4 字节":
        comm["all_reduce"]["bytes"] == 4 * 236_928,
    "training on dtlab's ring gives torch's losses within rounding / 在 dtlab 的环上训练，损失与 torch 的只差舍入":
        ring_gap < 1e-5,
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 01:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
