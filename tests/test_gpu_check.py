"""The GPU check script: its arithmetic and its steps everywhere (on the CPU, a tiny model); without CUDA, its refusal."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dtlab.config import MODEL_PRESETS, TrainConfig

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "gpu_check.py"
sys.path.insert(0, str(SCRIPT.parent))  # imported by name, so that a rank finds its functions and classes too
gpu_check = importlib.import_module("gpu_check")
TINY = MODEL_PRESETS["tiny"]


def test_layouts_are_every_split_the_gpu_count_allows():
    assert gpu_check.layouts(1) == [{"dp": 1, "tp": 1, "pp": 1, "micro_batches": 1}]
    two = {(x["dp"], x["tp"], x["pp"]) for x in gpu_check.layouts(2)}
    assert two == {(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2)}
    eight = gpu_check.layouts(8)
    assert len(eight) == 18 and all(x["dp"] * x["tp"] * x["pp"] in (1, 2, 4, 8) for x in eight)
    assert (2, 2, 2) in {(x["dp"], x["tp"], x["pp"]) for x in eight}


def test_the_mfu_model_is_about_100m_parameters_and_its_flops_are_papers():
    params = gpu_check.GPT_100M.param_count()
    assert 95e6 < params < 105e6
    cfg = gpu_check.GPT_100M
    assert gpu_check.model_flops_per_step(cfg, params, 1) == 6 * params + 12 * 14 * 768 * 1024
    assert (cfg.d_model, cfg.n_head, cfg.n_layer, cfg.vocab_size, cfg.seq_len) == (768, 12, 14, 256, 1024)


def test_peak_flops_names_its_source(monkeypatch):
    monkeypatch.delenv("DTLAB_PEAK_TFLOPS", raising=False)
    assert gpu_check.peak_flops("NVIDIA H200")[0] == 989e12
    assert gpu_check.peak_flops("NVIDIA H100 PCIe")[0] == 756e12
    assert gpu_check.peak_flops("NVIDIA H100 80GB HBM3")[0] == 989e12
    peak, why = gpu_check.peak_flops("Some GPU")
    assert peak is None and "DTLAB_PEAK_TFLOPS" in why
    monkeypatch.setenv("DTLAB_PEAK_TFLOPS", "100")
    assert gpu_check.peak_flops("Some GPU") == (100e12, "DTLAB_PEAK_TFLOPS")


def test_the_plain_loop_trains_dtlabs_model_with_either_attention_and_says_its_speed(monkeypatch):
    """Two steps of the tiny GPT on the CPU: SDPA and the eager attention give the same loss (the same
    batches, the same weights), and the speed is in the table's units (MFU against a stated peak)."""
    monkeypatch.setenv("DTLAB_PEAK_TFLOPS", "1")
    runs = {
        attention: gpu_check.plain_loop(
            TINY, batch=2, device="cpu", attention=attention, fused=False, compile=False, steps=2, warmup=1, bf16=False
        )
        for attention in ("eager", "sdpa")
    }
    assert runs["eager"]["loss"] == pytest.approx(runs["sdpa"]["loss"], rel=1e-5)
    row = runs["sdpa"]
    assert set(row) == {"ms", "tokens_per_s", "tflops", "mfu", "loss"}
    assert row["tokens_per_s"] == pytest.approx(2 * TINY.seq_len / (row["ms"] / 1e3))
    assert row["mfu"] == pytest.approx(row["tflops"] / 1)
    fused_bf16 = gpu_check.plain_loop(TINY, batch=2, device="cpu", fused=True, compile=False, steps=1, warmup=0)
    assert fused_bf16["loss"] > 0


def test_the_steps_table_adds_one_change_a_row_and_a_failed_row_keeps_its_error(monkeypatch):
    """Where torch.compile fails, its row says why and the larger batch builds on the last row that ran."""

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(gpu_check.torch, "compile", no_compiler)
    rows = gpu_check.steps_table(TINY, "cpu", batches=(2, 4), steps=2, warmup=1)
    assert [r["step"] for r in rows] == [name for name, _ in gpu_check.STEPS]
    settings = [(r["attention"], r["fused"], r["compile"], r["batch"]) for r in rows]
    assert settings == [
        ("eager", False, False, 2),
        ("sdpa", False, False, 2),
        ("sdpa", True, False, 2),
        ("sdpa", True, True, 2),
        ("sdpa", True, False, 4),  # on the fused row: the compiled one failed
    ]
    assert "no compiler here" in rows[3]["error"] and "ms" not in rows[3]
    assert all("error" not in r and r["ms"] > 0 and r["wall_s"] > 0 for r in rows[:3] + rows[4:])
    assert "failed: RuntimeError: no compiler here" in gpu_check.table(rows)


def test_dtlabs_path_is_the_real_training_loop_and_its_records_speed():
    """dtlab.train on one rank (gloo here, NCCL on a GPU): the records' tokens/s after the warm-up steps."""
    from tests.harness import session_pool

    config = TrainConfig(model="tiny", batch_size=2, steps=4, seed=0)
    found = gpu_check.dtlab_path(config, session_pool(), "cpu", warmup=2)
    assert found["tokens_per_s"] > 0 and found["ms"] > 0 and found["loss"] > 0
    assert {"params", "grads", "optimizer", "activations", "workspace"} <= found["mem"].keys()
    assert found["mem"]["workspace"] == 0  # on the CPU no allocator is asked
    assert 0 <= found["compute_s"] <= found["ms"] / 1e3


def test_the_100m_config_keeps_every_field_but_the_shape():
    config = gpu_check.GPT100MConfig(batch_size=32, precision="bf16", steps=13)
    cfg = config.model_config()
    assert (cfg.d_model, cfg.n_layer, cfg.seq_len) == (768, 14, 1024)
    assert config.batch_size == 32 and config.precision == "bf16" and config.validate(max_world_size=1) is config


def test_the_report_has_every_check_and_says_which_failed(monkeypatch, tmp_path, capsys):
    """main() end to end on the CPU with a tiny model (the device, the model and the step counts swapped in):
    the JSON has the environment and the four checks; torch.compile made to fail fails the steps table
    (exit 1) while every other check still runs and dtlab's run uses the last row that ran."""
    import json

    env = {**gpu_check.environment(), "cuda_available": True, "gpus": 1, "device": "cpu (a dry run)"}
    monkeypatch.setattr(gpu_check, "environment", lambda: env)
    for name, value in [("DEVICE", "cpu"), ("GPT_100M", TINY), ("MEMORY_PRESET", "tiny")]:
        monkeypatch.setattr(gpu_check, name, value)
    monkeypatch.setattr(gpu_check, "BATCHES", (2, 4))
    monkeypatch.setattr(gpu_check, "WARMUP", 1)
    monkeypatch.setattr(gpu_check, "TIMED", 2)
    monkeypatch.setattr(gpu_check, "LAYOUT_STEPS", 2)
    monkeypatch.setattr(gpu_check.torch, "compile", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no compiler")))
    monkeypatch.setattr(
        gpu_check, "fastest_config", lambda row: TrainConfig(model="tiny", batch_size=row["batch"], steps=3, seed=0)
    )
    out = tmp_path / "gpu.json"
    assert gpu_check.main(["--out", str(out)]) == 1
    found = json.loads(out.read_text())
    assert {"date", "torch", "cuda", "device", "nccl"} <= found["environment"].keys()
    checked = found["checked"]
    assert set(checked) == {
        "layout dp1 tp1 pp1",
        "memory accountant vs torch.cuda.memory_allocated",
        "MFU steps of a ~100M GPT (plain PyTorch loop, bf16 autocast)",
        "dtlab / plain PyTorch loop",
    }
    assert not found["failed"] and found["elapsed_s"] > 0
    assert checked["memory accountant vs torch.cuda.memory_allocated"]["ok"]
    assert set(checked["memory accountant vs torch.cuda.memory_allocated"]["categories"]) == {
        "params",
        "buffers",
        "grads",
        "optimizer",
        "activations",
    }
    steps = checked["MFU steps of a ~100M GPT (plain PyTorch loop, bf16 autocast)"]
    assert not steps["ok"] and [("error" in r) for r in steps["rows"]] == [False, False, False, True, False]
    versus = checked["dtlab / plain PyTorch loop"]
    assert versus["plain"] == steps["rows"][-1] and versus["plain"]["batch"] == 4
    assert versus["ratio_tokens_per_s"] == pytest.approx(
        versus["dtlab"]["tokens_per_s"] / versus["plain"]["tokens_per_s"]
    )
    assert "| + torch.compile | 2 | failed: RuntimeError: no compiler" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: `make gpu-check` runs the real thing")
def test_without_a_gpu_it_checks_nothing_writes_nothing_and_says_so(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not out.exists()
    assert "nothing was checked" in proc.stderr and "没有检查任何项目" in proc.stderr
    assert proc.stderr.count("not checked / 未检查") == 4
    assert "dtlab's training loop vs a plain PyTorch loop" in proc.stderr
