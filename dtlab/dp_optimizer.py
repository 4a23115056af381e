"""What the training loop asks of a data-parallel optimizer: one protocol for DP, ZeRO 1-3 and offloading.

Whatever the layout, the last thing :func:`dtlab.train.build_rank` applies is
data parallelism over the DP group, in one of these forms::

    zero=0        dtlab.data_parallel.ReplicatedOptimizer   every rank a whole replica of the model states
    zero=1, 2     dtlab.zero.ZeroOptimizer                  optimizer state (and, at 2, gradients) sharded
    zero=3        dtlab.zero.Stage3Optimizer                parameters sharded as well
    offload=True  the ZeRO optimizer runs a                 its shard's state and update on the host
                  dtlab.zero.OffloadOptimizer

They differ in where the model states live and in which collectives move
them; the loop must not need to know which one it holds. Each is a
:class:`DPOptimizer`, and one training step calls, in this order::

    for group in optimizer.param_groups: group["lr"] = ...     the schedule
    optimizer.zero_grad()                                       start of the step
    with optimizer.no_sync(): ...backward...                    every micro-batch's but the last
    ... the last micro-batch's backward ...
    optimizer.finish_gradient_sync()                            timed as communication
    precision.step(optimizer)                                   (fp16: unscale, check) optimizer.step()
    optimizer.memory_bytes(), optimizer.host_memory_bytes()     the step's record

and ``state_dict`` / ``load_state_dict`` for checkpoints and loss-spike
rollback. A capability the loop needs from a layout is added here, with its
docstring saying when it is called and a default where one makes sense, so
every implementation has it and the loop never asks ``hasattr``.
"""
from __future__ import annotations

from abc import abstractmethod
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol, runtime_checkable

MODEL_STATES = ("params", "grads", "optimizer")
"""The keys of :meth:`DPOptimizer.memory_bytes` and :meth:`DPOptimizer.host_memory_bytes`."""


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
    def state_dict(self) -> dict:
        """This rank's optimizer state, as saved in a checkpoint or a rollback snapshot."""

    @abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Take back what :meth:`state_dict` returned on this rank (same layout)."""
