"""The training state a rank holds, as pieces that say where they belong: what checkpoints and rollback keep.

A run continues exactly only if it gets back everything its next step reads:
each parameter's weights and the optimizer's state of that parameter (Adam's
two moments and its step count). Where these live depends on the layout::

    plain DP        every rank: whole weights, whole optimizer state
    ZeRO 1, 2       every rank: whole weights; the optimizer state of its 1/N flat shard
    ZeRO 3          every rank: its 1/N flat shard of the weights and of the state
    TP, PP, EP      (before the above) only this rank's slice, stage or experts

So the state is described, whatever the layout, as a list of :class:`Piece`:
a flat range ``[start, stop)`` of one parameter (its name in the model the
data-parallel optimizer wraps, its elements in row-major order) with the
tensors held for that range (``"param"``: the weights; the optimizer's
per-element state, e.g. ``"exp_avg"``) and its per-parameter scalars
(``"step"``). Every :class:`dtlab.parallel.dp_optimizer.DPOptimizer` returns its pieces
(``training_state()``) and takes them back from a :class:`StateSource`
(``load_training_state()``): a spike rollback gives back the pieces it kept,
and a checkpoint (``dtlab/state/checkpoint/``) places each piece in the whole
model, so a rank of another layout can read the ranges it holds (resharding,
as PyTorch's Distributed Checkpoint does).

This module holds the data type and the helpers the optimizers share: whole
parameters (:func:`whole_pieces`) and flat shards (:func:`flat_pieces`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from dtlab.i18n import DtlabError

PARAM = "param"
"""The key of the weights among a piece's tensors; every other key is optimizer state."""


@dataclass
class Piece:
    """Elements ``[start, stop)`` of parameter ``name`` (flattened, row-major) and what is held for them.

    ``tensors``: 1-D copies of ``stop - start`` elements each (``"param"``,
    ``"exp_avg"``, ...); ``scalars``: 0-d tensors kept once per parameter
    (Adam's ``"step"``). Copies, on the CPU: changing the model later does not
    change a piece.
    """

    name: str
    start: int
    stop: int
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    scalars: dict[str, torch.Tensor] = field(default_factory=dict)


class StateSource(Protocol):
    """Where a :class:`~dtlab.parallel.dp_optimizer.DPOptimizer` reads back its state, by parameter name and range."""

    def keys(self, name: str) -> set[str]:
        """The tensor keys held for parameter ``name`` (``"param"`` and optimizer state keys)."""

    def read(self, name: str, key: str, start: int, stop: int) -> torch.Tensor:
        """Elements ``[start, stop)`` of tensor ``key`` of parameter ``name``: a 1-D tensor."""

    def scalars(self, name: str) -> dict[str, torch.Tensor]:
        """The per-parameter scalars of ``name`` (``{}`` if none)."""


def _copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).to("cpu", copy=True)


def split_state(state: dict, numel: int) -> tuple[dict, dict]:
    """A torch optimizer's state of one parameter -> (per-element tensors, flattened; 0-d scalars)."""
    tensors = {
        k: _copy(v) for k, v in state.items() if isinstance(v, torch.Tensor) and v.dim() > 0 and v.numel() == numel
    }
    scalars = {
        k: v.detach().to("cpu", copy=True) for k, v in state.items() if isinstance(v, torch.Tensor) and v.dim() == 0
    }
    return tensors, scalars


def whole_pieces(named_params, state_of) -> list[Piece]:
    """One piece per whole parameter: its weights and ``state_of(p)``, the optimizer's state of it."""
    pieces = []
    for name, p in named_params:
        tensors, scalars = split_state(state_of(p), p.numel())
        pieces.append(Piece(name, 0, p.numel(), {PARAM: _copy(p), **tensors}, scalars))
    return pieces


@torch.no_grad()
def load_whole(named_params, source: StateSource, set_state=None) -> None:
    """Each whole parameter's weights from ``source``; with ``set_state``, its optimizer state too.

    ``set_state(p, state)`` gets ``{}`` for a parameter the source has no
    optimizer state for: the optimizer must then forget any it has.
    """
    for name, p in named_params:
        p.copy_(source.read(name, PARAM, 0, p.numel()).view_as(p))
        if set_state is None:
            continue
        state = {
            k: source.read(name, k, 0, p.numel()).view_as(p).to(p.device, p.dtype)
            for k in sorted(source.keys(name) - {PARAM})
        }
        set_state(p, {**state, **_scalars(source, name)} if state else {})


def _scalars(source: StateSource, name: str) -> dict:
    # Adam's step stays a float32 CPU tensor, as torch keeps it (unless capturable).
    return {k: v.clone() for k, v in source.scalars(name).items()}


def shard_ranges(names, numels, shard: slice) -> list[tuple[str, int, int, int]]:
    """Where a flat shard ``[shard.start, shard.stop)`` of tensors laid end to end cuts each of them.

    Returns ``(name, start, stop, offset)`` per tensor the shard overlaps:
    elements ``[start, stop)`` of that tensor sit at ``offset`` in the shard.
    Padding after the last tensor belongs to none.
    """
    ranges, begin = [], 0
    for name, numel in zip(names, numels):
        lo, hi = max(begin, shard.start), min(begin + numel, shard.stop)
        if lo < hi:
            ranges.append((name, lo - begin, hi - begin, lo - shard.start))
        begin += numel
    return ranges


def flat_pieces(
    names, numels, shard: slice, tensors: dict[str, torch.Tensor], scalars: dict[str, torch.Tensor]
) -> list[Piece]:
    """Pieces of a flat shard: ``tensors`` are (S,) per key (weights and/or state), cut per parameter."""
    if not tensors:
        return []
    copies = {k: _copy(v) for k, v in tensors.items()}
    return [
        Piece(
            name,
            start,
            stop,
            {k: v[offset : offset + stop - start].clone() for k, v in copies.items()},
            {k: v.detach().to("cpu", copy=True) for k, v in scalars.items()},
        )
        for name, start, stop, offset in shard_ranges(names, numels, shard)
    ]


def read_flat(names, numels, shard: slice, source: StateSource, key: str, out: torch.Tensor) -> bool:
    """Fill ``out`` (S,), a flat shard, with tensor ``key`` of each parameter it overlaps (padding: 0).

    Returns False, leaving ``out`` alone, if the source holds no ``key`` for them.
    """
    ranges = shard_ranges(names, numels, shard)
    if not ranges or not all(key in source.keys(name) for name, *_ in ranges):
        return False
    with torch.no_grad():
        out.zero_()
        for name, start, stop, offset in ranges:
            out[offset : offset + stop - start] = source.read(name, key, start, stop).to(out.dtype)
    return True


def read_flat_weights(names, numels, shard: slice, source: StateSource, device) -> torch.Tensor:
    """The fp32 weights of a flat shard ``[shard.start, shard.stop)`` of the parameters (padding: 0).

    What a rank that keeps fp32 masters of its shard loads (:class:`dtlab.numerics.master_weights.MasterWeights`).
    """
    out = torch.zeros(shard.stop - shard.start, dtype=torch.float32, device=device)
    if shard_ranges(names, numels, shard) and not read_flat(names, numels, shard, source, PARAM, out):
        raise DtlabError("the saved state holds no weights for this shard", "保存的状态中没有这个分片的权重")
    return out


def read_flat_state(names, numels, shard: slice, source: StateSource, like: torch.Tensor) -> dict:
    """The optimizer state of a flat shard parameter ``like`` (S,), from the state of the parameters in it.

    ``{}`` if the source holds none (the optimizer has not stepped yet).
    """
    ranges = shard_ranges(names, numels, shard)
    if not ranges:
        return {}
    keys = set.intersection(*(source.keys(name) for name, *_ in ranges)) - {PARAM}
    state = {}
    for key in sorted(keys):
        out = torch.zeros_like(like)
        read_flat(names, numels, shard, source, key, out)
        state[key] = out
    if state:
        state.update(_scalars(source, ranges[0][0]))
    return state


class PieceSource:
    """A :class:`StateSource` over pieces of this very layout: what a spike rollback restores from."""

    def __init__(self, pieces: list[Piece]):
        self.by_name: dict[str, list[Piece]] = {}
        for piece in pieces:
            self.by_name.setdefault(piece.name, []).append(piece)

    def keys(self, name: str) -> set[str]:
        return set().union(*(p.tensors for p in self.by_name.get(name, [])))

    def scalars(self, name: str) -> dict[str, torch.Tensor]:
        return next((p.scalars for p in self.by_name.get(name, []) if p.scalars), {})

    def read(self, name: str, key: str, start: int, stop: int) -> torch.Tensor:
        out, filled = None, 0
        for piece in self.by_name.get(name, []):
            lo, hi = max(start, piece.start), min(stop, piece.stop)
            if key in piece.tensors and lo < hi:
                value = piece.tensors[key]
                out = torch.empty(stop - start, dtype=value.dtype) if out is None else out
                out[lo - start : hi - start] = value[lo - piece.start : hi - piece.start]
                filled += hi - lo
        if filled != stop - start:
            raise DtlabError(
                f"the saved state has no {key} for elements {start}..{stop} of {name}",
                f"保存的状态中没有 {name} 第 {start}..{stop} 个元素的 {key}",
            )
        return out
