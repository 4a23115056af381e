"""Training checkpoints: exact resume, atomic writes, verification, layouts, weights_only, resharding.

The trainer's checkpoints at every layout, resharding between layouts and
the refusals before start are in tests/test_resume.py.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from dtlab.config import MODEL_PRESETS, TrainConfig
from dtlab.data import global_batch
from dtlab.i18n import DtlabError
from dtlab.model import build_model
from dtlab.numerics.loss_scaling import LossScaler
from dtlab.reference import make_optimizer
from dtlab.state.checkpoint import (
    GlobalSource,
    Place,
    capture_rng_state,
    latest_step,
    load_checkpoint,
    read_manifest,
    restore_rng_state,
    save_checkpoint,
    step_folder,
    to_global,
)
from dtlab.state.checkpoint import files as ckpt
from dtlab.state.training_state import Piece, PieceSource
from tests.harness import run_ranks

LAYOUT = {"dp": 1, "tp": 1, "pp": 1, "zero": 0}


def _trainer():
    model = build_model(MODEL_PRESETS["tiny"], seed=0)
    return model, make_optimizer(model.parameters(), TrainConfig(lr=1e-2))


def _train(model, optimizer, steps):
    """Steps of the tiny GPT; dropout-like noise from the global RNG makes the RNG state matter."""
    losses = []
    for step in steps:
        x, y = global_batch(step, batch_size=4, seq_len=16, seed=0)
        optimizer.zero_grad(set_to_none=True)
        noise = 1 + 0.01 * torch.randn(()) + 0.01 * random.random() + 0.01 * np.random.rand()
        loss = model(x, y) * noise
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _save(directory, step, model, optimizer, layout=LAYOUT, **kwargs):
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "data_position": step, **kwargs}
    return save_checkpoint(directory, step=step, layout=layout, state=state)


def test_a_resumed_run_continues_the_same_curve(tmp_path):
    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    model, optimizer = _trainer()
    scaler = LossScaler(growth_interval=3)
    scaler.update(False)
    _train(model, optimizer, range(3))
    folder = _save(tmp_path, 3, model, optimizer, scaler=scaler.state_dict())
    uninterrupted = _train(model, optimizer, range(3, 6))

    torch.manual_seed(123), random.seed(123), np.random.seed(123)  # a fresh process, other RNG states
    resumed_model, resumed_optimizer = _trainer()
    state = load_checkpoint(tmp_path, expected_layout=LAYOUT)
    assert state["step"] == state["data_position"] == latest_step(tmp_path) == 3
    assert load_checkpoint(folder, expected_layout=LAYOUT)["step"] == 3  # a step folder, named directly
    resumed_model.load_state_dict(state["model"])
    resumed_optimizer.load_state_dict(state["optimizer"])
    restore_rng_state(state["rng"])
    resumed_scaler = LossScaler()
    resumed_scaler.load_state_dict(state["scaler"])
    assert resumed_scaler.state_dict() == scaler.state_dict()
    assert _train(resumed_model, resumed_optimizer, range(state["data_position"], 6)) == uninterrupted
    # Nothing but the rank file and the manifest: no temporary file left behind.
    assert sorted(os.listdir(folder)) == ["manifest.json", "rank00000.pt"]
    # Any reader can check that the file needs nothing but weights_only to load.
    payload = torch.load(folder / "rank00000.pt", weights_only=True)
    assert payload["layout"] == LAYOUT and payload["rng"]["torch"].dtype == torch.uint8


def test_rng_states_round_trip():
    state = capture_rng_state()
    first = (torch.rand(3), random.random(), np.random.rand())
    restore_rng_state(state)
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(first[0], again[0]) and first[1:] == again[1:]


@pytest.mark.parametrize("damage", ["truncate", "flip a byte", "delete the manifest"])
def test_a_damaged_checkpoint_is_refused_and_names_the_file(tmp_path, damage):
    model, optimizer = _trainer()
    _save(tmp_path, 4, model, optimizer)  # an older, intact save: never used instead
    folder = _save(tmp_path, 5, model, optimizer)
    rank_file = folder / "rank00000.pt"
    data = bytearray(rank_file.read_bytes())
    if damage == "truncate":
        rank_file.write_bytes(data[: len(data) // 2])
        expected, zh = "rank00000.pt is truncated", "被截断"
    elif damage == "flip a byte":
        data[len(data) // 2] ^= 0xFF
        rank_file.write_bytes(bytes(data))
        expected, zh = "rank00000.pt was altered", "被改动过"
    else:
        (folder / "manifest.json").write_text('{"step": 5, "files": [')  # cut short
        expected, zh = "manifest.json is missing or damaged", "不存在或已损坏"
    with pytest.raises(DtlabError, match=expected) as error:
        load_checkpoint(tmp_path, expected_layout=LAYOUT)
    assert zh in str(error.value)
    with pytest.raises(DtlabError, match="missing or damaged"):
        load_checkpoint(tmp_path, expected_layout=LAYOUT, step=3)  # a step never saved


def test_an_interrupted_save_is_passed_over_and_a_missing_folder_named(tmp_path):
    model, optimizer = _trainer()
    _save(tmp_path, 2, model, optimizer)
    (step_folder(tmp_path, 3)).mkdir()
    (step_folder(tmp_path, 3) / "rank00000.pt").write_bytes(b"half")  # no manifest: never committed
    assert latest_step(tmp_path) == 2 and read_manifest(tmp_path)[1]["step"] == 2
    (step_folder(tmp_path, 2) / "manifest.json").unlink()
    with pytest.raises(DtlabError, match="no complete checkpoint") as error:
        load_checkpoint(tmp_path)
    assert "没有完整的检查点" in str(error.value)
    with pytest.raises(DtlabError, match="does not exist") as error:
        read_manifest(tmp_path / "nowhere")
    assert "不存在" in str(error.value)


def test_another_layout_is_refused_with_the_layout_it_needs(tmp_path):
    model, optimizer = _trainer()
    _save(tmp_path, 2, model, optimizer, layout={"dp": 2, "tp": 1, "pp": 1, "zero": 2})
    with pytest.raises(DtlabError, match="resume it with dp=2 tp=1 pp=1 zero=2") as error:
        load_checkpoint(tmp_path, expected_layout={"dp": 4, "tp": 1, "pp": 1, "zero": 0})
    assert "this run is dp=4 tp=1 pp=1 zero=0" in str(error.value)
    assert "请用 dp=2 tp=1 pp=1 zero=2 来恢复它" in str(error.value)


def test_a_failed_save_leaves_no_temporary_file_and_no_new_checkpoint(tmp_path, monkeypatch):
    model, optimizer = _trainer()
    _save(tmp_path, 1, model, optimizer)

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt.os, "fsync", disk_full)
    with pytest.raises(DtlabError, match="No space left"):
        _save(tmp_path, 2, model, optimizer)
    monkeypatch.undo()
    assert os.listdir(step_folder(tmp_path, 2)) == []  # neither a .tmp nor a rank file
    assert latest_step(tmp_path) == 1  # step 2 was never committed
    # State that weights_only could not load back is refused when saved, not at resume.
    with pytest.raises(DtlabError, match="weights_only"):
        _save(tmp_path, 3, model, optimizer, extra={"array": np.zeros(3)})
    assert latest_step(tmp_path) == 1
    # Saving a step again replaces it whole.
    _save(tmp_path, 1, model, optimizer, extra={"again": True})
    assert load_checkpoint(tmp_path, expected_layout=LAYOUT)["extra"] == {"again": True}


def _save_and_load_on_ranks(ctx, directory) -> dict:
    """Each rank saves its own (different) state; one rank's damaged file stops every rank."""
    layout = {"dp": ctx.world_size, "zero": 1}
    mine = {"shard": torch.full((3,), float(ctx.rank))}
    save_checkpoint(directory, step=7, layout=layout, state={"model": mine, "optimizer": {"rank": ctx.rank}})
    state = load_checkpoint(directory, expected_layout=layout)
    out = {
        "shard": state["model"]["shard"].tolist(),
        "optimizer": state["optimizer"],
        "files": sorted(os.listdir(step_folder(directory, 7))),
    }
    torch.distributed.barrier()
    if ctx.rank == 0:
        path = step_folder(directory, 7) / "rank00001.pt"
        path.write_bytes(path.read_bytes()[:-10])
    torch.distributed.barrier()
    try:
        load_checkpoint(directory, expected_layout=layout)
        out["error"] = None
    except DtlabError as error:
        out["error"] = error.en
    return out


def test_one_file_per_rank_and_a_damaged_rank_stops_every_rank(tmp_path):
    results = run_ranks(_save_and_load_on_ranks, 2, str(tmp_path))
    for rank, got in enumerate(results):
        assert got["shard"] == [float(rank)] * 3 and got["optimizer"] == {"rank": rank}
        assert got["files"] == ["manifest.json", "rank00000.pt", "rank00001.pt"]
        assert "rank00001.pt is truncated" in got["error"]  # rank 0's own file is fine


def test_pieces_saved_at_one_split_are_read_back_at_another():
    """A (6, 4) tensor saved as tensor parallelism's column halves, each cut by ZeRO into flat ranges,
    read back as row-parallel halves (columns) and as a whole: gathered, then sliced."""
    whole = torch.arange(24.0).view(6, 4)
    rows = {0: Place("w", (6, 4), (((0, 0), (3, 4)),)), 1: Place("w", (6, 4), (((3, 0), (3, 4)),))}
    saved = []
    for rank, place in rows.items():
        local = whole[3 * rank : 3 * rank + 3].reshape(-1)  # (12,)
        pieces = [
            Piece("local", 0, 5, {"param": local[:5], "exp_avg": -local[:5]}, {"step": torch.tensor(2.0)}),
            Piece("local", 5, 12, {"param": local[5:], "exp_avg": -local[5:]}),
        ]  # two ZeRO shards
        saved += to_global(pieces, {"local": place})
    cols = Place("w", (6, 4), (((0, 2), (6, 2)),))  # the right two columns
    source = GlobalSource(saved, {"mine": cols, "all": Place.whole("w", (6, 4))})
    assert torch.equal(source.read("mine", "param", 0, 12), whole[:, 2:].reshape(-1))
    assert torch.equal(source.read("all", "exp_avg", 3, 9), -whole.reshape(-1)[3:9])
    assert source.keys("mine") == {"param", "exp_avg"} and source.scalars("all")["step"].item() == 2.0
    with pytest.raises(DtlabError, match="another model"):
        GlobalSource(saved, {"mine": Place.whole("w", (4, 6))})
    with pytest.raises(DtlabError, match="only part"):
        GlobalSource(saved[:1], {"all": Place.whole("w", (6, 4))}).read("all", "param", 0, 24)
    local = PieceSource([Piece("p", 0, 2, {"param": torch.ones(2)}), Piece("p", 2, 4, {"param": torch.zeros(2)})])
    assert local.read("p", "param", 1, 3).tolist() == [1.0, 0.0]
