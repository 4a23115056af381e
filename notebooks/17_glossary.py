# %% [markdown]
# # Lesson 17 — Glossary and flash cards
# # 第 17 课 —— 术语表与闪卡
#
# **What you will see.** Every word this course uses, in English and in Chinese,
# each with a definition, a sentence you might hear in an AI-infrastructure
# meeting, the paper it comes from, the dtlab module that implements it, and the
# lesson that runs it. Then a deck of flash cards to practise the words in both
# directions.
#
# **你将看到什么。** 本课程用到的每一个术语，都有英文和中文两种说法，并附带定义、一句你可能在 AI
# 基础设施会议上听到的例句、术语出处的论文、实现它的 dtlab 模块，以及运行它的那一课。最后是一副闪卡，
# 可以双向练习这些术语。

# %%
import dtlab
from dtlab.course.glossary import all_terms, lookup, render_markdown
from dtlab.lab import check
from dtlab.lab.flashcards import Deck, FlashCards
from IPython.display import Markdown, display

# %% [markdown]
# ## 1. Look a word up / 查一个词
#
# A term is found by its English name, its abbreviation, an alias or its Chinese
# name, ignoring case. Before the list appears, two predictions: **Predict:**
# (a) what is the Chinese term for *pipeline parallelism*? (b) Looking up the
# Chinese name 零冗余优化器 finds a term: what is its abbreviation?
#
# 可以用英文名、缩写、别名或中文名查找术语，不区分大小写。在列表出现之前，先做两个预测。**预测：**
# (a) *pipeline parallelism* 的中文术语是什么？(b) 用中文名“零冗余优化器”查找会找到一个术语：它的缩写是什么？

# %%
my_prediction = None       # ← (a) your prediction: the Chinese term / 你的预测：中文术语
my_prediction_abbr = None  # ← (b) your prediction: an abbreviation / 你的预测：一个缩写

# %%
ok = check("17.pipeline_zh", my_prediction, lookup("pipeline parallelism").zh, source="glossary")
ok = check("17.zero_abbr", my_prediction_abbr, lookup("零冗余优化器").abbr, source="glossary")
display(Markdown(render_markdown(lookup("ZeRO"), "zh")))

# %% [markdown]
# ## 2. The whole list / 完整列表
#
# Each term is one file in `glossary/`, machine-readable, so lessons, widgets and
# `dtlab glossary TERM --lang zh` on the command line all read the same entries.
#
# 每个术语都是 `glossary/` 中的一个文件，机器可读，所以课程、控件和命令行里的
# `dtlab glossary TERM --lang zh` 读到的都是同一份条目。

# %%
terms = all_terms()
print(f"{len(terms)} terms / 个术语")
for term in terms:
    print(f"{term.title('en'):<36} {term.zh}")

# %% [markdown]
# ## 3. Flash cards / 闪卡
#
# Read the word, say its counterpart aloud, then press **Show answer**. Mark
# each card; the ones you did not know are worth another round. Switch the
# direction to practise Chinese → English.
#
# 看到术语后，先大声说出另一种语言的说法，再点 **显示答案**。给每张卡做标记；没答上来的值得再练一轮。
# 切换方向可以练习中文 → 英文。

# %%
# NBVAL_IGNORE_OUTPUT
cards = FlashCards(direction="en_to_zh", seed=0)
cards

# %% [markdown]
# The deck behind the widget can be stepped from code too: here every card is
# marked "known", one step per card, and the deck ends.
#
# 控件背后的卡组也可以用代码一步步推进：这里把每张卡都标为“答对”，每张一步，直到这一轮结束。

# %%
deck = Deck(direction="zh_to_en", seed=0)
first_question = deck.question()
while not deck.finished:
    deck.mark(True)
print("first card / 第一张卡:", first_question, "→", lookup(first_question).title("en"))
assert len(deck.known) == len(terms)
print(f"cards marked known: {len(deck.known)} of {len(terms)} / 标为答对的卡片数：{len(terms)} 张中的 {len(deck.known)} 张")

# %% [markdown]
# ## 4. Your progress / 你的进度
#
# Every prediction you write and every exercise you grade in the course is kept
# in a small file of your own (never in the notebooks, which you may share):
# per lesson, how many predictions you made and got right, and how many
# exercises passed. The same table prints in a terminal with `dtlab progress`
# (`--json` for one object per lesson, `--reset` to start again). The table below
# is yours, so it is different for everyone.
#
# 你在课程中写下的每个预测、评分过的每个练习，都记录在一个只属于你的小文件里（从不写进笔记本，因为笔记本可能会
# 分享给别人）：每一课做了多少个预测、对了多少个，以及通过了多少个练习。在终端里运行 `dtlab progress` 会打印同样
# 的表格（`--json` 每课输出一个 JSON 对象，`--reset` 从头开始）。下面的表格是你自己的，所以每个人看到的都不一样。

# %%
# NBVAL_IGNORE_OUTPUT
from dtlab.course.exercises import show_progress
show_progress()

# %% [markdown]
# ## Try this / 动手试试
#
# 1. In a terminal: `dtlab glossary bubble --lang zh`. Which term does the
#    alias *bubble* find, and what fraction of a step does its card give for
#    p = 4 stages and m = 4 micro-batches? (Answer: 流水线气泡, pipeline
#    bubble; (p−1)/(m+p−1) = 3/7.)
# 2. `dtlab glossary 梯度累积`: what is the English term, and which other
#    Chinese name is listed as an alias? (Answer: gradient accumulation; 梯度累加.)
# 3. Go through the deck in the Chinese → English direction and write down the
#    words you missed; how many cards does one round hold? (Answer: 52, one per
#    term of section 2's list.) Then `dtlab progress --lang zh` shows your table.
#
# 1. 在终端里运行 `dtlab glossary bubble --lang zh`。别名 *bubble* 找到的是哪个术语？p = 4 个 stage、m = 4 个
#    微批次时，它的卡片说气泡占一个 step 的几分之几？（答案：流水线气泡（pipeline bubble）；(p−1)/(m+p−1) = 3/7。）
# 2. 运行 `dtlab glossary 梯度累积`：它的英文术语是什么？别名里列出的另一个中文说法是什么？（答案：gradient
#    accumulation；梯度累加。）
# 3. 按中文 → 英文的方向过一遍卡组，记下答错的词；一轮有多少张卡？（答案：52 张，第 2 节列表中每个术语一张。）
#    然后运行 `dtlab progress --lang zh` 查看你的进度表。
#
# ## Check / 检查

# %%
results = {
    "every term has a Chinese name and both definitions / 每个术语都有中文名和中英文定义":
        all(t.zh and t.definition.en and t.definition.zh for t in terms),
    "lookup works by English, abbreviation and Chinese / 可以用英文、缩写和中文查找":
        lookup("pipeline parallelism") is lookup("PP") is lookup("流水线并行"),
    "the deck visits every term once / 卡组恰好经过每个术语一次": sorted(deck.known) == sorted(t.slug for t in terms),
}
for name, ok in results.items():
    print("✓" if ok else "✗", name)
print("lesson 17:", "all checks passed / 全部通过" if all(results.values()) else "some checks failed / 有检查未通过")
