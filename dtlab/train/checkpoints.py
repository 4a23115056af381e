"""The trainer's checkpoints and spike snapshots: this rank's training state, placed in the whole model.

Whatever the layout, the data-parallel optimizer answers for the state this
rank holds (:meth:`dtlab.parallel.dp_optimizer.DPOptimizer.training_state`: weights and
optimizer state, as pieces of its stage's parameters). What it cannot know is
where its stage sits in the whole model; :func:`parameter_places` says it,
from what the model-parallel steps of :func:`dtlab.train.rank.build_rank` did:

    pipeline           this stage's block j is the model's block ``layers[j]`` (interleaved:
                       its chunks' blocks one after the other, so any schedule reads any save)
    tensor parallel    a column-parallel weight is rows of the dense one (qkv: rows of
                       each of q, k and v), a row-parallel weight columns of it
    everything else    the whole tensor, under the same name (experts keep theirs)

With those places a checkpoint (``dtlab/state/checkpoint/``) can be written at one
layout and read at another. The spike guard's rollback snapshot is the same
state, kept in memory (:class:`OptimizerState`), and a checkpoint carries it
too, so a resumed run rolls back as the uninterrupted one would.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from dtlab.comm.collectives import group_size_and_rank
from dtlab.config import TrainConfig
from dtlab.i18n import DtlabError
from dtlab.model import GPT
from dtlab.numerics.loss_spikes import Snapshot, SpikeGuard, SpikePolicy
from dtlab.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from dtlab.state.checkpoint import (
    GlobalSource,
    Place,
    check_resume,
    keep_first_copies,
    load_all,
    restore_rng_state,
    save_checkpoint,
    to_global,
)
from dtlab.state.training_state import PieceSource


def whole_tensors(config: TrainConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of the whole model ``config`` trains: name -> shape (no memory: the meta device)."""
    with torch.device("meta"):
        model = GPT(config.model_config())
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def run_facts(config: TrainConfig) -> dict:
    """What a resume must share with the run that saved: the model's settings and the data order."""
    return {"model": dataclasses.asdict(config.model_config()), "seed": config.seed, "batch_size": config.batch_size}


def layout_of(config: TrainConfig) -> dict:
    """The layout that writes a checkpoint (recorded in it; a resume may use another)."""
    layout = {"dp": config.dp, "tp": config.tp, "pp": config.pp, "zero": config.zero}
    if config.dp_shard is not None:  # hybrid sharding: the same pieces, K ranks to a shard
        layout["dp_shard"] = config.dp_shard
    if config.virtual_stages > 1:  # interleaved: another cut of the blocks over the same ranks
        layout["virtual_stages"] = config.virtual_stages
    if config.cp > 1 or config.sp:
        layout.update(cp=config.cp, sp=config.sp)
    return layout if not config.experts else {**layout, "ep": config.ep, "experts": config.experts}


def check_before_start(config: TrainConfig) -> None:
    """The caller's checks of ``config.resume`` (:func:`dtlab.state.checkpoint.check_resume`), before any rank starts."""
    check_resume(config.resume, tensors=whole_tensors(config), run=run_facts(config), steps=config.steps)


# --------------------------------------------------------------------------- places


def parameter_places(stage: nn.Module, config: TrainConfig) -> dict[str, Place]:
    """Where each parameter of this rank's ``stage`` (a :class:`~dtlab.parallel.pipeline.partition.GPTStage`) sits.

    Call it after the model-parallel steps and before data parallelism or
    ZeRO, which keep these names. A parameter whose shape differs from the
    whole tensor's without a split this function knows is refused here, at
    build time, rather than saved somewhere wrong.
    """
    shapes = whole_tensors(config)
    places = {}
    for name, p in stage.named_parameters():
        parts = name.split(".")
        if parts[0] == "blocks":  # stage block j -> model block layers[j]
            parts[1] = str(stage.layers[int(parts[1])])
        whole = ".".join(parts)
        owner, _, attr = name.rpartition(".")
        place = _place(stage.get_submodule(owner), attr, whole, shapes[whole])
        fits = place.numel == p.numel() and (len(place.boxes) > 1 or place.boxes[0][1] == tuple(p.shape))
        if not fits:
            raise DtlabError(
                f"parameter {name} of shape {tuple(p.shape)} has no known place in {whole} "
                f"{place.shape}: the step that split it must say where (dtlab/train/checkpoints.py)",
                f"参数 {name}（形状 {tuple(p.shape)}）在 {whole} {place.shape} 中的位置未知："
                "切分它的步骤必须说明位置（dtlab/train/checkpoints.py）",
            )
        places[name] = place
    return places


def _place(module: nn.Module, attr: str, name: str, shape: tuple[int, ...]) -> Place:
    if isinstance(module, ColumnParallelLinear):  # rows of each stacked block: (out/tp, ...)
        size, rank = group_size_and_rank(module.group)
        per_block = shape[0] // module.blocks
        rows = per_block // size
        rest = (0,) * (len(shape) - 1)
        return Place(
            name, shape, tuple(((b * per_block + rank * rows, *rest), (rows, *shape[1:])) for b in range(module.blocks))
        )
    if isinstance(module, RowParallelLinear) and attr == "weight":  # columns: (out, in/tp)
        size, rank = group_size_and_rank(module.group)
        cols = shape[1] // size
        return Place(name, shape, (((0, rank * cols), (shape[0], cols)),))
    return Place.whole(name, shape)


# --------------------------------------------------------------------------- snapshots, saving, resuming


class OptimizerState:
    """A DP optimizer's training state as the spike guard snapshots it: ``state_dict()`` / ``load_state_dict()``."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def state_dict(self) -> list:
        return self.optimizer.training_state()

    def load_state_dict(self, pieces: list) -> None:
        self.optimizer.load_training_state(PieceSource(pieces))


def save(
    directory,
    step: int,
    *,
    optimizer,
    places: dict[str, Place],
    precision,
    guard: SpikeGuard,
    config: TrainConfig,
    group=None,
) -> None:
    """Every rank of ``group``: write its state at the start of ``step`` (its pieces placed in the model)."""
    snapshot = guard.snapshot
    state = {
        "pieces": keep_first_copies(to_global(optimizer.training_state(), places), group),
        "scaler": precision.state_dict(),
        "data_position": step,
        "spike_guard": {
            "detector": guard.detector.state_dict(),
            "snapshot": None
            if snapshot is None
            else {
                "step": snapshot.step,
                "scaler": snapshot.scaler,
                "pieces": keep_first_copies(to_global(snapshot.optimizer, places), group),
            },
        },
    }
    meta = {"run": run_facts(config), "tensors": {name: list(s) for name, s in whole_tensors(config).items()}}
    save_checkpoint(directory, step=step, layout=layout_of(config), state=state, meta=meta, group=group)


def resume(
    directory, *, optimizer, places: dict[str, Place], precision, guard: SpikeGuard, config: TrainConfig, group=None
) -> int:
    """Every rank of ``group``: load the newest save in ``directory``, of any layout; returns the next step."""
    manifest, payloads = load_all(directory, group=group)
    where = f"the checkpoint of step {manifest['step']} in {directory}"
    first = payloads[0]
    snapshot = first["spike_guard"]["snapshot"]
    if snapshot is not None and guard.policy is SpikePolicy.ROLLBACK:
        # Rebuild the snapshot on this layout: load it, keep what this rank now holds, then the present.
        optimizer.load_training_state(GlobalSource(_all(payloads, snapshot=True), places, where=where))
        _load_scaler(precision, snapshot["scaler"])
        guard.snapshot = Snapshot(snapshot["step"], None, OptimizerState(optimizer), precision.scaler)
    optimizer.load_training_state(GlobalSource(_all(payloads), places, where=where))
    _load_scaler(precision, first["scaler"])
    guard.detector.load_state_dict(first["spike_guard"]["detector"])
    world, rank = group_size_and_rank(group)
    same_layout = manifest["layout"] == layout_of(config) and manifest["world_size"] == world
    # Another layout: every rank takes rank 0's generators (nothing in a step draws from them: dropout 0).
    restore_rng_state(payloads[rank if same_layout else 0]["rng"])
    return first["data_position"]


def _all(payloads: list[dict], snapshot: bool = False) -> list[dict]:
    return [
        piece
        for payload in payloads
        for piece in (payload["spike_guard"]["snapshot"]["pieces"] if snapshot else payload["pieces"])
    ]


def _load_scaler(precision, saved: dict | None) -> None:
    """The fp16 loss scaler follows when both runs use fp16; another precision starts its own."""
    if saved is not None and saved.get("scaler") is not None and precision.scaler is not None:
        precision.scaler.load_state_dict(saved["scaler"])
