"""The flat buffer every ZeRO stage shards: tensors laid end to end, padded to equal shards.

All trainable parameters (stages 1 and 2), or one unit's (stage 3), are laid
end to end in one 1-D buffer, padded with zeros to a multiple of N so that
every rank owns an equal, contiguous shard (the collectives need equal
pieces)::

    Ψ = 10, N = 4: L = ceil(10 / 4) x 4 = 12 elements, shards of S = 3

    flat (L,)   [ a  a  a  a  a  a  b  b  b  b  0  0 ]    a: (2, 3)   b: (4,)   0: padding
    owner       [ rank 0 | rank 1 | rank 2 | rank 3  ]

The padding is at most N - 1 elements, all in the last shard(s). It stays
zero: its gradient is zero, and an optimizer step on a zero parameter with
zero gradient and zero state changes nothing (Adam: 0 / (0 + eps) = 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch
import torch.nn as nn

from dtlab.i18n import ConfigError


@dataclass(frozen=True)
class FlatLayout:
    """Where each tensor lives in a flat buffer padded to a multiple of N, and who owns which slice."""

    shapes: tuple[torch.Size, ...]
    world_size: int

    @property
    def numels(self) -> tuple[int, ...]:
        return tuple(prod(shape) for shape in self.shapes)

    @property
    def numel(self) -> int:
        """Ψ: the elements of the tensors themselves."""
        return sum(self.numels)

    @property
    def shard_numel(self) -> int:
        """S = ceil(Ψ / N): what each rank owns."""
        return -(-self.numel // self.world_size)

    @property
    def padded_numel(self) -> int:
        """L = S x N >= Ψ: the buffer's length."""
        return self.shard_numel * self.world_size

    def shard(self, rank: int) -> slice:
        """Rank ``rank``'s contiguous slice of the buffer."""
        return slice(rank * self.shard_numel, (rank + 1) * self.shard_numel)

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """One view of ``flat`` (L,) per tensor, in its shape (split is differentiable: stage 3 uses that)."""
        pieces = flat.split([*self.numels, self.padded_numel - self.numel])  # the last is padding
        return [piece.view(shape) for piece, shape in zip(pieces, self.shapes)]

    def flatten(self, tensors, *, dtype: torch.dtype, device) -> torch.Tensor:
        """The tensors end to end in a new (L,) buffer; ``None`` (no gradient) and padding are zeros."""
        flat = torch.zeros(self.padded_numel, dtype=dtype, device=device)  # (L,)
        for view, tensor in zip(self.views(flat), tensors):
            if tensor is not None:
                view.copy_(tensor)
        return flat


def trainable_parameters(params) -> list[nn.Parameter]:
    """Each parameter once (a tied one is one Parameter), leaving out frozen ones."""
    params = list(params)
    if any(isinstance(p, dict) for p in params):
        raise ConfigError(
            "here a plain list of parameters is expected, not parameter groups",
            "这里需要参数列表，而不是参数组（param groups）",
        )
    return [p for p in {id(p): p for p in params}.values() if p.requires_grad]


def parameter_groups(params) -> list[dict]:
    """``params`` as torch.optim takes it (parameters, or dicts of ``"params"`` and options) -> a list of groups.

    Each group is a new dict whose ``"params"`` is a list; items may be
    ``(name, parameter)`` pairs, as ``named_parameters()`` gives.
    """
    if isinstance(params, torch.Tensor):
        raise ConfigError(
            "params is one tensor; pass an iterable of parameters or of parameter groups (dicts)",
            "params 是单个张量；请传入参数的可迭代对象，或参数组（dict）的列表",
        )
    items = list(params)
    if not any(isinstance(item, dict) for item in items):
        return [{"params": items}]
    if not all(isinstance(item, dict) and "params" in item for item in items):
        raise ConfigError(
            "params mixes parameters and groups; every group is a dict with a 'params' key",
            "params 混合了参数和参数组；每个参数组都应是带 'params' 键的 dict",
        )
    return [
        {**group, "params": [group["params"]] if isinstance(group["params"], torch.Tensor) else list(group["params"])}
        for group in items
    ]


def named_groups(params) -> tuple[list[dict], list[str], list[nn.Parameter], list[int]]:
    """(each group's options, the parameters' names, the parameters in group order, parameters per group).

    Each trainable parameter once (a tied one is one Parameter: its first name
    labels it), frozen ones left out; one in two groups is refused, as torch.optim does.
    """
    groups = parameter_groups(params)
    items = [(g, item) for g, group in enumerate(groups) for item in group["params"]]
    owner, names, found, counts = {}, [], [], [0] * len(groups)
    for position, (g, item) in enumerate(items):
        name, p = item if isinstance(item, tuple) else (str(position), item)
        if owner.setdefault(id(p), g) != g:
            raise ConfigError(
                f"parameter {name} is in two parameter groups ({owner[id(p)]} and {g})",
                f"参数 {name} 同时出现在两个参数组中（{owner[id(p)]} 和 {g}）",
            )
        if p.requires_grad and all(q is not p for q in found):
            names.append(name)
            found.append(p)
            counts[g] += 1
    if not found:
        raise ConfigError("ZeroOptimizer got no trainable parameters", "ZeroOptimizer 没有收到任何可训练参数")
    return [{k: v for k, v in group.items() if k != "params"} for group in groups], names, found, counts
