"""ZeRO stages 1 and 2's state for checkpoints: the training state, resharded on load, and this layout's own.

:class:`Stage12State` is the part of :class:`dtlab.parallel.zero.stage12.ZeroOptimizer`
that saves and loads. :meth:`~Stage12State.training_state` gives every
parameter's weights whole (every rank's flat buffer holds them) and the
optimizer state of this rank's shard cut per parameter
(:mod:`dtlab.state.training_state`), so a checkpoint loads into another layout;
:meth:`~Stage12State.state_dict` is the wrapped optimizer's own, for the same
layout only.
"""

from __future__ import annotations

import torch

from dtlab.comm import calls as comm
from dtlab.i18n import ConfigError
from dtlab.parallel.zero.offload import set_state_of, state_of
from dtlab.state.training_state import (
    PARAM,
    Piece,
    PieceSource,
    StateSource,
    flat_pieces,
    load_whole,
    read_flat_state,
    read_flat_weights,
    shard_ranges,
    split_state,
    whole_pieces,
)


class Stage12State:
    """Save and load a ZeroOptimizer's state: its training state (any layout) and its ``state_dict`` (this one).

    A mixin of :class:`dtlab.parallel.zero.stage12.ZeroOptimizer`, which sets what
    these methods read: ``names``, ``params``, ``layout``, ``flat``, ``slices``,
    ``offsets``, ``pieces``, ``_cuts``, ``optimizer`` (the wrapped one), ``stage``,
    ``world_size``, ``rank`` and ``_share_wrapped()``.
    """

    # -- the training state: whole weights (every rank's flat buffer holds them), the shard's optimizer state
    def training_state(self) -> list[Piece]:
        """Every parameter's weights, whole, and the optimizer state of this rank's shard, cut per parameter.

        With the fp32 masters in the optimizer (``master_weights``) the weights are the masters, the
        authoritative ones, so each rank gives its shard's, beside its state (the 16-bit parameters
        are their rounding).
        """
        tensors, scalars = split_state(self._shard_state(), self.layout.shard_numel)
        if self.master_weights:
            tensors = {PARAM: torch.cat([self.optimizer.master_of(p).detach() for p in self.pieces]), **tensors}
            weights = []
        else:
            weights = whole_pieces(zip(self.names, self.params), lambda p: {})
        return weights + [
            piece
            for own, at in zip(self.slices, self.offsets)
            for piece in flat_pieces(
                self.names,
                self.layout.numels,
                own,
                {k: v[at : at + own.stop - own.start] for k, v in tensors.items()},
                scalars,
            )
        ]

    def _shard_state(self) -> dict:
        """The wrapped optimizer's state of the whole (S,) shard: the groups' pieces end to end ({}: none)."""
        states = [state_of(self.optimizer, piece) for piece in self.pieces]
        if not all(states):
            return {}
        first = states[0]  # per-parameter scalars (Adam's step) are the same in every group
        return {k: torch.cat([state[k] for state in states]) if v.dim() else v for k, v in first.items()}

    def load_training_state(self, source: StateSource) -> None:
        """The whole weights into the flat buffer, then the shard's state, cut per group (no communication).

        With ``master_weights``: this rank's range of the weights into its fp32 masters, their rounding
        into its shard of the flat buffer, then an all-gather of the buffer (every rank calls this).
        """
        if self.master_weights:
            masters = [
                read_flat_weights(self.names, self.layout.numels, own, source, self.flat.device) for own in self.slices
            ]
            weights = torch.cat(masters) if masters else None
        else:
            load_whole(zip(self.names, self.params), source)
        # The state in the masters' fp32 where the optimizer keeps them, else in the parameters' dtype.
        states = [
            read_flat_state(
                self.names,
                self.layout.numels,
                own,
                source,
                like=self.flat.detach()[own].float() if self.master_weights else self.flat.detach()[own],
            )
            for own in self.slices
        ]
        state = {}
        if all(states):  # the (S,) shard's: each range's end to end (scalars: the first's)
            state = {k: torch.cat([s[k] for s in states]) if v.dim() else v for k, v in states[0].items()}
        for piece, cut in zip(self.pieces, self._cuts):
            set_state_of(
                self.optimizer,
                piece,
                {k: v[cut].clone() if v.dim() else v.clone() for k, v in state.items()},
                weights[cut] if self.master_weights else None,
            )
        if self.master_weights:
            self._gather_parameters()  # the 16-bit parameters whole again, from every rank's rounded shard

    # -- a group added after construction (ZeroOptimizer.add_param_group)
    def add_group_after_construction(self, param_group: dict) -> None:
        """``add_param_group`` after construction, as torch's ZeroRedundancyOptimizer allows (every rank calls it).

        Its parameters join the flat buffer at its end, so every rank's shard moves: the state this
        optimizer holds is first gathered from every rank (one ``all_gather_object``), the buffer and
        the pieces are made anew with the new group last, and each piece of an old group takes its
        state back (the new group starts without any, as a new group of a torch optimizer does).
        Called between steps; not with stage 2's buckets, whose hooks are bound to the first buffer.
        """
        if self.bucket_mb is not None or self._reduced or any(p.grad is not None for p in self.params):
            raise ConfigError(
                "add_param_group is called between steps (no gradients held) and not with stage 2's buckets "
                f"(bucket_mb={self.bucket_mb!r}; allowed: bucket_mb=None, after step() and zero_grad())",
                "add_param_group 只能在两步之间调用（不持有梯度），且不能与第 2 阶段的桶同时使用"
                f"（bucket_mb={self.bucket_mb!r}；允许：bucket_mb=None，在 step() 与 zero_grad() 之后调用）",
            )
        held = [None] * self.world_size  # every rank's shard of the state (and, with masters, of the weights)
        comm.all_gather_object(held, self.training_state(), group=self.group, kind="all_gather_object.state")
        source = PieceSource([piece for pieces in held for piece in pieces])
        known = set(self.names)
        groups, first = [], 0
        for group, count in zip(self.param_groups, self._counts):
            options = {k: v for k, v in group.items() if k != "params"}
            groups.append(
                {**options, "params": list(zip(self.names[first : first + count], self.params[first : first + count]))}
            )
            first += count
        new = dict(param_group)
        items = [new["params"]] if isinstance(new["params"], torch.Tensor) else list(new["params"])
        new["params"] = [
            item if isinstance(item, tuple) else (str(len(self.names) + i), item) for i, item in enumerate(items)
        ]
        with torch.no_grad():
            for p in self.params:
                p.data = p.data.clone()  # off the old buffer, which the new one replaces
        self._build([*groups, new])
        self._load_pieces(source, known)

    @torch.no_grad()
    def _load_pieces(self, source, known: set[str]) -> None:
        """Each piece of parameters named in ``known`` takes its state (and fp32 masters) from ``source``."""
        for piece, at in zip(self.pieces, self._ranges):
            names = [name for name, *_ in shard_ranges(self.names, self.layout.numels, at)]
            if not names or not set(names) <= known:
                continue  # the new group's (or padding): fresh
            like = torch.zeros(at.stop - at.start, dtype=torch.float32 if self.master_weights else self.flat.dtype)
            state = read_flat_state(self.names, self.layout.numels, at, source, like=like.to(self.flat.device))
            weights = (
                read_flat_weights(self.names, self.layout.numels, at, source, self.flat.device)
                if self.master_weights
                else None
            )
            set_state_of(self.optimizer, piece, state, weights)

    # -- checkpoints of this layout only: each rank saves and loads its own shard of the state
    def state_dict(self) -> dict:
        """This rank's state: the wrapped optimizer's ``state_dict()`` of its pieces, with what it fits.

        It holds 1/N of the optimizer state and the groups' options; load it
        into a ZeroOptimizer of the same parameters, stage, group size and
        rank (the weights are the model's: save ``model.state_dict()`` too).
        For another layout, use :meth:`training_state` (what ``dtlab train
        --save`` writes, resharded on load).
        """
        return {
            "stage": self.stage,
            "world_size": self.world_size,
            "rank": self.rank,
            "shard_numel": self.layout.shard_numel,
            "pieces": [p.numel() for p in self.pieces],
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        mine = (self.stage, self.world_size, self.rank, self.layout.shard_numel)
        theirs = (state["stage"], state["world_size"], state["rank"], state["shard_numel"])
        if mine != theirs or state["pieces"] != [p.numel() for p in self.pieces]:
            raise ConfigError(
                f"this optimizer state is rank {theirs[2]}'s of {theirs[1]} at stage {theirs[0]} "
                f"(shard of {theirs[3]} in groups {state['pieces']}); this is rank {mine[2]} of {mine[1]} "
                f"at stage {mine[0]} (shard of {mine[3]} in groups {[p.numel() for p in self.pieces]})",
                f"这份优化器状态属于第 {theirs[0]} 阶段、{theirs[1]} 个 rank 中的 rank {theirs[2]}"
                f"（分片 {theirs[3]}，各组 {state['pieces']}）；当前是第 {mine[0]} 阶段、{mine[1]} 个 rank 中的 "
                f"rank {mine[2]}（分片 {mine[3]}，各组 {[p.numel() for p in self.pieces]}）",
            )
        self.optimizer.load_state_dict(state["optimizer"])
        self._share_wrapped()  # torch's load_state_dict made new groups and a new state there
