"""Plain data parallelism's optimizer: a torch optimizer beside a DP-wrapped model (ZeRO stage 0).

Every rank holds a whole replica of the model states; the wrapped model
(:mod:`dtlab.parallel.data_parallel`) averages the gradients by the end of
backward, and :class:`ReplicatedOptimizer` only adds what dtlab's training
loop asks of every layout (:class:`dtlab.parallel.dp_optimizer.DPOptimizer`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dtlab.comm.collectives import group_size_and_rank
from dtlab.measure.memory import model_state_bytes
from dtlab.numerics.master_weights import MasterWeights
from dtlab.parallel.dp_optimizer import DPOptimizer, GradPiece, WrappingOptimizer
from dtlab.state.training_state import Piece, StateSource, load_whole, whole_pieces

if TYPE_CHECKING:
    from dtlab.parallel.data_parallel import _DataParallel


class ReplicatedOptimizer(WrappingOptimizer, DPOptimizer):
    """Plain data parallelism's :class:`dtlab.parallel.dp_optimizer.DPOptimizer`: a torch optimizer and its DP model.

    ``ReplicatedOptimizer(model, torch.optim.AdamW(model.parameters()))``:
    every rank holds the whole model states (a replica), the wrapped model
    averages the gradients, and this only adds what the training loop asks
    of every layout: :meth:`no_sync` and :meth:`finish_gradient_sync` are
    the model's, :meth:`memory_bytes` counts the replica.
    """

    def __init__(self, model: "_DataParallel", optimizer: torch.optim.Optimizer):
        self.model = model
        self._adopt(optimizer)  # a torch.optim.Optimizer too: LambdaLR(this, ...) writes the wrapped one's lr

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def no_sync(self):
        """The model's :meth:`_DataParallel.no_sync`: backward passes in it do not communicate."""
        return self.model.no_sync()

    def finish_gradient_sync(self) -> None:
        """Wait for the model's gradient all-reduces (:meth:`_DataParallel.finish_gradient_sync`)."""
        self.model.finish_gradient_sync()

    def step(self) -> None:
        self.optimizer.step()

    def gradients(self) -> list[GradPiece]:
        """Every whole gradient; each is the same on every rank of the group, so its first rank counts them.

        With the fp32 masters in the optimizer (:class:`MasterWeights`): the masters' fp32 gradients,
        which the step uses (the loss scaler unscales them in fp32).
        """
        first = group_size_and_rank(self.model.group)[1] == 0
        if isinstance(self.optimizer, MasterWeights):
            self.optimizer.take_gradients()
            return [
                GradPiece(name, grad, first)
                for name, p in self._named()
                if (grad := self.optimizer.master_gradient(p)) is not None
            ]
        return [GradPiece(name, p.grad, first) for name, p in self._named() if p.grad is not None]

    def memory_bytes(self) -> dict[str, int]:
        """The whole parameters, their gradients and the optimizer's state: the same on every rank.

        ``buffers``: the flat gradient buckets (a whole Ψ copy of the gradients, kept between steps).
        """
        buckets = sum(b.nbytes for b in getattr(self.model, "buckets", ()))
        held = {**model_state_bytes(self.model.parameters(), self.optimizer), "buffers": buckets}
        if isinstance(self.optimizer, MasterWeights):
            held["master"] = self.optimizer.master_bytes()  # the fp32 masters, whole on every rank
        return held

    def training_state(self) -> list[Piece]:
        """Whole weights and optimizer state of every parameter, named as in the wrapped model (the fp32
        masters' weights where the optimizer keeps them)."""
        return whole_pieces(self._named_weights(), lambda p: self.optimizer.state.get(p, {}))

    @torch.no_grad()
    def load_training_state(self, source: StateSource) -> None:
        load_whole(self._named_weights(), source, self._set_state)
        if isinstance(self.optimizer, MasterWeights):
            for _, p in self._named():
                p.copy_(self.optimizer.master_of(p))  # the 16-bit parameters: the masters' rounding

    def _named(self) -> list:
        return [(name, p) for name, p in self.model.module.named_parameters() if p.requires_grad]

    def _named_weights(self) -> list:
        """Each parameter's authoritative weights by its name: itself, or its fp32 master."""
        if isinstance(self.optimizer, MasterWeights):
            return [(name, self.optimizer.master_of(p)) for name, p in self._named()]
        return self._named()

    def _set_state(self, p, state: dict) -> None:
        if state:
            self.optimizer.state[p] = state
        else:
            self.optimizer.state.pop(p, None)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)
        self._share_wrapped()  # torch's load replaces the groups
