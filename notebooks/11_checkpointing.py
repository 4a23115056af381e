# %% [markdown]
# # Lesson 11 — Checkpointing: recompute, save and resume
# # 第 11 课 —— 检查点：重计算与断点续训
#
# **What you will see.** Two different ideas share the word "checkpoint".
# **Gradient checkpointing** (activation recomputation) keeps only a few
# activations during the forward pass and recomputes the rest during the
# backward pass: less memory, more compute (Chen et al., 2016). A **training
# checkpoint** is everything a run needs to continue after it stops: weights,
# optimizer state, position in the data, random-number generators. You will
# measure the activation bytes with and without recomputation, watch them phase
# by phase through one step, see the saving grow with depth and time the extra
# forward pass; then save a run at step 10, interrupt it, resume it, and check
# that the resumed loss curve lies *exactly* on the uninterrupted one. Then a run
# saved under ZeRO-3 on two ranks resumes under tensor parallelism (the
# checkpoint is *resharded*), and last, a damaged checkpoint is refused.
#
# **你将看到什么。** 有两个不同的概念都叫“检查点”。**梯度检查点**（gradient checkpointing，也叫
# 激活重计算）在前向传播时只保留少量激活值，其余的在反向传播时重新计算：省内存，多计算
# （Chen 等，2016）。**训练检查点**（training checkpoint）则是一次训练停下之后继续所需的全部内容：
# 权重、优化器状态、数据读到哪里、随机数生成器的状态。你会测量开启与关闭重计算时的激活值字节数，
# 逐个阶段地观察一步训练中的变化，看到节省量随深度增长，并给多出来的那次前向计时；然后在第 10 步
# 保存一次训练，打断它，再恢复它，并检查恢复后的损失曲线与不中断的曲线 *完全* 重合。接着，一次在两个
# rank 上用 ZeRO-3 保存的训练会在张量并行下恢复（检查点被 *重新分片*）。最后，一个损坏的检查点会被拒绝。

# %%
import dataclasses
import re
import shutil
import tempfile
from pathlib import Path

import torch

import dtlab
from dtlab import TrainConfig
from dtlab.state.checkpoint import latest_step, load_checkpoint, step_folder
from dtlab.config import MODEL_PRESETS
from dtlab.i18n import DtlabError
from dtlab.lab import Dashboard, check, human_bytes
from dtlab.lab.recompute_view import RecomputeView
from dtlab.course.experiments import checkpointing as ckpt_lesson
from dtlab.course.exercises import grade

# %% [markdown]
# ## 1. What backward needs / 反向传播需要什么
#
# To compute gradients, backward needs what forward computed: every matrix
# multiplication keeps its input, a softmax its output and a GELU its input
# (its derivative is a function of the input; Korthikanti et al., 2022, count
# the GeLU's input among a layer's activations). For a
# stack of transformer blocks that is every block's intermediates, held from the
# moment forward makes them until backward reaches that block. dtlab's memory
# accountant counts them (saved-tensor hooks, `dtlab/measure/memory.py`).
#
# With `recompute=True`, every block runs its forward without keeping anything
# except its input, a single (B, T, C) tensor. When backward reaches the block,
# it runs the block's forward again from that input and backpropagates through
# the fresh result (`dtlab/numerics/gradient_checkpointing.py`). This is *full* recomputation in the
# words of Korthikanti et al. (2022).
#
# **Predict:** for the small GPT (4 blocks, batch of 8 sequences of 64 tokens),
# will the peak activation bytes be lower with recompute? Will the loss curve
# change at all?
#
# 为了计算梯度，反向传播需要前向算出的东西：每个矩阵乘法要保留它的输入，softmax 要保留它的输出，
# GELU 则要保留它的输入（它的导数是输入的函数；Korthikanti 等（2022）统计一层的激活时，算的也是 GeLU 的输入）。对于一叠 Transformer block，这就是每个 block 的全部中间结果，从前向产生它们的那
# 一刻起，一直保存到反向传播到达这个 block 为止。dtlab 的内存统计会数出它们（用 saved-tensor hooks，
# 见 `dtlab/measure/memory.py`）。
#
# 设置 `recompute=True` 后，每个 block 在前向时除了自己的输入（一个 (B, T, C) 张量）什么都不保留。
# 反向传播到达这个 block 时，它从这个输入重新跑一遍前向，再对新得到的结果做反向传播
# （`dtlab/numerics/gradient_checkpointing.py`）。用 Korthikanti 等（2022）的说法，这叫 *完全* 重计算。
#
# **预测：** 对于小 GPT（4 个 block，每批 8 条、每条 64 个 token 的序列），开启重计算后激活值峰值
# 字节数会更低吗？损失曲线会有任何变化吗？

# %%
# NBVAL_IGNORE_OUTPUT
dash = Dashboard()
dash

# %%
my_prediction = None  # ← your prediction: {"fewer activation bytes": bool, "same losses": bool} / 你的预测

plain = dash.watch(dtlab.train(TrainConfig(steps=5, seed=0)), label="keep all / 全部保存")
recomputed = dash.watch(dtlab.train(TrainConfig(steps=5, seed=0, recompute=True)), label="recompute / 重计算")
act_plain = plain.records[-1]["ranks"][0]["mem"]["activations"]
act_recomputed = recomputed.records[-1]["ranks"][0]["mem"]["activations"]
print(f"activations: {act_plain:,} bytes ({human_bytes(act_plain)}) keeping everything, "
      f"{act_recomputed:,} bytes ({human_bytes(act_recomputed)}) with recompute")
print(f"激活值：全部保存 {act_plain:,} 字节，重计算 {act_recomputed:,} 字节")
print(f"recompute keeps {act_recomputed / act_plain:.0%} of it / 重计算只保留了 {act_recomputed / act_plain:.0%}")
measured_recompute = {"fewer activation bytes": act_recomputed < act_plain, "same losses": plain.losses() == recomputed.losses()}
ok_recompute = check("11.recompute", my_prediction, measured_recompute)

# %% [markdown]
# ## 2. Phase by phase / 逐个阶段地看
#
# The view measures one forward and backward of the same model twice, in this
# notebook's process, reading the memory accountant at every block boundary:
# `F0` … `F3` after each block's forward, `loss` after the head, `B3` … `B0`
# just before each block's backward, `end` after it. The line is what is held at
# that moment; the pale bar above it is the most held since the previous phase.
# Press **Step** to reveal one phase at a time; the slider changes the depth.
#
# Keeping everything, the line climbs by a whole block of intermediates at each
# F and comes down by one at each B. With recompute, it climbs only by one
# block *input* per F; during backward a bar stands above the line: the
# intermediates of the one block being recomputed, freed again before the next.
#
# **Predict:** with recompute, how many bytes does each block add to what is
# held during forward? (Its input is B × T × C = 8 × 64 × 64 numbers in fp32.)
#
# 这个视图在本 notebook 的进程里，把同一个模型的一次前向和反向各测量两遍，并在每个 block 的边界上读取
# 内存统计：`F0` … `F3` 是每个 block 前向之后，`loss` 是输出头之后，`B3` … `B0` 是每个 block 反向
# 开始之前，`end` 是反向结束之后。折线是那一刻持有的字节数；折线上方的浅色柱子是自上一个阶段以来的
# 最大值。按 **Step**（前进一步）一次显示一个阶段；滑块可以改变深度。
#
# 全部保存时，折线在每个 F 上升一整个 block 的中间结果，在每个 B 下降一个。开启重计算时，每个 F
# 只上升一个 block 的 *输入*；反向时折线上方会立起一根柱子：正在重计算的那一个 block 的中间结果，
# 在处理下一个 block 之前又被释放。
#
# **预测：** 开启重计算时，前向过程中每个 block 会让持有的字节数增加多少？（它的输入是
# B × T × C = 8 × 64 × 64 个 fp32 数。）

# %%
# NBVAL_IGNORE_OUTPUT
view = RecomputeView(layers=4)
view

# %%
my_prediction = None  # ← your prediction: bytes per block, e.g. [n, n, n] / 你的预测：每个 block 的字节数，例如 [n, n, n]

view.layers.value = 4
view.reset()
held = []
for _ in range(4):                       # F0, F1, F2, F3
    view.step()
    held.append(view.held_now())
for phase, h in zip(view.phases, held):
    print(f"after {phase}: {h['plain']:>10,} bytes keeping everything, {h['recompute']:>8,} with recompute"
          f" / {phase} 之后：全部保存 {h['plain']:,} 字节，重计算 {h['recompute']:,} 字节")
per_block = [held[i + 1]["recompute"] - held[i]["recompute"] for i in range(3)]   # F0->F1, F1->F2, F2->F3
ok_per_block = check("11.per_block", my_prediction, per_block)
same_as_trainer = (view.traces["plain"]["peak"], view.traces["recompute"]["peak"]) == (act_plain, act_recomputed)
print("the view's peaks equal the trainer's records / 视图的峰值与训练记录一致:", same_as_trainer)

# %% [markdown]
# ## 3. The saving grows with depth / 节省量随深度增长
#
# Keeping everything, the peak grows by a whole block of intermediates per
# block. With recompute it grows only by one block input per block, plus the
# intermediates of *one* block, whatever the depth. So the deeper the model, the
# larger the saving. Chen et al. (2016) go further: keeping only every √n-th
# layer's output of an n-layer network brings activation memory down to O(√n)
# for about one extra forward pass.
#
# **Predict:** does the saving (bytes without recompute minus bytes with it)
# grow with every step in depth from 1 to 2, 4 and 8 blocks? And how much does
# the recompute peak grow from 4 to 8 blocks?
#
# 全部保存时，每多一个 block，峰值就增加一整个 block 的中间结果。开启重计算时，每多一个 block 只增加
# 一个 block 的输入，再加上 *一个* block 的中间结果（不论有多深）。所以模型越深，省下的越多。
# Chen 等（2016）更进一步：对于 n 层的网络，只保留每隔 √n 层的输出，就能把激活内存降到 O(√n)，
# 代价大约是多一次前向传播。
#
# **预测：** 深度从 1 到 2、4、8 个 block，每加深一次，节省量（不重计算的字节数减去重计算的字节数）
# 都会增长吗？从 4 个 block 到 8 个 block，重计算时的峰值会增加多少？

# %%
my_prediction = None  # ← your prediction: {"saving grows with depth": bool, "recompute peak, 4 -> 8 blocks": bytes} / 你的预测

sweep = ckpt_lesson.depth_sweep(layers=(1, 2, 4, 8))
print(f"{'blocks':>6} {'keep all':>12} {'recompute':>12} {'saved':>12}   (block 数 / 全部保存 / 重计算 / 节省)")
for row in sweep:
    print(f"{row['layers']:>6} {human_bytes(row['plain']):>12} {human_bytes(row['recompute']):>12} {human_bytes(row['saved']):>12}")
by_depth = {row["layers"]: row for row in sweep}
measured_depth = {"saving grows with depth": all(a["saved"] < b["saved"] for a, b in zip(sweep, sweep[1:])),
                  "recompute peak, 4 -> 8 blocks": by_depth[8]["recompute"] - by_depth[4]["recompute"]}
ok_depth = check("11.depth", my_prediction, measured_depth)
same_gradients = ckpt_lesson.same_gradients(dataclasses.replace(MODEL_PRESETS["small"], n_layer=8))
print("recompute gives exactly the same gradients / 重计算得到完全相同的梯度:", same_gradients)

# %% [markdown]
# ## 4. The price: one more forward / 代价：多一次前向
#
# With recompute, backward runs every block's forward once more, just before
# that block's backward. Count it (deterministic, unlike a time): a forward hook
# on each block counts how many block forwards one step runs. In FLOPs, with a
# forward costing 1 and a backward about 2 (it computes two gradients per
# matmul), a step goes from 1 + 2 = 3 units to 1 + 1 + 2 = 4: a third more
# compute. Korthikanti et al. (2022) show that recomputing only the attention
# part that is large to store and cheap to compute (*selective* recomputation)
# keeps most of the saving for a few percent of the cost; `dtlab plan
# --recompute selective` models it.
#
# **Predict** the block forwards per step for 4 and 8 blocks, without and with
# recompute, and the compute ratio (with over without, 2 decimals).
#
# 开启重计算时，反向传播会在每个 block 的反向之前把该 block 的前向再跑一遍。数一数（这是确定的，不像时间）：
# 每个 block 上的前向钩子会统计一步里运行了多少次 block 前向。以 FLOPs 计，前向算 1、反向约为 2（每个矩阵乘法
# 要算两个梯度），一步从 1 + 2 = 3 份变成 1 + 1 + 2 = 4 份：计算量多三分之一。Korthikanti 等（2022）指出，只
# 重计算注意力中那些存起来很大、算起来便宜的部分（*选择性* 重计算），就能以几个百分点的代价保住大部分节省；
# `dtlab plan --recompute selective` 对此建模。
#
# **预测：** 4 个和 8 个 block 时，不重计算与重计算每步各运行多少次 block 前向？计算量之比（重计算比不重计算，
# 保留 2 位小数）是多少？

# %%
my_prediction_passes = None  # ← your prediction: {4: {"keep all": n, "recompute": n}, 8: {...}} / 你的预测
my_prediction_ratio = None   # ← your prediction: a ratio / 你的预测：一个比值

passes = {}
for n in (4, 8):
    cfg = dataclasses.replace(MODEL_PRESETS["small"], n_layer=n)
    passes[n] = {"keep all": ckpt_lesson.forward_passes(cfg, recompute=False),
                 "recompute": ckpt_lesson.forward_passes(cfg, recompute=True)}
ok = check("11.forward_passes", my_prediction_passes, passes)
# A formula, not a measurement: assumed costs (a backward is about two forwards), and one
# extra forward per block with recompute, as the counts above show.
# 这是公式而不是测量：假定的代价（反向约为两次前向），重计算时每个 block 多一次前向（上面的计数证实了这一点）。
FORWARD, BACKWARD = 1, 2
flops_ratio = round((FORWARD + FORWARD + BACKWARD) / (FORWARD + BACKWARD), 2)
ok = check("11.flops_ratio", my_prediction_ratio, flops_ratio, source="formula")

# %% [markdown]
# Now the time: the fastest of three steps each way on this machine (a timing:
# it changes from run to run). The 4/3 counts the blocks only: the embedding,
# the head, the loss and the optimizer are not recomputed, so the whole step
# grows by less than a third. On top of that the ratio varies, and may land on
# either side: on a CPU the small GPT's backward is not exactly two forwards, the recomputed
# forward allocates its activations again just when backward is running, and
# the recompute machinery itself (saving inputs, re-entering autograd) costs
# time that the FLOP count does not see, more so on a small model and a busy
# machine. On a GPU running a large model the measured overhead comes close to
# the FLOP ratio (Chen et al., 2016, report that one extra forward adds about
# 30% to the running time).
#
# 再看时间：在这台机器上两种方式各跑三步，取最快的一步（这是计时，每次运行都会变）。4/3 只算了各个 block：
# 嵌入、输出头、损失和优化器都不重计算，所以整步增加得不到三分之一。此外比值还会波动，可能落在任何一边：在 CPU 上，小 GPT 的反向并不正好是两次前向；重计算的前向恰好在反向运行时重新分配激活值；重计算机制
# 本身（保存输入、重新进入 autograd）也要花时间，而 FLOPs 计数看不到这些，模型越小、机器越忙，这部分越明显。
# 在 GPU 上运行大模型时，实测开销会接近 FLOPs 之比（Chen 等，2016，报告多一次前向约增加 30% 的运行时间）。

# %%
# NBVAL_IGNORE_OUTPUT
for n in (4, 8):
    cfg = dataclasses.replace(MODEL_PRESETS["small"], n_layer=n)
    t_plain = ckpt_lesson.step_seconds(cfg, recompute=False)
    t_recompute = ckpt_lesson.step_seconds(cfg, recompute=True)
    print(f"{n} blocks: {t_plain * 1e3:.1f} ms keeping everything, {t_recompute * 1e3:.1f} ms with recompute "
          f"(x{t_recompute / t_plain:.2f}; FLOPs x{flops_ratio})")
    print(f"{n} 个 block：全部保存 {t_plain * 1e3:.1f} 毫秒，重计算 {t_recompute * 1e3:.1f} 毫秒"
          f"（x{t_recompute / t_plain:.2f}；FLOPs x{flops_ratio}）")

# %% [markdown]
# ## 5. Save, interrupt, resume / 保存、中断、恢复
#
# A training checkpoint must hold everything the next step depends on: the
# weights, Adam's moments and step count, the loss scaler, the position in the
# data and the random-number generators. The learning rate needs no saving: it is
# a function of the step. dtlab writes one file per rank plus a manifest
# (`dtlab/state/checkpoint/`; on checkpoints that are frequent and consistent, see
# CheckFreq, Mohan et al., 2021), with three rules:
#
# * each file is written under a temporary name in the same folder, flushed
#   and `os.fsync`ed to disk, then renamed over the target with `os.replace`: a
#   crash leaves the old file or the new one, never half of one;
# * the manifest, with every file's size and sha256, is written last: a folder
#   without it is an unfinished save and is ignored;
# * loading verifies sizes and hashes first, and unpickles with
#   `weights_only=True`, which never runs code from the file.
#
# The experiment: an uninterrupted run of 20 steps; then the same run, saving
# every 10 steps, which we interrupt with `run.stop()` as soon as step 10 has
# arrived (the ranks stop at the first step boundary after the request reaches
# them, usually a step or two later: well before step 20, where the run's last
# save would come); then a third run that resumes from what the second one
# saved. A checkpoint folder is named by the number of steps done, eight digits:
# `step00000010` holds the state after 10 steps, and a run resumed from it
# starts at step 10.
#
# **Predict:** which step folders are on disk after the interruption (a list of
# names, e.g. `["step00000005"]`)? Will the
# resumed losses of steps 10 to 19 equal the uninterrupted ones *exactly*, to
# the last bit?
#
# 训练检查点必须包含下一步所依赖的一切：权重、Adam 的动量和步数计数、损失缩放器、数据读到的位置以及
# 随机数生成器。学习率不需要保存：它只是步数的函数。dtlab 为每个 rank 写一个文件，外加一个清单
# （`dtlab/state/checkpoint/`；关于如何频繁而一致地保存检查点，可参考 CheckFreq，Mohan 等，2021），遵循三条规则：
#
# * 每个文件先在同一文件夹里以临时文件名写入，flush 并用 `os.fsync` 刷到磁盘，再用 `os.replace` 改名覆盖
#   目标：崩溃时留下的要么是旧文件，要么是新文件，绝不会是半个文件；
# * 清单记录每个文件的大小和 sha256，最后才写：没有清单的文件夹是一次没完成的保存，会被忽略；
# * 加载时先校验大小和哈希，再用 `weights_only=True` 反序列化，绝不会执行文件里的代码。
#
# 实验：先不中断地跑 20 步；再把同样的训练每 10 步保存一次，一收到第 10 步就用 `run.stop()` 打断它
# （各个 rank 在收到请求之后的第一个 step 边界停下，通常晚一两步：远在第 20 步之前，那里才会有这次运行的
# 最后一次保存）；最后第三次运行从第二次保存的内容恢复。检查点文件夹以完成的步数命名，八位数字：`step00000010`
# 保存的是 10 步之后的状态，从它恢复的运行从第 10 步开始。
#
# **预测：** 中断之后磁盘上有哪些 step 文件夹（写成名字的列表，例如 `["step00000005"]`）？恢复后第 10 到 19 步的损失会和不中断时的 *完全* 相等，
# 连最后一位都一样吗？

# %%
# NBVAL_IGNORE_OUTPUT
checkpoints = tempfile.mkdtemp(prefix="dtlab-lesson11-")   # removed at the end of the lesson / 本课结束时删除
run_dash = Dashboard()
run_dash

# %%
my_prediction = None  # ← your prediction: {"folders on disk": [names], "resumed losses equal exactly": bool} / 你的预测

full = run_dash.watch(dtlab.train(TrainConfig(steps=20, seed=0)), label="uninterrupted / 不中断")

interrupted = dtlab.train(TrainConfig(steps=20, seed=0, save=checkpoints, save_every=10))
entry = run_dash.add_run("interrupted / 被中断")
for record in interrupted:               # draw it live, and pull the plug after step 10
    run_dash.push(entry, record)
    if record["step"] == 10:
        interrupted.stop()
run_dash.push(entry, None, force=True)

folders = sorted(p.name for p in Path(checkpoints).iterdir())
print("stopped early / 提前停止:", interrupted.summary["stopped_early"])
print("on disk / 磁盘上:", folders, "containing / 包含:", sorted(p.name for p in (Path(checkpoints) / folders[0]).iterdir()))
print("latest committed step / 最新的已提交步:", latest_step(checkpoints))

resumed = run_dash.watch(dtlab.train(TrainConfig(steps=20, seed=0, resume=checkpoints)), label="resumed / 恢复")
print("resumed run starts at step / 恢复的运行从这一步开始:", resumed.records[0]["step"])
measured_resume = {"folders on disk": folders, "resumed losses equal exactly": resumed.losses() == full.losses()[10:]}
ok_resume = check("11.resume", my_prediction, measured_resume)
same_before = interrupted.losses() == full.losses()[:len(interrupted.losses())]
print("the interrupted run matched too, up to where it stopped / 被中断的运行在停下之前也完全一致:", same_before)

# %% [markdown]
# On the loss plot the resumed curve (steps 10 to 19) lies exactly on the
# uninterrupted one. Exact, not approximately: the same weights, the same Adam
# state and the same batches give the same floating-point operations in the same
# order.
#
# 在损失图上，恢复后的曲线（第 10 到 19 步）与不中断的曲线完全重合。是完全重合，而不是大致重合：
# 相同的权重、相同的 Adam 状态、相同的批次，意味着按相同顺序执行相同的浮点运算。
#
# ## 6. Resume on another layout / 换一种布局恢复
#
# A checkpoint is written by a layout. Under ZeRO-3 on two ranks each rank holds
# half of every block's flat buffer of parameters (and of Adam's moments); under
# tensor parallelism on two ranks each holds half of each matrix's rows or
# columns. To resume one as the other, dtlab saves what PyTorch's Distributed
# Checkpoint saves: every piece with its **place in the whole tensor**, its
# name, global shape, the box a tensor-parallel rank holds (offsets and sizes)
# and the flat range of that box ZeRO cut (`start`, `stop`). A rank of the new
# layout gathers the whole tensors its own parameters overlap and slices out
# its part (`dtlab/state/checkpoint/reshard.py`). The weights come from the
# data-parallel optimizer's `training_state()`, because under ZeRO-3 the model
# holds none of its own between steps: its shards are the optimizer's
# parameters.
#
# What follows along: weights, Adam's moments and step count, the loss scaler,
# the data position, the spike detector's recent losses and its rollback
# snapshot. The random-number generators follow by rank, and on another layout
# every rank takes rank 0's (nothing in a step draws from them: dropout is 0).
# What cannot follow is a different *data order*: every layout reads the same
# global batch at a step, split among its data-parallel ranks, so the layout
# may change, but another `seed` or `batch_size` would continue on other
# batches without a word. dtlab refuses that before any rank starts.
#
# The experiment: 20 steps under DP 2 + ZeRO-3 saving at step 10; then a run
# that resumes from the step-10 save under TP 2 and saves again at step 20.
# Below, the pieces of one weight, `blocks.0.mlp.fc.weight` (256 × 64), as each
# layout wrote them.
#
# **Predict:** resumed under TP 2, do the losses of steps 10 to 19 equal
# ZeRO-3's *exactly*, or only within fp32 rounding (the two layouts add the
# same numbers in different orders)? And is a resume with `seed=1` refused?
#
# 检查点是由某种布局写出的。在两个 rank 上用 ZeRO-3 时，每个 rank 持有每个 block 的扁平参数缓冲区
# （以及 Adam 的动量）的一半；在两个 rank 上用张量并行时，每个 rank 持有每个矩阵的一半行或一半列。要把
# 一种布局的检查点在另一种布局上恢复，dtlab 保存的正是 PyTorch 的 Distributed Checkpoint 所保存的：每一片
# 都带着它 **在完整张量中的位置**，即张量名、全局形状、张量并行 rank 持有的矩形块（offsets 与 sizes），
# 以及 ZeRO 切出的该矩形块的扁平区间（`start`、`stop`）。新布局的每个 rank 拼出自己的参数所覆盖的完整
# 张量，再切出属于自己的部分（`dtlab/state/checkpoint/reshard.py`）。权重来自数据并行优化器的
# `training_state()`，因为在 ZeRO-3 下，模型在两步之间自己不持有任何权重：它的分片是优化器的参数。
#
# 随之恢复的有：权重、Adam 的动量和步数、损失缩放器、数据位置、尖峰检测器最近的损失及其回滚快照。
# 随机数生成器按 rank 恢复，换布局时每个 rank 都取 rank 0 的（训练步不会用到它们：dropout 为 0）。
# 不能随之恢复的是不同的 *数据顺序*：每种布局在同一步读到的是同一个全局批次，再分给各数据并行 rank，
# 所以布局可以变；但换一个 `seed` 或 `batch_size` 就会悄无声息地在别的批次上继续。dtlab 会在任何 rank
# 启动之前拒绝它。
#
# 实验：在 DP 2 + ZeRO-3 下训练 20 步，第 10 步保存；然后从第 10 步的保存处以 TP 2 恢复，并在第 20 步
# 再保存一次。下面列出一个权重 `blocks.0.mlp.fc.weight`（256 × 64）在两种布局下各自写出的片。
#
# **预测：** 以 TP 2 恢复后，第 10 到 19 步的损失与 ZeRO-3 的 *完全* 相等，还是只在 fp32 舍入误差之内
# 相等（两种布局以不同的顺序把相同的数加起来）？用 `seed=1` 恢复会被拒绝吗？

# %%
my_prediction_equal = None     # "exactly" or "within rounding" / "完全相等" 或 "舍入误差之内"（半角引号）
my_prediction_refused = None   # True or False / True 或 False

# %%
# NBVAL_IGNORE_OUTPUT
layouts_dir = tempfile.mkdtemp(prefix="dtlab-lesson11-layouts-")   # removed below / 下面会删除
zero3 = TrainConfig(steps=20, seed=0, dp=2, zero=3, save=str(Path(layouts_dir) / "zero3"), save_every=10)
layout_dash = Dashboard()
layout_dash

# %%
on_zero3 = layout_dash.watch(dtlab.train(zero3), label="DP 2 + ZeRO-3")
resume_from = step_folder(zero3.save, 10)
on_tp = layout_dash.watch(dtlab.train(TrainConfig(steps=20, seed=0, tp=2, resume=str(resume_from),
                                                  save=str(Path(layouts_dir) / "tp2"), save_every=10)),
                          label="resumed under TP 2 / 以 TP 2 恢复")

def pieces_of(folder, name):
    rows = []
    for rank_file in sorted(Path(folder).glob("rank*.pt")):
        payload = torch.load(rank_file, weights_only=True)
        rows += [(payload["rank"], p["offsets"], p["sizes"], p["start"], p["stop"], sorted(p["tensors"]))
                 for p in payload["pieces"] if p["name"] == name]
    return rows

for label, folder in (("ZeRO-3, step 10", resume_from), ("TP 2, step 20", step_folder(Path(layouts_dir) / "tp2", 20))):
    print(label)
    for rank, offsets, sizes, start, stop, keys in pieces_of(folder, "blocks.0.mlp.fc.weight"):
        print(f"  rank {rank}: box at {offsets} of size {sizes}, elements {start}..{stop} of it: {', '.join(keys)}")
worst = max(abs(a - b) / b for a, b in zip(on_tp.losses(), on_zero3.losses()[10:]))
print("steps 10-19 equal exactly / 第 10-19 步完全相等:", on_tp.losses() == on_zero3.losses()[10:])
print("largest relative difference below 1e-5 / 最大相对差小于 1e-5:", worst < 1e-5)
measured_equal = "exactly" if on_tp.losses() == on_zero3.losses()[10:] else (
    "within rounding" if worst < 1e-5 else "different")
try:
    dtlab.train(TrainConfig(steps=20, seed=1, tp=2, resume=str(resume_from)))
    measured_refused = False
except DtlabError as error:
    measured_refused = True
    print(str(error).replace(layouts_dir, "<checkpoints>"))
ok_equal = check("11.other_layout", my_prediction_equal, measured_equal)
ok_refused = check("11.other_seed", my_prediction_refused, measured_refused)
shutil.rmtree(layouts_dir)

# %% [markdown]
# ZeRO-3's two ranks each wrote a flat range of the whole weight (the box is
# the whole tensor: no tensor parallelism), cut where the block's flat buffer
# is halved; Adam's moments and step count travel in the same piece. The TP
# ranks wrote boxes instead: rank 0 the first 128 rows (the first half of
# the MLP's hidden units), rank 1 the next 128. On the loss plot the resumed
# curve lies on ZeRO-3's, within 1e-5 relative (the check above): the same
# computation, summed in another order.
#
# ZeRO-3 的两个 rank 各写出整个权重的一段扁平区间（矩形块就是整个张量：没有张量并行），切点是该 block 的
# 扁平缓冲区的一半处；Adam 的动量和步数与权重放在同一片里。TP 的两个 rank 写出的则是矩形块：rank 0 是前
# 128 行（MLP 隐藏单元的前一半），rank 1 是后 128 行。在损失图上，恢复后的曲线与 ZeRO-3 的曲线的相对差
# 在 1e-5 以内（上面的检查）：同样的计算，只是求和顺序不同。
#
# ## 7. A damaged checkpoint is refused / 损坏的检查点会被拒绝
#
# Disks and copies fail. Flip one byte in the middle of the rank file and try to
# load it. (The folder name and the two sha256 fingerprints change from run to
# run, so they are masked in the printout.)
#
# **Predict:** is the damaged checkpoint refused?
#
# 磁盘和拷贝都会出错。把 rank 文件中间的一个字节翻转，再尝试加载它。（文件夹名和两个 sha256 指纹
# 每次运行都不一样，所以打印时把它们遮住了。）
#
# **预测：** 损坏的检查点会被拒绝吗？

# %%
my_prediction = None  # ← your prediction: True or False / 你的预测：True 或 False

rank_file = Path(checkpoints) / "step00000010" / "rank00000.pt"
data = bytearray(rank_file.read_bytes())
data[len(data) // 2] ^= 0xFF                      # one flipped byte / 翻转一个字节
rank_file.write_bytes(bytes(data))

def masked(text):
    return re.sub(r"[0-9a-f]{16}\.\.\.", "<sha256>", text.replace(checkpoints, "<checkpoints>"))

layout = {"dp": 1, "tp": 1, "pp": 1, "zero": 0}
try:
    load_checkpoint(checkpoints, expected_layout=layout)
    refused = False
except DtlabError as error:
    refused = True
    print(masked(str(error).splitlines()[0]))
    print(masked(str(error).splitlines()[1]))
ok_refused = check("11.refused", my_prediction, refused)

# %% [markdown]
# `dtlab.train(TrainConfig(..., resume=...))` checks the checkpoint the same way
# before it starts any rank, so a run asked to resume from this folder is
# refused at once, with the same message, and the warm pool stays warm.
#
# `dtlab.train(TrainConfig(..., resume=...))` 在启动任何 rank 之前就以同样的方式检查检查点，所以让一次
# 运行从这个文件夹恢复时，它会立刻被拒绝，给出同样的信息，预热的进程池也保持预热。

# %%
try:
    dtlab.train(TrainConfig(steps=20, seed=0, resume=checkpoints)).wait()
    trainer_refused = False
except DtlabError as error:
    trainer_refused = "was altered" in str(error) and "被改动过" in str(error)
print("the trainer refuses to resume from it / 训练拒绝从它恢复:", trainer_refused)

shutil.rmtree(checkpoints)
print("temporary checkpoints removed / 临时检查点已删除:", not Path(checkpoints).exists())

# %% [markdown]
# ## 8. Exercise: an atomic save / 练习：原子保存
#
# Write `atomic_save(data, path)`: afterwards `path` holds the bytes `data`; and
# if anything fails on the way (a full disk, a crash), `path` holds its old
# content or `data`, never a part of it, and nothing is left behind. Use `open`
# and `os` (the grader gives your function its own versions of both: real files,
# with a log, on a disk that can fail half-way through a write). The rules of
# section 5 are the answer: a temporary file in the target's folder, written,
# flushed and `os.fsync`ed, then `os.replace`d over the target; on failure,
# remove the temporary file. `grade` runs it
# on 2 real ranks, each saving its own rank file, once normally and once with a
# write that fails, and compares with what dtlab's writer leaves.
#
# 写出 `atomic_save(data, path)`：执行之后 `path` 中是字节串 `data`；而如果中途出了问题（磁盘满、崩溃），`path`
# 要么还是原来的内容，要么是 `data`，绝不能是其中一部分，而且不留下任何残余文件。请使用 `open` 和 `os`（评分器
# 会给你的函数提供它们的另一个版本：真实的文件、带日志，而且磁盘可能在写到一半时出错）。第 5 节的规则就是
# 答案：在目标所在的文件夹里建临时文件，写入、flush 并 `os.fsync`，再用 `os.replace` 覆盖目标；失败时删掉临时文件。`grade` 在 2 个真实
# rank 上运行它，每个 rank 保存自己的 rank 文件，一次正常保存、一次写入失败，并与 dtlab 自己的写入方式留下的
# 结果比较。

# %%
import os


def atomic_save(data, path):
    # data: bytes; path: the file to replace / data：字节串；path：要替换的文件
    raise NotImplementedError  # your code here / 在这里写你的代码


solved = grade("11.atomic_save", atomic_save)

# %% [markdown]
# ## 9. Try this / 动手试试
#
# 1. Slide the view's depth to 8 and step through it: the recompute line still
#    has one bar, of the same height, above it during backward.
# 2. **Task:** interrupt at another step: save every 5 steps and stop after the
#    record of step 14. At which step does the resumed run start? The cell runs
#    it (and checks that the curve is still exact).
# 3. Save under `pp=4, micro_batches=4` and resume in one process, or under
#    `dp=2, tp=2, pp=2` and resume under `dp=4, zero=1`: the curve continues
#    within rounding. Then resume with `batch_size=16`: why is it refused?
#
# 1. 把视图的深度拖到 8，再一步步走一遍：反向时重计算的折线上方仍然只有一根柱子，高度也一样。
# 2. **任务：** 换一个时刻打断：每 5 步保存一次，在第 14 步的记录之后停止。恢复的运行从哪一步开始？单元格会运行
#    它（并检查曲线是否仍然完全一致）。
# 3. 用 `pp=4, micro_batches=4` 保存、在单进程中恢复，或用 `dp=2, tp=2, pp=2` 保存、用 `dp=4, zero=1`
#    恢复：曲线在舍入误差之内继续。再用 `batch_size=16` 恢复：为什么会被拒绝？

# %%
my_answer_resume = None  # ← your answer: a step / 你的答案：步数

# %%
again = tempfile.mkdtemp(prefix="dtlab-lesson11-")
stopped = dtlab.train(TrainConfig(steps=20, seed=0, save=again, save_every=5))
for record in stopped:
    if record["step"] == 14:
        stopped.stop()
restarted = dtlab.train(TrainConfig(steps=20, seed=0, resume=again)).wait()
ok = check("11.try_resume_14", my_answer_resume, restarted.records[0]["step"])
start = restarted.records[0]["step"]
print("the curve is still exact / 曲线仍然完全一致:", restarted.losses() == full.losses()[start:])
shutil.rmtree(again)

# %% [markdown]
# ## Check / 检查
#
# The last cell repeats this lesson's results as one deterministic summary.
# 最后一个单元格把本课的结果汇总成一个确定的结论。

# %%
results = {
    "recompute: fewer activation bytes, the same losses / 重计算：激活值更少，损失相同": all(measured_recompute.values()),
    "with recompute each block keeps only its input (131,072 bytes) / 重计算时每个 block 只保留输入（131,072 字节）":
        per_block == [8 * 64 * 64 * 4] * 3 and same_as_trainer,
    "the saving grows with depth; gradients unchanged / 节省量随深度增长；梯度不变": measured_depth == {
        "saving grows with depth": True, "recompute peak, 4 -> 8 blocks": 4 * 8 * 64 * 64 * 4} and same_gradients,
    "recompute runs every block's forward twice: 4/3 of the FLOPs / 重计算让每个 block 的前向跑两遍：FLOPs 为 4/3":
        passes == {4: {"keep all": 4, "recompute": 8}, 8: {"keep all": 8, "recompute": 16}} and flops_ratio == 1.33,
    "resumed from step 10, the curve is exactly the uninterrupted one / 从第 10 步恢复，曲线与不中断时完全一致":
        measured_resume == {"folders on disk": ["step00000010"], "resumed losses equal exactly": True} and same_before,
    "resumed under TP 2 from ZeRO-3's save: the same curve within rounding; another seed refused"
    " / 用 TP 2 从 ZeRO-3 的存档恢复：曲线在舍入误差内相同；另一个种子被拒绝":
        measured_equal == "within rounding" and measured_refused,
    "a damaged checkpoint is refused, by the loader and the trainer / 损坏的检查点会被加载器和训练器拒绝":
        refused and trainer_refused,
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 11:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
