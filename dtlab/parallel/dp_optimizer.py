"""What the training loop asks of a data-parallel optimizer: one protocol for DP, ZeRO 1-3 and offloading.

Whatever the layout, the last thing :func:`dtlab.train.build_rank` applies is
data parallelism over the DP group, in one of these forms::

    zero=0        dtlab.parallel.replicated.ReplicatedOptimizer      every rank a whole replica of the model states
    zero=1, 2     dtlab.parallel.zero.ZeroOptimizer                  optimizer state (and, at 2, gradients) sharded
    zero=3        dtlab.parallel.zero.Stage3Optimizer                parameters sharded as well
    offload=True  the ZeRO optimizer runs a                 its shard's state and update on the host
                  dtlab.parallel.zero.OffloadOptimizer

They differ in where the model states live and in which collectives move
them; the loop must not need to know which one it holds. Each is a
:class:`DPOptimizer`, and one training step calls, in this order::

    for group in optimizer.param_groups: group["lr"] = ...     the schedule
    optimizer.zero_grad()                                       start of the step
    with optimizer.no_sync(): ...backward...                    every micro-batch's but the last
    ... the last micro-batch's backward ...
    optimizer.finish_gradient_sync()                            timed as communication
    optimizer.gradients()                                       with --clip-grad: the global norm
    precision.step(optimizer)                                   (fp16: unscale, check) optimizer.step()
    optimizer.memory_bytes(), optimizer.host_memory_bytes()     the step's record

and, for checkpoints and loss-spike rollback, :meth:`~DPOptimizer.training_state`
/ :meth:`~DPOptimizer.load_training_state`: the weights *and* the optimizer
state this rank holds, as pieces that name the parameter and the range of it
they hold (:mod:`dtlab.state.training_state`). The weights belong to the optimizer's
answer because only the layout knows where they are: between steps ZeRO-3's
model holds only this rank's 1-D shard of each parameter, so a model's
``state_dict()`` would save 1/N of the weights without saying which part. (``state_dict`` /
``load_state_dict`` remain, torch's optimizer state of this rank, for the same
layout only.) A capability the loop needs from a layout is added here, with its
docstring saying when it is called and a default where one makes sense, so
every implementation has it and the loop never asks ``hasattr``.
"""

from __future__ import annotations

from abc import abstractmethod
from contextlib import AbstractContextManager, nullcontext
from typing import NamedTuple, Protocol, runtime_checkable

import torch

from dtlab.state.training_state import Piece, StateSource

MODEL_STATES = ("params", "grads", "optimizer")
"""The keys of :meth:`DPOptimizer.memory_bytes` and :meth:`DPOptimizer.host_memory_bytes`."""


class GradPiece(NamedTuple):
    """One gradient that :meth:`DPOptimizer.step` will use on this rank: the tensor itself, not a copy.

    ``name``: the parameter's name in the model the layout wraps (as in
    :meth:`DPOptimizer.training_state`); ``grad``: its gradient, or this rank's
    range of it (a view into a ZeRO shard); ``counted``: whether this rank
    counts it in a norm over the DP group. The ranks of a DP group that hold
    the same averaged gradient (replicas) count it once, on the group's
    first rank; shards are disjoint, so every rank counts its own.
    """

    name: str
    grad: torch.Tensor
    counted: bool


def no_bytes() -> dict[str, int]:
    """``{"params": 0, "grads": 0, "optimizer": 0}``: nothing held there."""
    return dict.fromkeys(MODEL_STATES, 0)


@runtime_checkable
class DPOptimizer(Protocol):
    """The optimizer of a data-parallel layout, as the training loop drives it (see the module docstring).

    Implementations subclass it to say so and to inherit the defaults
    (:meth:`finish_gradient_sync` does nothing, :meth:`host_memory_bytes`
    is zeros); the abstract methods have none.
    """

    @property
    @abstractmethod
    def param_groups(self) -> list[dict]:
        """The torch optimizer's groups: the loop writes ``group["lr"]`` before each step."""

    @abstractmethod
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Called at the start of every step: free (or zero) every gradient this rank holds."""

    def no_sync(self) -> AbstractContextManager:
        """Entered around every backward of a step but the last (accumulation, pipeline micro-batches).

        Inside it gradients only add up locally; the step's last backward,
        outside it, may start communicating. Default: nothing to hold back.
        """
        return nullcontext()

    def finish_gradient_sync(self) -> None:
        """Called once per step, after the last backward of the last micro-batch, before the update.

        On return, the gradients that :meth:`step` will use (and that the
        fp16 loss scaler unscales and checks, through :attr:`param_groups`)
        are the mean over the DP group. What remains of the step's gradient
        communication happens here, so the loop times it as communication.
        Default: nothing (the averaging happened during backward, or there is
        no group).
        """

    @abstractmethod
    def gradients(self) -> list[GradPiece]:
        """Every gradient :meth:`step` will use on this rank, after :meth:`finish_gradient_sync`.

        Scaling these tensors in place scales the update (gradient clipping,
        :mod:`dtlab.numerics.gradient_clipping`, does); the ``counted`` flags let the
        ranks add up one global norm with each element counted once over the
        DP group. Parameters without a gradient this step are left out.
        """

    @abstractmethod
    def step(self) -> None:
        """Called once per step unless the loss scaler found an overflow or the spike guard a spike."""

    @abstractmethod
    def memory_bytes(self) -> dict[str, int]:
        """Model states on this rank's device, in bytes: ``{"params", "grads", "optimizer"}``.

        Called after :meth:`step` and before the next :meth:`zero_grad`, so
        that the gradients still exist. Counts what is allocated on this
        rank (a shard counts as a shard; padding counts); extra keys are
        allowed and ignored by the loop.
        """

    def host_memory_bytes(self) -> dict[str, int]:
        """Model states held in host memory for this rank, same keys; read when ``offload=True``.

        Default: zeros (nothing offloaded).
        """
        return no_bytes()

    @abstractmethod
    def training_state(self) -> list[Piece]:
        """Everything of the training state this rank holds: weights and optimizer state, as copies.

        One :class:`~dtlab.state.training_state.Piece` per parameter range held:
        the parameter's name in the model this optimizer's layout wraps, the
        flat range ``[start, stop)``, its tensors (``"param"`` for the
        weights, the optimizer's per-element state) and scalars (``"step"``).
        What a rank holds whole and what it holds a shard of is the layout's
        business; the pieces say which. Called at a checkpoint and at a spike
        snapshot, between steps (after the update, or before it, as here: never
        in the middle of one).
        """

    @abstractmethod
    def load_training_state(self, source: StateSource) -> None:
        """Take back the ranges this rank holds from ``source``, weights and optimizer state.

        Called on every rank of the layout together (an implementation may
        communicate). ``source`` answers for any range: the pieces a snapshot
        kept on this layout, or a checkpoint written at another layout
        (``dtlab/state/checkpoint/``). A parameter with no optimizer state in the
        source gets none (the optimizer had not stepped).
        """

    @abstractmethod
    def state_dict(self) -> dict:
        """This rank's torch optimizer state (same layout only; checkpoints use :meth:`training_state`)."""

    @abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Take back what :meth:`state_dict` returned on this rank (same layout)."""


class WrappingOptimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` that is a torch optimizer it wraps, seen by a schedule as that one.

    ``param_groups`` and ``state`` are the wrapped optimizer's very objects, so
    ``torch.optim.lr_scheduler.LambdaLR(this, ...)`` writing ``group["lr"]``
    writes it where the update reads it; :meth:`add_param_group` adds to the
    wrapped one. A subclass calls :meth:`_adopt` in its constructor, instead of
    ``torch.optim.Optimizer.__init__``.
    """

    def _adopt(self, optimizer) -> None:
        self.optimizer, self._adopting = optimizer, True
        torch.optim.Optimizer.__init__(self, optimizer.param_groups, optimizer.defaults)
        self._adopting = False
        self._share_wrapped()

    @property
    def param_groups(self) -> list[dict]:
        """The wrapped optimizer's groups: the loop and a schedule write ``group["lr"]`` here."""
        return self._param_groups

    @param_groups.setter
    def param_groups(self, groups: list[dict]) -> None:  # torch.optim.Optimizer assigns it
        self._param_groups = groups

    def _share_wrapped(self) -> None:
        """Point ``param_groups`` and ``state`` at the wrapped optimizer's (again after a load replaced them)."""
        self.param_groups, self.state = self.optimizer.param_groups, self.optimizer.state

    def add_param_group(self, param_group: dict) -> None:
        if getattr(self, "_adopting", False):  # torch.optim.Optimizer.__init__ taking the wrapped one's groups
            return super().add_param_group(param_group)
        self.optimizer.add_param_group(param_group)
        self._share_wrapped()
