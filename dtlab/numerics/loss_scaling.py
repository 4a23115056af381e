"""Loss scaling: keeping fp16 gradients out of the underflow zone (Micikevicius et al., 2017, Sec. 3.2).

fp16 cannot represent a magnitude below 2^-24 (its smallest subnormal), and
many activation gradients of a network are smaller than that: stored in fp16
they become 0 and the weights they belong to stop learning. The fix is to
multiply the loss by a factor S before backward. Backward is linear in the
loss, so every gradient comes out S times larger, lifted above the underflow
threshold; before the optimizer step the gradients are divided by S again (in
fp32, where nothing underflows), and the update is unchanged.

A scale that is too large makes some gradient overflow past fp16's maximum
(65504) to inf. Then the step must not be taken (an inf in Adam's moments
would poison every later step), so the scaler *skips* it. The paper (Sec. 3.2)
keeps S constant, chosen by hand per network, and skips a step that
overflows. Choosing S as training goes is the rule of NVIDIA's mixed-precision
training guide, which torch.amp.GradScaler implements:

    dynamic loss scaling (NVIDIA's guide; torch.amp.GradScaler)
      start with S = 2^16
      overflow (an inf or NaN in any gradient):  skip the step, S <- S * 0.5,
                                                  restart the count of clean steps
      growth_interval (2000) clean steps in a row: S <- S * 2

so S settles just below the largest scale the gradients tolerate, probing
upwards now and then. A *static* scaler keeps one S forever, and still skips a
step that overflows.

Usage (with :mod:`dtlab.numerics.precision`, which wraps exactly this)::

    scaler = LossScaler()                       # dynamic; LossScaler(1024.0, dynamic=False) is static
    scaler.scale(loss).backward()               # gradients are S x the true ones
    found_inf = scaler.unscale_and_check(model.parameters())   # now the true ones, checked
    if not found_inf:
        optimizer.step()                         # a skipped step touches nothing
    scaler.update(found_inf)

With data parallelism every rank sees the same averaged gradients, but when
ranks hold *different* gradients (ZeRO shards, tensor-parallel slices) one
rank may overflow alone. Pass ``group=`` and the ranks all-reduce (MAX) their
overflow flag, so all of them skip the step together and their scales stay equal.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

import torch
import torch.distributed as dist

from dtlab.comm import calls as comm
from dtlab.comm.collectives import group_size_and_rank
from dtlab.i18n import ConfigError


class ScalerStep(NamedTuple):
    """One entry of :attr:`LossScaler.history`: the scale a step used, and whether it was skipped."""

    scale: float
    skipped: bool


class LossScaler:
    """Dynamic (default) or static loss scaling, written out; same rule as ``torch.amp.GradScaler``.

    ``loss_scale`` is the current S. ``history`` lists one :class:`ScalerStep` per
    :meth:`update`. ``group=`` is the process group whose ranks must agree on
    skipping (None: the whole world, if one exists; a world of one rank communicates nothing).
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        *,
        dynamic: bool = True,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        group=None,
    ):
        if not init_scale > 0:
            raise ConfigError(
                f"loss scale {init_scale!r} is not allowed; expected a number > 0",
                f"损失缩放系数 {init_scale!r} 不合法；应为大于 0 的数",
            )
        if not (growth_factor > 1 and 0 < backoff_factor < 1 and growth_interval >= 1):
            raise ConfigError(
                "expected growth_factor > 1, 0 < backoff_factor < 1 and growth_interval >= 1, got "
                f"{growth_factor}, {backoff_factor}, {growth_interval}",
                f"应满足 growth_factor > 1、0 < backoff_factor < 1、growth_interval >= 1，收到的是 "
                f"{growth_factor}、{backoff_factor}、{growth_interval}",
            )
        self.loss_scale = float(init_scale)
        self.dynamic = dynamic
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.group = group
        self.clean_steps = 0  # GradScaler's "growth tracker": finite steps since the last change
        self.history: list[ScalerStep] = []

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """S x loss. Call ``.backward()`` on this, not on the loss, so every gradient is S x larger."""
        return loss * self.loss_scale

    def unscale_and_check(self, params_or_grads: Iterable[torch.Tensor]) -> bool:
        """Divide every gradient by S in place; True if any is inf or NaN (on any rank of the group).

        Takes parameters (their ``.grad`` is used; those without one are skipped)
        or the gradient tensors themselves. Call it once per step, after the
        last backward, before the optimizer step.
        """
        grads = [t.grad if isinstance(t, torch.nn.Parameter) or t.requires_grad else t for t in params_or_grads]
        grads = [g for g in grads if g is not None]
        device = grads[0].device if grads else torch.device("cpu")
        found = torch.zeros((), device=device)  # stays on the device: no host sync per tensor
        for g in grads:
            g.mul_(1.0 / self.loss_scale)  # back to the true gradient (exact for S = 2^k)
            found = torch.maximum(found, (~torch.isfinite(g)).any().to(device, torch.float32))
        world, _ = group_size_and_rank(self.group)
        if world > 1:
            # One overflowing rank makes every rank skip: a step taken on some
            # ranks and not others would leave the replicas (or shards) out of step.
            comm.all_reduce(found, dist.ReduceOp.MAX, group=self.group, kind="all_reduce.overflow")
        return bool(found.item() > 0)

    def update(self, found_inf: bool) -> None:
        """After each step: back off on overflow, grow after ``growth_interval`` clean steps."""
        self.history.append(ScalerStep(self.loss_scale, bool(found_inf)))
        if not self.dynamic:
            return
        if found_inf:
            self.loss_scale *= self.backoff_factor
            self.clean_steps = 0
            return
        self.clean_steps += 1
        if self.clean_steps == self.growth_interval:
            grown = self.loss_scale * self.growth_factor
            if grown != float("inf"):  # GradScaler never grows the scale to inf
                self.loss_scale = grown
            self.clean_steps = 0

    # A resumed run must continue with the same scale and the same count of clean steps.
    def state_dict(self) -> dict:
        return {
            "scale": self.loss_scale,
            "dynamic": self.dynamic,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "clean_steps": self.clean_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        self.loss_scale = float(state["scale"])
        self.dynamic = bool(state["dynamic"])
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self.clean_steps = int(state["clean_steps"])


def make_loss_scaler(loss_scale: str | float = "dynamic", *, group=None) -> LossScaler:
    """``--loss-scale dynamic`` or ``--loss-scale 1024``: the scaler that option names."""
    if isinstance(loss_scale, str) and loss_scale.strip().lower() == "dynamic":
        return LossScaler(group=group)
    try:
        value = float(loss_scale)
    except (TypeError, ValueError):
        value = float("nan")
    if not (value > 0 and value != float("inf")):
        raise ConfigError(
            f"loss_scale={loss_scale!r} is not allowed; expected 'dynamic' or a number > 0",
            f"loss_scale={loss_scale!r} 不合法；应为 'dynamic' 或大于 0 的数",
        )
    return LossScaler(value, dynamic=False, group=group)
