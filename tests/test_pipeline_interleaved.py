"""The interleaved 1F1B runtime equals one process, and the 1F1B runtime, at PP 2 and 4.

Every rank builds a tiny GPT of 8 blocks with the same seed and keeps its v = 2
chunks (:func:`dtlab.pipeline.partition_gpt` with ``virtual_stages``): PP 2
cuts it into 4 chunks of 2 blocks, PP 4 into 8 of one. One step of the
interleaved schedule is compared with the full model on the whole batch
(loss, every gradient by name, every parameter after an SGD step), and with
the 1F1B runtime on the same ranks; the measured timeline's actions are the
schedule's, in its order. One launch per world size runs every check; then
``dtlab train --schedule interleaved`` against the single-process reference,
through a save and a resume at 1F1B, and the refusals before any rank starts.
"""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import dtlab.train
from dtlab.collectives import group_size_and_rank
from dtlab.config import MODEL_PRESETS, TrainConfig
from dtlab.course.experiments.pipeline import stage_versus_dense
from dtlab.data import global_batch
from dtlab.i18n import ConfigError
from dtlab.model import build_model
from dtlab.pipeline import PipelineRuntime, max_in_flight, partition_gpt, schedule, stage_layers
from dtlab.pipeline.schedule import FORWARD
from dtlab.reference import reference_train
from tests.harness import run_ranks, session_pool

CFG = dataclasses.replace(MODEL_PRESETS["tiny"], n_layer=8)
V = 2
BATCH = 8
DIFF = 1e-5                          # largest absolute gradient difference from the dense model
LR = 0.1


def _dense():
    dense = build_model(CFG, seed=0)
    x, y = global_batch(0, batch_size=BATCH, seq_len=CFG.seq_len, seed=0)   # (B, T) each
    loss = dense(x, y)
    loss.backward()
    return dense, x, y, loss.item()


def _step(dense, x, y, kind: str, m: int, v: int) -> dict:
    """One ``kind`` step of this rank's stage (a copy of ``dense``), then one SGD step on it."""
    size, rank = group_size_and_rank(None)
    full = copy.deepcopy(dense)
    full.zero_grad(set_to_none=True)
    stage = partition_gpt(full, stage=rank, stages=size, virtual_stages=v)
    runtime = PipelineRuntime(stage, d_model=CFG.d_model, schedule=kind, micro_batches=m, virtual_stages=v)
    step = runtime.step(x, y)
    diff, compared = stage_versus_dense(full, stage, dense)
    assert diff <= DIFF, (kind, m, diff)
    torch.optim.SGD(stage.parameters(), lr=LR).step()
    stepped = {name: p for name, p in full.named_parameters() if any(p is q for q in stage.parameters())}
    for name, p in dense.named_parameters():
        if name in stepped:
            assert_close(stepped[name], p - LR * p.grad, atol=1e-6, rtol=1e-5, msg=name)
    assert [a["action"] for a in step.timeline] == [str(a) for a in schedule(kind, size, m, v)[rank]]
    assert all(0 <= a["start"] <= a["end"] and a["wait"] >= 0 for a in step.timeline)
    assert 0.0 <= step.bubble_fraction < 1.0
    return {"loss": step.loss, "params": compared, "in_flight": step.in_flight_peak,
            "activations": step.activation_peak, "layers": list(stage.layers)}


def interleaved_checks(ctx, counts) -> dict:
    dense, x, y, loss = _dense()
    out = {"dense_loss": loss}
    for m in counts:
        out[("interleaved", m)] = _step(dense, x, y, "interleaved", m, V)
        out[("1f1b", m)] = _step(dense, x, y, "1f1b", m, 1)
    return out


@pytest.mark.parametrize("pp,counts", [(2, (2, 4)), (4, (4,))])
def test_interleaved_equals_one_process_and_1f1b(pp, counts):
    results = run_ranks(interleaved_checks, pp, counts, timeout=90)
    chunks = stage_layers(CFG.n_layer, pp * V)
    for rank, got in enumerate(results):
        mine = [i for c in range(V) for i in chunks[c * pp + rank]]     # chunks rank, rank + p
        for m in counts:
            ours, plain = got[("interleaved", m)], got[("1f1b", m)]
            assert ours["loss"] == pytest.approx(got["dense_loss"], abs=1e-6)
            assert ours["loss"] == pytest.approx(plain["loss"], abs=1e-6)
            assert ours["layers"] == mine
            # Every parameter was compared: 12 per block, embeddings on rank 0, head on the last.
            assert ours["params"] == 12 * len(mine) + 2 * (rank == 0) + 3 * (rank == pp - 1)
            assert ours["in_flight"] == max_in_flight(schedule("interleaved", pp, m, V))[rank]
            assert plain["in_flight"] == min(pp - rank, m)


def _messages(p: int, m: int, v: int) -> tuple[dict, dict]:
    """Per (from rank, to rank): the messages sent, in the order posted, and those received, in order."""
    sent, received = {}, {}
    last = p * v - 1
    for rank, mine in enumerate(schedule("interleaved", p, m, v)):
        for a in mine:
            s, i, ahead = a.stage, a.micro_batch, a.kind == FORWARD
            if (s > 0 if ahead else s < last):                      # its input, or its output's gradient
                src = (rank - 1) % p if ahead else (rank + 1) % p
                received.setdefault((src, rank), []).append((a.kind, s, i))
            if (s < last if ahead else s > 0):                       # its output, or its input's gradient
                to = s + 1 if ahead else s - 1
                sent.setdefault((rank, to % p), []).append((a.kind, to, i))
    return sent, received


def test_receives_take_the_messages_in_the_order_they_were_sent():
    """NCCL ignores tags: between two ranks the n-th receive must be the n-th send. Checked, message
    by message, for p up to 8, v up to 4, m up to 8p (gloo also matches them by tag)."""
    for p in range(2, 9):
        for v in range(2, 5):
            for m in range(p, 8 * p + 1, p):
                sent, received = _messages(p, m, v)
                assert sent == received, (p, m, v)
