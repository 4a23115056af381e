# %% [markdown]
# # Lesson 02 — Data parallelism
# # 第 02 课 —— 数据并行
#
# **What you will see.** In **data parallelism** (DP) every rank holds the whole
# model and trains on its own slice of each batch; before the optimizer step the
# ranks average their gradients with an all-reduce, so every replica takes the
# same step (Goyal et al., 2017). You will run the three versions dtlab builds —
# one all-reduce per parameter, one per **bucket**, and buckets sent *during*
# backward as PyTorch's DDP does (Li et al., 2020) — count their all-reduce calls
# and look at each rank's time; use **gradient accumulation** to get the same
# loss with fewer all-reduces; and slow one rank down to see a **straggler** hold
# back every other rank.
#
# **你将看到什么。** 在 **数据并行**（data parallelism，DP）中，每个 rank 都持有完整的模型，只训练
# 每个批次中属于自己的那一份；在优化器更新之前，各个 rank 用一次全归约（all-reduce）求梯度的平均，
# 于是每个副本走出同样的一步（Goyal 等，2017）。你会运行 dtlab 实现的三个版本——每个参数一次全归约、
# 每个 **桶**（bucket）一次全归约、以及像 PyTorch 的 DDP 那样在反向传播 *进行中* 就发送桶
# （Li 等，2020）——统计它们的全归约调用次数，并观察每个 rank 的时间；用 **梯度累积**（gradient
# accumulation）以更少的全归约得到同样的损失；最后让一个 rank 变慢，看一个 **慢节点**（straggler，也叫掉队者）
# 如何拖住所有其他 rank。

# %%
import dtlab
from dtlab import TrainConfig
from dtlab.config import MODEL_PRESETS
from dtlab.parallel.data_parallel import BucketedDP
from dtlab.lab import Dashboard, check, human_bytes
from dtlab.lab.dp_view import AccumulationView, StragglerView, flagged_every_step, time_figure
from dtlab.lab.timeline import StepTimeline
from dtlab.model import build_model
from dtlab.launch import run
from dtlab.course.experiments import overlap as overlap_lesson
from dtlab.course.exercises import grade

# %% [markdown]
# ## 1. Three versions of the same idea / 同一个想法的三个版本
#
# All three give every rank the mean gradient; they differ in how many messages
# they send and when:
#
# * `per_parameter`: after backward, one all-reduce per parameter tensor. Simple,
#   but each call pays the collective's fixed start-up cost, and most of these
#   tensors are tiny (biases, LayerNorm scales).
# * `bucketed`: after backward, the gradients are copied into flat **buckets** of
#   25 MiB (DDP's default `bucket_cap_mb`: a bucket is closed once it holds that
#   much), one all-reduce per bucket (Li et
#   al., 2020, Sec. 3.2.2). The runs below pass `bucket_mb=25`; dtlab's own
#   default is 0.25 MiB, and section 2 shows why.
# * `overlapped`: the same buckets, but each one's all-reduce starts the moment
#   its last gradient exists, while backward goes on computing earlier layers (Li
#   et al., 2020, Sec. 3.2.3). This is what `DistributedDataParallel` does.
#
# **Predict:** how many all-reduce calls does each version make per step on the
# small GPT? The next cell counts its parameter tensors and buckets; no process
# needed.
#
# 三个版本都让每个 rank 得到平均梯度；区别在于发送多少条消息、什么时候发送：
#
# * `per_parameter`：反向传播结束后，每个参数张量做一次全归约。简单，但每次调用都要付出集合通信固定
#   的启动开销，而且这些张量大多很小（偏置、LayerNorm 的缩放系数）。
# * `bucketed`：反向传播结束后，把梯度复制进扁平的 **桶** 里，每个桶 25 MiB（DDP 默认的
#   `bucket_cap_mb`：桶一旦装到这么多就关闭），每个桶做一次全归约（Li 等，2020，第 3.2.2 节）。下面的运行传入
#   `bucket_mb=25`；dtlab 自己的默认值是 0.25 MiB，原因见第 2 节。
# * `overlapped`：同样的桶，但某个桶的最后一个梯度一算出来，它的全归约就立即开始，同时反向传播继续
#   计算更靠前的层（Li 等，2020，第 3.2.3 节）。`DistributedDataParallel` 就是这样做的。
#
# **预测：** 在这个小 GPT 上，每个版本每步调用多少次全归约？下一个单元格会数出它的参数张量和桶的
# 个数，不需要启动进程。

# %%
model = build_model(MODEL_PRESETS["small"], seed=0)
n_tensors = sum(1 for p in model.parameters() if p.requires_grad)
n_params = sum(p.numel() for p in model.parameters())
n_buckets = len(BucketedDP(model).buckets)      # a world of one rank: nothing is sent
print(f"parameter tensors / 参数张量: {n_tensors}; parameters / 参数: {n_params:,}; "
      f"gradient bytes / 梯度字节: {human_bytes(4 * n_params)}")
print(f"25 MiB buckets / 25 MiB 的桶: {n_buckets}")
print(f"0.25 MiB buckets / 0.25 MiB 的桶: {len(BucketedDP(model, bucket_cap_mb=0.25).buckets)}")

# %%
my_prediction = None  # ← your prediction: {"per_parameter": n, "bucketed": n, "overlapped": n} / 你的预测

# %% [markdown]
# Now the three runs on 4 ranks, 5 steps each, the same seed. The dashboard draws
# them live; the loss curves lie on top of each other, because the three versions
# compute the same mean gradient.
#
# 现在在 4 个 rank 上依次运行这三个版本，各 5 步，使用相同的随机种子。仪表盘会实时绘制它们；三条
# 损失曲线重合在一起，因为三个版本算出的平均梯度相同。

# %%
# NBVAL_IGNORE_OUTPUT
dash = Dashboard()
dash

# %%
modes = ("per_parameter", "bucketed", "overlapped")
runs = {mode: dash.watch(dtlab.train(TrainConfig(dp=4, dp_mode=mode, bucket_mb=25, steps=5, seed=0)), label=mode)
        for mode in modes}
calls = {mode: sorted({rec["ranks"][r]["comm"]["all_reduce"]["count"] for rec in run.records for r in range(4)})
         for mode, run in runs.items()}
calls_per_step = {mode: c[0] for mode, c in calls.items() if len(c) == 1}
ok = check("02.calls_per_step", my_prediction, calls_per_step)
print("bytes all-reduced per step, each version / 每个版本每步全归约的字节数:",
      {mode: run.records[-1]["ranks"][0]["comm"]["all_reduce"]["bytes"] for mode, run in runs.items()})
same = all(abs(a - b) <= 1e-4 * abs(b) for mode in modes[:2]
           for a, b in zip(runs[mode].losses(), runs["overlapped"].losses()))
print("same loss curve for the three versions (1e-4) / 三个版本损失曲线相同（1e-4）:", same)

# %% [markdown]
# Same bytes, very different numbers of messages. Below, each rank's time per
# step split into **compute**, **communication** (time inside the gradient
# all-reduce, or waiting for it) and **idle**. These are timings: they change
# from run to run and on your machine four ranks share a few cores, so read the
# shape. `per_parameter` usually spends the most time communicating (it pays the
# start-up cost once per tensor).
#
# 字节数相同，消息条数却相差很多。下面把每个 rank 每一步的时间拆成 **计算**、**通信**（在梯度全归约
# 里的时间，或等待它的时间）和 **空闲**。这些都是计时：每次运行都会变，而且在你的机器上四个 rank
# 共用少数几个核心，所以请看整体形状。`per_parameter` 通常通信时间最长（每个张量都要付一次启动开销）。

# %%
# NBVAL_IGNORE_OUTPUT
time_figure({mode: run.records for mode, run in runs.items()})

# %% [markdown]
# ### One step, rank by rank / 一步之内，逐个 rank 看
#
# The bars above are sums. The tracer (`dtlab/comm/tracer.py`) keeps every collective's
# times: when it was issued, when the rank started to wait for it, when the wait
# ended. The timeline draws one step of the `overlapped` run that way: **compute**,
# **blocked** in communication (hover a red bar: which collective), **idle**, and,
# as a thin bar above, communication **in flight while the rank computed**. Move
# the slider to see another step.
#
# **Predict:** which of the three versions has communication in flight while its
# ranks compute (`overlap_s > 0`: the rank went on computing after it issued an
# all-reduce, however briefly)?
#
# 上面的柱子是总和。追踪器（`dtlab/comm/tracer.py`）记下每次集合通信的时间：何时发出、rank 何时开始等待、
# 等待何时结束。时间线用这种方式画出 `overlapped` 运行中的一步：**计算**、**阻塞**于通信（鼠标悬停在
# 红色条上可看到是哪次集合通信）、**空闲**，以及上方细条表示的 **在 rank 计算时仍在进行的通信**。
# 拖动滑块可查看其他步。
#
# **预测：** 三个版本中，哪个版本在 rank 计算的同时有通信在进行（`overlap_s > 0`：rank 发出全归约之后还在继续
# 计算，哪怕只有一小会儿）？

# %%
# NBVAL_IGNORE_OUTPUT
StepTimeline(runs["overlapped"].records)

# %%
my_prediction_overlap = None  # ← your prediction: {"per_parameter": bool, "bucketed": bool, "overlapped": bool} / 你的预测

overlaps = {mode: all(r["overlap_s"] > 0 for rec in run.records for r in rec["ranks"]) for mode, run in runs.items()}
none_overlap = {mode: all(r["overlap_s"] == 0 for rec in run.records for r in rec["ranks"]) for mode, run in runs.items()}
ok = check("02.overlap_versions", my_prediction_overlap, overlaps)
print("the other two never overlap: they send after backward and wait at once / 另外两个从不重叠：它们在反向传播之后发送并立即等待:",
      none_overlap["per_parameter"] and none_overlap["bucketed"])

# %% [markdown]
# With DDP's default 25 MiB bucket the whole small GPT fits in **one** bucket,
# so `overlapped` can only start it when backward has produced the last gradient,
# from inside that gradient's hook: the overlap is only what autograd still does
# after it, a fraction of a millisecond. With smaller buckets (next section) more of the
# all-reduce runs during backward: that is why DDP cuts a large model's
# gradients into many buckets instead of sending them as one.
#
# DDP 默认 25 MiB 的桶能装下整个小 GPT，所以只有 **一个** 桶，`overlapped` 只能等反向传播算出最后一个梯度
# 才开始发送它（在这个梯度的钩子里发出）：重叠只有 autograd 在此之后还要做的那一点工作，不到一毫秒。桶更小时（见下一节），更多的全归约会在反向传播期间进行：这正是
# DDP 把大模型的梯度切成许多桶、而不是一次发送的原因。

# %% [markdown]
# ## 2. When overlapping overlaps / 重叠何时真正发生
#
# Backward makes the last layers' gradients first. With buckets of 0.25 MiB the
# small GPT's gradients fill several buckets, in backward order: each bucket
# whose gradients are complete is sent while backward still computes earlier
# layers. The cell below runs one `OverlappedDP` step on 2 ranks with each cap
# and counts, with a hook, the buckets whose all-reduce started while some
# gradient was still to come (the count is exact; the overlap seconds measured by
# dtlab's communication tracer are a timing).
#
# **Predict:** how many buckets start their all-reduce before backward's last
# gradient exists, with the 25 MiB cap and with the 0.25 MiB cap (4 buckets)?
#
# 反向传播先算出最后几层的梯度。桶上限为 0.25 MiB 时，小 GPT 的梯度按反向顺序装满好几个桶：每个梯度
# 已经齐全的桶，都会在反向传播还在计算更靠前的层时发出去。下面的单元格在 2 个 rank 上分别用两种上限
# 运行一步 `OverlappedDP`，并用钩子数出有多少个桶在还有梯度没算出来时就开始了全归约（这个数是精确的；
# dtlab 通信追踪器测得的重叠秒数是计时）。
#
# **预测：** 上限 25 MiB 和上限 0.25 MiB（4 个桶）时，各有多少个桶在反向传播算出最后一个梯度之前就开始全归约？

# %%
my_prediction_early = None  # ← your prediction: {"25 MiB": n, "0.25 MiB": n} / 你的预测

# %%
early = {cap: run(overlap_lesson.buckets_started_early, 2, mb) for cap, mb in (("25 MiB", 25.0), ("0.25 MiB", 0.25))}
ok = check("02.early_buckets", my_prediction_early, {cap: r[0]["started_early"] for cap, r in early.items()})
print("buckets / 桶数:", {cap: r[0]["buckets"] for cap, r in early.items()})

# %%
# NBVAL_IGNORE_OUTPUT
for cap, r in early.items():
    print(f"{cap}: communication in flight while backward computed, rank 0 / 反向计算时在途的通信: "
          f"{r[0]['overlap_s'] * 1e3:.2f} ms")

# %% [markdown]
# ## 3. Gradient accumulation / 梯度累积
#
# With **gradient accumulation** a rank splits its share of the batch into K
# micro-steps and runs forward and backward on each, adding into `.grad`, before
# one optimizer step. Averaging is linear, so the gradients need to be averaged
# only once, after the last micro-step: the first K − 1 backward passes run
# inside `no_sync()` and send nothing (Li et al., 2020, Sec. 3.2.4). The global
# batch (8 sequences on 2 ranks) stays the same, so the update should too.
#
# Move the slider: each value trains 6 steps with that K and draws it over the
# K = 1 curve.
#
# **Predict:** with K = 4, how many all-reduce calls per optimizer step, and does
# the loss stay the same as with K = 1 (within a relative 1e-4)?
#
# 使用 **梯度累积** 时，一个 rank 把自己那份批次再切成 K 个微步，每个微步都做前向和反向、把梯度累加到
# `.grad` 里，最后才做一次优化器更新。求平均是线性运算，所以梯度只需要在最后一个微步之后平均一次：
# 前 K − 1 次反向传播都在 `no_sync()` 里运行，不发送任何数据（Li 等，2020，第 3.2.4 节）。全局批大小
# （2 个 rank 共 8 条序列）保持不变，所以更新也应该不变。
#
# 拖动滑块：每个取值都会用该 K 训练 6 步，并画在 K = 1 的曲线上。
#
# **预测：** K = 4 时，每个优化器步调用几次全归约？损失与 K = 1 时是否相同（相对误差在 1e-4 以内）？

# %%
# NBVAL_IGNORE_OUTPUT
accum = AccumulationView(TrainConfig(dp=2, batch_size=8, bucket_mb=25, steps=6, seed=0), choices=(1, 2, 4))
accum

# %%
my_prediction_calls = None   # ← your prediction: an integer / 你的预测：整数
my_prediction_same = None    # ← your prediction: True or False / 你的预测：True 或 False

accum.slider.value = 4       # the same as moving the slider: runs K = 4 (and K = 1 once)
k4, k1 = accum.run(4), accum.run(1)
calls_k4 = sorted({rec["ranks"][r]["comm"]["all_reduce"]["count"] for rec in k4.records for r in range(2)})
gap = max(abs(a - b) / b for a, b in zip(k4.losses(), k1.losses()))
print(f"losses K=1 / K=4: {[round(x, 4) for x in k1.losses()]} / {[round(x, 4) for x in k4.losses()]}")
ok = check("02.accum_calls", my_prediction_calls, calls_k4[0] if len(calls_k4) == 1 else calls_k4)
ok = check("02.accum_same", my_prediction_same, gap < 1e-4)
print("without no_sync it would be one per micro-step / 如果没有 no_sync，每个微步都要一次:", 4 * calls_k4[0])

# %% [markdown]
# Goyal et al. (2017) trained ResNet-50 on ImageNet with a global batch of 8192
# split over 256 GPUs and matched the small-batch accuracy, by scaling the
# learning rate linearly with the batch and warming it up. Accumulation is how
# you reach such a batch with fewer GPUs: the same gradient, computed in K pieces.
#
# Goyal 等（2017）把 8192 的全局批次分到 256 张 GPU 上训练 ImageNet 上的 ResNet-50，通过让学习率随批大小
# 线性放大并配合预热，达到了小批次训练的精度。梯度累积则让你用更少的 GPU 达到这样的批大小：同一个梯度，
# 分 K 份算出来。
#
# ## 4. A straggler / 慢节点
#
# The word **straggler** comes from MapReduce (Dean and Ghemawat, 2004): a
# machine that takes unusually long to finish its part and so delays the whole
# job. In synchronous DP every rank meets the others at the gradient all-reduce,
# which cannot finish before the slowest rank's gradient arrives. A slow rank's
# extra time therefore shows up on the others as communication — time spent
# waiting inside the all-reduce.
#
# `TrainConfig(straggler=(rank, seconds))` makes that rank sleep that long in
# every step's compute; the trainer flags a rank whose compute time is far above
# the others' with a `{"kind": "straggler", "rank": r}` event.
#
# **Predict:** slow rank 3 of 4 by 0.5 s. Which rank will be flagged, and will
# each rank's step last at least about 0.5 s?
#
# **慢节点**（straggler，也叫掉队者）这个词来自 MapReduce（Dean 和 Ghemawat，2004）：指完成自己那部分工作异常缓慢、
# 从而拖慢整个作业的机器。在同步数据并行中，每个 rank 都要在梯度全归约处和其他 rank 碰头，而最慢的
# rank 的梯度没到，全归约就无法完成。所以一个慢 rank 多出来的时间，会在其他 rank 上表现为通信时间——
# 也就是在全归约里等待的时间。
#
# `TrainConfig(straggler=(rank, seconds))` 让那个 rank 在每一步的计算中睡眠相应的秒数；训练器会把计算
# 时间远高于其他 rank 的那个 rank 标记出来，产生一个 `{"kind": "straggler", "rank": r}` 事件。
#
# **预测：** 让 4 个 rank 中的 rank 3 慢 0.5 秒。哪个 rank 会被标记？每个 rank 的一步是否都至少持续
# 约 0.5 秒？

# %%
# NBVAL_IGNORE_OUTPUT
straggler = StragglerView(TrainConfig(dp=4, steps=4, seed=0))
straggler

# %%
my_prediction_flagged = None   # ← your prediction: a list of ranks / 你的预测：rank 列表
my_prediction_all_slow = None  # ← your prediction: True or False / 你的预测：True 或 False

slow = straggler.show(3, 0.5)   # what the two sliders do: a real run with straggler=(3, 0.5)
flagged = flagged_every_step(slow.records[1:])  # the steps after the first, which warms up
ok = check("02.flagged", my_prediction_flagged, flagged)
every_rank_waits = all(r["compute_s"] + r["comm_s"] + r["idle_s"] >= 0.9 * 0.5
                       for rec in slow.records for r in rec["ranks"])
ok = check("02.all_slow", my_prediction_all_slow, every_rank_waits)


# %% [markdown]
# The chart in the view (a timing, so it changes from run to run) shows where the
# time went: rank 3 in compute, the others in communication, waiting for it. The
# step runs at the pace of the slowest rank. Real clusters meet this with
# monitoring that finds the slow machine, and with backup tasks (MapReduce) or by
# replacing the node and resuming from a training checkpoint.
#
# 视图里的图（这是计时，每次运行都会变）显示了时间花在哪里：rank 3 花在计算上，其他 rank 花在通信上，
# 也就是在等它。整个训练步以最慢的 rank 的速度前进。真实的集群用监控找出慢机器，再用备份任务
# （MapReduce 的做法），或者替换那台机器、从训练检查点恢复来应对。
#
# ## 5. Exercise: buckets in backward order / 练习：按反向顺序分桶
#
# Write `assign_buckets(sizes, cap_bytes)`: `sizes[i]` is the size in bytes of
# parameter i's gradient, in the order `model.parameters()` yields them. Return
# the buckets as lists of parameter indices, in the order backward fills them;
# close a bucket as soon as it holds at least `cap_bytes`, as DDP does (so its
# last gradient may take it past the cap, and a cap of 0 gives each gradient a
# bucket of its own). Fewer buckets mean fewer collectives, each paying its
# start-up cost. `grade` compares your buckets
# with dtlab's for caps of 25 MiB, 0.25 MiB and 0 bytes, then uses your 0.25 MiB
# buckets for real: 2 ranks all-reduce the small GPT's gradients bucket by bucket,
# and every gradient is compared with dtlab's `BucketedDP`.
#
# 写出 `assign_buckets(sizes, cap_bytes)`：`sizes[i]` 是参数 i 的梯度字节数，顺序与 `model.parameters()`
# 相同。返回各个桶（每个桶是参数下标的列表），顺序就是反向传播填满它们的顺序；像 DDP 那样，
# 桶一旦装到至少 `cap_bytes` 就关闭（所以最后放进去的梯度可能让它超过上限；上限为 0 时每个梯度各占一个桶）。
# 桶越少，集合通信调用就越少，而每次调用都要付一次启动开销。`grade` 会在上限为 25 MiB、0.25 MiB 和
# 0 字节时把你的桶与 dtlab 的比较，然后真的用你的 0.25 MiB 桶：2 个 rank 逐桶全归约小 GPT 的梯度，
# 每个梯度都与 dtlab 的 `BucketedDP` 比较。

# %%
def assign_buckets(sizes, cap_bytes):
    # sizes[i]: bytes of parameter i's gradient (model order); return [[indices], ...] in backward order
    # sizes[i]：参数 i 的梯度字节数（模型顺序）；按反向顺序返回 [[下标], ...]
    raise NotImplementedError  # your code here / 在这里写你的代码


solved = grade("02.buckets", assign_buckets)

# %% [markdown]
# ## 6. Try this / 动手试试
#
# Each **Task** has an answer to write in the cell below, checked like a prediction; items 1
# and 4 are timings, to explore in the view and in a terminal.
#
# 1. Move the straggler sliders: slow rank 0 instead, or set 0 s. Does the
#    flagged rank follow? With 0 s, is anyone flagged? (Expected: the flag follows
#    the slowed rank; with 0 s no rank is flagged, unless the machine itself makes
#    one slow.)
# 2. **Task:** at K = 2 in the accumulation view (2 ranks, 8 sequences): how many sequences
#    does each micro-step hold per rank, and how many all-reduces per optimizer step?
# 3. **Task:** with 0.1 MiB buckets (`bucket_mb=0.1`), how many all-reduce calls does each step make?
#    Work it out from the parameters' sizes, `[4 * p.numel() for p in model.parameters()]` (`model`
#    is section 1's; your `assign_buckets` can count them); the cell trains 2 steps on 2 ranks with
#    that cap to check.
# 4. In a terminal, run `dtlab bench dp`: the overlapped version against PyTorch's DDP, 0.25 MiB
#    buckets on both, its buckets on dtlab's ring over shared memory (lesson 01) and, beside it,
#    on torch's all-reduce. How much of the gap to DDP is the wrapper, and how much the transport?
#    (Our 2-core machine: about 0.8–1.0 of DDP's step time on the ring, 0.95–1.1 on torch's; the
#    README's benchmark table has the runs.)
#
# 每个 **任务** 都要在下面的单元格里写下答案，像预测一样检查；第 1 项和第 4 项是计时，请在视图里和终端里探索。
#
# 1. 拖动慢节点视图的滑块：改成让 rank 0 变慢，或者设为 0 秒。被标记的 rank 会跟着变吗？设为 0 秒时，
#    还有 rank 被标记吗？（预期：标记跟着变慢的 rank 走；设为 0 秒时没有 rank 被标记，除非机器本身让某个
#    rank 变慢。）
# 2. **任务：** 在梯度累积视图里设 K = 2（2 个 rank，8 条序列）：每个 rank 的每个微步有多少条序列？每个优化器步
#    有几次全归约？
# 3. **任务：** 桶上限为 0.1 MiB（`bucket_mb=0.1`）时，每步调用多少次全归约？请根据各参数的大小推算
#    （各参数的字节数是 `[4 * p.numel() for p in model.parameters()]`，`model` 来自第 1 节；你写的
#    `assign_buckets` 可以帮你数）；单元格会用这个上限在 2 个 rank 上训练 2 步来检查。
# 4. 在终端里运行 `dtlab bench dp`：重叠版本与 PyTorch 的 DDP 对比，两边都用 0.25 MiB 的桶，它的桶走 dtlab
#    经共享内存的环（第 01 课），旁边一列改走 torch 的全归约。与 DDP 的差距有多少来自封装，有多少来自传输方式？
#    （在我们的 2 核机器上：走环时单步时间约为 DDP 的 0.8–1.0，走 torch 时约 0.95–1.1；各次运行见 README 的基准测试表。）

# %%
my_answer_accum = None     # ← your answer: {"sequences": n, "all-reduces": n} / 你的答案
my_answer_calls = None     # ← your answer: an integer / 你的答案：整数

# %%
k2 = accum.run(2)
calls_k2 = sorted({rec["ranks"][r]["comm"]["all_reduce"]["count"] for rec in k2.records for r in range(2)})
per_micro = accum.base.batch_size // accum.base.dp // 2   # sequences per rank per micro-step
ok = check("02.try_accum_2", my_answer_accum, {"sequences": per_micro, "all-reduces": calls_k2[0]})
tiny = dtlab.train(TrainConfig(dp=2, dp_mode="bucketed", bucket_mb=0.1, steps=2, seed=0)).wait()
calls_tiny = sorted({rec["ranks"][r]["comm"]["all_reduce"]["count"] for rec in tiny.records for r in range(2)})
ok = check("02.try_small_cap", my_answer_calls, calls_tiny[0] if len(calls_tiny) == 1 else calls_tiny)

# %% [markdown]
# ## Check / 检查
#
# The last cell repeats this lesson's results as one deterministic summary.
# 最后一个单元格把本课的结果汇总成一个确定的结论。

# %%
results = {
    f"one all-reduce per parameter ({n_tensors}) vs one per bucket ({n_buckets}) each step"
    f" / 每个参数一次全归约（{n_tensors}）与每个桶一次（{n_buckets}）":
        calls_per_step == {"per_parameter": n_tensors, "bucketed": n_buckets, "overlapped": n_buckets},
    "the three DP versions give the same loss / 三个 DP 版本的损失相同": same,
    "only the overlapped version has communication in flight while computing / 只有 overlapped 版本在计算时有通信在进行":
        overlaps == {"per_parameter": False, "bucketed": False, "overlapped": True}
        and none_overlap["per_parameter"] and none_overlap["bucketed"],
    "one 25 MiB bucket starts only once the last gradient exists; 0.25 MiB buckets start 3 of 4 before"
    " / 一个 25 MiB 的桶要等最后一个梯度出现才开始；0.25 MiB 的桶有 3/4 在此之前发出":
        {cap: (r[0]["started_early"], r[0]["buckets"]) for cap, r in early.items()}
        == {"25 MiB": (0, 1), "0.25 MiB": (3, 4)},
    "accumulating K = 4 micro-steps: 1 all-reduce per step, the same loss (1e-4)"
    " / 累积 K = 4 个微步：每步 1 次全归约，损失相同（1e-4）": calls_k4 == [1] and gap < 1e-4,
    "the slowed rank is the one flagged, and every rank waits for it / 被拖慢的 rank 被标记，所有 rank 都在等它":
        flagged == [3] and every_rank_waits,
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 02:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
