"""The GPU check script: its arithmetic everywhere; on a machine without CUDA, its refusal."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "gpu_check.py"
spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


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


def test_peak_flops_names_its_source(monkeypatch):
    monkeypatch.delenv("DTLAB_PEAK_TFLOPS", raising=False)
    assert gpu_check.peak_flops("NVIDIA H200")[0] == 989e12
    assert gpu_check.peak_flops("NVIDIA H100 PCIe")[0] == 756e12
    assert gpu_check.peak_flops("NVIDIA H100 80GB HBM3")[0] == 989e12
    peak, why = gpu_check.peak_flops("Some GPU")
    assert peak is None and "DTLAB_PEAK_TFLOPS" in why
    monkeypatch.setenv("DTLAB_PEAK_TFLOPS", "100")
    assert gpu_check.peak_flops("Some GPU") == (100e12, "DTLAB_PEAK_TFLOPS")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: `make gpu-check` runs the real thing")
def test_without_a_gpu_it_checks_nothing_writes_nothing_and_says_so(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not out.exists()
    assert "nothing was checked" in proc.stderr and "没有检查任何项目" in proc.stderr
    assert proc.stderr.count("not checked / 未检查") == 3
