# %% [markdown]
# # Lesson 08 — Pipeline parallelism
# # 第 08 课 —— 流水线并行
#
# **What you will see.** **Pipeline parallelism** (PP) cuts the model by depth:
# consecutive blocks go to consecutive ranks, the **stages**, and the only thing
# that travels between two stages is one activation forward and its gradient
# backward. To keep every stage busy, the batch is cut into **micro-batches** that
# flow through the stages one after another. You will read a schedule as plain
# data, step through it, predict the idle time it leaves — the **bubble** — and
# check it against a simulation; then run the small GPT on 4 real pipeline ranks,
# compare the measured timeline with the ideal one, and measure how much
# activation memory the two classic schedules, **GPipe** (Huang et al., 2018) and
# **1F1B** (PipeDream, Narayanan et al., 2019; its flush variant, Narayanan et al., 2021),
# make a stage hold.
#
# **你将看到什么。** **流水线并行**（pipeline parallelism，PP）按深度切分模型：相邻的 block 放到
# 相邻的 rank 上，这些 rank 称为 **阶段**（stage）；两个阶段之间传递的只有一份前向的激活值和反向时
# 它的梯度。为了让每个阶段都忙起来，批次被切成若干 **微批次**（micro-batch），一个接一个地流过各个阶段。
# 你会把调度当作普通数据来读，一步步地执行它，预测它留下的空闲时间——也就是 **气泡**（bubble）——
# 并用模拟来验证；然后在 4 个真实的流水线 rank 上运行小 GPT，把实测的时间线与理想时间线对照，
# 再测量两种经典调度 **GPipe**（Huang 等，2018）和 **1F1B**（PipeDream，Narayanan 等，2019；带 flush 的版本见 Narayanan 等，2021）分别让一个阶段
# 保存多少激活值。

# %%
import dataclasses
from fractions import Fraction

import dtlab
from dtlab import TrainConfig
from dtlab.config import MODEL_PRESETS
from dtlab.data import global_batch
from dtlab.launch import run
from dtlab.lab import check, human_bytes
from dtlab.lab.pipeline_view import PipelineView, TimelineComparison
from dtlab.lab.timeline import StepTimeline
from dtlab.course.experiments import pipeline as pp_lesson
from dtlab.course.exercises import grade
from dtlab.model import build_model
from dtlab.parallel.pipeline import format_grid, ideal_bubble_fraction, max_in_flight, schedule, simulate
from dtlab.config.layout import Layout
from dtlab.planner import plan

# %% [markdown]
# ## 1. A schedule is data / 调度就是数据
#
# A schedule says, for each rank, which actions it runs and in which order. An
# action is written like `1F0`: stage 1, **F**orward, micro-batch 0 (`B` is
# backward). Here are p = 4 stages and m = 4 micro-batches under both schedules:
#
# * **GPipe** runs every forward first, then every backward.
# * **1F1B** lets each stage run a few forwards to fill the pipe (how many
#   depends on the stage: read it off the grid below), then alternates one
#   forward and one backward, then finishes the remaining backwards.
#
# `format_grid` places the actions in time on an ideal machine (every action takes
# one slot, messages are free); a dot is a slot in which the stage waits.
#
# 调度规定了每个 rank 要执行哪些动作、按什么顺序执行。动作写成 `1F0` 的形式：阶段 1，**F**
# 表示前向（forward），微批次 0（`B` 表示反向，backward）。下面是 p = 4 个阶段、m = 4 个微批次
# 在两种调度下的样子：
#
# * **GPipe** 先做完所有前向，再做所有反向。
# * **1F1B** 让每个阶段先做几次前向把流水线填满（几次取决于是哪个阶段：可以从下面的表格里读出来），
#   然后前向、反向交替进行，最后做完剩下的反向。
#
# `format_grid` 把这些动作放到一台理想机器的时间轴上（每个动作占一个时隙，消息传递不耗时）；
# 圆点表示该阶段在那个时隙里等待。

# %%
for kind in ("gpipe", "1f1b"):
    actions = schedule(kind, 4, 4)
    print(f"{kind}: rank 0 runs {[str(a) for a in actions[0]]}")
    print(format_grid(actions))
    print()

# %% [markdown]
# ## 2. Step through it / 一步一步地执行
#
# Press **Step** to advance one time slot, **Reset** to start again from an empty
# pipe. The sliders change the number of stages p, the number of micro-batches m
# and the schedule; the text under the picture gives the bubble and how many
# micro-batches each stage holds *in flight* — forward done, backward not yet —
# because those are the ones whose activations it must keep.
#
# **Predict:** in GPipe with p = 4 and m = 4, after 4 time slots, how many
# micro-batches is each stage holding? (Look at the first four columns of the
# grid above.)
#
# 按 **Step**（前进一步）推进一个时隙，按 **Reset**（重置）回到空的流水线重新开始。滑块可以改变阶段数 p、
# 微批次数 m 和调度方式；图下方的文字给出气泡大小，以及每个阶段有多少个 *在途* 微批次——
# 前向已做完、反向还没做——因为阶段必须保存的正是这些微批次的激活值。
#
# **预测：** 在 p = 4、m = 4 的 GPipe 中，经过 4 个时隙之后，每个阶段各持有几个微批次？
# （看看上面表格的前四列。）

# %%
# NBVAL_IGNORE_OUTPUT
view = PipelineView(stages=4, micro_batches=4, schedule="gpipe")
view

# %%
my_prediction = None  # ← your prediction: a list, one number per stage / 你的预测：每个阶段一个数的列表

view.stages.value, view.micro_batches.value, view.schedule.value = 4, 4, "gpipe"
view.reset()
for _ in range(4):
    view.step()
ok = check("08.in_flight_gpipe", my_prediction, view.in_flight_now(), source="simulated")

# %% [markdown]
# ## 3. The bubble / 气泡
#
# Count the dots. The last stage cannot start until the first p − 1 stages have
# each passed micro-batch 0 on, and at the end the first stage waits while the
# gradients travel back. With equal work per stage, the forward phase lasts
# m + p − 1 slots and so does the backward phase; each stage is busy in m of
# them, so the idle share is (p − 1)/(m + p − 1) (GPipe paper, Huang et al., 2018). 1F1B reorders the work
# but does not remove this idle time. (Megatron-LM writes the same bubble as
# (p − 1)/m of the ideal time; here it is a share of the whole step.)
#
# **Predict** the bubble fraction for p = 4 with m = 4 and with m = 16 (a number
# or a `Fraction`; checked to 4 decimals).
#
# 数一数圆点。最后一个阶段要等前面 p − 1 个阶段都把微批次 0 传下来才能开始；结束时，梯度往回传的
# 过程中第一个阶段也在等待。各阶段工作量相同时，前向部分持续 m + p − 1 个时隙，反向部分也一样；
# 每个阶段只在其中 m 个时隙里忙碌，所以空闲比例是 (p − 1)/(m + p − 1)（GPipe 论文，Huang 等，2018）。
# 1F1B 调整了工作顺序，但并没有消除这段空闲。（Megatron-LM 把同一个气泡写成理想时间的
# (p − 1)/m；这里用的是占整个步骤的比例。）
#
# **预测：** p = 4 时，m = 4 和 m = 16 的气泡比例各是多少？（写成小数或 `Fraction` 都可以；检查到小数点后 4 位。）

# %%
my_prediction = None  # ← your prediction: {4: fraction, 16: fraction} / 你的预测：{4: 比例, 16: 比例}

bubbles = {}
for m in (4, 16):
    print(f"m = {m}: formula (p-1)/(m+p-1) / 公式 = {ideal_bubble_fraction(4, m)}")
    # a backward costs about two forwards; the bubble does not depend on that ratio
    simulated = {kind: round(simulate(schedule(kind, 4, m), f_time=1, b_time=2).bubble_fraction, 4)
                 for kind in ("gpipe", "1f1b")}
    print(f"        simulated / 模拟: {simulated}")
    bubbles[m] = simulated["1f1b"] if simulated["1f1b"] == simulated["gpipe"] else simulated
rounded = None if my_prediction is None else {m: round(float(v), 4) for m, v in my_prediction.items()}
ok = check("08.bubbles", rounded, bubbles, source="simulated")

# %% [markdown]
# More micro-batches make the bubble smaller, but each micro-batch gets smaller
# too, and small matrix multiplications use the hardware less well. That is the
# trade-off behind choosing m.
#
# 微批次越多，气泡越小；但每个微批次也随之变小，而小矩阵乘法对硬件的利用率更低。选择 m 时要权衡的
# 正是这一点。
#
# Megatron-LM shrinks the bubble another way: **interleaving** (Narayanan et al., 2021, Sec. 2.2.2).
# Each rank holds v model chunks instead of one block of consecutive layers (rank r: chunks r, r + p,
# ...), so a micro-batch goes round the ranks v times and every slot is 1/v as long. The bubble becomes
# (1/v)(p − 1)/m of the ideal time, paid for with v times as many sends and more memory on the first
# rank, which holds more micro-batches in flight (the planner below says how much, and why). dtlab simulates, plans and runs it: `dtlab plan --schedule interleaved
# --virtual-stages 2` predicts it, and `dtlab train --pp 2 --micro-batches 2 --schedule interleaved
# --virtual-stages 2` trains with it. Each rank then keeps its v chunks, and an action is named by its
# virtual stage, chunk × p + rank: with p = 2, `2F0` is rank 0's second chunk.
#
# Megatron-LM 用另一种办法缩小气泡：**交错调度**（Narayanan 等，2021，第 2.2.2 节）。每个 rank 不再持有一段
# 连续的层，而是持有 v 个模型块（rank r：第 r、r + p …… 块），于是一个微批次要绕所有 rank 走 v 圈，每个时隙只有
# 原来的 1/v 长。气泡变为理想时间的 (1/v)(p − 1)/m，代价是 v 倍的点对点发送，以及第一个 rank 上更多的内存——它同时在途的微批次更多（下面的规划器会给出多了多少、为什么）。
# dtlab 可以模拟、规划并运行它：`dtlab plan --schedule interleaved --virtual-stages 2` 预测它，`dtlab train --pp 2
# --micro-batches 2 --schedule interleaved --virtual-stages 2` 用它训练。此时每个 rank 保存自己的 v 个模型块，动作按
# 虚拟阶段（块号 × p + rank）命名：p = 2 时，`2F0` 是 rank 0 的第二个模型块。

# %%
print(format_grid(schedule("interleaved", 2, 2, 2)))   # p = 2 ranks, m = 2, v = 2: stages 0-3, rank r runs r and r + 2
for v in (1, 2, 4):
    kind = "1f1b" if v == 1 else "interleaved"
    simulated = simulate(schedule(kind, 4, 8, v), f_time=1, b_time=2).bubble_fraction
    print(f"p = 4, m = 8, v = {v}: simulated bubble / 模拟气泡 {simulated:.3f}, "
          f"formula (p-1)/(v·m+p-1) / 公式 {float(ideal_bubble_fraction(4, 8, v)):.3f}")
gpt3 = Layout(dp=8, tp=8, pp=16, micro_batches=32, precision="bf16", recompute="selective", sp=True, zero=1)
for layout in (gpt3, dataclasses.replace(gpt3, schedule="interleaved", virtual_stages=2)):
    planner_plan = plan("gpt3-175b", layout, batch_size=256)
    print(f"planner / 规划器, GPT-3 175B, 1024 H100, {layout.schedule}: bubble / 气泡 {planner_plan.bubble_fraction:.1%}, "
          f"point-to-point / 点对点 {planner_plan.comm_time_s['pp']:.2f} s, step / 单步 {planner_plan.step_time_s:.2f} s, "
          f"memory per GPU / 每卡显存 {human_bytes(planner_plan.memory['total'])} "
          + ("(fits / 放得下)" if planner_plan.fits else "(does not fit in 80 GB / 80 GB 放不下)"))
    print("    " + ", ".join(f"{k} {human_bytes(planner_plan.memory[k])}"
                             for k in ("params", "grads", "optimizer", "copies", "activations"))
          + "  (参数、梯度、优化器、16 位副本、激活值)")

# %% [markdown]
# Where the extra memory comes from: interleaving lets the first rank start more (chunk, micro-batch)
# pairs before their backwards come back, about half as many again here. Its activations grow with them,
# 9.6 → 14.0 GiB. The larger part of the jump, though, is `copies`, the 16-bit casts of the weights: in
# dtlab's runtime, under autocast, each micro-batch's forward casts a chunk's weights anew and autograd
# keeps that cast until the micro-batch's backward, so a rank holds one 16-bit copy of its weights per
# micro-batch in flight, and the planner counts them that way (40.5 → 60.8 GiB). Megatron-LM keeps its
# bf16 weights once and casts nothing per micro-batch, so on Megatron this layout, and the plain 1F1B one,
# would need much less memory than dtlab predicts for its own runtime.
#
# 多出来的内存从哪里来：交错调度让第一个 rank 在反向回来之前先启动更多的（模型块, 微批次）组合，这里大约多出
# 一半。激活值随之增长，从 9.6 GiB 到 14.0 GiB。但增长的大头是 `copies`，也就是权重的 16 位副本：在 dtlab 的
# 运行时里，autocast 下每个微批次的前向都会重新把模型块的权重转换一次，autograd 会把这份副本一直留到该微批次的
# 反向，所以一个 rank 每有一个在途微批次就多一份 16 位权重副本，规划器也是这样计数的（从 40.5 GiB 到 60.8 GiB）。
# Megatron-LM 的 bf16 权重只存一份，不会按微批次重复转换，所以在 Megatron 上，这种布局（以及普通的 1F1B 布局）
# 需要的内存会比 dtlab 为自己的运行时预测的少得多。

# %% [markdown]
# ## 4. A real run on 4 pipeline ranks / 在 4 个流水线 rank 上真实运行
#
# Now the small GPT (4 blocks) runs on 4 ranks, one block per stage: stage 0 also
# holds the embeddings, stage 3 the final LayerNorm, the output head and the loss.
# Each rank executes its list of actions from the 1F1B schedule with real sends
# and receives. The batch of 8 sequences is cut into m = 4 micro-batches; each
# micro-batch's loss is divided by m, so the gradients add up to those of the
# whole batch.
#
# **Predict:** is the pipelined loss equal to the loss of the whole model in one
# process on the same batch? How many micro-batches does each stage hold at most?
#
# 现在小 GPT（4 个 block）在 4 个 rank 上运行，每个阶段一个 block：阶段 0 还持有嵌入层，阶段 3
# 持有最后的 LayerNorm、输出头和损失。每个 rank 按 1F1B 调度执行自己的动作列表，用真实的发送和
# 接收传递数据。8 条序列的批次被切成 m = 4 个微批次；每个微批次的损失都除以 m，所以梯度累加起来
# 正好是整个批次的梯度。
#
# **预测：** 流水线算出的损失，与在单个进程里用整个模型算同一批次的损失相等吗？每个阶段最多持有
# 几个微批次？

# %%
my_prediction_same_loss = None  # ← your prediction: True or False / 你的预测：True 或 False
my_prediction_in_flight = None  # ← your prediction: a list, one number per stage / 你的预测：每个阶段一个数

stages = run(pp_lesson.pipeline_step, 4, schedule="1f1b", micro_batches=4, batch_size=8)
for r in stages:
    extras = " + embeddings / 嵌入层" * r["embeddings"] + " + head and loss / 输出头与损失" * r["head"]
    print(f"stage {r['stage']} / 阶段 {r['stage']}: blocks {r['blocks']}{extras}; actions / 动作 {' '.join(r['actions'])}")

cfg = MODEL_PRESETS["small"]
x, y = global_batch(0, batch_size=8, seq_len=cfg.seq_len, seed=0)
single = build_model(cfg, seed=0)(x, y).item()           # one process, the whole batch
pipelined = stages[0]["loss"]
print(f"loss: pipelined {pipelined:.3f}, one process {single:.3f} / 损失：流水线 {pipelined:.3f}，单进程 {single:.3f}")
same_loss = abs(pipelined - single) < 1e-5 and all(r["loss"] == pipelined for r in stages)
same_grads = all(r["grad_diff"] < 1e-5 for r in stages)
ok = check("08.same_loss", my_prediction_same_loss, same_loss)
ok = check("08.in_flight_1f1b", my_prediction_in_flight, [r["in_flight_peak"] for r in stages])
print("the schedules' most in flight at once (simulated), GPipe / 调度给出的同时在途最多（模拟），GPipe:",
      max_in_flight(schedule("gpipe", 4, 4)), "; 1F1B:", max_in_flight(schedule("1f1b", 4, 4)))
print("every stage's gradients equal the single process's / 每个阶段的梯度与单进程一致:", same_grads)

# %% [markdown]
# Below, the measured timeline (right) beside the ideal one (left). Real actions
# have unequal lengths — the last stage also computes the head and the loss, and
# four processes share the cores of your machine — so the measured bubble is not
# exactly the formula's. This cell's numbers change from run to run.
#
# 下面是实测的时间线（右）与理想时间线（左）的对照。真实的动作长短不一——最后一个阶段还要计算输出头
# 和损失，而且四个进程共用你机器上的 CPU 核心——所以实测的气泡不会正好等于公式的值。这个单元格的数字
# 每次运行都会变。

# %%
# NBVAL_IGNORE_OUTPUT
comparison = TimelineComparison([r["timeline"] for r in stages], schedule="1f1b", micro_batches=4)
display(comparison)
for r in stages:
    print(f"stage {r['stage']}: measured bubble {r['bubble_fraction']:.2f}, "
          f"formula {ideal_bubble_fraction(4, 4)} = {float(ideal_bubble_fraction(4, 4)):.2f}"
          f" / 阶段 {r['stage']}：实测气泡 {r['bubble_fraction']:.2f}，公式 {float(ideal_bubble_fraction(4, 4)):.2f}")

# %% [markdown]
# ### Interleaved, for real / 交错调度的真实运行
#
# The same small GPT on 2 ranks with v = 2 chunks each: the 4 blocks become 4
# virtual stages of one block. Rank 0 holds virtual stages 0 (the embeddings and
# block 0) and 2 (block 2), rank 1 holds 1 (block 1) and 3 (block 3, the head and
# the loss), so every micro-batch goes round the two ranks twice. Actions are
# named by virtual stage: `2F1` is rank 0's second chunk, forward, micro-batch 1.
#
# 同样的小 GPT 在 2 个 rank 上运行，每个 rank v = 2 个模型块：4 个 block 成为 4 个各含一个 block 的虚拟阶段。
# rank 0 持有虚拟阶段 0（嵌入层和 block 0）和 2（block 2），rank 1 持有 1（block 1）和 3（block 3、输出头和损失），
# 因此每个微批次要绕两个 rank 走两圈。动作按虚拟阶段命名：`2F1` 是 rank 0 的第二个模型块对微批次 1 的前向。

# %%
interleaved_ranks = run(pp_lesson.pipeline_step, 2, schedule="interleaved", virtual_stages=2, micro_batches=4,
                        batch_size=8)
for r in interleaved_ranks:
    print(f"rank {r['stage']}: blocks {r['blocks']}; actions / 动作 {' '.join(r['actions'])}")
print("same loss and gradients as one process / 损失和梯度与单进程一致:",
      all(abs(r["loss"] - single) < 1e-5 and r["grad_diff"] < 1e-5 for r in interleaved_ranks))
print("(chunk, micro-batch) pairs held at most / 最多同时持有的（模型块, 微批次）:",
      [r["in_flight_peak"] for r in interleaved_ranks], "; the schedule's / 调度给出的:",
      max_in_flight(schedule("interleaved", 2, 4, 2)))

# %% [markdown]
# The same picture as above, one row per rank: each action sits on the rank that ran it, and a darker
# box is that rank's second chunk (hover a box for its rank, chunk and virtual stage). Every micro-batch
# crosses from rank 1 back to rank 0 halfway through its forward, and from rank 0 to rank 1 halfway
# through its backward.
#
# 和上面一样的图，每个 rank 一行：每个动作画在运行它的 rank 上，颜色较深的方块属于该 rank 的第二个模型块
# （把鼠标移到方块上可以看到它的 rank、模型块和虚拟阶段）。每个微批次在前向走到一半时从 rank 1 回到 rank 0，
# 反向走到一半时从 rank 0 回到 rank 1。

# %%
# NBVAL_IGNORE_OUTPUT
display(TimelineComparison([r["timeline"] for r in interleaved_ranks], schedule="interleaved", micro_batches=4,
                           virtual_stages=2))

# %% [markdown]
# ### Where the stages wait / 各阶段在哪里等待
#
# The same layout as a training run: `dtlab.train(TrainConfig(pp=4, micro_batches=4))`.
# Its tracer times every send and receive; a stage **blocked** in a receive is
# waiting for its neighbour, which is the bubble seen from that stage (hover a
# red bar: `recv.forward` waits for an activation, `recv.backward` for a
# gradient). Sends are posted without waiting, so they show as communication
# **in flight** (the thin bars) while the stage computes.
#
# **Predict:** per step, how many activations does stage 0 send forward, and how
# many gradients does it receive back? And the last stage?
#
# 同样的布局作为一次训练运行：`dtlab.train(TrainConfig(pp=4, micro_batches=4))`。它的追踪器记录每一次
# 发送和接收的时间；**阻塞**在接收上的阶段是在等它的邻居，这就是从该阶段看到的气泡（鼠标悬停在红色条
# 上：`recv.forward` 在等激活值，`recv.backward` 在等梯度）。发送不等待就发出，所以在阶段计算时显示为
# **进行中** 的通信（细条）。
#
# **预测：** 每一步里，阶段 0 向前发送多少个激活值、收回多少个梯度？最后一个阶段呢？

# %%
# ← your prediction / 你的预测: stage 0 sends activations and receives gradients; stage 3 receives activations
#   and sends gradients / 阶段 0 发送激活、接收梯度；阶段 3 接收激活、发送梯度
my_prediction_messages = None  # {0: {"send.forward": n, "recv.backward": n}, 3: {"recv.forward": n, "send.backward": n}}

trained = dtlab.train(TrainConfig(pp=4, micro_batches=4, steps=3, seed=0)).wait()
messages = {r["pp"]: {kind: c["count"] for kind, c in sorted(r["comm"].items()) if kind.startswith(("send", "recv"))}
            for r in trained.records[-1]["ranks"]}
for stage, counts in sorted(messages.items()):
    print(f"stage {stage} / 阶段 {stage}: {counts}")
ok = check("08.messages", my_prediction_messages, {0: messages[0], 3: messages[3]})

# %%
# NBVAL_IGNORE_OUTPUT
StepTimeline(trained.records)

# %% [markdown]
# ## 5. Activation memory: GPipe versus 1F1B / 激活内存：GPipe 对比 1F1B
#
# Both schedules leave the same bubble, so why does 1F1B exist? Memory. A stage
# must keep a micro-batch's activations from its forward until its backward.
# GPipe runs all m forwards before any backward, so stage 0 holds all m at once.
# 1F1B starts backwards as early as it can, so stage s never holds more than
# p − s, however large m grows (Narayanan et al., 2021).
#
# We keep each micro-batch at 1 sequence and grow m from 4 to 8 to 16 — the
# batch grows with it — and measure stage 0's peak activation bytes.
#
# **Predict:** going from m = 4 to m = 16, by what factor does stage 0's peak
# grow under GPipe, and under 1F1B?
#
# 两种调度留下的气泡一样大，那 1F1B 为什么存在？为了内存。一个阶段必须从某个微批次的前向开始，
# 一直保存它的激活值，直到它的反向结束。GPipe 在任何反向之前先做完全部 m 次前向，所以阶段 0 要同时
# 保存全部 m 个微批次。1F1B 尽早开始反向，所以无论 m 多大，阶段 s 同时保存的都不超过 p − s 个
# （Narayanan 等，2021）。
#
# 我们让每个微批次固定为 1 条序列，把 m 从 4 增加到 8 再到 16（批次也随之变大），测量阶段 0 的
# 激活值峰值字节数。
#
# **预测：** m 从 4 变到 16 时，阶段 0 的峰值在 GPipe 下变为原来的几倍？在 1F1B 下呢？

# %%
my_prediction = None  # ← your prediction: {"gpipe": factor, "1f1b": factor} / 你的预测：{"gpipe": 倍数, "1f1b": 倍数}

peaks = run(pp_lesson.activation_peaks, 4, counts=(4, 8, 16), micro_batch_size=1)
stage0 = peaks[0]
print(f"{'m':>3} {'GPipe':>10} {'1F1B':>10}   (stage 0, one sequence per micro-batch / 阶段 0，每个微批次 1 条序列)")
for g, f in zip(stage0["gpipe"], stage0["1f1b"]):
    print(f"{g['m']:>3} {human_bytes(g['bytes']):>10} {human_bytes(f['bytes']):>10}   "
          f"in flight / 在途 {g['in_flight']:>2} vs {f['in_flight']}")
growth = {kind: stage0[kind][-1]["bytes"] / stage0[kind][0]["bytes"] for kind in ("gpipe", "1f1b")}
ok = check("08.peak_growth", my_prediction, growth)
gpipe_grows = all(a["bytes"] < b["bytes"] for a, b in zip(stage0["gpipe"], stage0["gpipe"][1:]))
one_f_one_b_flat = len({f["bytes"] for f in stage0["1f1b"]}) == 1
print("GPipe grows with m / GPipe 随 m 增长:", gpipe_grows)
print("1F1B stays flat / 1F1B 保持不变:", one_f_one_b_flat)
print("1F1B in flight per stage at m=16 / m=16 时 1F1B 每个阶段在途数:", [p["1f1b"][-1]["in_flight"] for p in peaks])


# %% [markdown]
# ## 6. Exercise: the 1F1B order / 练习：1F1B 的动作顺序
#
# Write `one_f_one_b(stage, stages, micro_batches)`: the list of actions one
# stage runs under 1F1B, as strings `"F0"`, `"B0"`, ... (forward or backward,
# then the micro-batch). Fill the pipeline with a few forwards, then alternate
# one forward and one backward, then finish the backwards. How many forwards
# fill it on stage s is for you to find. `grade` checks, for several p and m,
# that the schedule of all stages never deadlocks, that no stage holds more than
# min(p − s, m) micro-batches' activations and that the bubble is no larger than
# GPipe's; then 4 real pipeline ranks run one step of the small GPT in your
# order and compare the loss and gradients with one process.
#
# 写出 `one_f_one_b(stage, stages, micro_batches)`：一个阶段在 1F1B 下执行的动作列表，用 `"F0"`、`"B0"`
# 这样的字符串表示（前向或反向，后面是微批次编号）。先用几个前向填满流水线，然后一个前向、一个反向
# 交替进行，最后做完剩下的反向。阶段 s 需要先做几个前向，请你自己找出来。`grade` 会在几组 p 和 m 下检查：
# 所有阶段的调度不会死锁、没有阶段同时持有超过 min(p − s, m) 个微批次的激活值、气泡不比 GPipe 大；然后
# 4 个真实的流水线 rank 按你的顺序运行小 GPT 的一步，并把损失和梯度与单进程比较。

# %%
def one_f_one_b(stage, stages, micro_batches):
    # return e.g. ["F0", "F1", "B0", ...] for this stage / 返回本阶段的动作，例如 ["F0", "F1", "B0", ...]
    raise NotImplementedError  # your code here / 在这里写你的代码


solved = grade("08.one_f_one_b", one_f_one_b)

# %% [markdown]
# ## 7. Try this / 动手试试
#
# 1. In the view, set m = 1: the bubble is (p − 1)/p, and the pipeline is just
#    one rank working at a time. Then slide m up to 16 and watch it shrink.
# 2. **Task:** with p = 8 stages and m = 8 micro-batches, what is the bubble
#    fraction?
# 3. **Task:** under 1F1B with p = 4 and m = 8, how many micro-batches does
#    stage 0 hold at most? Switch the view to 1F1B and press **Step** through a
#    whole run to see it.
# 4. Megatron-LM's interleaved schedule gives each rank several smaller stages to
#    shrink the bubble further (Narayanan et al., 2021, Sec. 2.2.2). Which term of
#    (p − 1)/(m + p − 1) would it change? Choose **interleaved 1F1B** in the view
#    and move the v slider: the bubble line and the picture answer it (m must be a
#    multiple of p; the view says so if it is not).
#
# 1. 在视图中设置 m = 1：气泡是 (p − 1)/p，流水线里同一时刻只有一个 rank 在工作。再把 m 拖到 16，
#    看气泡缩小。
# 2. **任务：** p = 8 个阶段、m = 8 个微批次时，气泡占比是多少？
# 3. **任务：** 1F1B 下 p = 4、m = 8 时，阶段 0 最多持有几个微批次？把视图切换到 1F1B，按 **Step**（前进一步）
#    走完整个过程看一看。
# 4. Megatron-LM 的交错式调度让每个 rank 负责几个更小的阶段，从而进一步缩小气泡（Narayanan 等，2021，
#    第 2.2.2 节）。它会改变 (p − 1)/(m + p − 1) 中的哪一项？在视图中选择 **interleaved 1F1B**，
#    再拖动 v 滑块：气泡那一行和图会给出答案（m 必须是 p 的倍数；不是的话视图会提示）。

# %%
my_answer_bubble = None     # ← your answer: a fraction / 你的答案：一个比例
my_answer_in_flight = None  # ← your answer: an integer / 你的答案：整数

# %%
ok = check("08.try_bubble_8", None if my_answer_bubble is None else round(float(my_answer_bubble), 4),
           round(simulate(schedule("1f1b", 8, 8), b_time=2).bubble_fraction, 4), source="simulated")
ok = check("08.try_in_flight_8", my_answer_in_flight, max_in_flight(schedule("1f1b", 4, 8))[0], source="simulated")

# %% [markdown]
# ## Check / 检查
#
# The last cell repeats this lesson's results as one deterministic summary.
# 最后一个单元格把本课的结果汇总成一个确定的结论。

# %%
results = {
    "bubble 3/7 for p=4 m=4 and 3/19 for m=16, both schedules / p=4 时 m=4 气泡 3/7、m=16 气泡 3/19，两种调度相同":
        all(round(simulate(schedule(k, 4, m), b_time=2).bubble_fraction, 4) == round(float(ideal_bubble_fraction(4, m)), 4)
            for k in ("gpipe", "1f1b") for m in (4, 16))
        and (ideal_bubble_fraction(4, 4), ideal_bubble_fraction(4, 16)) == (Fraction(3, 7), Fraction(3, 19)),
    "GPipe holds m micro-batches per stage, 1F1B at most p - stage / GPipe 每个阶段持有 m 个微批次，1F1B 至多 p - stage 个":
        max_in_flight(schedule("gpipe", 4, 4)) == [4] * 4 and [r["in_flight_peak"] for r in stages] == [4, 3, 2, 1],
    "4 pipeline ranks give the single-process loss and gradients / 4 个流水线 rank 得到单进程的损失和梯度":
        same_loss and same_grads,
    "per step, m activations go forward and m gradients come back at every stage boundary"
    " / 每步在每个阶段边界上，m 份激活值向前、m 份梯度向后":
        messages[0] == {"recv.backward": 4, "send.forward": 4} and messages[3] == {"recv.forward": 4, "send.backward": 4}
        and all(messages[s] == {"recv.backward": 4, "recv.forward": 4, "send.backward": 4, "send.forward": 4}
                for s in (1, 2)),
    "stage 0's activations grow with m under GPipe, not under 1F1B / 阶段 0 的激活值在 GPipe 下随 m 增长，1F1B 下不变":
        gpipe_grows and one_f_one_b_flat and growth == {"gpipe": 4.0, "1f1b": 1.0},
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 08:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
