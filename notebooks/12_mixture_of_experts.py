# %% [markdown]
# # Lesson 12 — Mixture of experts and expert parallelism
# # 第 12 课 —— 混合专家与专家并行
#
# **What you will see.** A **mixture of experts** (MoE) replaces a transformer
# block's MLP by E expert MLPs and a small **router** that sends each token to
# only k of them (Shazeer et al., 2017; GShard, Lepikhin et al., 2020; Switch
# Transformer, Fedus et al., 2021): E times the MLP parameters, but each token
# pays for k. **Expert parallelism** (EP) puts different experts on different ranks
# and moves every token to its experts and back with an **all-to-all**. You will
# step through the all-to-all and measure what it sends; see the router drop
# tokens when an expert is over its **capacity factor**; train with and without
# the load-balancing loss while the load per expert is drawn live; check that
# EP trains exactly the model one process trains; and write the top-k dispatch
# yourself, graded on real ranks.
#
# **你将看到什么。** **混合专家**（mixture of experts，MoE）把 Transformer block 里的 MLP 换成
# E 个专家 MLP，再加一个小小的 **路由器**（router），它只把每个 token 送给其中 k 个专家
# （Shazeer 等，2017；GShard，Lepikhin 等，2020；Switch Transformer，Fedus 等，2021）：MLP 的参数
# 变成 E 倍，而每个 token 只付出 k 个专家的计算。**专家并行**（expert parallelism，EP）把不同的专家放到
# 不同的 rank 上，用 **全对全**（all-to-all）通信把每个 token 送到它的专家那里、再送回来。你会一步一步
# 地走一遍全对全并测量它发送的字节；看到专家超过 **容量因子**（capacity factor）时路由器如何丢弃
# token；在实时绘制每个专家负载的同时，分别在有、无负载均衡损失的情况下训练；验证 EP 训练出的模型与
# 单进程完全相同；最后亲手写出 top-k 分发，并在真实的 rank 上评分。

# %%
import dataclasses

import dtlab
import dtlab.parallel.moe
from dtlab import TrainConfig
from dtlab.comm.all_to_all import all_to_all_schedule
from dtlab.course.exercises import grade
from dtlab.course.experiments import moe as moe_lesson
from dtlab.planner.communication import all_to_all_time, ring_allreduce_time
from dtlab.planner.hardware import LINKS
from dtlab.lab import check, human_bytes
from dtlab.lab.all_to_all_view import AllToAllView
from dtlab.lab.expert_load_view import ExpertLoadView
from dtlab.launch import run
from dtlab.model import build_model, count_params

# %% [markdown]
# ## 1. The all-to-all, step by step / 一步一步地看全对全
#
# In an **all-to-all** every rank cuts its tensor into N pieces, piece j
# addressed to rank j; afterwards rank j holds the N pieces addressed to it, one
# from every rank, in rank order. It is a transpose across ranks. In a mixture of
# experts, piece j holds the tokens this rank's router sent to the experts that
# live on rank j, so the pieces have *different sizes* (uneven splits).
#
# dtlab builds it from send and receive with the **pairwise exchange** (Thakur,
# Rabenseifner and Gropp, 2005): in step s = 1 … N − 1, every rank r sends its
# piece for rank r + s and receives the piece from rank r − s. Its own piece is a
# local copy. The view is driven by `all_to_all_schedule(N)`, the plain data the
# real collective executes; cell (r, j) is the piece rank j addresses to rank r.
# Press **Step** to advance.
#
# **Predict** (write it in the cell below the view, before running the cell
# after it): on 4 ranks, how many steps does the exchange take, and what fraction
# of its tensor does each rank send to other ranks?
#
# 在 **全对全**（all-to-all）中，每个 rank 把自己的张量切成 N 块，第 j 块发给 rank j；结束后 rank j
# 按 rank 顺序持有发给它的 N 块，每个 rank 一块。它相当于在 rank 之间做一次转置。在混合专家模型里，
# 第 j 块装的是本 rank 的路由器分给 rank j 上那些专家的 token，所以各块的大小 *不同*（不均匀切分）。
#
# dtlab 用 **成对交换**（pairwise exchange，Thakur、Rabenseifner 和 Gropp，2005）从点对点收发构建它：
# 第 s = 1 … N − 1 步中，每个 rank r 把发给 rank r + s 的那一块发出去，并接收 rank r − s 发来的那一块；
# 发给自己的那一块是本地复制。下面的视图由 `all_to_all_schedule(N)` 驱动，也就是真实集合通信所执行的
# 以数据形式给出的调度表；格子 (r, j) 是 rank j 发给 rank r 的那一块。按 **Step**（前进一步） 推进。
#
# **预测**（写在视图下面的单元格里，再运行它后面的单元格）：4 个 rank 上，交换需要几步？每个 rank
# 要把自己张量的多大比例发给其他 rank？

# %%
# NBVAL_IGNORE_OUTPUT
view = AllToAllView(ranks=4)
view

# %%
# Your predictions / 你的预测 (replace None)
my_prediction_steps = None        # steps of the pairwise exchange on 4 ranks / 4 个 rank 上的步数
my_prediction_fraction = None     # fraction of its tensor each rank sends, e.g. 0.5 / 每个 rank 发出的比例

# %%
view.ranks.value = 4
view.reset()
for presses in range(1, 17):      # press Step until every rank holds a piece from every rank
    view.step()
    if all(all(row) for row in view.state()):
        break
sent_fraction = sum(view.sent_rows()) / (4 * 4)         # rows sent / rows held, all ranks (1 row per pair)
ok = check("12.a2a_steps", my_prediction_steps, presses, source="simulated")
ok = check("12.a2a_fraction", my_prediction_fraction, sent_fraction, source="simulated")
print(f"every rank holds a piece from every rank after {presses} presses of Step / "
      f"按 {presses} 次 Step 之后，每个 rank 都有来自每个 rank 的一块")
for e in all_to_all_schedule(4):
    if e.rank == 0:
        print(f"  step {e.step}: rank 0 sends to rank {e.send_to}, receives from rank {e.recv_from}")

# %% [markdown]
# ## 2. Bytes per rank, on real ranks / 真实 rank 上每个 rank 发送的字节数
#
# Each rank keeps 1/N of its tensor and sends the other **(N − 1)/N**, one piece
# per step: the volume of a reduce-scatter, without the additions, and half of
# what a ring all-reduce sends. nccl-tests reports all-to-all bus bandwidth with
# the same factor (N − 1)/N.
#
# The next cell runs dtlab's all-to-all on 4 ranks on a 4 MiB float32 tensor,
# with a `CommMeter` counting the bytes each rank put on its links, beside
# `torch.distributed.all_to_all_single` on the same data, with even pieces and
# with uneven ones (rank r sends r + j + 1 rows to rank j).
#
# **Predict:** how many bytes does each rank send for 4 MiB on 4 ranks?
#
# 每个 rank 留下张量的 1/N，把其余的 **(N − 1)/N** 发出去，每步一块：与一次归约散射的数据量
# 相同，只是不做加法，是环形全归约发送量的一半。nccl-tests 报告全对全的总线带宽时用的也是
# (N − 1)/N 这个系数。
#
# 下一个单元格在 4 个 rank 上对 4 MiB 的 float32 张量运行 dtlab 的全对全，用 `CommMeter` 统计
# 每个 rank 放到链路上的字节数；同时在同样的数据上运行 `torch.distributed.all_to_all_single`，
# 分别用均匀的块和不均匀的块（rank r 给 rank j 发 r + j + 1 行）。
#
# **预测：** 4 个 rank、4 MiB 时，每个 rank 发送多少字节？

# %%
my_prediction_bytes = None   # ← your prediction / 你的预测

# %%
N, nbytes = 4, 4 * 2**20
ranks = run(moe_lesson.all_to_all_versus_torch, N, nbytes)
for r in ranks:
    print(f"rank {r['rank']}: tensor {human_bytes(r['nbytes'])}, sent {r['bytes_sent']:,} bytes "
          f"= {human_bytes(r['bytes_sent'])} in {r['steps']} steps")
ok = check("12.a2a_bytes", my_prediction_bytes, ranks[0]["bytes_sent"])
print("each rank followed all_to_all_schedule(4) / 每个 rank 都按 all_to_all_schedule(4) 执行:",
      all(r["trace_is_schedule"] for r in ranks))
print("equal to torch, even pieces / 与 torch 相同（均匀切分）:", all(r["equal_to_torch"] for r in ranks))
print("equal to torch, uneven pieces / 与 torch 相同（不均匀切分）:",
      all(r["uneven_equal_to_torch"] for r in ranks))

# %% [markdown]
# The link model prices it like a ring step: N − 1 steps of α + (nbytes/N)/β.
# Below, a 64 MiB all-to-all against a 64 MiB ring all-reduce on 8 ranks, on the
# interconnects of lesson 01 (predictions from nominal figures).
#
# 链路模型像估算环形算法一步的耗时那样估算它的耗时：N − 1 步，每步 α + (nbytes/N)/β。下面在 8 个 rank 上，
# 用第 01 课的几种互联，比较 64 MiB 的全对全与 64 MiB 的环形全归约（基于标称参数的预测）。

# %%
for name, link in LINKS.items():
    a2a, ar = all_to_all_time(64 * 2**20, 8, link), ring_allreduce_time(64 * 2**20, 8, link)
    print(f"{name:<11} all-to-all {a2a * 1e3:8.3f} ms   all-reduce {ar * 1e3:8.3f} ms")

# %% [markdown]
# ## 3. The router and its capacity / 路由器与容量
#
# The router is one linear map C → E and a softmax: p = softmax(x W_r). A token
# goes to its k experts of highest p; with k = 2 their two probabilities are
# renormalised to sum to 1 and weight the two experts' outputs. Each expert takes
# at most **capacity = ⌈capacity factor × T × k / E⌉** tokens of a sequence of T
# tokens; choices beyond it are **dropped**: that expert adds nothing to the
# token. With k = 2 the token still gets its other expert's output; only when
# every one of its k choices is dropped does the residual connection alone carry
# it on. First choices get places before second choices. Counting the capacity
# per sequence is dtlab's choice, so that every layout drops the same tokens:
# Switch Transformer (Sec. 2.2, k = 1) counts it over the tokens of a batch,
# GShard over each group of tokens, so there how many choices are dropped
# depends on how the batch is laid out.
#
# Our model: the small GPT (4 blocks, C = 64, T = 64) with 4 experts and top-2
# in every block. Step 0's batch (8 sequences) makes 8 × 64 × 2 = 1,024
# assignments per layer, 4,096 over the 4 layers. The router is untrained: its
# choices are close to random.
#
# **Predict:** at capacity factor 1.0, how many places does each expert have per
# sequence? And how many of the 4,096 assignments are dropped at factor 2.0?
#
# 路由器就是一个 C → E 的线性映射加 softmax：p = softmax(x W_r)。token 被送给 p 最高的 k 个专家；
# k = 2 时，这两个概率重新归一化到和为 1，作为两个专家输出的权重。在一条 T 个 token 的序列里，
# 每个专家最多接收 **容量 = ⌈容量因子 × T × k / E⌉** 个 token；超出的选择被 **丢弃**：这个专家对该
# token 没有任何贡献。k = 2 时，这个 token 仍然得到另一个专家的输出；只有它的 k 个选择全被丢弃时，才只剩
# 残差连接把它传下去。第一选择先于第二选择占位。按序列计算容量是 dtlab 的选择，这样任何布局丢弃的 token 都
# 相同：Switch Transformer（第 2.2 节，k = 1）按一个批次的 token 计算容量，GShard 按每个 token 分组计算，
# 所以在它们那里丢弃多少取决于批次怎样切分。
#
# 我们的模型：小 GPT（4 个 block，C = 64，T = 64），每个 block 有 4 个专家、top-2。第 0 步的批次
# （8 条序列）每层产生 8 × 64 × 2 = 1,024 个分配，4 层共 4,096 个。路由器还没有训练：它的选择接近随机。
#
# **预测：** 容量因子为 1.0 时，每个专家在每条序列中有多少个位置？容量因子为 2.0 时，4,096 个分配里有
# 多少个被丢弃？

# %%
my_prediction_places = None       # places per expert per sequence at 1.0 / 1.0 时每个专家每条序列的位置数
my_prediction_dropped_at_2 = None  # assignments dropped at 2.0 / 2.0 时被丢弃的分配数

# %%
moe = TrainConfig(model="small", experts=4, top_k=2, seed=0)
dense, sparse = build_model(TrainConfig().model_config(), seed=0), build_model(moe.model_config(), seed=0)
expert = sum(p.numel() for p in sparse.blocks[0].mlp.experts["0"].parameters())
print(f"parameters: dense {count_params(dense):,}, with 4 experts {count_params(sparse):,}; "
      f"one expert {expert:,}, used by each token: 2 of 4 per block")
print(f"参数量：稠密模型 {count_params(dense):,}，4 个专家 {count_params(sparse):,}；每个专家 {expert:,}，"
      f"每个 token 每个 block 只用 4 个中的 2 个")
start = moe_lesson.routing_at_start(moe, [1.0, 1.25, 2.0, None])
for factor, counts in start.items():
    print(f"capacity factor {factor}: {counts['dropped']:>4} of {counts['routed']} assignments dropped")
ok = check("12.capacity", my_prediction_places, dtlab.parallel.moe.capacity(64, experts=4, top_k=2, capacity_factor=1.0),
           source="formula")
ok = check("12.dropped_at_2", my_prediction_dropped_at_2, start[2.0]["dropped"])

# %% [markdown]
# Even an untrained router is not perfectly even *within a sequence*, so a
# factor of exactly 1.0 already drops some choices; a little slack (Switch
# Transformer trained at 1.25) removes most of them. At 2.0 with k = 2 nothing
# can be dropped: the capacity is then T, and a token picks an expert at most once.
#
# 即使是未训练的路由器，在 *一条序列内部* 也不是完全均匀的，所以容量因子恰好为 1.0 时就已经会丢弃一些
# 选择；留一点余量（Switch Transformer 训练时用 1.25）就能消除其中的大部分。k = 2 时容量因子为 2.0
# 就不可能丢弃任何分配：此时容量等于 T，而一个 token 至多选择同一个专家一次。
#
# ## 4. Load balance, live / 实时观察负载均衡
#
# A router left alone tends to collapse: the experts it favours get more tokens,
# train faster, and win more tokens still. Switch Transformer adds an
# **auxiliary load-balancing loss** α · E · Σᵢ fᵢ Pᵢ per layer, with fᵢ the
# fraction of assignments expert i got and Pᵢ its mean router probability: it is
# smallest, α, when both are uniform (α = 0.01 by default). dtlab counts both
# per sequence, and a sequence never spans ranks: the capacity is per sequence,
# so every layout drops the same tokens, and the balancing loss is per sequence
# (like DeepSeek-V3's sequence-wise balance loss), so the loss, and with it the
# training, does not depend on the layout either.
#
# Two runs of 60 steps on 2 ranks with EP 2 (2 experts on each rank), capacity
# factor 1.0: with the balancing loss, and without it (`aux_loss_coef=0`). The
# plots draw each expert's share of the assignments per step (balanced: 1/4,
# dashed), and the dropped share with the balance term E · Σ f P (1.0 = balanced).
#
# **Predict:** without the balancing loss, will the last step drop *more* or
# *fewer* assignments than with it? And which run ends with the lower loss?
#
# 无人约束的路由器往往会坍缩：它偏爱的专家拿到更多 token、训练得更快、于是赢得更多 token。Switch
# Transformer 在每层加上 **辅助负载均衡损失** α · E · Σᵢ fᵢ Pᵢ，其中 fᵢ 是专家 i 得到的分配比例，Pᵢ
# 是它的平均路由概率：两者都均匀时它最小，等于 α（默认 α = 0.01）。dtlab 对两者都按序列计算，而一条序列
# 从不跨 rank：容量按序列计算，所以任何布局丢弃的 token 都相同；均衡损失也按序列计算（类似 DeepSeek-V3 的
# 序列级均衡损失），所以损失、进而整个训练过程也与布局无关。
#
# 在 2 个 rank 上以 EP 2（每个 rank 2 个专家）、容量因子 1.0 各训练 60 步：一次带均衡损失，一次不带
# （`aux_loss_coef=0`）。图中画出每一步每个专家得到的分配比例（均衡时为 1/4，虚线），以及丢弃比例和
# 均衡项 E · Σ f P（1.0 表示均衡）。
#
# **预测：** 不带均衡损失时，最后一步丢弃的分配会比带均衡损失时 *多* 还是 *少*？哪一次运行的最终损失更低？

# %%
my_prediction_drops = None       # "more" or "fewer" / "多" 或 "少"（半角引号）
my_prediction_lower_loss = None  # "with" or "without" / "带均衡损失" 或 "不带均衡损失"（半角引号）

# %%
# NBVAL_IGNORE_OUTPUT
views = {"with": ExpertLoadView(4), "without": ExpertLoadView(4)}
print("with the balancing loss (α = 0.01) / 带均衡损失（α = 0.01）")
display(views["with"])
print("without it (α = 0) / 不带均衡损失（α = 0）")
display(views["without"])

# %%
base = dataclasses.replace(moe, ep=2, steps=60, lr=3e-3, capacity_factor=1.0)
runs = {name: views[name].watch(dtlab.train(dataclasses.replace(base, aux_loss_coef=alpha)))
        for name, alpha in (("with", 0.01), ("without", 0.0))}
last = {name: r.records[-1]["experts"] for name, r in runs.items()}
for name, e in last.items():
    print(f"{name:<8} last step: dropped {e['dropped']} of {sum(e['routed'])}, "
          f"balance {e['balance']:.1f}, loss {runs[name].losses()[-1]:.1f}")
measured = "more" if last["without"]["dropped"] > last["with"]["dropped"] else "fewer"
ok = check("12.drops_without_balance", my_prediction_drops, measured)
lower = "with" if runs["with"].losses()[-1] < runs["without"].losses()[-1] else "without"
ok = check("12.lower_loss", my_prediction_lower_loss, lower)

# %% [markdown]
# Dropped assignments are tokens an expert never saw: the model learns less from
# the same batch. Balance is not only about speed (an overloaded expert's rank is
# the straggler of every all-to-all), it is about quality.
#
# 被丢弃的分配，就是专家从没见过的 token：同样一批数据，模型学到的更少。所以均衡不只关乎速度（负载过重的专家
# 所在的 rank 会成为每次全对全中掉队的那一个），也关乎模型质量。
#
# ## 5. Expert parallelism trains the same model / 专家并行训练的是同一个模型
#
# With EP 2, rank 0 keeps experts 0–1 and rank 1 experts 2–3; attention, the
# routers and embeddings are replicated, and each rank reads half the batch. Per
# MoE layer and micro-batch, the forward pass runs three all-to-alls (the counts,
# then the tokens out and back) and backward two more. An expert's gradient
# already sums the tokens of every rank that routed to it, so it is averaged
# over the ranks that hold the same expert (the expert-data-parallel group, one
# rank here) and divided by EP: 1/(DP × EP) in all, the same share of each
# rank's batch as the replicated parameters get when they are averaged over all
# DP × EP ranks, as in data parallelism (DeepSpeed-MoE, 2022). The loss
# should equal one process's at every step, dropped tokens included.
#
# 在 EP 2 下，rank 0 持有专家 0–1，rank 1 持有专家 2–3；注意力、路由器和嵌入层都是复制的，每个 rank
# 读一半批次。每个 MoE 层、每个微批次，前向做三次全对全（先交换数量，再把 token 发出去、送回来），
# 反向再做两次。专家的梯度已经累加了所有把 token 路由给它的 rank 的贡献，所以先在持有同一专家的 rank
# 之间（专家数据并行组，这里只有一个 rank）求平均，再除以 EP：合起来是 1/(DP × EP)，与被复制的参数在全部
# DP × EP 个 rank 之间像数据并行那样求平均时得到的比例相同（DeepSpeed-MoE，2022）。每一步的损失都应当与单进程相同，包括被丢弃的 token。

# %%
short = dataclasses.replace(base, steps=10)
one, two = (dtlab.train(dataclasses.replace(short, ep=ep)).wait() for ep in (1, 2))
gap = max(abs(a - b) / b for a, b in zip(one.losses(), two.losses()))
print("EP 2 loss equals one process at every step (1e-4) / EP 2 每一步的损失都与单进程相同（1e-4）:", gap < 1e-4)
print("same dropped assignments at every step / 每一步丢弃的分配相同:",
      [r["experts"]["dropped"] for r in one.records] == [r["experts"]["dropped"] for r in two.records])
sent = two.records[-1]["ranks"][0]["comm"]["all_to_all"]["count"]
print(f"all-to-all calls per step on rank 0 / rank 0 每步的全对全次数: {sent} "
      f"(4 layers x (3 forward + 2 backward) = 20)")

# %% [markdown]
# **What EP sends.** Of those five all-to-alls per layer, one carries counts (E
# numbers); the other four carry tokens. A rank's router makes k rows per token,
# so the **dispatch** feeds k·b·s rows of h values into the all-to-all, and the
# rows for this rank's own experts stay: **k·b·s·h·(N − 1)/N values leave the
# rank**. The **combine** sends the experts' outputs back (the same volume when
# the load is even), and backward sends the gradients of both: four all-to-alls
# of that size per MoE layer and micro-batch.
#
# **Predict:** with EP 2, b = 4 sequences per rank, s = 64, h = 64, k = 2, fp32
# and no capacity limit, how many bytes does one rank send in one dispatch? The
# cell runs one training step on 2 ranks with the communication tracer on.
#
# **EP 发送了什么。** 每层这五次全对全中，一次传的是数量（E 个数），另外四次传 token。一个 rank 的路由器为每个
# token 生成 k 行，所以 **分发**（dispatch）向全对全送入 k·b·s 行、每行 h 个值，其中发给本 rank 自己专家的行
# 留在本地：**离开 rank 的是 k·b·s·h·(N − 1)/N 个值**。**合并**（combine）把专家的输出送回（负载均匀时数据量
# 相同），反向再把两者的梯度送回：每个 MoE 层、每个微批次有四次这样大小的全对全。
#
# **预测：** EP 2、每个 rank b = 4 条序列、s = 64、h = 64、k = 2、fp32、不设容量上限时，一次分发中一个 rank
# 发送多少字节？下面的单元格在 2 个 rank 上用通信追踪器（tracer）运行一步训练。

# %%
my_prediction_dispatch = None  # bytes one rank sends in one dispatch / 一次分发中一个 rank 发送的字节数

# %%
traced = run(moe_lesson.expert_parallel_bytes, 2, batch=4)
for r in traced:
    tokens = [c for c in r["calls"] if c["tokens"]]
    print(f"rank {r['rank']}: {len(r['calls'])} all-to-alls, {len(tokens)} of them tokens; wire bytes of layer 0's "
          f"dispatch {tokens[0]['wire_bytes']:,}, combine {tokens[1]['wire_bytes']:,}")
ok = check("12.dispatch_bytes", my_prediction_dispatch, traced[0]["calls"][1]["wire_bytes"])
shape = traced[0]["shape"]
formula = shape["k"] * shape["b"] * shape["s"] * shape["h"] * (shape["N"] - 1) // shape["N"] * 4
both = sum(c["wire_bytes"] for r in traced for c in r["calls"] if c["tokens"])
print(f"both ranks, one step: {both:,} bytes = N x 4 x {shape['layers']} layers x k·b·s·h·(N−1)/N x 4 B "
      f"= {2 * 4 * shape['layers'] * formula:,} / 两个 rank 一步合计")


# %% [markdown]
# ## 6. Exercise: the top-k dispatch / 练习：top-k 分发
#
# Between the router and the all-to-all sits the **dispatch**: from the router's
# (S, k) choices, make one row per *kept* choice, grouped by expert, so that each
# rank's piece is one contiguous block. Write it. You get, for S tokens:
#
# * `expert` (S, k) int64, the chosen experts, best first;
# * `gate` (S, k), their weights;
# * `keep` (S, k) bool, False where the choice was dropped for capacity.
#
# Return three tensors of shape (A,), A = the number of kept choices: `token`
# (which token each row is), `expert` and `gate`, with rows ordered by expert.
# `grade` runs your function inside dtlab's MoE layer on 2 real
# expert-parallel ranks and compares outputs and gradients with dtlab's own
# dispatch. Your function must be self-contained (it may use `torch`).
#
# 在路由器和全对全之间是 **分发**（dispatch）：把路由器 (S, k) 的选择变成每个 *保留下来的*
# 选择一行，并按专家分组，这样每个 rank 收到的那一块是连续的。请实现它。对 S 个 token，你会得到：
#
# * `expert` (S, k) int64，被选中的专家，最好的在前；
# * `gate` (S, k)，它们的权重；
# * `keep` (S, k) bool，因容量而被丢弃的选择为 False。
#
# 返回三个形状为 (A,) 的张量，A 是保留下来的选择数：`token`（每一行是哪个 token）、`expert` 和
# `gate`，各行按专家排序。`grade` 会在 2 个真实的专家并行 rank 上、在 dtlab 的 MoE 层里运行
# 你的函数，并把输出和梯度与 dtlab 自己的分发结果比较。你的函数必须自成一体（可以使用 `torch`）。

# %%
def top_k_dispatch(expert, gate, keep):
    raise NotImplementedError  # your code here / 在这里写你的代码


# %%
solved = grade("12.top_k_dispatch", top_k_dispatch)

# %% [markdown]
# ## 7. At scale: the planner / 规模化：规划器
#
# The planner (`dtlab plan --experts E --top-k K --ep N`) counts what a mixture
# of experts costs without running it: all parameters, the *active* ones a token
# uses (FLOPs and MFU count those), the experts each GPU keeps under EP, and the
# all-to-all bytes each GPU sends per iteration. Below, a Llama-3-70B-shaped
# model whose MLPs become 8 experts with top-2 routing, on 1,024 GPUs. dtlab
# keeps every expert whole on each TP rank (Megatron-Core can also split experts
# by TP); EP is what divides them, so compare the parameters per GPU at EP 1 and 8.
# EP takes its ranks from data parallelism: `dp = 64 // ep` keeps DP × EP × TP × PP
# = 64 × 8 × 2 = 1,024 GPUs at every EP degree.
#
# 规划器（`dtlab plan --experts E --top-k K --ep N`）不运行就能算出混合专家的开销：全部参数、一个 token
# 实际用到的 *激活* 参数（FLOPs 和 MFU 按它计算）、EP 下每张 GPU 保存的专家，以及每张 GPU 每次迭代
# 全对全发送的字节数。下面是一个 Llama-3-70B 形状的模型，把 MLP 换成 8 个专家、top-2 路由，
# 用 1,024 张 GPU。dtlab 在每个 TP rank 上都保留完整的专家（Megatron-Core 还可以用 TP 切分专家）；
# 真正把专家分开的是 EP，所以请比较 EP 为 1 和 8 时每张 GPU 的参数量。EP 的 rank 取自数据并行：
# `dp = 64 // ep` 让 DP × EP × TP × PP = 64 × 8 × 2 = 1,024 张 GPU 在每个 EP 并行度下都不变。
#
# **Predict** the all-to-all volume at EP 8 from the formula you just measured. The
# sequences are s = 8,192 tokens, h = 8,192, k = 2, bf16 (2 bytes). Each GPU reads
# b = 1,024 / (64 data ranks) / 8 micro-batches = 2 sequences per micro-batch
# (EP takes its ranks from DP, so the EP ranks read different data) and holds 40
# of the 80 layers (PP 2). How many GB does one GPU send per iteration?
#
# **预测：** 用刚才测过的公式推算 EP 8 时的全对全数据量。每条序列 s = 8,192 个 token，h = 8,192，k = 2，
# bf16（2 字节）。每张 GPU 每个微批次读 b = 1,024 / 64 个数据 rank / 8 个微批次 = 2 条序列（EP 的 rank 取自
# DP，各 EP rank 读的数据不同），并持有 80 层中的 40 层（PP 2）。一张 GPU 每次迭代发送多少 GB？

# %%
my_prediction_planner = None  # GB per GPU per iteration / 每张 GPU 每次迭代的 GB 数

# %%
from dtlab.config.layout import Layout
from dtlab.planner import ARCHITECTURES, plan

moe70 = dataclasses.replace(ARCHITECTURES["llama3-70b"], experts=8, top_k=2)
for ep in (1, 8):
    p = plan(moe70, Layout(dp=64 // ep, ep=ep, tp=8, pp=2, micro_batches=8, precision="bf16", zero=1),
             batch_size=1024)
    print(f"ep={ep}: params {p.params / 1e9:.0f}B, active {p.active_params / 1e9:.0f}B, "
          f"per GPU {p.params_per_gpu / 1e9:.1f}B, all-to-all {p.all_to_all_bytes / 1e9:.0f} GB/iteration")
ok = check("12.planner_a2a", my_prediction_planner, round(p.all_to_all_bytes / 1e9, 1), source="planner")
per_call = 2 * p.micro_batch_size * 8192 * 8192 * 7 // 8 * 2
print(f"one all-to-all: k·b·s·h·(N−1)/N x 2 B = {per_call / 1e6:.1f} MB; x 4 per layer x 40 layers x 8 micro-batches "
      f"= {4 * 40 * 8 * per_call / 1e9:.1f} GB / 一次全对全 {per_call / 1e6:.1f} MB，乘以每层 4 次、40 层、8 个微批次")

# %% [markdown]
# ## 8. Try this / 动手试试
#
# 1. With E = 8 experts, top-1 and T = 64, what is the capacity per sequence at
#    factor 1.25? Check: `dtlab.parallel.moe.capacity(64, experts=8, top_k=1, capacity_factor=1.25)`.
# 2. On 8 ranks, how many bytes does each rank send in an all-to-all of 64 MiB?
#    Check: `dtlab.planner.communication.ring_bytes_sent_per_rank(64 * 2**20, 8, "all_to_all")`.
# 3. Run section 4 with `capacity_factor=None`: what does the last step drop now,
#    and does the balance term still drift without the balancing loss?
#    (Answer: nothing, in both runs: with no capacity no choice is dropped. Yes:
#    without the balancing loss the balance term still climbs, to about 1.1 by
#    step 59 in our run, against about 1.4 at factor 1.0, where every drop also
#    starves the experts that lose tokens.)
# 4. `dtlab train --experts 4 --top-k 2 --ep 3` on the command line: what does it
#    refuse, and which EP degrees does it allow? (Answer: ep=3, which does not
#    divide the 4 experts, before any rank starts; allowed: 1, 2 and 4.)
#
# 1. E = 8 个专家、top-1、T = 64 时，容量因子 1.25 下每条序列的容量是多少？验证：
#    `dtlab.parallel.moe.capacity(64, experts=8, top_k=1, capacity_factor=1.25)`。
# 2. 8 个 rank 上，64 MiB 的全对全中每个 rank 发送多少字节？验证：
#    `dtlab.planner.communication.ring_bytes_sent_per_rank(64 * 2**20, 8, "all_to_all")`。
# 3. 用 `capacity_factor=None` 重新运行第 4 节：最后一步还丢弃多少？不带均衡损失时均衡项还会漂移吗？
#    （答案：两次运行都不丢弃：没有容量上限，就没有选择被丢弃。会：不带均衡损失时均衡项仍会上升，在我们的运行中
#    第 59 步约为 1.1，而容量因子 1.0 时约为 1.4，因为每次丢弃还会让失去 token 的专家得到更少的训练。）
# 4. 在命令行运行 `dtlab train --experts 4 --top-k 2 --ep 3`：它拒绝了什么？允许哪些 EP 并行度？
#    （答案：在任何 rank 启动之前就拒绝了 ep=3，因为 3 不能整除 4 个专家；允许 1、2 和 4。）
#
# ## Check / 检查
#
# The last cell repeats this lesson's results as one deterministic summary.
# 最后一个单元格把本课的结果汇总成一个确定的结论。

# %%
results = {
    "a pairwise all-to-all on 4 ranks: 3 steps, 3/4 of the tensor sent per rank"
    " / 4 个 rank 上的两两全对全：3 步，每个 rank 发出张量的 3/4":
        presses == 3 and ranks[0]["bytes_sent"] == 3 * nbytes // 4,
    "dtlab's all-to-all equals torch's, even and uneven / dtlab 的全对全与 torch 的相同（均匀与不均匀）":
        all(r["equal_to_torch"] and r["uneven_equal_to_torch"] for r in ranks),
    "capacity factor 1.0 drops more than 1.25, and 2.0 none"
    " / 容量因子 1.0 丢弃的比 1.25 多，2.0 不丢弃":
        start[1.0]["dropped"] > start[1.25]["dropped"] > start[2.0]["dropped"] == 0,
    "without the balancing loss more assignments are dropped / 没有均衡损失时丢弃的分配更多": measured == "more",
    "EP 2 trains the same model as one process / EP 2 训练出的模型与单进程相同": gap < 1e-4,
    "each dispatch sends k·b·s·h·(N−1)/N values, as the planner counts / 每次分发发送 k·b·s·h·(N−1)/N 个值，与规划器一致":
        traced[0]["calls"][1]["wire_bytes"] == formula and 4 * 40 * 8 * per_call == p.all_to_all_bytes,
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 12:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
