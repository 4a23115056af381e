"""The planner's published architectures: vocabulary-parallel embeddings and head under TP.

Megatron-LM (Shoeybi et al. 2019, Sec. 3) splits the token table and the
output layer by vocabulary across the TP ranks; dtlab's own TP runtime keeps
them whole, so only the published presets (or ``vocab_parallel=True``) split
them. Every expectation is the count by hand. Pure arithmetic: no processes.
"""

from __future__ import annotations

import pytest

from dtlab.config.layout import Layout
from dtlab.planner import ARCHITECTURES, by_shape, params_per_rank, plan
from dtlab.planner.communication import ring_allreduce_time, tensor_parallel_comm_time
from dtlab.planner.hardware import get_link

L, H, A, V, S = 24, 2304, 24, 51200, 2048  # Narayanan et al. 2021, Table 1's 1.7B row
BLOCK_SPLIT, BLOCK_WHOLE = 12 * H * H + 7 * H, 6 * H  # per block, see test_planner's by-hand count


def _row(**kw):
    return plan(by_shape(layers=L, hidden=H, heads=A, vocab=V, seq_len=S), vocab_parallel=True, **kw)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_untied_model_splits_table_and_head_by_vocabulary(tp):
    p = _row(layout=Layout(tp=tp))
    split = L * BLOCK_SPLIT // tp + 2 * (V // tp) * H  # blocks, token table, head
    whole = L * BLOCK_WHOLE + S * H + 2 * H  # norms, row biases, positions, final norm
    assert p.params_per_gpu == split + whole
    assert p.memory["params"] == 4 * (split + whole) and p.memory["optimizer"] == 8 * (split + whole)
    assert p.memory["logits"] == 1 * S * (V // tp) * 4  # this rank's (b, s, V/t), fp32
    bf16 = _row(layout=Layout(tp=tp, precision="bf16"), master_weights="model")  # the fp32 module's casts
    assert bf16.memory["copies"] == 2 * (L * 12 * H * H // tp + H * V // tp)  # the head's slice too
    whole_vocab = plan(by_shape(layers=L, hidden=H, heads=A, vocab=V, seq_len=S), Layout(tp=tp))
    assert whole_vocab.params_per_gpu == L * BLOCK_SPLIT // tp + 2 * V * H + whole


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_gpt3_preset_is_vocabulary_parallel_with_its_tied_table_padded(tp):
    arch = ARCHITECTURES["gpt3-175b"]
    h, v = arch.hidden, arch.vocab  # 50,257 is not a multiple of 8
    rows = -(-v // tp)  # 50257, 25129, 6283
    assert rows == {1: 50257, 2: 25129, 8: 6283}[tp]
    split, whole = arch.layer_params()
    one = params_per_rank(arch, tp=tp)
    assert one.split == 96 * split // tp + rows * h  # tied: one table, used twice
    assert one.replicated == 96 * whole + 2048 * h + 2 * h
    first, last = params_per_rank(arch, tp=tp, pp=2, stage=0), params_per_rank(arch, tp=tp, pp=2, stage=1)
    assert first.split == 48 * split // tp + rows * h == last.split  # the last stage's copy is split too
    assert first.replicated == 48 * whole + 2048 * h and last.replicated == 48 * whole + 2 * h
    layout = Layout(tp=tp, precision="bf16", zero=3, dp=2)
    p, kept_whole = plan("gpt3-175b", layout), plan("gpt3-175b", layout, vocab_parallel=False)
    assert p.memory["logits"] == 2048 * rows * 4  # the masters in the optimizer: the head returns fp32 logits
    in_module = plan("gpt3-175b", layout, master_weights="model")
    assert in_module.memory["logits"] == 2048 * rows * 2  # ZeRO-3 with the fp32 module computes the head in bf16

    def gathered(table):  # ZeRO-3's largest unit in bf16, padded to dp = 2
        return 2 * max(-(-n // 2) * 2 for n in (split // tp + whole, table * h, 2048 * h, 2 * h))

    assert kept_whole.memory["buffers"] - p.memory["buffers"] == gathered(v) - gathered(rows)


@pytest.mark.parametrize("tp", [2, 8])
def test_vocabulary_parallel_tp_communication(tp):
    # The blocks' four all-reduces per layer, plus the embedding's forward all-reduce, the head's
    # backward one and the parallel cross-entropy's three of one fp32 per token.
    p = _row(layout=Layout(tp=tp, micro_batches=2), batch_size=4)
    link = get_link(p.links["tp"])
    boundary, tokens = 2 * S * H * 4, 2 * S
    blocks = tensor_parallel_comm_time(boundary, tp=tp, layers=L, micro_batches=2, recompute="none", link=link)
    vocab = 2 * (2 * ring_allreduce_time(boundary, tp, link) + 3 * ring_allreduce_time(4 * tokens, tp, link))
    assert p.comm_time_s["tp"] == pytest.approx(blocks + vocab, rel=1e-12)
    assert _row(layout=Layout(tp=1)).comm_time_s["tp"] == 0


def test_dtlab_models_keep_the_vocabulary_whole_as_dtlab_tp_runs_them():
    # dtlab/parallel/tensor_parallel.py replicates the embeddings and head: the plan of dtlab's GPT must
    # predict what a local run measures, so its presets are not vocabulary-parallel.
    h, v = 64, 256
    assert not ARCHITECTURES["small"].vocab_parallel
    whole, split = plan("small", Layout(tp=2)), plan("small", Layout(tp=2), vocab_parallel=True)
    assert whole.params_per_gpu - split.params_per_gpu == 2 * (v * h - v // 2 * h)
    assert whole.memory["logits"] == 2 * split.memory["logits"]
    assert whole.comm_time_s["tp"] < split.comm_time_s["tp"]
    assert all(ARCHITECTURES[name].vocab_parallel for name in ("gpt3-175b", "llama3-8b", "llama3-405b"))


def test_a_layout_train_refuses_is_refused_or_flagged_by_plan_with_trains_message():
    from dtlab.config import TrainConfig
    from dtlab.i18n import ConfigError

    def refusal(**fields):
        with pytest.raises(ConfigError) as info:
            TrainConfig(**fields).validate()
        return info.value

    # ZeRO-3 with a pipeline: no trainer runs it, so the plan refuses it, with train's words.
    for model in ("small", "gpt3-175b"):
        with pytest.raises(ConfigError) as info:
            plan(model, Layout(zero=3, pp=2))
        train = refusal(zero=3, pp=2)
        assert (info.value.en, info.value.zh) == (train.en, train.zh) and "pp=2" in train.zh
    # ZeRO-3 in fp16 with the masters in the model: only dtlab's runtime refuses it (DeepSpeed runs it):
    # planned, and flagged. With the masters in the optimizer (the default) both run it.
    train = refusal(zero=3, precision="fp16", master_weights="model")
    flagged = plan("small", Layout(dp=2, zero=3, precision="fp16"), master_weights="model").notes
    assert [n for n in flagged if train.en in n and train.zh in n] and "fp16" in train.en
    TrainConfig(zero=3, dp=2, precision="fp16").validate()
    assert not any("dtlab train" in n for n in plan("small", Layout(dp=2, zero=3, precision="fp16")).notes)
    assert not any("dtlab train" in n for n in plan("small", Layout(dp=2, zero=3, precision="bf16")).notes)


def test_the_plan_says_how_it_counted_the_embeddings(capsys):
    from dtlab.planner.cli import format_plan

    gpt3, small, bare = plan("gpt3-175b", Layout(tp=8)), plan("small"), plan(10**9)
    assert (gpt3.tied_embeddings, gpt3.vocab_parallel) == (True, True)
    assert (small.tied_embeddings, small.vocab_parallel) == (False, False)
    assert (bare.tied_embeddings, bare.vocab_parallel) == (None, None)
    assert gpt3.to_dict()["vocab_parallel"] is True
    assert "tied / 输入输出共享; split by vocabulary over TP / 在 TP 上按词表切分" in format_plan(gpt3)
    assert "untied / 不共享; whole on every TP rank / 每个 TP rank 完整保存" in format_plan(small)
    assert "embeddings / 嵌入层" not in format_plan(bare)


def test_the_explorer_counts_model_states_as_asked():
    """Lesson 15's explorer opens on its GPT-3 layout with the ZeRO paper's count, as the lesson's section 2 does:
    it fits; dtlab's own count (16-bit copies per micro-batch in flight) does not."""
    from dtlab.lab.planner_widget import PlannerExplorer

    paper, own = PlannerExplorer(states="paper").result, PlannerExplorer().result
    assert paper.fits and paper.memory["copies"] < 1e-3 * paper.memory["total"]  # only the norms' fp32 casts
    assert not own.fits and own.memory["copies"] > 0


def test_the_explorer_draws_no_bars_for_a_layout_it_refuses():
    """A refused layout (the batch does not split into dp x micro-batches) leaves no bars of the last one
    that planned, only the refusal; the next layout that plans draws its own (tools/browser_course.py
    --every-value found lesson 15's bars of micro-batches 251 shown at 252)."""
    from dtlab.lab.planner_widget import PlannerExplorer

    explorer = PlannerExplorer()
    explorer.micro_batches.value = 252  # 1536 sequences do not split into 8 ranks x 252
    assert explorer.result is None and "252" in explorer.summary.value
    assert all(len(trace.x) == 0 and len(trace.y) == 0 for trace in explorer.figure.data)
    explorer.micro_batches.value = 192
    label = f"{explorer.result.gpus} x {explorer.result.gpu}"
    assert all(list(trace.x) == [label] for trace in explorer.figure.data)
    assert explorer.figure.data[0].y[0] == explorer.result.memory["params"] / 1e9
