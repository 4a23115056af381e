"""The pipeline runtime equals one process, and torch.distributed.pipelining, at PP 2 and 4.

Every rank builds the full model with the same seed, keeps its stage, and
runs one step of each schedule at several micro-batch counts; the reference
is the full model on the whole batch. The stage's modules *are* modules of
its full copy, so each gradient is compared with the dense gradient of the
same name. One launch per world size runs every check.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from dtlab.comm.collectives import group_size_and_rank
from dtlab.config import MODEL_PRESETS
from dtlab.course.experiments.pipeline import schedule_activation_peaks, stage_versus_dense
from dtlab.data import global_batch, shard
from dtlab.grid import Grid, build_groups
from dtlab.i18n import ConfigError
from dtlab.model import build_model
from dtlab.parallel.data_parallel import apply_data_parallel
from dtlab.parallel.pipeline import PipelineRuntime, partition_gpt, schedule, stage_layers
from dtlab.parallel.tensor_parallel import apply_tensor_parallel
from tests.harness import run_ranks

CFG = MODEL_PRESETS["tiny"]
TOL = dict(atol=1e-6, rtol=1e-5)
DIFF = 1e-5  # largest absolute gradient difference from the dense model
BATCH = 8


def _batch(batch_size: int):
    return global_batch(0, batch_size=batch_size, seq_len=CFG.seq_len, seed=0)  # (B, T) each


def _stage_of_copy(dense):
    size, rank = group_size_and_rank(None)
    full = copy.deepcopy(dense)
    return full, partition_gpt(full, stage=rank, stages=size)


def _compare_with_dense(full, stage, dense) -> int:
    """Each of the stage's gradients equals the dense gradient of the same name; returns how many."""
    diff, compared = stage_versus_dense(full, stage, dense)  # what lesson 08 prints
    assert diff <= DIFF, diff
    return compared


def _ours(dense, x, y, kind: str, m: int, results: dict) -> None:
    full, stage = _stage_of_copy(dense)
    runtime = PipelineRuntime(stage, d_model=CFG.d_model, group=None, schedule=kind, micro_batches=m)
    step = runtime.step(x, y)
    assert step.loss == pytest.approx(dense(x, y).item(), abs=1e-6)
    compared = _compare_with_dense(full, stage, dense)
    assert [a["action"] for a in step.timeline] == [str(a) for a in runtime.actions]
    assert all(0 <= a["start"] <= a["end"] and a["wait"] >= 0 and a["cpu"] >= 0 for a in step.timeline)
    assert 0.0 <= step.bubble_fraction < 1.0
    results[(kind, m)] = {"params": compared, "in_flight": step.in_flight_peak}


def _torch_pipelining(dense, x, y, kind: str, m: int) -> None:
    """PyTorch's own PipelineStage + ScheduleGPipe / Schedule1F1B on the same stages."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    size, rank = group_size_and_rank(None)
    full, stage = _stage_of_copy(dense)

    def loss_fn(logits, targets):  # (B/m, T, V), (B/m, T)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    pipe_stage = PipelineStage(stage, rank, size, torch.device("cpu"))
    runner = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[kind](pipe_stage, m, loss_fn=loss_fn)
    losses = []
    if rank == 0:
        runner.step(x)
    elif rank == size - 1:
        runner.step(target=y, losses=losses)
        assert_close(torch.stack(losses).mean(), dense(x, y), **TOL)
    else:
        runner.step()
    _compare_with_dense(full, stage, dense)


def _activation_peaks(kind: str, counts) -> list[int]:
    """Stage peak activation bytes with one sequence per micro-batch, for each micro-batch count."""
    return [row["bytes"] for row in schedule_activation_peaks(CFG, kind, counts)]


def pipeline_checks(ctx, micro_batch_counts, compare_torch: bool) -> dict:
    dense = build_model(CFG, seed=0)
    x, y = _batch(BATCH)
    dense(x, y).backward()  # the single-process gradients
    results = {}
    for kind in ("gpipe", "1f1b"):
        for m in micro_batch_counts:
            _ours(dense, x, y, kind, m, results)
        if compare_torch:
            _torch_pipelining(dense, x, y, kind, max(micro_batch_counts))
        results[f"peaks_{kind}"] = _activation_peaks(kind, (2, 4, 8))
    return results


def composed_checks(ctx, layouts) -> list:
    """DP x TP x PP on 4 ranks, composed the way a trainer does it: partition, TP, DP, run."""
    from dtlab.course.experiments.tensor_parallel import dense_shard as _dense_shard

    dense = build_model(CFG, seed=0)
    x, y = _batch(BATCH)
    dense(x, y).backward()
    losses = []
    for dp, tp, pp in layouts:
        groups = build_groups(Grid(dp=dp, tp=tp, pp=pp))
        full = copy.deepcopy(dense)
        stage = partition_gpt(full, stage=groups.coords.pp, stages=pp)
        stage = apply_tensor_parallel(stage, group=groups.tp)
        model = apply_data_parallel(stage, mode="overlapped", group=groups.dp)
        runtime = PipelineRuntime(
            model, d_model=CFG.d_model, group=groups.pp, schedule="1f1b", micro_batches=2, no_sync=model.no_sync
        )
        mx = shard(x, index=groups.coords.dp, count=dp)  # (B / dp, T)
        my = shard(y, index=groups.coords.dp, count=dp)
        step = runtime.step(mx, my)
        model.finish_gradient_sync()  # mean over the DP group
        # Parameters were replaced by TP, so match them by name within the stage.
        dense_params = dict(dense.named_parameters())
        first = stage.layers.start
        for name, p in stage.named_parameters():
            parts = name.split(".")
            if parts[0] == "blocks":
                parts[1] = str(first + int(parts[1]))
            dense_name = ".".join(parts)
            expected = _dense_shard(dense_name, dense_params[dense_name].grad, groups.coords.tp, tp)
            assert_close(p.grad, expected, **TOL, msg=lambda m, n=dense_name: f"{n}: {m}")
        losses.append(step.loss)
    return losses


def pp4_checks(ctx, counts, compare_torch: bool) -> dict:
    return {
        **pipeline_checks(ctx, counts, compare_torch),
        "composed": composed_checks(ctx, [(2, 1, 2), (1, 2, 2), (2, 2, 1)]),
    }


@pytest.mark.parametrize("pp,counts", [(2, (1, 2, 4, 8)), (4, (1, 4, 8))])
def test_pipeline_equals_one_process(pp, counts):
    results = run_ranks(pipeline_checks if pp == 2 else pp4_checks, pp, counts, True, timeout=90)
    if pp == 4:
        dense = build_model(CFG, seed=0)
        x, y = _batch(BATCH)
        full_loss = dense(x, y).item()
        for r in results:  # the loss of each DP rank's half, or the whole batch's
            assert len(r["composed"]) == 3
            assert r["composed"][1] == pytest.approx(full_loss, abs=1e-6)
    layers = stage_layers(CFG.n_layer, pp)
    for rank, got in enumerate(results):
        # Every parameter of the stage was compared: 12 per block, embeddings / head on the ends.
        expected = 12 * len(layers[rank]) + 2 * (rank == 0) + 3 * (rank == pp - 1)
        for kind in ("gpipe", "1f1b"):
            for m in counts:
                assert got[(kind, m)]["params"] == expected
                assert got[(kind, m)]["in_flight"] == (m if kind == "gpipe" else min(pp - rank, m))
    gpipe, one_f_one_b = results[0]["peaks_gpipe"], results[0]["peaks_1f1b"]
    # Stage 0 with micro-batches of the same size: GPipe holds all m, 1F1B at most p.
    assert gpipe[0] < gpipe[1] < gpipe[2]
    assert gpipe[2] == 4 * gpipe[0], gpipe
    if pp == 2:
        assert one_f_one_b[0] == one_f_one_b[1] == one_f_one_b[2], one_f_one_b
    else:  # m = 2 < p: 1F1B holds both, then at most p = 4
        assert one_f_one_b[0] == gpipe[0] and one_f_one_b[1] == one_f_one_b[2], one_f_one_b


def test_one_stage_is_gradient_accumulation():
    dense = build_model(CFG, seed=0)
    x, y = _batch(BATCH)
    dense(x, y).backward()
    results = {}
    for kind in ("gpipe", "1f1b"):
        _ours(dense, x, y, kind, 4, results)
    assert results[("1f1b", 4)] == {"params": sum(1 for _ in dense.parameters()), "in_flight": 1}


def test_partition_and_errors():
    assert stage_layers(4, 2) == [range(0, 2), range(2, 4)]
    assert stage_layers(5, 3) == [range(0, 2), range(2, 4), range(4, 5)]
    with pytest.raises(ConfigError, match="pp=5 is not allowed for a model of 4 blocks") as err:
        stage_layers(4, 5)
    assert "每个阶段至少要有一个 block" in str(err.value)
    model = build_model(CFG, seed=0)
    first, last = partition_gpt(model, stage=0, stages=2), partition_gpt(model, stage=1, stages=2)
    assert first.tok_emb is model.tok_emb and last.head is model.head
    assert not hasattr(first, "head") and not hasattr(last, "tok_emb")
    runtime = PipelineRuntime(partition_gpt(model, stage=0, stages=1), d_model=CFG.d_model, micro_batches=3)
    with pytest.raises(ConfigError, match="cannot be cut into 3 equal micro-batches"):
        runtime.step(*_batch(BATCH))
    assert [str(a) for a in runtime.actions] == [str(a) for a in schedule("1f1b", 1, 3)[0]]
