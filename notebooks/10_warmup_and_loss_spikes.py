# %% [markdown]
# # Lesson 10 — Warmup and loss spikes
# # 第 10 课 —— 学习率预热与损失尖峰
#
# **What you will see.** Two ways a training run goes wrong in its loss curve,
# and what large runs do about them. First the learning rate: a peak rate that
# is fine later in training can wreck the first steps, when the weights and
# Adam's statistics have not settled yet. **Warmup** ramps the rate up over the
# first steps instead (Goyal et al., 2017). You will compute the schedule step
# by step, then train the small GPT at a high peak rate without warmup and with
# it. Then a **loss spike**: one corrupted batch is fed at a chosen step; dtlab
# detects the jump at that step and recovers, by skipping the batch or by
# rolling back to an earlier snapshot. Last, **gradient clipping** by the norm
# of the whole gradient, which no rank holds alone: why that norm needs an
# all-reduce of its own, and how an unstable start shows in it first.
#
# **你将看到什么。** 损失曲线上训练出问题的两种方式，以及大规模训练如何应对。先看学习率：一个在
# 训练后期完全合适的峰值学习率，可能在最初几步就把模型毁掉，因为那时权重和 Adam 的统计量都还没有
# 稳定。**学习率预热**（warmup）的做法是在最初若干步里把学习率逐步升上去（Goyal 等，2017）。
# 你会一步一步地算出学习率调度，然后用较高的峰值学习率分别在不预热和预热的情况下训练小 GPT。
# 接着是 **损失尖峰**（loss spike）：在指定的一步送入一个被破坏的批次；dtlab 会在这一步检测到损失的
# 跳变，并通过跳过这个批次或回滚到之前的快照来恢复。最后是按整个梯度的范数做的 **梯度裁剪**：没有哪个
# rank 独自持有整个梯度，为什么这个范数需要一次专门的 all-reduce，以及不稳定的开局如何最先在它上面显现。

# %%
import dtlab
from dtlab import TrainConfig
from dtlab.lab import Dashboard, check
from dtlab.lab.warmup_view import WarmupView
from dtlab.numerics.lr_schedule import lr_at
from dtlab.course.exercises import grade

# %% [markdown]
# ## 1. The schedule, step by step / 一步一步看学习率调度
#
# Goyal et al. (2017) trained ResNet-50 on ImageNet with a minibatch of 8,192
# images on 256 GPUs in one hour. Their *linear scaling rule* multiplies the
# learning rate by k when the minibatch grows k times; such a large rate breaks
# the start of training, so they raise it gradually, from the small-batch rate to
# the large one, over the first five epochs ("gradual warmup", Sec. 2.2).
#
# dtlab's `lr_at` (`dtlab/numerics/lr_schedule.py`) does linear warmup over W optimizer
# steps, then cosine decay towards a tenth of the peak. Counting steps from 0
# in a run of `total` steps, step k < W uses
#
#     lr(k) = peak × (k + 1) / W
#
# so the first step already moves a little, and step W − 1 reaches the peak.
# From step W on, with p = (k − W) / (total − W),
#
#     lr(k) = peak × (0.1 + 0.9 × (1 + cos(π p)) / 2)
#
# which would reach peak / 10 at k = total, one step past the run: the last
# step, total − 1, is still a little above it (0.0307 for a peak of 0.3 over 40
# steps, in the table below).
# Press **Step** to walk along it; the grey dashed line is the same schedule
# without warmup.
#
# **Predict:** with a peak of 0.3 and W = 10, the learning rate at step 2.
#
# Goyal 等（2017）用 256 张 GPU、每批 8,192 张图片，在一小时内完成了 ResNet-50 在 ImageNet 上
# 的训练。他们的 *线性缩放规则* 是：批大小扩大 k 倍，学习率也乘以 k；这么大的学习率会在训练一开始
# 就把模型搞坏，所以他们在最初五个 epoch 里把学习率从小批量时的值逐步升到大批量时的值（“gradual
# warmup”，第 2.2 节）。
#
# dtlab 的 `lr_at`（`dtlab/numerics/lr_schedule.py`）先在 W 个优化器步内线性预热，再用余弦衰减向峰值的十分之一
# 下降。在一次共 `total` 步的运行里，步数从 0 开始计，第 k 步（k < W）的学习率是
#
#     lr(k) = 峰值 × (k + 1) / W
#
# 所以第一步就已经有一点点更新，第 W − 1 步达到峰值。从第 W 步起，记 p = (k − W) / (total − W)，
#
#     lr(k) = 峰值 × (0.1 + 0.9 × (1 + cos(π p)) / 2)
#
# 它要到 k = total 才正好降到峰值的十分之一，而那已经是运行结束后的一步：最后一步 total − 1 仍略高于它
# （下表中峰值 0.3、共 40 步时为 0.0307）。按 **Step**（前进一步） 沿着调度往前走；灰色虚线是
# 不预热时的同一个调度。
#
# **预测：** 峰值为 0.3、W = 10 时，第 2 步的学习率是多少？

# %%
# NBVAL_IGNORE_OUTPUT
view = WarmupView(TrainConfig(lr=0.3, warmup=10, steps=40, seed=0))
view

# %%
my_prediction = None  # ← your prediction: a learning rate / 你的预测：一个学习率

view.lr.value, view.warmup.value = 0.3, 10
view.reset()
view.step()
view.step()
print(f"step {view.now}: view shows {view.lr_now():.6g}, lr_at gives {lr_at(2, lr=0.3, warmup=10, total_steps=40):.6g}"
      f" / 第 {view.now} 步：视图显示 {view.lr_now():.6g}，lr_at 给出 {lr_at(2, lr=0.3, warmup=10, total_steps=40):.6g}")
ok_lr = check("10.lr_step2", my_prediction, round(lr_at(2, lr=0.3, warmup=10, total_steps=40), 10), source="formula")
print(" k   with warmup   no warmup")
for k in (0, 1, 2, 5, 9, 10, 20, 39):
    print(f"{k:>2}   {lr_at(k, lr=0.3, warmup=10, total_steps=40):>11.4f}   {lr_at(k, lr=0.3, warmup=0, total_steps=40):>9.4f}")

# %% [markdown]
# ## 2. A high peak rate, without and with warmup / 较高的峰值学习率：不预热与预热
#
# The small GPT usually trains at 1e-3. Now both runs use a peak of 0.3, 300
# times more, for 40 steps with the same seed; one starts at the peak, the other
# warms up over 10 steps. Adam moves every weight by up to about the learning
# rate in its first steps, whatever the gradient's size, so a rate of 0.3 from
# step 0 shoves every weight at once.
#
# The loss starts at about ln 256 ≈ 5.55 (a uniform guess over 256 bytes).
# **Predict:** does the run without warmup *diverge* (its loss rises above twice
# the starting loss at some step)? Does the run with warmup? Which one has the
# lower loss over its last 5 steps?
#
# 小 GPT 平时用 1e-3 的学习率训练。现在两次运行都用 0.3 的峰值，是平时的 300 倍，用相同的随机种子
# 训练 40 步；一次从第 0 步就用峰值，另一次用 10 步预热。Adam 在最初几步里，不论梯度大小，都会把
# 每个权重移动大约一个学习率那么多，所以从第 0 步就用 0.3，相当于把所有权重一起猛推一把。
#
# 损失的起点约为 ln 256 ≈ 5.55（对 256 个字节做均匀猜测）。**预测：** 不预热的运行会 *发散* 吗
# （即某一步的损失超过起点的两倍）？预热的运行呢？哪一次最后 5 步的平均损失更低？

# %%
# NBVAL_IGNORE_OUTPUT
dash = Dashboard()
dash

# %%
# ← your prediction: {"diverges without warmup": bool, "diverges with warmup": bool,
#                     "lower final loss with warmup": bool} / 你的预测
my_prediction = None

without = dash.watch(dtlab.train(TrainConfig(lr=0.3, warmup=0, steps=40, seed=0)),
                     label="lr 0.3, no warmup / 无预热")
with_warmup = dash.watch(dtlab.train(TrainConfig(lr=0.3, warmup=10, steps=40, seed=0)),
                         label="lr 0.3, warmup 10 / 预热 10 步")

def diverged(run):
    return max(run.losses()) > 2 * run.losses()[0]

def last5(run):
    return sum(run.losses()[-5:]) / 5

measured_lr = {"diverges without warmup": diverged(without), "diverges with warmup": diverged(with_warmup),
               "lower final loss with warmup": last5(with_warmup) < last5(without)}
ok_warmup = check("10.warmup_runs", my_prediction, measured_lr)
lr_matches = all(r["lr"] == lr_at(r["step"], lr=0.3, warmup=w, total_steps=40)
                 for run, w in ((without, 0), (with_warmup, 10)) for r in run.records)
print("every step trained at lr_at's rate / 每一步都按 lr_at 的学习率训练:", lr_matches)

# %% [markdown]
# Look at the first five steps of the run without warmup: the loss climbs far
# above where it started. The spike guard of the next section sees it: it
# refuses the updates of two steps that look like spikes (5 and 6), and when a
# third comes in a row (step 7) it accepts that the loss now lives at this
# higher level (a `spike_accepted` event in the records) and lets training go
# on, from a much worse place. No
# guard can repair a learning rate that is too high; the damage was done by the
# updates of the first steps. Warmup avoids it. (Warmup is not a guarantee
# either: with seed 4, 10 steps of warmup at 0.3 still let the loss jump to
# about 10.2, not quite twice the start, and the guard flags spikes. Try it
# below.)
#
# 看不预热那次运行的前五步：损失爬到了远高于起点的位置。下一节的尖峰保护会注意到这一点：它先拒绝两步看起来像
# 尖峰的更新（第 5、6 步），连续第三次（第 7 步）时，就认定损失已经停留在这个更高的水平上（记录里会出现一个 `spike_accepted` 事件），
# 让训练继续下去——只是起点已经差了很多。任何保护机制都救不了过高的学习率；伤害早在最初几步的更新里就造成了。
# 预热则避免了它。（预热也不是万能的：换成种子 4，0.3 的峰值配 10 步预热时损失仍会跳到约 10.2，差一点就是起点的两倍，
# 尖峰保护也会报告尖峰。可以在下面试试。）
#
# ## 3. A loss spike, detected and recovered / 损失尖峰：检测与恢复
#
# `spike=15` feeds one corrupted batch at step 15: random bytes from 128 to 255,
# which the training text never contains, so a model that has learned anything
# finds them very unlikely and the loss jumps. Every step, before the optimizer
# runs, `dtlab.numerics.loss_spikes.SpikeDetector` compares the loss with the last 10
# accepted ones: a loss more than 3 robust deviations above their median is a
# spike (a deviation counts as at least 5% of the median, so a flat curve's
# small wiggles are not spikes). Then the policy decides:
#
# * `skip`: drop this step's update; the weights stay as they were before the bad batch.
# * `rollback`: also restore the last in-memory snapshot of weights and optimizer
#   (one is taken every 10 healthy steps) and carry on with the next batch; the
#   batches since the snapshot are dropped too. PaLM (Chowdhery et al., 2022)
#   did this at scale: it restarted about 100 steps before a spike and skipped
#   200 to 500 batches.
#
# We train three times for 30 steps at the usual rate: clean, and with the bad
# batch under each policy.
#
# **Predict:** at which step is the spike detected? Which snapshot does rollback
# return to? Does each run end below the loss it had just before the spike? Which
# policy ends lower, skip or rollback?
#
# `spike=15` 会在第 15 步送入一个被破坏的批次：由 128 到 255 之间的随机字节组成，训练文本里从不
# 出现这些字节，所以只要模型学到了一点东西，就会觉得它们极不可能出现，损失随之跳高。每一步在优化器
# 更新之前，`dtlab.numerics.loss_spikes.SpikeDetector` 都会把损失和最近 10 个被接受的损失比较：比它们的中位数
# 高出 3 个稳健偏差以上就算尖峰（一个偏差至少按中位数的 5% 计，这样平坦曲线上的小抖动不会被当成尖峰）。然后由策略决定：
#
# * `skip`（跳过）：丢弃这一步的更新；权重保持在坏批次之前的样子。
# * `rollback`（回滚）：还要恢复最近一次内存中的权重和优化器快照（每 10 个正常步保存一次），然后从
#   下一个批次继续；快照之后的批次也一并丢弃。PaLM（Chowdhery 等，2022）在大规模训练中就是这样做的：
#   从尖峰之前大约 100 步重新开始，并跳过 200 到 500 个批次。
#
# 我们用平常的学习率训练三次，每次 30 步：一次干净的，另外两次带坏批次，分别用两种策略。
#
# **预测：** 尖峰会在第几步被检测到？回滚会回到哪一步的快照？每次运行最终的损失是否低于尖峰前一步
# 的损失？skip 和 rollback 哪个最终损失更低？

# %%
# NBVAL_IGNORE_OUTPUT
spike_dash = Dashboard()
spike_dash

# %%
# ← your prediction: {"detected at step": n, "rollback returns to step": n,
#                     "both recover below the pre-spike loss": bool, "skip ends lower than rollback": bool} / 你的预测
my_prediction = None

clean = spike_dash.watch(dtlab.train(TrainConfig(steps=30, seed=0)), label="clean / 干净")
policies = {}
for policy in ("skip", "rollback"):
    config = TrainConfig(steps=30, seed=0, spike=15, spike_policy=policy)
    policies[policy] = spike_dash.watch(dtlab.train(config), label=f"spike at 15, {policy} / 第 15 步尖峰，{policy}")

for policy, run in policies.items():
    for r in run.records:
        for e in r["events"]:
            if e["kind"] in ("spike", "rollback"):
                detail = (f"loss above threshold / 损失高于阈值: {e['loss'] > e['threshold']}" if e["kind"] == "spike"
                          else f"back to the snapshot of step {e['to_step']} / 回到第 {e['to_step']} 步的快照")
                print(f"{policy:>8}: step / 第 {r['step']} 步, {e['kind']}, skipped / 跳过 {r['skipped']}, {detail}")

def events(run, kind):
    return [(r["step"], e) for r in run.records for e in r["events"] if e["kind"] == kind]

before_spike = {p: run.losses()[14] for p, run in policies.items()}
measured = {
    "detected at step": events(policies["skip"], "spike")[0][0],
    "rollback returns to step": events(policies["rollback"], "rollback")[0][1]["to_step"],
    "both recover below the pre-spike loss": all(run.losses()[-1] < before_spike[p] for p, run in policies.items()),
    "skip ends lower than rollback": policies["skip"].losses()[-1] < policies["rollback"].losses()[-1],
}
ok_spike = check("10.spike", my_prediction, measured)
same_step_both = events(policies["rollback"], "spike")[0][0] == measured["detected at step"]
only_that_step = all([s for s, _ in events(run, "spike")] == [15] for run in policies.values())
print("both policies flag step 15 and no other / 两种策略都只标记第 15 步:", same_step_both and only_that_step)
print("the clean run has no spike / 干净的运行没有尖峰:", not events(clean, "spike"))
gap = (policies["skip"].losses()[-1] - clean.losses()[-1]) / clean.losses()[-1]
print("skip ends within 2% of the clean run / skip 最终与干净运行相差在 2% 以内:", abs(gap) < 0.02)

# %% [markdown]
# Skip loses one update; rollback loses the five healthy updates since its
# snapshot as well, so it ends a little higher here. Rollback earns its cost when
# the damage is already in the weights, for instance when a bad batch was only
# caught a step late and its update has been applied. It cannot cure a learning
# rate that is still too high, as in section 2: back at the snapshot, the same
# rate does the same damage again.
#
# skip 只损失了一次更新；rollback 还丢掉了快照之后那五次正常的更新，所以在这里最终损失稍高一些。
# 当伤害已经进入权重时，回滚的代价才物有所值，比如坏批次晚了一步才被发现、它的更新已经写进了权重。但回滚
# 治不了一个仍然过高的学习率（第 2 节的情形）：回到快照之后，同样的学习率会再造成同样的伤害。
#
# ## 4. Gradient clipping across shards / 跨分片的梯度裁剪
#
# Large runs also clip the gradient (`--clip-grad NORM`, DeepSpeed's
# `gradient_clipping`): when the L2 norm ‖g‖ over *all* parameters is above NORM,
# the whole gradient is scaled by NORM / ‖g‖, so a bad step keeps its direction
# but is shortened. On one process that is `torch.nn.utils.clip_grad_norm_`.
# Distributed, no rank holds all of g: a ZeRO rank holds a shard of it, a
# tensor-parallel rank a slice of each weight, a pipeline stage its own blocks.
# So the norm needs a communication of its own: each rank adds up the squares of
# the gradient elements it counts, and one all-reduce of that single number
# sums them over every rank. Every element must be counted exactly once: data-
# parallel replicas hold the same averaged gradient, so only the first rank of
# the DP group counts it; under ZeRO the DP ranks hold disjoint shards instead,
# so each rank counts its own shard; and a parameter every TP rank holds whole
# (LayerNorms, embeddings) is counted by TP rank 0 only
# (`dtlab/numerics/gradient_clipping.py`).
# Each step's record then carries `grad_norm` (before clipping) and `clipped`.
#
# The norm is also a gauge. Below, the small GPT trains at a peak rate of 0.02
# without warmup, once with a threshold no step reaches (the norm is measured,
# nothing is clipped) and once clipped at 1.0.
#
# **Predict:** how many bytes does each rank all-reduce per step for the norm,
# at DP 2 × TP 2 × PP 2? Is the norm there the same as on one process (within
# 1e-5)? At step 1 of the unclipped run, does the norm grow (relative to step 0)
# more than the loss does?
#
# 大规模训练还会裁剪梯度（`--clip-grad NORM`，即 DeepSpeed 的 `gradient_clipping`）：当 *所有* 参数上的
# L2 范数 ‖g‖ 超过 NORM 时，把整个梯度乘以 NORM / ‖g‖，这样坏的一步保持方向、只是被缩短。在单进程中这就是
# `torch.nn.utils.clip_grad_norm_`。分布式时没有哪个 rank 持有完整的 g：ZeRO 的 rank 只有它的一个分片，张量并行的
# rank 只有每个权重的一个切片，流水线的每个阶段只有自己的 block。所以范数需要一次专门的通信：每个 rank 把它负责
# 计数的梯度元素的平方相加，再用一次对这单个数的 all-reduce 在所有 rank 上求和。每个元素必须恰好计一次：数据
# 并行的副本持有同样的平均梯度，所以只由 DP 组的第一个 rank 计；在 ZeRO 下各 DP rank 持有的是互不重叠的分片，
# 所以每个 rank 各计自己的分片；每个 TP rank 都完整持有的参数（LayerNorm、嵌入）只由 TP rank 0 计（`dtlab/numerics/gradient_clipping.py`）。于是每步的记录里多出 `grad_norm`（裁剪前）和 `clipped`。
#
# 范数也是一个监测指标。下面用 0.02 的峰值学习率、不预热训练小 GPT：一次用一个没有哪一步会达到的阈值（只测量
# 范数，不裁剪），一次在 1.0 处裁剪。
#
# **预测：** 在 DP 2 × TP 2 × PP 2 上，每个 rank 每步为范数 all-reduce 多少字节？那里的范数是否与单进程的相同
# （误差 1e-5 以内）？在不裁剪的那次运行里，第 1 步的范数（相对第 0 步）的增长是否比损失的增长更大？

# %%
# NBVAL_IGNORE_OUTPUT
clip_dash = Dashboard(grad_norm=True)
clip_dash

# %%
# ← your prediction: {"bytes each rank all-reduces for the norm": n, "same norm as one process": bool,
#                     "the norm grows more than the loss at step 1": bool} / 你的预测
my_prediction_clip = None

from dtlab.numerics.gradient_clipping import KIND
from dtlab.reference import reference_train

one_process = []                      # torch's clip_grad_norm_ on one process / 单进程上 torch 的 clip_grad_norm_
reference_train(TrainConfig(steps=6, seed=0, clip_grad=1.0), one_process)
grid = dtlab.train(TrainConfig(dp=2, tp=2, pp=2, micro_batches=2, steps=6, seed=0, clip_grad=1.0)).wait()
norm_bytes = sorted({r["comm"][KIND]["bytes"] for record in grid.records for r in record["ranks"]})
same_norm = all(abs(r["grad_norm"] - n) <= 1e-5 * n for r, n in zip(grid.records, one_process))
print("bytes each of the 8 ranks all-reduces for the norm, per step / 8 个 rank 每步为范数 all-reduce 的字节数:",
      norm_bytes)

free = clip_dash.watch(dtlab.train(TrainConfig(steps=12, seed=0, lr=0.02, clip_grad=1000.0)),
                       label="lr 0.02, not clipped / 不裁剪")
tamed = clip_dash.watch(dtlab.train(TrainConfig(steps=12, seed=0, lr=0.02, clip_grad=1.0)),
                        label="lr 0.02, clipped at 1.0 / 在 1.0 处裁剪")
print("step / 步   loss / 损失   grad_norm   clipped at 1.0: loss / 在 1.0 处裁剪：损失")
for a, b in zip(free.records[:5], tamed.records[:5]):
    print(f"{a['step']:>9}   {a['loss']:>11.2f}   {a['grad_norm']:>9.1f}   {b['loss']:>10.2f}")
norms, losses = [r["grad_norm"] for r in free.records], free.losses()
measured_clip = {"bytes each rank all-reduces for the norm": norm_bytes[0] if len(norm_bytes) == 1 else norm_bytes,
                 "same norm as one process": same_norm,
                 "the norm grows more than the loss at step 1": norms[1] / norms[0] > losses[1] / losses[0]}
ok_clip = check("10.clip_norm", my_prediction_clip, measured_clip)


# %% [markdown]
# Each rank sends 4 bytes, one fp32 number, however large its share of the
# gradient: the norm is cheap, but it is a synchronisation point every rank must
# reach before any of them may update. At step 1 the loss has risen by about 2%;
# the norm has grown about 2.5 times, and at step 2 almost six times: the norm
# is the louder and earlier alarm. Clipping cannot change the first update:
# Adam's first step divides the gradient by its own magnitude, so scaling it
# changes nothing (the loss at step 1 is the same). From then on Adam's running
# averages mix gradients of different sizes, and the clipped run, whose large
# gradients were cut down to norm 1, ends up lower at steps 2 and 3.
#
# 每个 rank 只发送 4 个字节，即一个 fp32 数，无论它持有多大一份梯度：范数很便宜，但它是一个同步点，所有 rank 都要
# 到达之后才能更新。第 1 步损失只升高了约 2%，范数却变成了约 2.5 倍，第 2 步几乎是 6 倍：范数是更响、更早的警报。
# 裁剪改变不了第一次更新：Adam 的第一步会把梯度除以它自身的大小，所以按比例缩放梯度不起作用（第 1 步的损失相同）。
# 此后 Adam 的滑动平均混合了大小不同的梯度，而裁剪过的那次运行（大梯度被压到范数 1）在第 2、3 步的损失更低。
#
# ## 5. Exercises: the schedule and the spike rule / 练习：学习率调度与尖峰判定
#
# Two functions. First `warmup_lr(step, peak, warmup, total)`: linear warmup that
# reaches `peak` at step W − 1 (starting at `peak / W` on step 0, as in section
# 1), then the cosine decay of section 1, p = (step − W) / (total − W), which
# reaches a tenth of the peak at step `total`, one past the last. `grade`
# compares it with dtlab's on a grid of steps, then trains a small model for 6
# data-parallel steps on 2 real ranks with your rates and with dtlab's.
#
# Then `is_spike(local_loss, recent)`, the rule of section 3 on one rank:
# `local_loss` is this rank's loss, but the decision is about the *global* loss
# (the mean over the ranks), or the ranks would not skip the same steps. Return
# `(spike, global_loss)`. A loss that is inf or NaN is always a spike; with
# fewer than 5 `recent` losses nothing else is; otherwise a spike is a loss above
# the median m of `recent` by more than 3 × max(1.4826 × MAD, 0.05 × m) (MAD: the
# median absolute deviation from m). `grade` plays a script on 2 ranks in which
# rank 1's batch goes bad, and compares every step with dtlab's `SpikeDetector`.
#
# 两个函数。先写 `warmup_lr(step, peak, warmup, total)`：线性预热在第 W − 1 步达到 `peak`（与第 1 节一样，第 0 步从
# `peak / W` 开始），之后按第 1 节的余弦衰减，p = (step − W) / (total − W)，在第 `total` 步（最后一步的下一步）
# 降到峰值的十分之一。`grade` 会在一组步数上把它与 dtlab 的比较，
# 再在 2 个真实 rank 上分别用你的学习率和 dtlab 的学习率把一个小模型训练 6 步数据并行。
#
# 再写 `is_spike(local_loss, recent)`，即第 3 节在单个 rank 上的判定规则：`local_loss` 是本 rank 的损失，但要判断的
# 是 *全局* 损失（各 rank 的平均），否则各 rank 跳过的步就不一样了。返回 `(spike, global_loss)`。inf 或 NaN 的损失
# 一定是尖峰；`recent` 少于 5 个时其他都不算；否则，高于 `recent` 的中位数 m 超过 3 × max(1.4826 × MAD, 0.05 × m)
# 的损失是尖峰（MAD：与 m 之差的绝对值的中位数）。`grade` 会在 2 个 rank 上运行一个脚本，其中 rank 1 的批次会损坏，
# 并把每一步与 dtlab 的 `SpikeDetector` 比较。

# %%
def warmup_lr(step, peak, warmup, total):
    # the learning rate of optimizer step `step` (0-based) / 第 `step` 步（从 0 开始）的学习率
    raise NotImplementedError  # your code here / 在这里写你的代码


solved_lr = grade("10.warmup_lr", warmup_lr)

# %%
import math
import statistics

import torch
import torch.distributed as dist


def is_spike(local_loss, recent):
    # return (spike, global_loss); `recent`: the last accepted global losses (up to 10)
    # 返回 (spike, global_loss)；`recent`：最近被接受的全局损失（最多 10 个）
    raise NotImplementedError  # your code here / 在这里写你的代码


solved_spike = grade("10.is_spike", is_spike)

# %% [markdown]
# ## 6. Try this / 动手试试
#
# 1. In the view of section 1, move the **peak learning rate** and **warmup
#    steps W**, then press **Train both**: both runs are drawn under the view.
#    Find the smallest W for which a peak of 0.3 does not diverge, and try
#    another seed with `view.base = TrainConfig(lr=0.3, warmup=10, steps=40, seed=4)`.
#    (Answer, seed 0, in our runs: W = 6 is the first that does not diverge, yet
#    W = 7 diverges again, and from W = 8 on none does: warmup lowers the risk,
#    it draws no sharp line. Seed 4 at W = 10 peaks at about 10.2: no divergence
#    by our rule, but spike events.)
# 2. Rerun section 2 with `spike_policy="rollback"` in the run without warmup:
#    does rolling back to step 0 help while the rate stays at 0.3?
# 3. **Task:** inject the spike earlier, `spike=3`. The detector needs five
#    losses before it judges: how many spike events will the run have? The cell
#    trains 30 steps to check.
#
# 1. 在第 1 节的视图里调整 **峰值学习率** 和 **预热步数 W**，再按 **两种都训练一次**：两次运行会画在
#    视图下方。找出峰值 0.3 时不发散所需的最小 W；再用
#    `view.base = TrainConfig(lr=0.3, warmup=10, steps=40, seed=4)` 换一个随机种子试试。
#    （答案，种子 0，我们的运行：W = 6 是第一个不发散的，但 W = 7 又发散了，从 W = 8 起都不发散：预热降低了
#    风险，却没有一条清楚的分界线。种子 4、W = 10 时损失最高约 10.2：按我们的规则不算发散，但有尖峰事件。）
# 2. 在不预热的那次运行里加上 `spike_policy="rollback"` 重跑第 2 节：学习率仍是 0.3 时，回滚到第 0 步
#    有用吗？
# 3. **任务：** 把尖峰提前到 `spike=3`。检测器要先看到五个损失才开始判断：这次运行会有几个尖峰事件？
#    单元格会训练 30 步来检查。

# %%
my_answer_early = None  # ← your answer: an integer / 你的答案：整数

# %%
early = dtlab.train(TrainConfig(steps=30, seed=0, spike=3)).wait()
ok = check("10.try_early_spike", my_answer_early, len(events(early, "spike")))

# %% [markdown]
# ## Check / 检查
#
# The last cell repeats this lesson's results as one deterministic summary.
# 最后一个单元格把本课的结果汇总成一个确定的结论。

# %%
results = {
    "warmup: lr(k) = peak x (k + 1) / W, 0.09 at step 2 / 预热：lr(k) = 峰值 x (k + 1) / W，第 2 步为 0.09":
        round(lr_at(2, lr=0.3, warmup=10, total_steps=40), 10) == 0.09 and lr_matches,
    "peak lr 0.3 diverges without warmup, not with it / 峰值 0.3 不预热会发散，预热则不会":
        measured_lr == {"diverges without warmup": True, "diverges with warmup": False, "lower final loss with warmup": True},
    "the spike is detected at step 15 and skipped / 尖峰在第 15 步被检测到并跳过": measured["detected at step"] == 15
        and only_that_step and all(r["skipped"] for run in policies.values() for r in run.records if r["step"] == 15),
    "rollback returns to the snapshot of step 10 / 回滚回到第 10 步的快照": measured["rollback returns to step"] == 10,
    "both policies recover / 两种策略都能恢复": measured["both recover below the pre-spike loss"],
    "the norm: 4 bytes per rank, one process's value at 2 x 2 x 2 / 范数：每 rank 4 字节，2 x 2 x 2 上等于单进程的值":
        norm_bytes == [4] and same_norm,
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 10:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
