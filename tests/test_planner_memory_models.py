"""The planner's memory models reproduce their references: ZeRO's Figure 1 and Table 1, DeepSpeed's
estimators and Megatron-LM's bytes per parameter to the byte, and Megatron-LM's published A100 runs
(Narayanan et al. 2021, Tables 1 and 2): they fit in 80 GB, at their TFLOP/s within 10%.

Every expectation is written here from its source, independently of dtlab/planner/memory_models.py.
Pure arithmetic: no processes.
"""

from __future__ import annotations

import argparse
import json
import re

import pytest

from dtlab.config.layout import Layout
from dtlab.i18n import ConfigError
from dtlab.planner import GPUS, by_shape, plan
from dtlab.planner.cli import add_plan_arguments, format_plan, run_plan
from dtlab.planner.formulas import dtlab_model_states_bytes, model_states_bytes
from dtlab.planner.search import search

GB = 10**9  # the ZeRO paper's GB: 16 bytes x 7.5B = 120 GB is decimal
CJK = re.compile(r"[\u4e00-\u9fff]")
PSI = 7_500_000_000
N_GPUS = (8, 16, 64, 128, 512, 1024)


def _plan_json(capsys, flags: str) -> dict:
    parser = argparse.ArgumentParser(prog="dtlab plan")
    add_plan_arguments(parser)
    assert run_plan(parser.parse_args([*flags.split(), "--json"])) == 0
    return json.loads(capsys.readouterr().out)


def _states(memory: dict) -> int:
    return sum(memory[k] for k in ("params", "grads", "optimizer", "copies"))


# --- ZeRO (Rajbhandari et al. 2020): the paper's split is the runtime's with the master in the optimizer ---

# Table 1, the 7.5B model: GB per device by DP degree, for P_os, P_os+g, P_os+g+p.
ZERO_TABLE_1 = {4: (52.5, 41.3, 30), 16: (35.6, 21.6, 7.5), 64: (31.4, 16.6, 1.88), 256: (30.4, 15.4, 0.47)}


@pytest.mark.parametrize("gpus", [4, 64, 16, 256])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_table_1_within_one_percent(capsys, gpus, stage):
    out = _plan_json(
        capsys,
        f"--params 7.5e9 --seq-len 1024 --gpus {gpus} --dp {gpus} --zero {stage} --precision fp16 "
        "--master-weights optimizer",
    )
    paper = ZERO_TABLE_1[gpus][stage - 1]
    assert _states(out["memory"]) == out["memory"]["total"]  # params only: model states are the total
    assert out["memory"]["total"] / GB == pytest.approx(paper, rel=0.01)
    assert (out["memory_model"], out["master_weights"], out["grad_dtype"]) == ("runtime", "optimizer", "fp16")
    assert out["fits"]  # 52.5 GB at N = 4 fits an 80 GB GPU, even at its peak (the gradient buckets beside)


@pytest.mark.parametrize("stage, figure_gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_figure_1(capsys, stage, figure_gb):
    # Figure 1: Ψ = 7.5B, N_d = 64, K = 12: (2 + 2 + K)Ψ, 4Ψ + KΨ/N_d, 2Ψ + (2 + K)Ψ/N_d, (2 + 2 + K)Ψ/N_d.
    out = _plan_json(
        capsys,
        f"--params 7.5e9 --seq-len 1024 --gpus 64 --dp 64 --zero {stage} --precision fp16 --master-weights optimizer",
    )
    exact = {0: 16 * PSI, 1: 4 * PSI + 12 * PSI // 64, 2: 2 * PSI + 14 * PSI // 64, 3: 16 * PSI // 64}[stage]
    assert out["memory"]["total"] == exact
    assert round(exact / GB, 1) == figure_gb  # the figure prints one decimal: 1.875 GB is its 1.9


def test_the_runtime_default_is_what_dtlab_train_allocates_by_default(capsys):
    # dtlab train keeps fp16's masters in the optimizer unless told: the paper's (2 + 2 + K)Ψ, 16-bit gradients.
    default = _plan_json(capsys, "--params 7.5e9 --seq-len 1024 --gpus 4 --dp 4 --zero 1 --precision fp16")
    optimizer = _plan_json(
        capsys, "--params 7.5e9 --seq-len 1024 --gpus 4 --dp 4 --zero 1 --precision fp16 --master-weights optimizer"
    )
    assert default == optimizer
    assert (default["memory_model"], default["master_weights"], default["grad_dtype"]) == (
        "runtime",
        "optimizer",
        "fp16",
    )
    assert _states(default["memory"]) == sum(model_states_bytes(PSI, dp=4, zero=1, precision="fp16").values())
    # The other layout, --master-weights model: fp32 module and gradients, 16-bit copies: 18Ψ at stage 0.
    model = _plan_json(
        capsys, "--params 7.5e9 --seq-len 1024 --gpus 4 --dp 4 --zero 1 --precision fp16 --master-weights model"
    )
    assert (model["master_weights"], model["grad_dtype"]) == ("model", "fp32")
    assert _states(model["memory"]) == sum(dtlab_model_states_bytes(PSI, dp=4, zero=1, precision="fp16").values())
    assert plan(PSI, Layout(dp=4, zero=1, precision="fp16"), states="paper") == plan(
        PSI, Layout(dp=4, zero=1, precision="fp16"), master_weights="optimizer"
    )
    fp32 = plan(PSI, Layout(dp=4, zero=1))
    assert (fp32.master_weights, fp32.grad_dtype) == (None, "fp32")  # no master copy in fp32


def test_megatrons_fp32_gradients_beside_bf16_weights_in_the_runtime():
    # --grad-dtype fp32 with the master in the optimizer: 2 + 4 + 12 bytes per parameter at stage 0.
    p = plan(PSI, Layout(dp=8, zero=0, precision="bf16"), master_weights="optimizer", grad_dtype="fp32")
    assert (p.memory["params"], p.memory["grads"], p.memory["optimizer"]) == (2 * PSI, 4 * PSI, 12 * PSI)


# --- DeepSpeed's estimators, as deepspeed/runtime/zero/stage_1_and_2.py and stage3.py state them ---


def deepspeed_zero2_gpu_bytes(total_params, total_gpus, cpu_offload):
    if cpu_offload:
        return 2 * total_params
    return 2 * total_params + int(18 * total_params / total_gpus)


def deepspeed_zero3_gpu_bytes(total_params, largest_layer_params, total_gpus, cpu_offload):
    largest_layer_memory = 4 * largest_layer_params
    if cpu_offload:  # offload_optimizer only; the parameters stay on the GPU
        return largest_layer_memory + int(2 * total_params / total_gpus)
    return largest_layer_memory + int(18 * total_params / total_gpus)


def gpt3_shaped_largest_layer(params):
    # The planner's stated assumption for a bare count: GPT-3's shape, h = 128 l and Ψ = 12 l h^2, so
    # h^3 = 32Ψ/3; the largest module is the token table, 50,257 x h.
    h = round((32 * params / 3) ** (1 / 3))
    return max(50_257 * h, 4 * h * h + 4 * h)


@pytest.mark.parametrize("params", [PSI, 175_000_000_000])
@pytest.mark.parametrize("gpus", N_GPUS)
def test_deepspeed_estimators_to_the_byte(capsys, params, gpus):
    flags = f"--params {params} --gpus {gpus} --dp {gpus} --memory-model deepspeed"
    for precision in ("fp16", "bf16"):
        for offload in (False, True):
            extra = f" --precision {precision}" + (" --offload" if offload else "")
            two = _plan_json(capsys, flags + " --zero 2" + extra)
            assert _states(two["memory"]) == deepspeed_zero2_gpu_bytes(params, gpus, offload)
            three = _plan_json(capsys, flags + " --zero 3" + extra)
            largest = gpt3_shaped_largest_layer(params)
            assert _states(three["memory"]) == deepspeed_zero3_gpu_bytes(params, largest, gpus, offload)
            assert (two["memory_model"], two["offload"], two["master_weights"]) == ("deepspeed", offload, "optimizer")
    assert gpt3_shaped_largest_layer(PSI) == 50_257 * 4309


@pytest.mark.parametrize("gpus", N_GPUS)
def test_deepspeed_zero3_largest_layer_of_a_shape(gpus):
    # GPT-3 175B: the largest module is its (tied) token table, 50,257 x 12,288, whole at tp = 1.
    arch = by_shape(layers=96, hidden=12288, heads=96, vocab=50257, seq_len=2048)
    p = plan(arch, Layout(dp=gpus, zero=3, precision="bf16"), memory_model="deepspeed", tied_embeddings=True)
    assert _states(p.memory) == deepspeed_zero3_gpu_bytes(p.params, 50_257 * 12_288, gpus, False)
    assert any("fp32 gradient partition" in n and "fp32 梯度分片" in n for n in p.notes)


def test_deepspeed_says_what_it_keeps_beyond_the_paper():
    p = plan(PSI, Layout(dp=64, zero=2, precision="fp16"), memory_model="deepspeed")
    paper = plan(PSI, Layout(dp=64, zero=2, precision="fp16"), master_weights="optimizer")
    assert _states(p.memory) - _states(paper.memory) == pytest.approx(4 * PSI / 64, abs=8)  # the fp32 partition
    (note,) = [n for n in p.notes if "DeepSpeed" in n]
    assert "fp32 gradient partition, 4Ψ/N = 0.47 GB" in note and CJK.search(note)
    assert "deepspeed" in format_plan(p) and "ZeRO-2" in format_plan(p)


# --- Megatron-LM's bytes per parameter (docs/source/api-guide/dist_optimizer.md) ---------------

MEGATRON = {  # (precision, grad dtype): (whole, (a, b) for the distributed optimizer's a + b/d)
    ("fp16", "fp16"): (20, (4, 16)),
    ("bf16", "fp32"): (18, (6, 12)),
    ("fp32", "fp32"): (16, (8, 8)),
}


@pytest.mark.parametrize("params", [PSI, 175_000_000_000])
@pytest.mark.parametrize("gpus", N_GPUS)
@pytest.mark.parametrize("precision, grads", list(MEGATRON))
def test_megatron_bytes_per_parameter_to_the_byte(capsys, params, gpus, precision, grads):
    whole, (a, b) = MEGATRON[(precision, grads)]
    flags = f"--params {params} --gpus {gpus} --dp {gpus} --memory-model megatron --precision {precision}"
    plain = _plan_json(capsys, flags + " --zero 0")
    assert _states(plain["memory"]) == whole * params
    assert plain["grad_dtype"] == grads  # Megatron-LM's default: fp32 gradients beside bf16 weights
    distributed = _plan_json(capsys, flags + " --zero 1")
    shard = -(-params // gpus)  # the buffer padded to a multiple of d
    assert _states(distributed["memory"]) == a * params + b * shard
    assert abs(_states(distributed["memory"]) - params * (a + b / gpus)) < b  # the formula, padding aside


# --- Megatron-LM's published runs on 80 GB A100s ---------------------------------------------

# Narayanan et al. 2021, Table 1 (V = 51,200, s = 2048): params (B), heads, h, layers, t, p, GPUs, batch,
# TFLOP/s per GPU. Run as Sec. 5.1 says: mixed precision (fp16), activation recomputation (Eq. 3 counts
# it), the interleaved schedule with scatter/gather; the table gives neither the micro-batch size nor v:
# micro-batches of one sequence (as Table 2's PTD-P rows), v the smallest > 1 dividing a stage's blocks.
NARAYANAN = {
    "1.7B": (24, 2304, 24, 1, 1, 32, 512, 137),
    "3.6B": (32, 3072, 30, 2, 1, 64, 512, 138),  # calibration (dtlab/planner/hardware.py)
    "18.4B": (48, 6144, 40, 8, 1, 256, 1024, 135),
    "145.6B": (96, 12288, 80, 8, 8, 1536, 2304, 148),
    "529.6B": (128, 20480, 105, 8, 35, 2520, 2520, 163),  # calibration
    "1T": (160, 25600, 128, 8, 64, 3072, 3072, 163),
}


def _narayanan(name: str, memory_model: str = "megatron", **options):
    heads, h, layers, t, p, gpus, batch, _ = NARAYANAN[name]
    d = gpus // (t * p)
    blocks = layers // p
    v = 1 if p == 1 else min(k for k in range(2, blocks + 1) if blocks % k == 0)
    layout = Layout(
        dp=d,
        tp=t,
        pp=p,
        micro_batches=batch // d,
        precision="fp16",
        recompute="full",
        schedule="interleaved" if p > 1 else "1f1b",
        virtual_stages=v,
    )
    arch = by_shape(layers=layers, hidden=h, heads=heads, vocab=51200, seq_len=2048)
    return plan(
        arch,
        layout,
        gpu="A100",
        batch_size=batch,
        tied_embeddings=True,
        vocab_parallel=True,
        memory_model=memory_model,
        **options,
    )


def _tflops(p) -> float:
    return p.flops_per_iteration / (p.step_time_s * p.gpus) / 1e12  # as Table 1 counts: Eq. 3, recompute in


@pytest.mark.parametrize("name", ["1.7B", "18.4B", "145.6B", "1T"])
def test_narayanan_table_1_tflops_within_ten_percent(name):
    p = _narayanan(name)
    assert _tflops(p) == pytest.approx(NARAYANAN[name][-1], rel=0.10)
    assert p.fits, (name, p.memory)


def test_the_a100_fractions_reproduce_their_calibration_rows_and_grow_with_the_model():
    fractions = []
    for name in ("3.6B", "529.6B"):
        p = _narayanan(name)
        assert _tflops(p) == pytest.approx(NARAYANAN[name][-1], rel=0.01)
        fractions.append(p.achievable_fraction)
    assert 0.18 < fractions[0] < fractions[1] < 0.61  # between the attention core's and the matmuls'
    assert _narayanan("1T").achievable_fraction > 0.5  # above the old fixed guess, which capped 1T at 156


@pytest.mark.parametrize("name", ["145.6B", "1T"])
def test_narayanan_layouts_fit_in_80_gb_under_megatron_as_they_ran(name):
    p = _narayanan(name)
    assert p.memory["copies"] == 0 and p.memory["peak"] <= 80 * GB and p.fits
    # The 16-bit weights are the model's, held once; the pipeline keeps two boundary tensors in flight.
    assert p.memory["params"] == 2 * p.params_per_gpu and p.memory["grads"] == 6 * p.params_per_gpu
    assert p.memory["buffers"] == 2 * 2048 * NARAYANAN[name][1] * 2
    # dtlab's own runtime with the masters in the fp32 module: a 16-bit copy per micro-batch in flight.
    runtime = _narayanan(name, "runtime", master_weights="model")
    assert not runtime.fits and runtime.memory["copies"] > 10 * GB


@pytest.mark.parametrize("gpus", [384, 768, 1536])
def test_narayanan_table_2_gpt3_175b_fits_under_megatron(gpus):
    # Table 2, PTD-P: GPT-3 175B, t = 8, p = 12 (model-parallel size 96), batch 1536, micro-batch 1.
    d = gpus // 96
    layout = Layout(
        dp=d,
        tp=8,
        pp=12,
        micro_batches=1536 // d,
        precision="fp16",
        recompute="full",
        schedule="interleaved",
        virtual_stages=2,
    )
    p = plan("gpt3-175b", layout, gpu="A100", batch_size=1536, memory_model="megatron")
    assert p.fits and p.memory["peak"] <= 80 * GB
    assert _tflops(p) == pytest.approx({384: 153, 768: 149, 1536: 141}[gpus], rel=0.10)


def test_the_a100_has_its_own_links():
    a100, h100 = GPUS["A100"], GPUS["H100"]
    assert a100.link("nvlink").bandwidth_Bps == 300e9  # NVLink 3: 600 GB/s both directions, 300 one way
    assert a100.link("infiniband").bandwidth_Bps == 25e9  # HDR: 200 Gb/s per NIC, one NIC per GPU
    assert h100.link("nvlink").bandwidth_Bps == 450e9 and h100.link("infiniband").bandwidth_Bps == 50e9
    assert h100.matmul_fraction == h100.attention_fraction == 0.5  # not calibrated: the old guess


# --- refusals, in both languages, naming what is allowed ------------------------------------


@pytest.mark.parametrize(
    "layout, options, shown",
    [
        (Layout(dp=8, zero=1, precision="bf16"), dict(memory_model="deepspeed"), ("zero=1", "'bf16'")),
        (Layout(dp=8, zero=2), dict(memory_model="deepspeed"), ("precision='fp32'", "'fp16'")),
        (Layout(dp=4, pp=2, zero=2, precision="bf16"), dict(memory_model="deepspeed"), ("pp=2", "pipeline")),
        (Layout(dp=8, zero=2, precision="bf16"), dict(memory_model="megatron"), ("zero=2", "zero=1")),
        (Layout(dp=8, precision="bf16"), dict(memory_model="megatron", master_weights="model"), ("'model'",)),
        (
            Layout(dp=8, precision="bf16"),
            dict(master_weights="model", grad_dtype="bf16"),
            ("grad_dtype='bf16'", "'fp32'"),
        ),
        (Layout(dp=8, zero=1, precision="bf16"), dict(offload=True), ("offload=True", "'deepspeed'")),
        (Layout(dp=8), dict(memory_model="zero"), ("memory_model", "'megatron'")),
        (Layout(dp=8), dict(states="paper", memory_model="megatron"), ("states='paper'", "'optimizer'")),
    ],
)
def test_refusals_are_bilingual_and_name_the_value(layout, options, shown):
    with pytest.raises(ConfigError) as info:
        plan(PSI, layout, **options)
    for text in shown:
        assert text in info.value.en and text in info.value.zh
    assert CJK.search(info.value.zh) and not CJK.search(info.value.en)


def test_search_rejects_what_the_memory_models_trainer_does_not_run():
    found = search("small", gpus=4, gpu="H100", batch_size=8, memory_model="deepspeed")
    assert found.ranked and all(p.zero in (2, 3) and p.pp == 1 for p in found.ranked)
    refused = found.by_reason()["framework_refuses"]
    assert {r.fields["zero"] for r in refused} >= {0, 1} and all(r.zh for r in refused)
    assert all(p.memory_model == "deepspeed" for p in found.ranked)


def test_the_report_names_the_memory_model_in_both_languages():
    text = format_plan(plan("gpt3-175b", Layout(tp=8, pp=16, dp=8, zero=1, precision="bf16"), memory_model="megatron"))
    assert "memory model: megatron, bf16 params, fp32 grads, distributed optimizer" in text
    assert "显存模型：megatron" in text and "Megatron-LM's bytes per parameter" in text
    assert "(d = 8): 7.5;" in text  # 6 + 12/d
