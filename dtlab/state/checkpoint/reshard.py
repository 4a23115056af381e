"""Resharding: each saved piece knows its place in the whole tensor, so any layout can read what it needs.

PyTorch's Distributed Checkpoint (``torch.distributed.checkpoint``) saves, with
every shard, the fully qualified name of its tensor, the tensor's global shape
and the shard's offsets in it; a loader of another layout works out which
saved shards overlap the ones it holds and copies the overlap. dtlab does the
same with two coordinates, because ZeRO cuts a flat buffer of many tensors
laid end to end (:mod:`dtlab.parallel.zero.flat`), not a box of one::

    whole tensor  blocks.1.attn.qkv.weight (192, 64)
    box           what tensor parallelism gives a rank: offsets (32, 0), sizes (32, 64)
                  (qkv, split by heads, is three boxes on each rank: its q, k and v rows)
    flat range    what ZeRO cuts of the rank's box: elements [start, stop) of it, row-major

A rank's :class:`~dtlab.state.training_state.Piece` names a *local* parameter (in
its pipeline stage, TP-split) and a flat range of it; :class:`Place` says
where that parameter sits in the whole model, :func:`to_global` turns each
piece into saved pieces of whole tensors, :func:`keep_first_copies` leaves
one copy of what several ranks hold alike (replicas), and
:class:`GlobalSource` rebuilds, on the loading rank, the whole tensors its
layout needs and reads any range of its own parameters from them. (Each
rank reads every rank file and builds whole tensors: simple, and cheap at this
course's sizes; Distributed Checkpoint reads only the chunks that overlap.)
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch

from dtlab.comm.collectives import group_size_and_rank
from dtlab.i18n import DtlabError
from dtlab.state.checkpoint.files import gather_objects
from dtlab.state.training_state import Piece

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes) in the whole tensor


@dataclass(frozen=True)
class Place:
    """Where a local parameter sits in the whole model: the whole tensor's name and shape, and its boxes.

    The local parameter's elements, flattened row-major, are the boxes'
    elements one box after the other (each box flattened row-major).
    """

    name: str
    shape: tuple[int, ...]
    boxes: tuple[Box, ...]

    @classmethod
    def whole(cls, name: str, shape) -> "Place":
        shape = tuple(shape)
        return cls(name, shape, (((0,) * len(shape), shape),))

    @property
    def numel(self) -> int:
        return sum(prod(sizes) for _, sizes in self.boxes)


def to_global(pieces: list[Piece], places: dict[str, Place]) -> list[dict]:
    """Each local piece as saved pieces of whole tensors (one per box it overlaps): plain values and tensors."""
    saved = []
    for piece in pieces:
        place, begin = places[piece.name], 0
        for offsets, sizes in place.boxes:
            lo, hi = max(piece.start, begin), min(piece.stop, begin + prod(sizes))
            if lo < hi:
                saved.append(
                    {
                        "name": place.name,
                        "shape": list(place.shape),
                        "offsets": list(offsets),
                        "sizes": list(sizes),
                        "start": lo - begin,
                        "stop": hi - begin,
                        "tensors": {
                            k: v[lo - piece.start : hi - piece.start].clone() for k, v in piece.tensors.items()
                        },
                        "scalars": dict(piece.scalars),
                    }
                )
            begin += prod(sizes)
    return saved


def _key(saved: dict) -> tuple:
    return (
        saved["name"],
        tuple(saved["offsets"]),
        tuple(saved["sizes"]),
        saved["start"],
        saved["stop"],
        tuple(sorted(saved["tensors"])),
    )


def keep_first_copies(saved: list[dict], group=None) -> list[dict]:
    """Drop the pieces a lower rank of ``group`` also holds (the same range of the same tensor): replicas.

    Data-parallel replicas, and the parameters tensor parallelism leaves
    whole, are then written once, by the first rank that holds them.
    """
    mine = [_key(s) for s in saved]
    everyone = gather_objects(mine, group)
    _, rank = group_size_and_rank(group)
    earlier = {key for keys in everyone[:rank] for key in keys}
    return [s for s, key in zip(saved, mine) if key not in earlier]


def _box(tensor: torch.Tensor, offsets, sizes) -> torch.Tensor:
    return tensor[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]


class GlobalSource:
    """A :class:`~dtlab.state.training_state.StateSource` over saved pieces of any layout, for this rank's ``places``.

    Builds each whole tensor this rank's parameters overlap from the saved
    pieces (gathering), and reads the local ranges out of it (slicing).
    Raises a bilingual error if a tensor is missing, of another shape, or not
    fully covered by the pieces: a checkpoint of another model.
    """

    def __init__(self, saved, places: dict[str, Place], *, where: str = "the checkpoint"):
        self.places, self.where = places, where
        shapes = {place.name: place.shape for place in places.values()}
        self.full: dict[tuple[str, str], torch.Tensor] = {}
        self.filled: dict[tuple[str, str], torch.Tensor] = {}
        self.scalar: dict[str, dict] = {}
        self.cache: dict[tuple[str, str], torch.Tensor] = {}
        for piece in saved:
            name = piece["name"]
            if name not in shapes:
                continue  # a tensor this rank holds nothing of
            if tuple(piece["shape"]) != shapes[name]:
                raise DtlabError(
                    f"{where} holds {name} of shape {tuple(piece['shape'])}, this model's is "
                    f"{shapes[name]}: it is a checkpoint of another model",
                    f"{where} 中的 {name} 形状为 {tuple(piece['shape'])}，本模型的是 "
                    f"{shapes[name]}：这是另一个模型的检查点",
                )
            for key, value in piece["scalars"].items():
                self.scalar.setdefault(name, {}).setdefault(key, value)
            for key, value in piece["tensors"].items():
                self._fill(name, key, piece, value)

    def _fill(self, name: str, key: str, piece: dict, value: torch.Tensor) -> None:
        shape = tuple(piece["shape"])
        full = self.full.setdefault((name, key), torch.zeros(shape, dtype=value.dtype))
        filled = self.filled.setdefault((name, key), torch.zeros(shape, dtype=torch.bool))
        for target, data in ((full, value), (filled, True)):
            box = _box(target, piece["offsets"], piece["sizes"])
            flat = box.reshape(-1).clone()  # (numel of the box,) row-major
            flat[piece["start"] : piece["stop"]] = data
            box.copy_(flat.view(box.shape))

    def keys(self, name: str) -> set[str]:
        whole = self.places[name].name
        return {key for (n, key) in self.full if n == whole}

    def scalars(self, name: str) -> dict[str, torch.Tensor]:
        return self.scalar.get(self.places[name].name, {})

    def read(self, name: str, key: str, start: int, stop: int) -> torch.Tensor:
        return self._local(name, key)[start:stop]

    def _local(self, name: str, key: str) -> torch.Tensor:
        """The local parameter ``name``'s tensor ``key``, flat: its boxes cut out of the whole tensor."""
        if (name, key) not in self.cache:
            place = self.places[name]
            if (place.name, key) not in self.full:
                raise DtlabError(
                    f"{self.where} holds no {key} of {place.name}: it is a checkpoint of another model",
                    f"{self.where} 中没有 {place.name} 的 {key}：这是另一个模型的检查点",
                )
            full, filled = self.full[place.name, key], self.filled[place.name, key]
            if not all(bool(_box(filled, *box).all()) for box in place.boxes):
                raise DtlabError(
                    f"{self.where} holds only part of {key} of {place.name}",
                    f"{self.where} 中只有 {place.name} 的 {key} 的一部分",
                )
            self.cache[name, key] = torch.cat([_box(full, *box).reshape(-1) for box in place.boxes])
        return self.cache[name, key]
