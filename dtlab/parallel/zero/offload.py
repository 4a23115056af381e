"""Offloading: the optimizer state, and the optimizer step, on the host (CPU) instead of the device.

Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model Training",
USENIX ATC 2021. Adam's state (two tensors per parameter) plus an fp32
master copy of the parameters is most of the model states (12 of the 16
bytes per parameter in mixed precision, the paper's Fig. 1 K = 12), and the
update touches each element once per step: work a CPU can do. So the device
keeps only what forward and backward need, and each step moves::

    device                                  host (CPU, pinned memory)
    parameters p   ---- gradients g  -->    g copy        (d2h: device -> host)
                                            master p32 <- Adam(p32, g), state m, v
    parameters p   <--- updated p   ----    p32           (h2d: host -> device)

That is two copies of Ψ elements per step over the host link (PCIe: tens of
GB/s) in exchange for 12Ψ bytes (8Ψ with fp32 training) of device memory; the
lesson asks when the copy costs more than the memory it frees. Pinned (page
-locked) host memory lets the copy engine move the bytes without staging
them through a bounce buffer; it is used when CUDA is available.

:class:`OffloadOptimizer` wraps any torch optimizer this way, for any set of
parameters: a whole model in one process, or the shard that ZeRO gives a
rank (``ZeroOptimizer(..., offload=True)``, ``apply_zero(..., offload=True)``;
the trainer offloads only with a ZeRO stage, as ZeRO-Offload does).
On a CPU-only machine "device" and "host" are both main memory, but the two
pools are still separate tensors, counted separately, and the copies between
them still happen and are measured, so a lesson can show what moved.
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn

from dtlab.i18n import ConfigError
from dtlab.measure.memory import model_state_bytes, tensor_bytes
from dtlab.numerics.master_weights import MasterWeights
from dtlab.parallel.dp_optimizer import DPOptimizer, GradPiece
from dtlab.parallel.zero.flat import parameter_groups
from dtlab.state.training_state import Piece, StateSource, load_whole, whole_pieces


class OffloadOptimizer(DPOptimizer):
    """``optimizer_class`` run on fp32 master copies in host memory; the device keeps params and grads.

    ``OffloadOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)`` (or parameter groups,
    as torch.optim takes them): use it
    as the optimizer (``step``, ``zero_grad``, ``param_groups``,
    ``state_dict``). After each :meth:`step`, ``transfers`` holds the bytes and
    seconds of each direction's copies in that step. It is a
    :class:`dtlab.parallel.dp_optimizer.DPOptimizer` of a world of one (nothing to
    synchronise); the ZeRO optimizers wrap it over their shard.
    """

    def __init__(
        self, params, optimizer_class=torch.optim.AdamW, *, pin_memory: bool | None = None, **optimizer_kwargs
    ):
        groups = parameter_groups(params)  # parameter groups keep their options on the host too
        self.params = [p for p in {id(p): p for g in groups for p in g["params"]}.values() if p.requires_grad]
        pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        # The host side: an fp32 master of every parameter and room for its gradient,
        # allocated once (pinned allocations are slow to make, fast to copy into).
        self.master = [nn.Parameter(torch.empty(p.shape, dtype=torch.float32, pin_memory=pin)) for p in self.params]
        self.host_grads = [torch.empty(p.shape, dtype=torch.float32, pin_memory=pin) for p in self.params]
        with torch.no_grad():
            for m, p in zip(self.master, self.params):
                m.copy_(p)
        master_of = {id(p): m for p, m in zip(self.params, self.master)}
        self.optimizer = optimizer_class(
            [{**g, "params": [master_of[id(p)] for p in g["params"] if p.requires_grad]} for g in groups],
            **optimizer_kwargs,
        )
        self.transfers = {"d2h": {"bytes": 0, "seconds": 0.0}, "h2d": {"bytes": 0, "seconds": 0.0}}

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @property
    def state(self):
        """The wrapped optimizer's state: host tensors."""
        return self.optimizer.state

    @property
    def defaults(self) -> dict:
        """The wrapped optimizer's default options (torch.optim's ``defaults``)."""
        return self.optimizer.defaults

    @property
    def transfer_bytes(self) -> dict[str, int]:
        """Bytes copied in the last step: ``{"d2h": gradients down, "h2d": parameters up}``."""
        return {direction: t["bytes"] for direction, t in self.transfers.items()}

    def _sync(self) -> None:
        """Wait for the asynchronous copies, so that their time is measured (a no-op on the CPU)."""
        if any(p.is_cuda for p in self.params):
            torch.cuda.synchronize()

    @torch.no_grad()
    def step(self) -> None:
        """Gradients to the host, the update there, the updated parameters back to the device."""
        # 1. device -> host: each gradient into its preallocated host buffer.
        started, moved = time.perf_counter(), 0
        for p, m, g in zip(self.params, self.master, self.host_grads):
            if p.grad is None:
                m.grad = None  # no gradient this step: the optimizer skips it, as on the device
                continue
            g.copy_(p.grad, non_blocking=True)
            m.grad = g
            moved += tensor_bytes(p.grad)
        self._sync()
        self.transfers["d2h"] = {"bytes": moved, "seconds": time.perf_counter() - started}

        # 2. the update, by the host's cores, on the fp32 masters and the host-resident state.
        self.optimizer.step()

        # 3. host -> device: the updated masters, in the device parameters' dtype.
        started, moved = time.perf_counter(), 0
        for p, m in zip(self.params, self.master):
            if m.grad is None:
                continue
            p.copy_(m if p.dtype == m.dtype else m.to(p.dtype), non_blocking=True)
            moved += tensor_bytes(p)
        self._sync()
        self.transfers["h2d"] = {"bytes": moved, "seconds": time.perf_counter() - started}

    def gradients(self) -> list[GradPiece]:
        """The device gradients (copied to the host in :meth:`step`), named by position; a world of one counts all."""
        return [GradPiece(name, p.grad, True) for name, p in self._named() if p.grad is not None]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Free the device gradients (the host buffers stay allocated for the next step)."""
        for p in self.params:
            p.grad = None
        for m in self.master:
            m.grad = None

    # -- the training state, per device parameter (the ZeRO optimizers ask for their shard's)
    def state_of(self, p: torch.Tensor) -> dict:
        """The optimizer's state of device parameter ``p`` (kept for its host master)."""
        return self.optimizer.state.get(self._master(p), {})

    @torch.no_grad()
    def load_state_of(self, p: torch.Tensor, state: dict) -> None:
        """``p``'s master takes ``p``'s (already loaded) weights, and the optimizer ``state`` ({}: none)."""
        master = self._master(p)
        master.copy_(p)
        if state:
            self.optimizer.state[master] = {k: v.to(master.device) if v.dim() else v for k, v in state.items()}
        else:
            self.optimizer.state.pop(master, None)

    def _master(self, p: torch.Tensor) -> nn.Parameter:
        return self.master[next(i for i, q in enumerate(self.params) if q is p)]

    def training_state(self) -> list[Piece]:
        """Whole weights and state of each parameter, named by its position in ``params``."""
        return whole_pieces(self._named(), self.state_of)

    def load_training_state(self, source: StateSource) -> None:
        load_whole(self._named(), source, self.load_state_of)

    def _named(self) -> list:
        return [(str(i), p) for i, p in enumerate(self.params)]

    def state_dict(self) -> dict:
        """The wrapped optimizer's state and the fp32 masters (the authoritative weights)."""
        return {"optimizer": self.optimizer.state_dict(), "master": [m.detach().clone() for m in self.master]}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        for p, m, saved in zip(self.params, self.master, state["master"]):
            m.copy_(saved)
            p.copy_(m)  # the device copy follows the master

    def memory_bytes(self) -> dict[str, int]:
        """Bytes on the device for these parameters: ``{"params", "grads", "optimizer": 0}``."""
        return {**model_state_bytes(self.params), "optimizer": 0}

    def host_memory_bytes(self) -> dict[str, int]:
        """Bytes on the host: the fp32 masters, the gradient buffers and the optimizer state."""
        return {
            "params": sum(tensor_bytes(m) for m in self.master),
            "grads": sum(tensor_bytes(g) for g in self.host_grads),
            "optimizer": model_state_bytes([], self.optimizer)["optimizer"],
        }


def check_master_weights(master_weights: bool, offload: bool) -> None:
    """A ZeRO optimizer keeps fp32 masters in one place: the device's (``master_weights``) or the host's."""
    if master_weights and offload:
        raise ConfigError(
            "master_weights=True with offload=True: an offloaded optimizer keeps its own fp32 masters on "
            "the host (allowed: one of the two)",
            "master_weights=True 与 offload=True 不能同时使用：卸载的优化器已在主机端保存自己的 fp32 主权重"
            "（允许：二者选一）",
        )


def state_of(optimizer, p: torch.Tensor) -> dict:
    """The state ``optimizer`` (a torch optimizer, an :class:`OffloadOptimizer` or a
    :class:`dtlab.numerics.master_weights.MasterWeights`) keeps for ``p``."""
    if isinstance(optimizer, (OffloadOptimizer, MasterWeights)):
        return optimizer.state_of(p)
    return optimizer.state.get(p, {})


def set_state_of(optimizer, p: torch.Tensor, state: dict, weights: torch.Tensor | None = None) -> None:
    """Give ``optimizer`` the ``state`` of ``p`` (``{}``: it forgets any), after ``p``'s weights are loaded.

    ``weights``: the exact fp32 weights of ``p``, for an optimizer that keeps fp32 masters of a
    16-bit ``p`` (:class:`dtlab.numerics.master_weights.MasterWeights`); others read ``p``.
    """
    if isinstance(optimizer, MasterWeights):
        optimizer.load_state_of(p, state, weights)
    elif isinstance(optimizer, OffloadOptimizer):
        optimizer.load_state_of(p, state)
    elif state:
        optimizer.state[p] = state
    else:
        optimizer.state.pop(p, None)
