"""The planner and the link model against the numbers their papers publish.

Each test names the paper and the table, figure or equation it reproduces.
Pure arithmetic: no processes, no process groups.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import subprocess
import sys

import pytest

from dtlab.config import MODEL_PRESETS, TrainConfig
from dtlab.config.layout import Layout
from dtlab.i18n import ConfigError
from dtlab.parallel.pipeline.schedule import peak_in_flight
from dtlab.planner import (
    ACHIEVABLE_FRACTION,
    ARCHITECTURES,
    GPUS,
    LINKS,
    Architecture,
    Link,
    activation_bytes_per_layer,
    by_shape,
    dtlab_model_states_bytes,
    flops_per_iteration,
    get_link,
    model_flops_per_token,
    model_states_bytes,
    params_per_rank,
    plan,
    plan_for_config,
)
from dtlab.planner.cli import add_plan_arguments, format_plan, parse_count, run_plan
from dtlab.planner.communication import (
    bus_bandwidth,
    data_parallel_comm_time,
    ring_all_gather_time,
    ring_allreduce_time,
    ring_bytes_sent_per_rank,
    ring_reduce_scatter_time,
    tensor_parallel_comm_time,
)

GB = 10**9
CJK = re.compile(r"[\u4e00-\u9fff]")


# --- ZeRO (Rajbhandari et al. 2019) --------------------------------------------


@pytest.mark.parametrize(
    "stage, paper_gb, tolerance_gb", [(0, 120, 0.05), (1, 31.4, 0.05), (2, 16.6, 0.05), (3, 1.88, 0.005)]
)
def test_zero_figure_1_model_states(stage, paper_gb, tolerance_gb):
    # ZeRO, Fig. 1: Ψ = 7.5B, N_d = 64, K = 12, mixed precision.
    states = model_states_bytes(7_500_000_000, dp=64, zero=stage, precision="bf16")
    assert sum(states.values()) == pytest.approx(paper_gb * GB, abs=tolerance_gb * GB)
    # With the masters in the fp32 module, plan() counts dtlab's other layout (fp32 gradients, 16-bit copies).
    p = plan(7_500_000_000, Layout(dp=64, zero=stage, precision="bf16"), seq_len=1024, master_weights="model")
    dtlab_states = dtlab_model_states_bytes(7_500_000_000, dp=64, zero=stage, precision="bf16")
    assert p.memory["total"] - p.memory["activations"] == sum(dtlab_states.values())
    # By default (the masters in the optimizer, as dtlab train keeps them for bf16): the paper's split.
    default = plan(7_500_000_000, Layout(dp=64, zero=stage, precision="bf16"), seq_len=1024)
    assert default.memory["total"] - default.memory["activations"] == sum(states.values())
    paper = plan(7_500_000_000, Layout(dp=64, zero=stage, precision="bf16"), seq_len=1024, states="paper")
    assert paper.memory["total"] - paper.memory["activations"] == sum(states.values())


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_dtlab_categories_map_onto_the_papers_2_2_k(stage):
    """Same Ψ, dtlab's split: 16-bit copies 2Ψ (paper's 16-bit params), fp32 grads 4Ψ (paper: 2Ψ
    of 16-bit), fp32 master = params 4Ψ and moments 8Ψ (together the paper's K = 12)."""
    psi = 1_000_000
    paper = model_states_bytes(psi, dp=4, zero=stage, precision="bf16")
    mine = dtlab_model_states_bytes(psi, dp=4, zero=stage, precision="bf16")
    shard = psi // 4
    assert mine["copies"] == (2 * psi if stage < 3 else 0) == (paper["params"] if stage < 3 else 0)
    assert mine["grads"] == 2 * paper["grads"]
    assert mine["optimizer"] == 8 * (shard if stage >= 1 else psi)
    assert mine["params"] == 4 * (shard if stage >= 3 else psi)
    assert mine["params"] + mine["optimizer"] == (paper["optimizer"] if stage in (0, 3) else 4 * psi + 8 * shard)
    assert dtlab_model_states_bytes(psi, precision="fp32") == {**model_states_bytes(psi), "copies": 0}


def test_zero_fp32_counts_four_four_eight_bytes_and_pads_the_shard():
    assert model_states_bytes(10, precision="fp32") == {"params": 40, "grads": 40, "optimizer": 80}
    # 10 elements over 4 ranks: a flat buffer padded to 12, 3 elements per rank.
    assert model_states_bytes(10, dp=4, zero=1, precision="fp32") == {"params": 40, "grads": 40, "optimizer": 24}
    assert model_states_bytes(10, dp=4, zero=3, precision="fp32") == {"params": 12, "grads": 12, "optimizer": 24}


# --- parameter counts ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny", "small", "medium"])
def test_dtlab_presets_count_exactly_as_model_config(name):
    assert plan(name).params == MODEL_PRESETS[name].param_count()
    shorter = dataclasses.replace(MODEL_PRESETS[name], seq_len=8)  # position table shrinks
    assert plan(name, seq_len=8).params == shorter.param_count()
    assert plan(MODEL_PRESETS[name]).params == MODEL_PRESETS[name].param_count()


def test_shape_flags_describe_dtlab_layout_and_match_the_torch_model():
    from dtlab.model import GPT

    cfg = MODEL_PRESETS["small"]
    shaped = plan(
        by_shape(layers=cfg.n_layer, hidden=cfg.d_model, heads=cfg.n_head, vocab=cfg.vocab_size, seq_len=cfg.seq_len)
    )
    assert shaped.params == sum(p.numel() for p in GPT(cfg).parameters())


@pytest.mark.parametrize(
    "heads, hidden, layers, billions",
    [
        # Narayanan et al. 2021, Table 1 (V = 51,200, s = 2048): a sample of rows.
        (24, 2304, 24, 1.7),
        (32, 4096, 36, 7.5),
        (64, 8192, 48, 39.1),
        (96, 12288, 80, 145.6),
        (128, 16384, 96, 310.1),
        (160, 25600, 128, 1008.0),
    ],
)
def test_megatron_table_1_parameter_counts(heads, hidden, layers, billions):
    arch = Architecture(
        name="row", layers=layers, hidden=hidden, heads=heads, vocab=51200, seq_len=2048, tied_embeddings=True
    )
    # Their parameter formula P = 12lh^2 (1 + 13/(12h) + (V+s)/(12lh)), plus the final
    # LayerNorm's 2h, which the formula leaves out.
    l, h, V, s = layers, hidden, 51200, 2048
    assert arch.param_count() == 12 * l * h * h + 13 * l * h + (V + s) * h + 2 * h
    assert arch.param_count() / 1e9 == pytest.approx(billions, abs=0.05)


def test_megatron_1_7b_row_by_equation_2_with_tied_embeddings(capsys):
    # Narayanan et al. 2021, Table 1's first row and Eq. (2), V = 51,200, s = 2048: tied,
    # as Megatron-LM's GPTs are; untied adds a second V x h table (1.77B).
    l, h, V, s = 24, 2304, 51200, 2048
    equation_2 = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))
    assert round(equation_2 / 1e9, 2) == 1.65
    flags = f"--layers {l} --hidden {h} --heads 24 --vocab {V} --seq-len {s} --json".split()
    for extra, expected in (
        (["--tied-embeddings"], equation_2 + 2 * h),
        ([], equation_2 + 2 * h + V * h),
        (["--no-tied-embeddings"], equation_2 + 2 * h + V * h),
    ):
        run_plan(_parse(flags + extra))
        assert json.loads(capsys.readouterr().out)["params"] == pytest.approx(expected, abs=1e-3)
    assert round((equation_2 + V * h) / 1e9, 2) == 1.77
    # The presets as published: GPT-3 tied (untying it adds V x h), Llama 3 and dtlab's GPT untied.
    gpt3 = ARCHITECTURES["gpt3-175b"]
    assert plan("gpt3-175b", tied_embeddings=False).params == gpt3.param_count() + gpt3.vocab * gpt3.hidden
    assert not ARCHITECTURES["llama3-8b"].tied_embeddings and not ARCHITECTURES["small"].tied_embeddings
    assert plan("small", tied_embeddings=True).params == MODEL_PRESETS["small"].param_count() - 256 * 64


def test_params_alone_answer_model_state_memory_without_seq_len(capsys):
    # ZeRO, Fig. 1's 7.5B at N_d = 64, stage 3: 16 bytes per parameter / 64 = 1.875 GB (fp32 or
    # the paper's mixed precision: 16Ψ both), with no --seq-len.
    run_plan(_parse("--params 7.5e9 --dp 64 --zero 3 --json".split()))
    out = json.loads(capsys.readouterr().out)
    states = sum(out["memory"][k] for k in ("params", "grads", "optimizer", "copies"))
    assert states == sum(model_states_bytes(7_500_000_000, dp=64, zero=3).values()) == 1_875_000_000
    assert out["memory"]["activations"] == 0 and out["seq_len"] == 2048
    assert any("2048" in note and "seq_len" in note and CJK.search(note) for note in out["notes"])
    # Given a sequence length, it is used and the note about the assumed one goes.
    given = plan(7_500_000_000, Layout(dp=64, zero=3), seq_len=1024)
    assert given.seq_len == 1024 and not any("2048" in note for note in given.notes)
    assert given.memory == plan(7_500_000_000, Layout(dp=64, zero=3)).memory


def test_gpt3_175b_preset():
    # The same formula with GPT-3's 50,257-token vocabulary: 174.6B.
    assert plan("gpt3-175b").params / 1e9 == pytest.approx(174.6, abs=0.05)


@pytest.mark.parametrize(
    "name, count",
    [
        # Parameter counts of the released Llama 3 / 3.1 checkpoints.
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
        ("llama3-405b", 405_853_388_800),
    ],
)
def test_llama3_presets_count_swiglu_gqa_rmsnorm_without_biases(name, count):
    assert ARCHITECTURES[name].param_count() == count


# --- parameters per rank under TP and PP ---------------------------------------------


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_pipeline_stages_partition_the_parameters(pp):
    total = MODEL_PRESETS["small"].param_count()
    assert sum(params_per_rank("small", pp=pp, stage=i).total for i in range(pp)) == total


@pytest.mark.parametrize("tp, pp", [(2, 1), (4, 1), (2, 2), (4, 4)])
def test_tensor_parallel_splits_blocks_and_replicates_the_rest(tp, pp):
    for stage in range(pp):
        whole = params_per_rank("small", tp=1, pp=pp, stage=stage)
        shard = params_per_rank("small", tp=tp, pp=pp, stage=stage)
        # Summed over the tp ranks: the split part once, the replicated part tp times.
        assert tp * shard.split + shard.replicated == whole.total
        assert shard.replicated == whole.replicated


def test_small_model_stage_zero_with_tp2_pp2_by_hand():
    h, V, s = 64, 256, 64
    split_per_block = 12 * h * h + 7 * h  # QKV, out, MLP weights; QKV and MLP-up biases
    replicated_per_block = 6 * h  # 2 LayerNorms, out and MLP-down biases
    rank = params_per_rank("small", tp=2, pp=2, stage=0)
    assert rank.split == 2 * split_per_block // 2
    assert rank.replicated == 2 * replicated_per_block + V * h + s * h
    last = params_per_rank("small", tp=2, pp=2, stage=1)
    assert last.replicated == 2 * replicated_per_block + 2 * h + h * V  # final LN, head


def test_tied_embeddings_keep_a_copy_on_the_last_stage():
    arch = ARCHITECTURES["gpt3-175b"]
    stages = [params_per_rank(arch, pp=8, stage=i).total for i in range(8)]
    assert sum(stages) == arch.param_count() + arch.vocab * arch.hidden


def test_uneven_layers_go_to_the_first_stages():
    # The runtime's own split (dtlab.parallel.pipeline.schedule.stage_layers): 3 + 2 blocks of 5.
    arch = dataclasses.replace(ARCHITECTURES["small"], layers=5)
    split, replicated = arch.layer_params()
    first, last = (params_per_rank(arch, pp=2, stage=i) for i in range(2))
    assert first.total == 3 * (split + replicated) + arch.embedding_params()
    assert last.total == 2 * (split + replicated) + arch.head_params()


def test_plan_reports_the_fullest_rank_and_shards_it_with_zero():
    p = plan("small", Layout(dp=2, tp=2, pp=2, zero=1, precision="fp32"))
    fullest = max(params_per_rank("small", tp=2, pp=2, stage=i).total for i in range(2))
    assert p.params_per_gpu == fullest
    assert p.memory["params"] == 4 * fullest
    assert p.memory["optimizer"] == 8 * math.ceil(fullest / 2)


# --- activations (Korthikanti et al. 2022) -------------------------------------------

S, H, A, T = 2048, 12288, 96, 8  # GPT-3 175B with 8-way tensor parallelism
SBH = S * 1 * H


def test_gpt3_attention_term_is_80():
    # Korthikanti et al. 2022, Sec. 5: for GPT-3, 5as/h = 80, more than the 34.
    assert 5 * A * S / H == 80


@pytest.mark.parametrize(
    "tp, sp, recompute, per_sbh",
    [
        (1, False, "none", 34 + 80),  # Eq. (1)
        (T, False, "none", 10 + 24 / T + 80 / T),  # Eq. (2)
        (T, True, "none", (34 + 80) / T),  # Eq. (3)
        (T, False, "selective", 10 + 24 / T),  # Table 2, selective recompute
        (T, True, "selective", 34 / T),
        (T, False, "full", 2),  # Table 2, full recompute
        (T, True, "full", 2 / T),
    ],
)
def test_korthikanti_activation_formulas(tp, sp, recompute, per_sbh):
    got = activation_bytes_per_layer(
        seq_len=S, micro_batch=1, hidden=H, heads=A, tp=tp, sequence_parallel=sp, recompute=recompute
    )
    assert got == pytest.approx(SBH * per_sbh)


def test_1f1b_first_stage_holds_a_whole_model_of_activations():
    # Korthikanti et al. 2022, Sec. 4.3: with 1F1B the first stage holds p micro-batches
    # of L/p layers, sbhL/t (34 + 5as/h) in total with TP + SP, whatever p is.
    for pp in (4, 8):
        p = plan("gpt3-175b", Layout(tp=T, pp=pp, micro_batches=16, sp=True, precision="bf16"))
        assert p.memory["activations"] == pytest.approx(SBH * 96 / T * (34 + 80))


def test_gpipe_holds_every_micro_batch():
    assert peak_in_flight("gpipe", 4, 8) == 8
    assert peak_in_flight("1f1b", 4, 8) == 4
    assert peak_in_flight("1f1b", 4, 8, 3) == 1
    gpipe = plan("small", Layout(pp=4, micro_batches=8, schedule="gpipe"))
    one_f_one_b = plan("small", Layout(pp=4, micro_batches=8, schedule="1f1b"))
    assert gpipe.memory["activations"] == 2 * one_f_one_b.memory["activations"]


def test_fp32_activations_are_twice_bf16():
    assert (
        plan("small", Layout(precision="fp32")).memory["activations"]
        == 2 * plan("small", Layout(precision="bf16")).memory["activations"]
    )


# --- FLOPs (Narayanan et al. 2021; PaLM) ------------------------------------------------

GPT3 = ARCHITECTURES["gpt3-175b"]
B = 1536


def test_narayanan_equation_3_with_full_recompute():
    l, h, s, V = GPT3.layers, GPT3.hidden, GPT3.seq_len, GPT3.vocab
    eq3 = 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    assert flops_per_iteration(GPT3, batch_size=B, recompute="full") == pytest.approx(eq3, rel=1e-12)
    without = 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))
    assert flops_per_iteration(GPT3, batch_size=B) == pytest.approx(without, rel=1e-12)
    selective = flops_per_iteration(GPT3, batch_size=B, recompute="selective")
    assert selective == flops_per_iteration(GPT3, batch_size=B) + l * 4 * B * s * s * h


def test_narayanan_training_time_estimate():
    # Narayanan et al. 2021, Sec. 5.1, Eq. (4): about 8TP/(nX); GPT-3 on 300B tokens,
    # 1024 A100s at 140 TFLOP/s each takes about 34 days.
    per_token = flops_per_iteration(GPT3, batch_size=1, recompute="full") / GPT3.seq_len
    assert per_token == pytest.approx(8 * GPT3.param_count(), rel=0.03)
    days = 300e9 * per_token / (1024 * 140e12) / 86400
    assert days == pytest.approx(34, abs=1)


def test_mfu_counts_6_psi_plus_attention_without_recompute():
    # PaLM (Chowdhery et al. 2022), Appendix B: 6N + 12 L H Q T per token.
    assert model_flops_per_token(100, layers=2, hidden=8, seq_len=16) == 600 + 12 * 2 * 8 * 16
    layout = Layout(tp=8, pp=8, micro_batches=8, precision="bf16")
    full = plan("gpt3-175b", dataclasses.replace(layout, recompute="full"), gpu="A100")
    none = plan("gpt3-175b", layout, gpu="A100")
    assert full.model_flops_per_iteration == none.model_flops_per_iteration
    assert full.flops_per_iteration > none.flops_per_iteration
    # With the shape known, the model's FLOPs are its matmuls, once: without recomputation MFU is HFU, and
    # 6N's count of looked-up embeddings is left out (PaLM's formula is within 1% for GPT-3, 10% over here).
    assert none.model_flops_per_iteration == none.flops_per_iteration
    assert none.model_flops_per_iteration == pytest.approx(
        none.batch_size * 2048 * model_flops_per_token(none.params, layers=96, hidden=12288, seq_len=2048), rel=0.01
    )
    small = plan("small")
    assert small.model_flops_per_iteration == small.flops_per_iteration
    assert small.mfu <= small.achievable_fraction
    peak = GPUS["A100"].peak_flops["bf16"]
    assert full.mfu == pytest.approx(full.model_flops_per_iteration / (full.step_time_s * full.gpus * peak))


# --- bubble -------------------------------------------------------------------------------


def test_bubble_fraction_of_total_time():
    # GPipe (Huang et al. 2018): (p-1)/(m+p-1), from dtlab.parallel.pipeline.schedule.
    assert plan("small", Layout(pp=4, micro_batches=4)).bubble_fraction == 3 / 7
    assert plan("small", Layout(pp=4, micro_batches=16)).bubble_fraction == 3 / 19
    assert plan("small", Layout(micro_batches=16)).bubble_fraction == 0
    # Narayanan et al. 2021, Sec. 2.2.1: bubble time over ideal time, (p-1)/m.
    assert plan("small", Layout(pp=4, micro_batches=16)).bubble_over_ideal == 3 / 16


def test_step_time_is_compute_stretched_by_the_bubble_plus_communication():
    p = plan("gpt3-175b", Layout(dp=4, tp=8, pp=4, micro_batches=8, precision="bf16", zero=1), batch_size=64)
    peak = GPUS["H100"].peak_flops["bf16"]
    ideal = p.flops_per_iteration / (p.gpus * peak * ACHIEVABLE_FRACTION)
    assert p.compute_time_s == pytest.approx(ideal / (1 - p.bubble_fraction))
    assert p.step_time_s == pytest.approx(p.compute_time_s + sum(p.comm_time_s.values()))
    assert p.links == {"dp": "infiniband", "tp": "nvlink", "pp": "infiniband"}
    assert plan("small", Layout(dp=2, tp=4)).links["dp"] == "nvlink"  # tp*dp = 8: one node


# --- GPU presets -------------------------------------------------------------------------------


def test_gpu_presets():
    assert GPUS["A100"].memory_bytes == 80 * GB and GPUS["A100"].peak_flops["bf16"] == 312e12
    assert GPUS["H100"].memory_bytes == 80 * GB and GPUS["H100"].peak_flops["bf16"] == 989e12
    assert GPUS["H200"].memory_bytes == 141 * GB and GPUS["H200"].peak_flops["bf16"] == 989e12
    for gpu in GPUS.values():
        assert gpu.gpus_per_node == 8
        assert gpu.intra_node_link == "nvlink" and gpu.inter_node_link == "infiniband"
    assert not plan("gpt3-175b", Layout(precision="bf16")).fits
    assert plan("small").fits


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, layout, kwargs, shown",
    [
        ("small", Layout(dp=2, tp=2), dict(gpus=8), ("dp*tp*pp", "gpus = 8")),
        ("small", Layout(tp=3), {}, ("tp = 3", "heads = 4")),
        ("small", Layout(pp=5), {}, ("pp = 5", "layers = 4")),
        ("small", Layout(micro_batches=3), dict(batch_size=4), ("batch_size = 4", "micro_batches = 3")),
        ("small", Layout(dp=0), {}, ("dp", " 0")),
        ("small", Layout(dp=1.5), {}, ("dp", "1.5")),
        ("small", Layout(schedule="zigzag"), {}, ("schedule", "'zigzag'", "'gpipe'", "'1f1b'")),
        ("small", Layout(zero=4), {}, ("zero", " 4", "0, 1, 2, 3")),
        ("small", Layout(precision="fp4"), {}, ("precision", "'fp4'", "'fp8'")),
        ("small", Layout(recompute="some"), {}, ("recompute", "'some'", "'selective'")),
        ("small", Layout(sp="yes"), {}, ("sp", "'yes'")),
        ("small", Layout(cp=3), {}, ("seq_len 64", "cp = 3", " 6")),
        ("small", Layout(sp=True), {}, ("--sequence-parallel", "tp > 1", "--tp 2")),
        ("small", Layout(ep=2), {}, ("ep = 2", "[1]")),
        ("small", Layout(experts=4, ep=3), {}, ("ep = 3", "[1, 2, 4]")),
        (dataclasses.replace(MODEL_PRESETS["small"], n_experts=4, top_k=5), Layout(), {}, ("top_k = 5", " 4")),
        ("small", Layout(), dict(gpu="V100"), ("'V100'", "H100")),
        ("small", Layout(), dict(seq_len=0), ("seq_len", " 0")),
        ("gpt5", Layout(), {}, ("'gpt5'", "llama3-8b")),
        (10**9, Layout(), dict(tied_embeddings=True), ("tied_embeddings", "--params")),
        ("small", Layout(), dict(tied_embeddings="yes"), ("tied_embeddings", "'yes'")),
        (0, Layout(), dict(seq_len=8), ("params", " 0")),
    ],
)
def test_bad_input_is_a_bilingual_error_naming_the_value(model, layout, kwargs, shown):
    with pytest.raises(ConfigError) as info:
        plan(model, layout, **kwargs)
    _assert_bilingual(info.value, shown)


def _assert_bilingual(error, shown):
    for text in shown:
        assert text in error.en and text in error.zh
    assert CJK.search(error.zh) and not CJK.search(error.en)


@pytest.mark.parametrize(
    "shape, shown",
    [
        (dict(layers=4, hidden=64, heads=4, vocab=256, seq_len=None), ("seq_len", "None")),
        (dict(layers=2, hidden=10, heads=4, vocab=8, seq_len=8), ("heads = 4", "hidden = 10")),
    ],
)
def test_bad_shape_is_a_bilingual_error(shape, shown):
    with pytest.raises(ConfigError) as info:
        by_shape(**shape)
    _assert_bilingual(info.value, shown)


def test_plan_for_config_passes_the_train_layout():
    config = TrainConfig(dp=2, pp=2, micro_batches=2, grad_accum=2, zero=1, recompute=True, batch_size=16)
    got = plan_for_config(config)
    # Gradient accumulation folds into the micro-batches; the bool recompute is "full".
    assert got == plan(
        MODEL_PRESETS["small"], Layout(dp=2, pp=2, micro_batches=4, zero=1, recompute="full"), batch_size=16
    )
    scaled = plan_for_config(config, gpus=64, gpu="A100")
    assert (scaled.gpus, scaled.dp, scaled.batch_size, scaled.gpu) == (64, 32, 256, "A100")


# --- the contract: plan(...).to_dict() and `dtlab plan --json` ------------------------------

CONTRACT = {"memory", "flops_per_iteration", "bubble_fraction", "step_time_s", "mfu", "params"}


def test_to_dict_has_the_contract_fields_and_is_json():
    d = plan("medium", Layout(dp=2, pp=2, micro_batches=4, zero=2)).to_dict()
    assert CONTRACT <= d.keys()
    assert set(d["memory"]) == {
        "params",
        "grads",
        "optimizer",
        "copies",
        "activations",
        "buffers",
        "logits",
        "peak",
        "total",
    }
    assert d["memory"]["total"] == sum(
        d["memory"][k] for k in ("params", "grads", "optimizer", "copies", "activations")
    )
    assert d["memory"]["peak"] <= sum(v for k, v in d["memory"].items() if k not in ("peak", "total"))
    assert json.loads(json.dumps(d)) == d


def _parse(argv):
    parser = argparse.ArgumentParser(prog="dtlab plan")
    add_plan_arguments(parser)
    return parser.parse_args(argv)


def test_run_plan_prints_the_json_object(capsys):
    args = _parse(
        [
            "--model",
            "small",
            "--dp",
            "2",
            "--pp",
            "2",
            "--micro-batches",
            "2",
            "--zero",
            "1",
            "--schedule",
            "gpipe",
            "--batch-size",
            "8",
            "--json",
        ]
    )
    assert run_plan(args) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = plan("small", Layout(dp=2, pp=2, micro_batches=2, zero=1, schedule="gpipe"), batch_size=8).to_dict()
    assert printed == expected and CONTRACT <= printed.keys()


def test_run_plan_table_is_labelled_in_both_languages(capsys):
    args = _parse(
        [
            "--params",
            "7.5B",
            "--seq-len",
            "2048",
            "--gpus",
            "64",
            "--dp",
            "64",
            "--zero",
            "3",
            "--precision",
            "bf16",
            "--gpu",
            "A100",
        ]
    )
    assert run_plan(args) == 0
    out = capsys.readouterr().out
    for label in ("params / 参数量", "optimizer / 优化器状态", "total / 合计", "MFU"):
        assert label in out
    assert "1.88 GB" in out  # ZeRO Fig. 1's P_os+g+p column
    assert format_plan(plan("small")).count("\n") > 10


def test_run_plan_refuses_two_ways_of_giving_the_model():
    with pytest.raises(ConfigError) as info:
        run_plan(_parse(["--model", "small", "--params", "1B"]))
    _assert_bilingual(info.value, ("--model='small'", "--params=1000000000"))


def test_run_plan_by_shape_and_sequence_parallel(capsys):
    run_plan(
        _parse(
            [
                "--layers",
                "4",
                "--hidden",
                "64",
                "--heads",
                "4",
                "--vocab",
                "256",
                "--seq-len",
                "64",
                "--tp",
                "2",
                "--sequence-parallel",
                "--json",
            ]
        )
    )
    printed = json.loads(capsys.readouterr().out)
    assert printed == plan(MODEL_PRESETS["small"], Layout(tp=2, sp=True)).to_dict() | {"model": "custom"}
    assert printed["sequence_parallel"] is True


def test_parse_count():
    assert parse_count("7.5B") == 7_500_000_000
    assert parse_count("175e9") == 175_000_000_000
    assert parse_count("350M") == 350_000_000
    with pytest.raises(argparse.ArgumentTypeError):
        parse_count("many")


# --- the link model (nccl-tests' PERFORMANCE.md) ------------------------------------------------

LINK = Link(name="test", latency_s=1e-5, bandwidth_Bps=1e9)


def test_ring_allreduce_time_formula():
    n, nbytes = 4, 64 * 10**6
    expected = 2 * (n - 1) * LINK.latency_s + 2 * (n - 1) / n * nbytes / LINK.bandwidth_Bps
    assert ring_allreduce_time(nbytes, n, LINK) == pytest.approx(expected)
    half = (n - 1) * LINK.latency_s + (n - 1) / n * nbytes / LINK.bandwidth_Bps
    assert ring_reduce_scatter_time(nbytes, n, LINK) == pytest.approx(half)
    assert ring_all_gather_time(nbytes, n, LINK) == pytest.approx(half)
    assert LINK.time(1000) == pytest.approx(1e-5 + 1e-6)


def test_world_size_one_costs_nothing():
    for op in (ring_allreduce_time, ring_reduce_scatter_time, ring_all_gather_time):
        assert op(10**9, 1, LINK) == 0


def test_bus_bandwidth_factors():
    assert bus_bandwidth(100.0, 4, "all_reduce") == pytest.approx(150.0)  # 2(n-1)/n
    assert bus_bandwidth(100.0, 4, "reduce_scatter") == pytest.approx(75.0)  # (n-1)/n
    assert bus_bandwidth(100.0, 4, "all_gather") == pytest.approx(75.0)
    # Lesson 01: a 64 MB all-reduce on 4 ranks sends 96 MB from every rank.
    assert ring_bytes_sent_per_rank(64e6, 4, "all_reduce") == pytest.approx(96e6)
    with pytest.raises(ConfigError):
        bus_bandwidth(1.0, 4, "all-to-all")


def test_link_presets_and_unknown_link():
    assert LINKS["nvlink"].bandwidth_Bps == 450e9
    assert LINKS["infiniband"].bandwidth_Bps == 50e9
    assert get_link("pcie") is LINKS["pcie"]
    with pytest.raises(ConfigError) as info:
        get_link("token-ring")
    assert "'token-ring'" in info.value.en and "nvlink" in info.value.en
    assert "'token-ring'" in info.value.zh and CJK.search(info.value.zh)
    with pytest.raises(ConfigError):
        ring_allreduce_time(1, 0, LINK)


def test_zero3_moves_one_and_a_half_times_the_data_of_dp():
    # ZeRO, Sec. 7: 3Ψ instead of 2Ψ. With no latency, time is proportional to volume.
    wire = Link(name="ideal", latency_s=0.0, bandwidth_Bps=1e9)
    dp = data_parallel_comm_time(1e9, dp=8, zero=0, link=wire)
    assert data_parallel_comm_time(1e9, dp=8, zero=2, link=wire) == pytest.approx(dp)
    assert data_parallel_comm_time(1e9, dp=8, zero=3, link=wire) == pytest.approx(1.5 * dp)


def test_tensor_parallel_all_reduces_four_times_per_layer_and_micro_batch():
    # Megatron-LM (Shoeybi et al. 2019), Sec. 3: f and g, two forward, two backward.
    one = ring_allreduce_time(1e6, 8, LINK)
    t = tensor_parallel_comm_time(1e6, tp=8, layers=3, micro_batches=5, recompute="none", link=LINK)
    assert t == pytest.approx(4 * 3 * 5 * one)


# --- torch-free -------------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["dtlab.parallel.pipeline.schedule", "dtlab.planner", "dtlab.config.layout"])
def test_importing_does_not_import_torch(module):
    # A fresh interpreter: this test process has torch loaded already.
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_zero2_walk_groups_the_models_own_parameters_and_only_lowers_the_bound():
    """The walk's layers are dtlab's GPT's parameters, grouped as the model names them (embeddings,
    each block, the final LayerNorm and head); its ZeRO-2 peak lies between the loss moment and the
    bound that counts every activation beside two buckets, and it applies only where it can."""
    from dtlab.model import build_model
    from dtlab.planner.architectures import from_model_config
    from dtlab.planner.step_memory import layout_peak
    from dtlab.planner.zero2_backward import backward_high, layers_in_model_order

    cfg = MODEL_PRESETS["small"]
    groups: dict[str, list[int]] = {}
    for name, p in build_model(cfg, seed=0).named_parameters():
        key = (
            ".".join(name.split(".")[:2])
            if name.startswith("blocks.")
            else ("first" if name.startswith(("tok_emb", "pos_emb")) else "last")
        )
        groups.setdefault(key, []).append(p.numel())
    assert layers_in_model_order(from_model_config(cfg), tp=1) == list(groups.values())

    config = TrainConfig(model="small", batch_size=8, dp=2, zero=2)
    memory = plan_for_config(config).memory
    arch = from_model_config(cfg)
    walked = backward_high(arch, config.layout, activations=memory["activations"], micro_batch=4, bucket_mb=0.25)
    loss_moment = memory["activations"] + memory["logits"]
    bound = memory["buffers"] + memory["grads"] + memory["activations"]
    assert memory["grads"] + memory["buffers"] < walked < bound
    assert memory["peak"] == memory["params"] + memory["optimizer"] + max(loss_moment, walked)
    assert memory["peak"] < layout_peak(memory, config.layout)  # the bound, without the walk
    for other in (dict(pp=2), dict(micro_batches=2), dict(precision="bf16"), dict(zero=1)):
        layout = TrainConfig(model="small", batch_size=8, **{"dp": 2, "zero": 2, **other}).layout
        assert backward_high(arch, layout, activations=memory["activations"], micro_batch=4, bucket_mb=0.25) is None


def test_fits_judges_the_higher_of_total_and_peak():
    """Buffers and logits can push the high-water mark above the papers' total: a GPU must hold that."""
    import dataclasses as dc

    from dtlab.planner.hardware import GPUS as presets

    p = plan("small", Layout(dp=2), batch_size=8)
    assert p.memory["peak"] > p.memory["total"]
    between = (p.memory["total"] + p.memory["peak"]) // 2
    tight = dc.replace(presets["H100"], name="tight", memory_bytes=between)
    presets["tight"] = tight
    try:
        squeezed = plan("small", Layout(dp=2), batch_size=8, gpu="tight")
    finally:
        del presets["tight"]
    assert not squeezed.fits and squeezed.memory["total"] <= squeezed.gpu_memory
