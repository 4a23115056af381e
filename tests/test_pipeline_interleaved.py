"""The interleaved 1F1B runtime equals one process, and the 1F1B runtime, at PP 2 and 4.

Every rank builds a tiny GPT of 8 blocks with the same seed and keeps its v = 2
chunks (:func:`dtlab.parallel.pipeline.partition_gpt` with ``virtual_stages``): PP 2
cuts it into 4 chunks of 2 blocks, PP 4 into 8 of one. One step of the
interleaved schedule is compared with the full model on the whole batch
(loss, every gradient by name, every parameter after an SGD step), and with
the 1F1B runtime on the same ranks; the measured timeline's actions are the
schedule's, in its order. At PP 2, also with PyTorch's own
ScheduleInterleaved1F1B on the same chunks. One launch per world size runs every check; then
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
from dtlab.comm.collectives import group_size_and_rank
from dtlab.config import MODEL_PRESETS, TrainConfig
from dtlab.course.experiments.pipeline import stage_versus_dense
from dtlab.data import global_batch
from dtlab.i18n import ConfigError
from dtlab.model import build_model
from dtlab.parallel.pipeline import GPTStage, PipelineRuntime, max_in_flight, partition_gpt, schedule, stage_layers
from dtlab.parallel.pipeline.schedule import FORWARD
from dtlab.reference import reference_train
from tests.expected_comm import expected_comm
from tests.harness import run_ranks, session_pool

CFG = dataclasses.replace(MODEL_PRESETS["tiny"], n_layer=8)
V = 2
BATCH = 8
DIFF = 1e-5  # largest absolute gradient difference from the dense model
LR = 0.1


def _dense():
    dense = build_model(CFG, seed=0)
    x, y = global_batch(0, batch_size=BATCH, seq_len=CFG.seq_len, seed=0)  # (B, T) each
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
    return {
        "loss": step.loss,
        "params": compared,
        "in_flight": step.in_flight_peak,
        "activations": step.activation_peak,
        "layers": list(stage.layers),
    }


def _torch_interleaved(dense, x, y, m: int) -> int:
    """PyTorch's own ScheduleInterleaved1F1B on the same chunks (one PipelineStage per chunk); returns
    how many gradients equal the dense ones."""
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

    size, rank = group_size_and_rank(None)
    full = copy.deepcopy(dense)
    full.zero_grad(set_to_none=True)
    chunks = [GPTStage(full, stage=c * size + rank, stages=size * V) for c in range(V)]

    def loss_fn(logits, targets):  # (B/m, T, V), (B/m, T)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    stages = [PipelineStage(chunk, c * size + rank, size * V, torch.device("cpu")) for c, chunk in enumerate(chunks)]
    runner = ScheduleInterleaved1F1B(stages, m, loss_fn=loss_fn)
    losses = []
    if rank == 0:
        runner.step(x)
    elif rank == size - 1:
        runner.step(target=y, losses=losses)
        assert_close(torch.stack(losses).mean(), dense(x, y), atol=1e-6, rtol=1e-5)
    else:
        runner.step()
    compared = 0
    for chunk in chunks:
        diff, n = stage_versus_dense(full, chunk, dense)
        assert diff <= DIFF, diff
        compared += n
    return compared


def interleaved_checks(ctx, counts, compare_torch: bool) -> dict:
    dense, x, y, loss = _dense()
    out = {"dense_loss": loss}
    for m in counts:
        out[("interleaved", m)] = _step(dense, x, y, "interleaved", m, V)
    out["1f1b"] = _step(dense, x, y, "1f1b", max(counts), 1)
    if compare_torch:
        out["torch"] = _torch_interleaved(dense, x, y, max(counts))
    return out


@pytest.mark.parametrize("pp,counts", [(2, (2, 4)), (4, (4,))])
def test_interleaved_equals_one_process_1f1b_and_torch(pp, counts):
    results = run_ranks(interleaved_checks, pp, counts, pp == 2, timeout=90)
    chunks = stage_layers(CFG.n_layer, pp * V)
    for rank, got in enumerate(results):
        mine = [i for c in range(V) for i in chunks[c * pp + rank]]  # chunks rank, rank + p
        plain = got["1f1b"]
        assert plain["in_flight"] == min(pp - rank, max(counts))
        for m in counts:
            ours = got[("interleaved", m)]
            assert ours["loss"] == pytest.approx(got["dense_loss"], abs=1e-6)
            assert ours["loss"] == pytest.approx(plain["loss"], abs=1e-6)
            assert ours["layers"] == mine
            # Every parameter was compared: 12 per block, embeddings on rank 0, head on the last.
            assert ours["params"] == 12 * len(mine) + 2 * (rank == 0) + 3 * (rank == pp - 1)
            assert ours["in_flight"] == max_in_flight(schedule("interleaved", pp, m, V))[rank]
        if pp == 2:  # torch.distributed.pipelining: the same gradients
            assert got["torch"] == got[("interleaved", max(counts))]["params"]


def _messages(p: int, m: int, v: int) -> tuple[dict, dict]:
    """Per (from rank, to rank): the messages sent, in the order posted, and those received, in order."""
    sent, received = {}, {}
    last = p * v - 1
    for rank, mine in enumerate(schedule("interleaved", p, m, v)):
        for a in mine:
            s, i, ahead = a.stage, a.micro_batch, a.kind == FORWARD
            if s > 0 if ahead else s < last:  # its input, or its output's gradient
                src = (rank - 1) % p if ahead else (rank + 1) % p
                received.setdefault((src, rank), []).append((a.kind, s, i))
            if s < last if ahead else s > 0:  # its output, or its input's gradient
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


# --------------------------------------------------------------------------- dtlab train

TRAIN = dict(model="tiny", steps=2, seed=0, batch_size=8)
INTERLEAVED = dict(pp=2, micro_batches=2, schedule="interleaved", virtual_stages=2)


def test_dtlab_train_runs_interleaved_and_a_1f1b_run_resumes_its_save(tmp_path):
    """The tiny GPT's 4 blocks as 4 chunks on 2 ranks: the single-process losses; saved at step 1 and
    resumed with one stage per rank (1F1B), the run goes on as the interleaved one did."""
    from dtlab.state.checkpoint import step_folder

    reference = reference_train(TrainConfig(**TRAIN))[0]
    straight = dtlab.train(
        TrainConfig(**TRAIN, **INTERLEAVED, save=str(tmp_path), save_every=1), pool=session_pool()
    ).wait()
    assert straight.losses() == pytest.approx(reference, rel=1e-4)
    for record in straight.records:  # v sends per micro-batch and direction (tests/expected_comm.py)
        for rank in record["ranks"]:
            for kind, want in expected_comm(straight.config, rank).items():
                assert {k: rank["comm"][kind][k] for k in want} == want, kind
    for record in straight.records:
        for r in record["ranks"]:  # the measured timeline is the schedule's, labelled by virtual stage
            assert [a["action"] for a in r["timeline"]] == [str(a) for a in schedule("interleaved", 2, 2, 2)[r["pp"]]]
    resumed = dtlab.train(
        TrainConfig(**TRAIN, pp=2, micro_batches=2, resume=str(step_folder(tmp_path, 1))), pool=session_pool()
    ).wait()
    assert [r["step"] for r in resumed.records] == [1]
    assert resumed.losses() == pytest.approx(straight.losses()[1:], rel=1e-5)


@pytest.mark.parametrize(
    "changes,en,zh",
    [
        (
            dict(micro_batches=3, batch_size=6),
            "micro_batches a multiple of pp; got pp=2, micro_batches=3",
            "micro_batches=3",
        ),
        (dict(virtual_stages=1), "virtual_stages=1 is not allowed for the interleaved schedule", "virtual_stages=1"),
        (dict(pp=1, micro_batches=2), "needs pp >= 2", "pp >= 2"),
        (
            dict(pp=4, micro_batches=4),
            "pp x virtual_stages = 4 x 2 = 8 model chunks, more than the 4 blocks",
            "超过了模型 'tiny' 的 4 个 block",
        ),
        (dict(schedule="1f1b"), "virtual_stages=2 needs schedule='interleaved'", "virtual_stages=2 需要"),
        (dict(dp=2, zero=3), "zero=3 with pp=2", "zero=3 与 pp=2"),
        (dict(virtual_stages=0), "virtual_stages=0 is not allowed; expected a positive integer", "virtual_stages=0"),
    ],
)
def test_train_refuses_what_does_not_interleave_before_any_rank_starts(changes, en, zh):
    with pytest.raises(ConfigError) as refusal:
        TrainConfig(**{**TRAIN, **INTERLEAVED, **changes}).validate()
    assert en in refusal.value.en and zh in refusal.value.zh


def test_the_flags_reach_the_config():
    from dtlab.config.flags import config_from_args
    from tests.test_config import _train_parser

    args = _train_parser().parse_args("--pp 2 --micro-batches 2 --schedule interleaved --virtual-stages 2".split())
    config = config_from_args(args).validate()
    assert (config.schedule, config.virtual_stages) == ("interleaved", 2)
    assert (config.layout.schedule, config.layout.virtual_stages) == ("interleaved", 2)  # what dtlab plan takes
