"""The planner with sequence and context parallelism: Korthikanti et al.'s memory, ring attention's traffic."""

from __future__ import annotations

import json

import pytest

from dtlab.config.layout import Layout
from dtlab.planner import activation_bytes_per_layer, get_gpu, get_link, plan
from dtlab.planner.communication import context_parallel_comm_time, tensor_parallel_comm_time

S, B, H, A = 2048, 1, 12288, 96  # GPT-3 175B's shape, Korthikanti et al.'s running example


def per_layer(**kw) -> float:
    return activation_bytes_per_layer(seq_len=S, micro_batch=B, hidden=H, heads=A, **kw)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_activations_follow_korthikanti_table_2(t):
    sbh, attn = S * B * H, 5 * A * S / H
    assert per_layer(tp=t) == pytest.approx(sbh * (10 + 24 / t + attn / t))
    assert per_layer(tp=t, sequence_parallel=True) == pytest.approx(sbh * (34 / t + attn / t))
    # What SP saves is the 10 sbh TP leaves whole, divided by t.
    assert per_layer(tp=t) - per_layer(tp=t, sequence_parallel=True) == pytest.approx(sbh * 10 * (1 - 1 / t))


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_context_parallelism_divides_every_token_term_and_keeps_no_scores(cp):
    for sp in (False, True):
        for t in (1, 8):
            if sp and t == 1:
                continue
            selective = per_layer(tp=t, sequence_parallel=sp, recompute="selective")
            assert per_layer(tp=t, sequence_parallel=sp, cp=cp) == pytest.approx(selective / cp)
    assert per_layer(cp=cp, recompute="full") == pytest.approx(2 * S * B * H / cp)


def test_plan_with_cp_and_sp():
    base = Layout(tp=8, sp=True, precision="bf16", recompute="selective", zero=1)
    one = plan("llama3-8b", base, seq_len=131072)
    cp = plan("llama3-8b", Layout(**{**base.__dict__, "cp": 4}), seq_len=131072)
    assert (cp.gpus, cp.cp, one.cp) == (32, 4, 1)
    assert cp.memory["activations"] == pytest.approx(one.memory["activations"] / 4, rel=1e-9)
    assert cp.memory["optimizer"] == pytest.approx(one.memory["optimizer"] / 4, rel=1e-3)  # ZeRO over dp x cp
    assert cp.flops_per_iteration == one.flops_per_iteration  # the same work, 4x the GPUs
    assert cp.compute_time_s == pytest.approx(one.compute_time_s / 4)
    assert "cp" not in one.comm_time_s and "cp" not in one.links  # a plan without CP: as before
    assert cp.links == {"dp": "infiniband", "tp": "nvlink", "cp": "infiniband", "pp": "infiniband"}
    # Ring attention's bytes: this rank's K and V (GQA: 8 KV heads of 128), s/cp tokens, bf16, heads / tp.
    kv = 2 * (131072 // 4) * 1024 // 8 * 2
    assert cp.comm_time_s["cp"] == pytest.approx(
        context_parallel_comm_time(
            kv, cp=4, layers=32, micro_batches=1, recompute="selective", link=get_link("infiniband")
        )
    )
    link = get_link("nvlink")
    expected = 3 * link.time(kv) + 3 * link.time(2 * kv) + link.time(kv)  # N-1 forward, N-1 + 1 back
    assert context_parallel_comm_time(
        kv, cp=4, layers=1, micro_batches=1, recompute="none", link=link
    ) == pytest.approx(expected)
    # SP's ring cost: TP's all-reduces plus the two inputs gathered again in backward.
    assert tensor_parallel_comm_time(
        1e6, tp=8, layers=1, micro_batches=1, recompute="none", link=link, sequence_parallel=True
    ) > tensor_parallel_comm_time(1e6, tp=8, layers=1, micro_batches=1, recompute="none", link=link)
    assert get_gpu("H100").link_for(8 * 4) == "infiniband"


def test_plan_cli_takes_cp(capsys):
    from dtlab.cli import main

    assert (
        main(
            [
                "plan",
                "--model",
                "llama3-8b",
                "--seq-len",
                "32768",
                "--tp",
                "4",
                "--sequence-parallel",
                "--cp",
                "2",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert (out["cp"], out["tp"], out["gpus"], out["sequence_parallel"]) == (2, 4, 8, True)
    assert out["comm_time_s"]["cp"] > 0


def test_memory_view_redraws_from_the_planner():
    from dtlab.i18n import set_language
    from dtlab.lab.long_context_view import CP_DEGREES, SEQ_LENS, LongContextMemoryView, activations_per_gpu

    view = LongContextMemoryView(model="llama3-8b", tp=8, sp=True, cp=1, seq_len=131072)
    lines = {cp: list(trace.y) for cp, trace in zip(CP_DEGREES, view.figure.data)}
    for cp in CP_DEGREES:  # selective recompute: every line is the CP 1 line divided by cp
        assert lines[cp] == pytest.approx([y / cp for y in lines[1]])
    view.cp.value = 4  # a change redraws at once: the dot moves to the CP 4 line
    assert list(view.figure.data[len(CP_DEGREES)].y) == pytest.approx([lines[4][SEQ_LENS.index(131072)]])
    assert "CP 4" in view.summary.value and "18.3 GB" in view.summary.value
    assert view.chosen_bytes() == activations_per_gpu("llama3-8b", seq_len=131072, tp=8, sp=True, cp=4)
    view.seq_len.value = SEQ_LENS[2]  # every curve is drawn over the axis's sequence lengths (x sent with y)
    assert [list(trace.x) for trace in view.figure.data[: len(CP_DEGREES)]] == [list(SEQ_LENS)] * len(CP_DEGREES)
    assert list(view.figure.data[len(CP_DEGREES)].x) == [SEQ_LENS[2]]
    try:
        set_language("zh")
        assert "每张 GPU 激活" in view.summary.value and "规划器" in view.figure.layout.title.text
    finally:
        set_language("en")
