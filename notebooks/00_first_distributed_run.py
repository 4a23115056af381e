# %% [markdown]
# # Lesson 00 — Your first distributed run
# # 第 00 课 —— 你的第一次分布式运行
#
# **What you will see.** Four real processes start on your machine. Each one is a
# **rank**; together they form a **world** of size 4. They meet at a
# **rendezvous**, join one **process group**, and talk through a **backend**
# (gloo on the CPU, NCCL on GPUs). You will run one all-reduce by hand, then train
# the same small GPT on 1 replica and on 4 replicas and compare the two loss
# curves.
#
# **你将看到什么。** 你的机器上会启动四个真实的进程。每个进程是一个 **rank**（进程编号），
# 它们合起来组成大小为 4 的 **world**（world size，进程总数 = 4）。它们先在 **rendezvous**
# （进程会合）碰面，加入同一个 **process group**（进程组），再通过 **backend**
# （通信后端：CPU 上用 gloo，GPU 上用 NCCL）交换数据。你会先亲手做一次
# all-reduce，然后分别用 1 个副本和 4 个副本训练同一个小 GPT，比较两条损失曲线。

# %%
import dtlab
from dtlab import TrainConfig
from dtlab.launch import default_pool, run
from dtlab.lab import Dashboard, check, human_bytes, prediction_box
from dtlab.course.experiments import basics

# %% [markdown]
# ## 1. Start four ranks / 启动四个 rank
#
# `run(fn, 4)` starts (the first time) or reuses (every later time) four worker
# processes, joins them into a fresh process group over loopback, and calls
# `fn` on each. The first call pays for process start-up — importing torch in four
# processes — so the pool stays **warm** afterwards and later runs start in
# milliseconds.
#
# `run(fn, 4)` 第一次调用时会启动四个工作进程（之后每次都复用它们），通过本机回环地址把它们
# 组成一个新的进程组，然后在每个进程里调用 `fn`。第一次调用要付出进程启动的代价（四个进程各自
# 导入 torch），所以之后进程池会保持 **预热**，后面的运行只需几毫秒就能开始。

# %%
for who in run(basics.hello, 4):
    print(f"rank {who['rank']} of world size {who['world_size']}, backend {who['backend']}")

# %% [markdown]
# ## 2. One all-reduce / 一次 all-reduce
#
# Each rank holds one number, `rank + 1`: 1, 2, 3 and 4. An **all-reduce** with
# SUM adds everyone's tensor and leaves the total on *every* rank.
#
# **Predict first:** what will each rank hold afterwards? Write your number in the
# next cell before you run it. Every prediction cell in the course starts empty
# (`None`): the check below it tells you whether you were right, and why not.
#
# 每个 rank 持有一个数 `rank + 1`，也就是 1、2、3、4。用 SUM 做一次 **all-reduce**，
# 会把所有 rank 的张量加起来，并让 *每一个* rank 都得到这个总和。
#
# **先预测：** 运行之后，每个 rank 上的值是多少？请先在下一个单元格里写下你的答案，再运行。
# 本课程里每个预测单元格一开始都是空的（`None`）：下面的检查会告诉你是否预测正确，以及错在哪里。

# %%
my_prediction = None  # ← your prediction: one number / 你的预测：一个数

# %%
values = run(basics.all_reduce_rank_plus_one, 4)
print("every rank holds / 每个 rank 上的值:", values)
ok = check("00.all_reduce_sum", my_prediction, values[0])
assert len(set(values)) == 1, "all ranks must agree / 所有 rank 必须一致"

# %% [markdown]
# ## 3. Train on 1 replica and on 4 / 用 1 个副本和 4 个副本训练
#
# **Data parallelism** gives every rank a full copy of the model and a quarter of
# each batch. After the backward pass the ranks average their gradients with an
# all-reduce, so all four copies take exactly the same step. The global batch
# (8 sequences) is the same in both runs, only split differently.
#
# **Predict:** will the two loss curves agree to better than 1e-4 (relative) at
# every step? Write `True` or `False` in the cell below.
#
# **数据并行** 让每个 rank 拥有一份完整的模型，并只处理每个批次的四分之一。反向传播之后，
# 各个 rank 用 all-reduce 求梯度的平均，因此四份模型副本走出完全相同的一步。两次运行的全局批
# 大小都是 8 条序列，只是切分方式不同。
#
# **预测：** 两条损失曲线在每一步的相对差都会小于 1e-4 吗？请在下面的单元格里写 `True` 或 `False`。
#
# The plots below are live: they update while the ranks train.
# 下面的图是实时的：rank 训练的同时，图会不断更新。

# %%
my_prediction_same = None  # ← your prediction: True or False / 你的预测：True 或 False

# %%
# NBVAL_IGNORE_OUTPUT
dash = Dashboard()
dash

# %%
one = dash.watch(dtlab.train(TrainConfig(dp=1, steps=30, seed=0)), label="1 replica / 1 个副本")
four = dash.watch(dtlab.train(TrainConfig(dp=4, steps=30, seed=0)), label="4 replicas / 4 个副本")
gap = max(abs(a - b) / b for a, b in zip(four.losses(), one.losses()))
print(f"steps: {len(one.losses())} and {len(four.losses())}")
print("loss went down / 损失下降了:", four.losses()[-1] < four.losses()[0])
ok = check("00.same_curve", my_prediction_same, gap < 1e-4)

# %% [markdown]
# ## 4. Memory per rank / 每个 rank 的内存
#
# Data parallelism *copies* the model: every rank holds all parameters (4 bytes
# each in fp32), all gradients (4 bytes each) and Adam's two moments (4 bytes
# each, 8 the pair). Only the **activations** — what the forward pass keeps for the backward
# pass — shrink, because each rank sees a quarter of the batch.
#
# **Predict:** the small GPT has 236,928 parameters. How many bytes of parameters
# does each of the 4 ranks hold? And how many times larger are the activations of
# the single rank at dp=1 than those of one rank at dp=4? (You can also type a
# number into the box instead of the code.)
#
# 数据并行会 *复制* 模型：每个 rank 都持有全部参数（fp32 下每个 4 字节）、全部梯度（每个 4 字节）
# 以及 Adam 的两个动量（每个 4 字节，两个共 8 字节）。只有 **激活值**（前向传播为反向传播保存下来的张量）会变小，
# 因为每个 rank 只处理四分之一的批次。
#
# **预测：** 这个小 GPT 有 236,928 个参数。4 个 rank 中每个 rank 持有多少字节的参数？dp=1 时那一个
# rank 的激活值是 dp=4 时单个 rank 的多少倍？（也可以不写代码，直接在输入框里填数字。）

# %%
# NBVAL_IGNORE_OUTPUT
my_prediction_bytes = None  # ← your prediction: bytes, an integer / 你的预测：字节数（整数）
my_prediction_ratio = None  # ← your prediction: a ratio / 你的预测：一个比值
display(prediction_box("00.param_bytes"), prediction_box("00.activation_ratio"))

# %%
last = four.records[-1]
print(f"{'rank':>4} {'params':>12} {'grads':>12} {'optimizer':>12} {'activations':>12}")
for r in last["ranks"]:
    m = r["mem"]
    print(f"{r['rank']:>4} {human_bytes(m['params']):>12} {human_bytes(m['grads']):>12} "
          f"{human_bytes(m['optimizer']):>12} {human_bytes(m['activations']):>12}")
ok = check("00.param_bytes", my_prediction_bytes, last["ranks"][0]["mem"]["params"])
ratio = one.records[-1]["ranks"][0]["mem"]["activations"] / last["ranks"][0]["mem"]["activations"]
ok = check("00.activation_ratio", my_prediction_ratio, round(ratio, 2))

# %% [markdown]
# ## 5. Try this / 动手试试
#
# 1. Move the **DP degree** slider: each change starts a real run on the warm
#    pool (no start-up cost). Does the loss curve move? Does tokens/s grow?
#    (Expected: the curve stays where it is, as section 3 measured; tokens/s
#    grows only while there are free cores: with 4 ranks on 2 cores it may not
#    grow at all, since the ranks take turns.)
# 2. **Task:** set **grad. accumulation** to 2 at dp=4, with the same global
#    batch of 8 sequences. How many times larger are one rank's activations
#    *without* accumulation than *with* it? Write your answer in `my_answer_accum`,
#    then run the next cell (it trains 3 steps and checks).
# 3. Switch the labels to Chinese with `dtlab.set_language("zh")`.
#
# 1. 拖动 **DP degree**（数据并行度）滑块：每次改动都会在预热好的进程池上启动一次真实运行（没有启动开销）。
#    损失曲线会变吗？每秒 token 数会增加吗？（预期：曲线不动，正如第 3 节测得的那样；每秒 token 数只有在还有
#    空闲核时才会增加：2 个核上跑 4 个 rank 时，它们要轮流用核，可能根本不增加。）
# 2. **任务：** 在 dp=4、全局批大小仍为 8 条序列时，把 **grad. accumulation**（梯度累积）滑块设为 2。不做累积时单个 rank 的
#    激活值是做累积时的多少倍？把答案写进 `my_answer_accum`，再运行下一个单元格（它会训练 3 步并检查）。
# 3. 用 `dtlab.set_language("zh")` 把所有标签切换成中文（切换后滑块显示为 **数据并行度 (DP)** 和 **梯度累积**）。

# %%
# NBVAL_IGNORE_OUTPUT
from dtlab.lab import ControlPanel
panel = ControlPanel(TrainConfig(dp=2, steps=40), auto_run=True)
panel

# %%
my_answer_accum = None  # ← your answer: a ratio / 你的答案：一个比值

# %%
accum = dtlab.train(TrainConfig(dp=4, grad_accum=2, steps=3, seed=0)).wait()
accum_ratio = last["ranks"][0]["mem"]["activations"] / accum.records[-1]["ranks"][0]["mem"]["activations"]
ok = check("00.try_accum", my_answer_accum, round(accum_ratio, 2))

# %% [markdown]
# ## Check / 检查
#
# The last cell repeats this lesson's measurements as one deterministic result.
# 最后一个单元格把本课的测量结果汇总成一个确定的结论。

# %%
results = {
    "all-reduce gives 10 on every rank / all-reduce 在每个 rank 上得到 10": values == [10.0] * 4,
    "1 and 4 replicas give the same loss curve / 1 个与 4 个副本的损失曲线相同": gap < 1e-4,
    "every rank holds 4 bytes per parameter / 每个 rank 每个参数 4 字节": all(
        r["mem"]["params"] == 4 * 236_928 for r in last["ranks"]),
    "activations per rank shrink about 4x at dp=4 / dp=4 时每个 rank 的激活值约缩小 4 倍": 3.5 < ratio < 4.5,
    "accumulating 2 micro-steps halves them again / 2 步梯度累积再减半": 1.7 < accum_ratio < 2.3,
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 00:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
