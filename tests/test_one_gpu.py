"""Lesson 13's measurements: the steps table and its gains, the stored GPU report, the attention's saved bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dtlab.config import MODEL_PRESETS
from dtlab.course.experiments import one_gpu
from dtlab.course.experiments.attention_memory import activations_by_seq_len, attention_saved_bytes

REPORT = Path(__file__).resolve().parent.parent / "notebooks" / "gpu_check.json"


def test_the_stored_report_says_where_and_when_and_sdpa_gains_most_there():
    stored = one_gpu.stored_report(REPORT)
    assert "H200" in stored["device"] and len(stored["date"]) == 10 and stored["date"][4] == "-"
    assert [row["step"] for row in stored["rows"]] == [name for name, _ in one_gpu.STEPS]
    gains = one_gpu.gains(stored["rows"])
    assert set(gains) == {"sdpa", "fused", "compile", "batch"}
    assert one_gpu.gains_most(stored["rows"]) == "sdpa" and gains["sdpa"] > 2.5
    assert stored["rows"][0]["mfu"] < 0.1 < 0.45 < stored["rows"][-1]["mfu"]


def test_the_mfu_of_a_row_is_papers_flops_over_the_peak(monkeypatch):
    """The stored eager row's MFU, recomputed from its milliseconds with PaLM's FLOPs per token and the peak."""
    monkeypatch.delenv("DTLAB_PEAK_TFLOPS", raising=False)
    row = one_gpu.stored_report(REPORT)["rows"][0]
    cfg, params = one_gpu.GPT_100M, one_gpu.GPT_100M.param_count()
    assert one_gpu.model_flops_per_step(cfg, params, 1) == 6 * params + 12 * 14 * 768 * 1024 == 734_588_928
    again = one_gpu.speed(cfg, params, row["batch"], [row["ms"] / 1e3], "cpu")
    assert again["mfu"] is None  # the CPU has no peak in the table
    peak, _ = one_gpu.peak_flops("NVIDIA H200")
    assert again["tflops"] * 1e12 / peak == pytest.approx(row["mfu"], rel=1e-9)


def test_a_skipped_row_keeps_its_reason_and_the_next_builds_on_the_last_that_ran():
    rows = one_gpu.steps_table(
        MODEL_PRESETS["tiny"], "cpu", (2, 4), skip={"compile": "not here"}, bf16=False, steps=1, warmup=0
    )
    assert rows[3]["skipped"] == "not here" and "ms" not in rows[3]
    assert (rows[4]["compile"], rows[4]["batch"], rows[4]["fused"]) == (False, 4, True)
    assert set(one_gpu.gains(rows)) == {"sdpa", "fused", "batch"}
    assert "not run: not here" in one_gpu.table(rows) and "not run / 未运行: not here" in one_gpu.text_table(rows)


def test_the_live_table_on_a_cpu_is_small_and_does_not_compile(monkeypatch):
    monkeypatch.setattr(one_gpu, "CPU_MODEL", "tiny")
    monkeypatch.setattr(one_gpu, "CPU_TIMED", 1)
    here = one_gpu.live_table("cpu")
    assert here["device"] == "cpu" and here["model"].startswith("tiny")
    assert [("skipped" in row) for row in here["rows"]] == [False, False, False, True, False]
    assert one_gpu.gains_most(here["rows"]) in ("sdpa", "fused", "batch")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_eager_keeps_the_t_by_t_scores_and_sdpa_one_statistic_per_query(dtype):
    B, nh, T = 3, 5, 40
    size = torch.empty((), dtype=dtype).element_size()
    eager = attention_saved_bytes(B, nh, T, dtype)
    assert eager["scores"] == B * nh * T * T * size and eager["per_query"] == 0
    fused = attention_saved_bytes(B, nh, T, dtype, attention="sdpa")
    assert fused["scores"] == 0 and fused["per_query"] == B * nh * T * 4  # fp32 log-sum-exp


def test_eager_activations_grow_faster_than_twice_with_t_and_sdpas_double():
    eager = activations_by_seq_len((128, 256), attention="eager", batch=1, preset="tiny")
    fused = activations_by_seq_len((128, 256), attention="sdpa", batch=1, preset="tiny")
    assert fused[256] / fused[128] == pytest.approx(2.0, rel=0.01)
    assert eager[256] / eager[128] > 3.0 and eager[256] > fused[256]


def test_the_figures_follow_the_language():
    from dtlab.i18n import set_language, t
    from dtlab.lab.one_gpu_view import AttentionMemoryFigure, StepGainsFigure

    gains = StepGainsFigure({"sdpa": 2.7}, {"sdpa": 1.2}, gpu_name="NVIDIA H200", date="2026-12-04", here_name="cpu")
    memory = AttentionMemoryFigure({"eager": {64: 2**20}, "sdpa": {64: 2**19}}, batch=1)
    try:
        set_language("zh")
        assert gains.figure.layout.title.text == t("onegpu.gains.title", "zh")
        assert gains.figure.data[0].name == "NVIDIA H200，2026-12-04（约 1 亿参数 GPT）"
        assert memory.figure.layout.xaxis.title.text == "序列长度 T（token）"
        set_language("en")
        assert memory.figure.data[1].name == t("onegpu.mem.sdpa", "en")
        assert memory.figure.data[0].y == (1.0,)
    finally:
        set_language("en")
