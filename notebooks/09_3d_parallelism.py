# %% [markdown]
# # Lesson 09 — 3D parallelism
# # 第 09 课 —— 3D 并行
#
# **What you will see.** Data, tensor and pipeline parallelism combine on one
# grid of ranks: DP × TP × PP = world size. You will work out which ranks share
# each kind of group, then move three sliders and watch a real job with that
# layout train the small GPT on up to 8 ranks — memory per rank and throughput
# change with the layout; whether the loss does is one of your predictions.
#
# **你将看到什么。** 数据并行、张量并行和流水线并行可以在同一张 rank 网格上组合：DP × TP × PP = world size。
# 你会先推算哪些 rank 同属一个通信组，然后拖动三个滑块，看一个真实的、采用该布局的任务在最多 8 个
# rank 上训练小 GPT——每个 rank 的内存和吞吐量随布局变化；损失会不会变，是你要做的预测之一。

# %%
import dtlab
from dtlab import TrainConfig
from dtlab.config import MODEL_PRESETS
from dtlab.grid import Grid
from dtlab.lab import ControlPanel, check, human_bytes
from dtlab.lab.timeline import StepTimeline
from dtlab.planner import params_per_rank
from dtlab.reference import reference_train
from dtlab.course.exercises import grade

# %% [markdown]
# ## 1. The grid / rank 网格
#
# dtlab orders the axes as Megatron-LM does (Narayanan et al., 2021):
# **TP innermost**, then DP, then PP:
# `rank = (pp_index × dp + dp_index) × tp + tp_index`. Tensor parallelism all-reduces
# twice per block forward and twice backward, so its ranks must be neighbours on
# the fastest links (NVLink, inside one machine); pipeline parallelism only sends
# one activation per micro-batch to the next stage, so it can cross machines.
#
# **Predict:** with DP = 2, TP = 2, PP = 2 (8 ranks), which ranks are in rank 5's
# TP group, DP group and PP group?
#
# dtlab 按 Megatron-LM 的方式排列各个维度（Narayanan 等，2021）：**TP 在最内层**，
# 其次是 DP，最外层是 PP：`rank = (pp_index × dp + dp_index) × tp + tp_index`。张量并行在每个 block
# 的前向和反向各做两次 all-reduce，所以它的 rank 必须是通过最快链路相连的邻居（同一台机器内的 NVLink）；
# 流水线并行每个微批次只向下一阶段发送一次激活值，因此可以跨机器。
#
# **预测：** DP = 2、TP = 2、PP = 2（共 8 个 rank）时，rank 5 所在的 TP 组、DP 组和 PP 组分别包含哪些 rank？

# %%
my_prediction = None  # ← your prediction: {"tp": [ranks], "dp": [ranks], "pp": [ranks]} / 你的预测

grid = Grid(dp=2, tp=2, pp=2)
for rank in range(8):
    c = grid.coords(rank)
    print(f"rank {rank}: dp={c.dp} tp={c.tp} pp={c.pp}")
ok = check("09.rank5_groups", my_prediction, {axis: next(list(g) for g in grid.groups(axis) if 5 in g)
                                              for axis in ("tp", "dp", "pp")}, source="formula")

# %% [markdown]
# ## 2. Memory per rank / 每个 rank 的内存
#
# Each axis divides something different. DP divides the **batch** (each replica
# holds the whole model); TP divides each block's **weight matrices**; PP divides
# the **blocks** (stage 0 also holds the embeddings, the last stage the final
# LayerNorm and the output head).
#
# To count, you need the model (printed below): stage 0 holds the token
# embedding (vocabulary × C) and the learned position embedding (T × C), whole
# on every TP rank, and its blocks. TP splits each block's QKV and first MLP
# matrices by columns, with their biases, and the attention's output and second
# MLP matrices by rows; those two biases and both LayerNorms (a scale and a bias
# each) stay whole on every TP rank. The head is not tied to the embedding.
#
# **Predict:** in fp32, how many bytes of parameters does stage 0, TP rank 0 hold
# with TP = 2 and PP = 2? (Count it from the model: the planner's `params_per_rank` does the same.)
#
# 每个维度切分的东西不同。DP 切分 **批次**（每个副本都持有完整模型）；TP 切分每个 block 的 **权重矩阵**；
# PP 切分 **block**（第 0 阶段还持有嵌入层，最后一个阶段持有最后的 LayerNorm 和输出头）。
#
# 要数清楚，你需要模型的参数（下面打印出来了）：第 0 阶段持有词嵌入（词表大小 × C）和可学习的位置嵌入（T × C），
# 它们在每个 TP rank 上都是完整的，再加上它的各个 block。TP 把每个 block 的 QKV 矩阵和 MLP 第一层矩阵按列切分
# （连同它们的偏置），把注意力输出矩阵和 MLP 第二层矩阵按行切分；后两者的偏置以及两个 LayerNorm（各有一个缩放
# 和一个偏置）在每个 TP rank 上都是完整的。输出头不与嵌入层共享权重。
#
# **预测：** fp32 下，TP = 2、PP = 2 时，第 0 阶段、TP rank 0 持有多少字节的参数？
# （请根据模型结构自己数；规划器的 `params_per_rank` 做的是同样的事。）

# %%
print(MODEL_PRESETS["small"])
my_prediction_bytes = None  # ← your prediction: bytes, an integer / 你的预测：字节数（整数）

layout = dict(dp=2, tp=2, pp=2, micro_batches=2)
run = dtlab.train(TrainConfig(steps=20, seed=0, **layout)).wait()
ranks = sorted(run.records[-1]["ranks"], key=lambda r: r["rank"])
print(f"{'rank':>4} {'dp':>3} {'tp':>3} {'pp':>3} {'params':>12} {'activations':>12}   (参数 / 激活值，字节)")
for r in ranks:
    print(f"{r['rank']:>4} {r['dp']:>3} {r['tp']:>3} {r['pp']:>3} {r['mem']['params']:>12,} {r['mem']['activations']:>12,}")
stage0_tp0 = next(r for r in ranks if r["pp"] == 0 and r["tp"] == 0)
ok = check("09.stage0_bytes", my_prediction_bytes, stage0_tp0["mem"]["params"])

# %% [markdown]
# ## 3. Does the loss change? / 损失会变吗？
#
# However the work is divided, every layout computes the same mathematics: the
# same model, the same global batch, the same averaged gradient.
#
# **Predict:** the largest relative difference between the 2 × 2 × 2 run and one
# process, over 20 steps — below 1e-4?
#
# 无论怎样切分工作，每种布局计算的都是同样的数学：同样的模型、同样的全局批次、同样的平均梯度。
#
# **预测：** 20 步内，2 × 2 × 2 布局与单进程之间的最大相对差异会低于 1e-4 吗？

# %%
my_prediction_same = None  # ← your prediction: True or False / 你的预测：True 或 False

single = reference_train(TrainConfig(steps=20, seed=0))[0]
gap = max(abs(a - b) / b for a, b in zip(run.losses(), single))
ok = check("09.same_loss", my_prediction_same, gap < 1e-4)

# %% [markdown]
# ## 4. One step, rank by rank / 一步之内，逐个 rank 看
#
# Each rank of a 2x2x2 job talks over three groups: its TP group inside every
# block (f and g), its PP group between stages (send and receive), and its DP
# group once per step (the gradient all-reduce). The tracer (`dtlab/comm/tracer.py`)
# records every call with its group; the timeline below fills in live, one step
# at a time, as the run streams: **compute**, **blocked** in communication
# (hover: which call, which group), **idle**, and communication **in flight**
# while the rank computes (the thin bars).
#
# **Predict:** over which group does rank 0 send its `all_reduce.forward` (g),
# its `send.forward` (an activation to the next stage) and its `all_reduce` of
# the gradients?
#
# 2x2x2 任务中的每个 rank 在三个组上通信：每个 block 里在它的 TP 组上（f 与 g），阶段之间在它的 PP 组上
# （发送和接收），每步一次在它的 DP 组上（梯度全归约）。追踪器（`dtlab/comm/tracer.py`）记录每次调用及其所在的组；
# 下面的时间线随着运行的数据流入一步一步实时填充：**计算**、**阻塞**于通信（鼠标悬停：哪次调用、哪个组）、
# **空闲**，以及 rank 计算时仍在进行的通信（细条）。
#
# **预测：** rank 0 的 `all_reduce.forward`（g）、`send.forward`（发给下一阶段的激活值）和梯度的 `all_reduce`
# 分别在哪个组上进行？

# %%
# NBVAL_IGNORE_OUTPUT
timeline = StepTimeline()
timeline

# %%
my_prediction_groups = None  # ← your prediction: {"all_reduce.forward": axis, "send.forward": axis, "all_reduce": axis} / 你的预测

live = timeline.watch(dtlab.train(TrainConfig(dp=2, tp=2, pp=2, micro_batches=2, steps=5, seed=0)))
rank0 = live.records[-1]["ranks"][0]
groups = {call["kind"]: call["group"] for call in rank0["spans"]["comm"]}
CALLS = ("all_reduce.forward", "send.forward", "all_reduce")
ok = check("09.call_groups", my_prediction_groups, {kind: groups[kind] for kind in CALLS})
print("every kind of call on rank 0, by group / rank 0 上每种调用所在的组:", dict(sorted(groups.items())))

# %% [markdown]
# ## 5. Move the sliders / 拖动滑块
#
# DP, TP and PP sliders: their product is the number of ranks (at most 8). Each
# change runs a real job on the warm pool — no process start-up — with the
# single-process loss drawn dashed beside it. A layout the model cannot split
# (TP not dividing the 4 heads, more stages than blocks, a product above 8)
# is refused in the panel, in your language, before anything starts.
#
# DP、TP、PP 三个滑块的乘积就是 rank 的数量（最多 8 个）。每次改动都会在预热好的进程池上运行一个真实任务
# （没有进程启动开销），旁边用虚线画出单进程的损失。模型无法切分的布局（TP 不能整除 4 个注意力头、
# 阶段数多于 block 数、乘积超过 8）会在启动任何进程之前，在面板里用你选择的语言提示并拒绝。

# %%
# NBVAL_IGNORE_OUTPUT
panel = ControlPanel(TrainConfig(dp=2, tp=2, pp=2, micro_batches=2, steps=30),
                     show=("dp", "tp", "pp", "micro", "schedule", "steps"), reference=True)
panel


# %% [markdown]
# ## 6. Exercise: the groups of a grid / 练习：网格的分组
#
# Write `rank_groups(dp, tp, pp)`: every group of each axis, as
# `{"tp": [[...], ...], "dp": [[...], ...], "pp": [[...], ...]}`, for dtlab's
# order (TP innermost, then DP, then PP, as in section 1). `grade` compares your
# groups with dtlab's `Grid` for several layouts, then makes them real on 4
# ranks (`dist.new_group` for each of yours, at 2 × 2 × 1 and 1 × 2 × 2) and has
# every rank find its partners with an all-reduce inside its group.
#
# 写出 `rank_groups(dp, tp, pp)`：按 dtlab 的顺序（TP 在最内层，其次 DP，最外层 PP，见第 1 节）返回每个
# 维度的所有组，形如 `{"tp": [[...], ...], "dp": [[...], ...], "pp": [[...], ...]}`。`grade` 会在几种布局下
# 把你的分组与 dtlab 的 `Grid` 比较，然后在 4 个 rank 上把它们变成真实的进程组（2 × 2 × 1 和 1 × 2 × 2
# 时对你的每个组调用 `dist.new_group`），让每个 rank 在自己的组里用一次 all-reduce 找出同组的伙伴。

# %%
def rank_groups(dp, tp, pp):
    # return {"tp": [[ranks], ...], "dp": [[ranks], ...], "pp": [[ranks], ...]}
    # 返回 {"tp": [[rank], ...], "dp": [[rank], ...], "pp": [[rank], ...]}
    raise NotImplementedError  # your code here / 在这里写你的代码


solved = grade("09.rank_groups", rank_groups)

# %% [markdown]
# ## 7. Try this / 动手试试
#
# 1. **Task:** of the layouts 8 × 1 × 1, 1 × 4 × 2 and 2 × 2 × 2 (DP × TP × PP),
#    which holds the fewest parameter bytes on its largest rank? Try them with
#    the sliders, then write `"8x1x1"`, `"1x4x2"` or `"2x2x2"`. Which one has the
#    highest tokens/s on your machine (a timing)?
# 2. **Task:** 1 × 8 × 1 is refused. What is the largest TP degree the small GPT
#    allows?
# 3. With PP = 4, raise the micro-batches from 1 to 8 and watch the time per
#    rank: the idle (bubble) share shrinks. (Answer, by the formula
#    (p−1)/(m+p−1): from 3/4 at m = 1 to 3/11 at m = 8; measured here it is
#    higher, since 4 ranks on 2 cores also wait for a core.)
#
# 1. **任务：** 在 8 × 1 × 1、1 × 4 × 2 和 2 × 2 × 2（DP × TP × PP）三种布局中，哪一种最大 rank 上的参数
#    字节数最少？先用滑块试一试，再写 `"8x1x1"`、`"1x4x2"` 或 `"2x2x2"`。在你的机器上哪种每秒 token 数
#    最高（这是计时）？
# 2. **任务：** 1 × 8 × 1 会被拒绝。小 GPT 允许的最大 TP 度是多少？
# 3. PP = 4 时，把微批次从 1 调到 8，观察每个 rank 的时间：空闲（气泡）部分在缩小。（答案，按公式
#    (p−1)/(m+p−1)：从 m = 1 时的 3/4 降到 m = 8 时的 3/11；这里实测会更高，因为 2 个核上的 4 个 rank 还要等核。）

# %%
my_answer_layout = None  # ← your answer: "8x1x1", "1x4x2" or "2x2x2" / 你的答案
my_answer_max_tp = None  # ← your answer: an integer / 你的答案：整数

# %%
largest_rank = {f"{d}x{t}x{p}": max(params_per_rank("small", tp=t, pp=p, stage=s).total for s in range(p))
                for d, t, p in ((8, 1, 1), (1, 4, 2), (2, 2, 2))}
print("parameters on the largest rank / 最大 rank 上的参数:", largest_rank)
ok = check("09.try_least_memory", my_answer_layout, min(largest_rank, key=largest_rank.get), source="planner")
allowed = [t for t in (1, 2, 4, 8) if MODEL_PRESETS["small"].n_head % t == 0]
ok = check("09.try_max_tp", my_answer_max_tp, max(allowed), source="formula")

# %% [markdown]
# ## Check / 检查
#
# The last cell repeats this lesson's results as one deterministic summary.
# 最后一个单元格把本课的结果汇总成一个确定的结论。

# %%
results = {
    "rank 5's groups: TP [4, 5], DP [5, 7], PP [1, 5] / rank 5 的分组：TP [4, 5]，DP [5, 7]，PP [1, 5]":
        [next(list(g) for g in grid.groups(a) if 5 in g) for a in ("tp", "dp", "pp")] == [[4, 5], [5, 7], [1, 5]],
    "stage 0 / TP rank 0 holds the planner's parameter count / 第 0 阶段、TP rank 0 的参数数等于规划器的计数":
        stage0_tp0["mem"]["params"] == 4 * params_per_rank("small", tp=2, pp=2, stage=0).total,
    "every rank reported, each with its own coordinates / 每个 rank 都报告了自己的坐标":
        len({(r["dp"], r["tp"], r["pp"]) for r in ranks}) == 8,
    "2x2x2 gives the single-process loss / 2x2x2 得到单进程的损失": gap < 1e-4,
    "rank 0 sends g over TP, activations over PP, gradients over DP / rank 0 经 TP 发 g、经 PP 发激活值、经 DP 发梯度":
        {kind: groups[kind] for kind in CALLS} == {"all_reduce.forward": "tp", "send.forward": "pp",
                                                                 "all_reduce": "dp"},
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 09:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
