"""The fp32 master weights kept by the optimizer: the model holds 16-bit parameters only.

Mixed precision can keep its fp32 copy of the weights in one of two places:

* **in the model** (``--master-weights model``; PyTorch AMP, FSDP's
  ``MixedPrecision``): the module's parameters stay fp32 and each layer casts
  them to 16 bits as it runs (:mod:`dtlab.numerics.precision`). Gradients
  arrive in fp32; the 16-bit casts live only during the step.
* **in the optimizer** (``--master-weights optimizer``; Micikevicius et al. 2017,
  Fig. 1, ZeRO's Sec. 3.1, Megatron-LM, DeepSpeed): the module's parameters *are*
  16-bit, so are their gradients, and the optimizer keeps an fp32 master of every
  parameter beside Adam's two moments: K = 4 + 4 + 4 = 12 bytes per parameter.
  This is the layout ZeRO's Figure 1 counts, (2 + 2 + K)Ψ, and the one whose K it
  shards from stage 1 on: each rank keeps the master and moments of its 1/N only.

:class:`MasterWeights` is the second: a ``torch.optim.Optimizer`` over 16-bit
parameters (or a ZeRO rank's 16-bit shards) that runs any torch optimizer on
fp32 masters of them::

    model = apply_mixed_precision(build_model(cfg), "bf16")  # casts where a layer needs fp32
    to_16_bit(model, torch.bfloat16)                          # the parameters themselves: bf16
    optimizer = MasterWeights(model.parameters(), torch.optim.AdamW, lr=1e-3)
    model(x, y).backward()                                    # bf16 gradients on the parameters
    optimizer.step()      # g32 = g16 in fp32; Adam on the masters; p16 = round(master)

A step's fp32 gradients are made when asked for (:meth:`take_gradients`: the
loss scaler must unscale them in fp32, where a small gradient divided by the
scale does not underflow, and clipping scales them) and freed by the step:
they are a transient beside the model states (DeepSpeed keeps such an fp32
gradient partition; the paper's K does not count it). The masters start as the
16-bit parameters' values, as Megatron-LM's do.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from dtlab.measure.memory import note_moment, tensor_bytes
from dtlab.parallel.dp_optimizer import WrappingOptimizer

SIXTEEN_BIT = {"fp16": torch.float16, "bf16": torch.bfloat16}
"""The precisions whose parameters ``--master-weights optimizer`` keeps in 16 bits."""


@torch.no_grad()
def to_16_bit(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Store every floating-point parameter of ``model`` in ``dtype``, in place (buffers stay as they are).

    The same ``nn.Parameter`` objects, so hooks and names are kept; a tied
    parameter is converted once.
    """
    for p in {id(p): p for p in model.parameters()}.values():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    return model


class MasterWeights(WrappingOptimizer):
    """``optimizer_class`` run on fp32 masters of 16-bit ``params``; the masters are this optimizer's.

    ``params``: parameters, or groups as torch.optim takes them (each group's
    options go with its masters). ``param_groups`` and ``state`` are the wrapped
    optimizer's, over the masters, so a schedule writing ``group["lr"]`` is
    heard. :meth:`step` takes the gradients (if :meth:`take_gradients` has not),
    steps the masters and rounds them into the parameters.
    """

    def __init__(self, params, optimizer_class=torch.optim.AdamW, **optimizer_kwargs):
        from dtlab.parallel.zero.flat import parameter_groups  # (the zero package imports this module)

        groups = parameter_groups(params)
        self.params = [p for p in {id(p): p for g in groups for p in g["params"]}.values() if p.requires_grad]
        self.masters = [nn.Parameter(p.detach().to(torch.float32, copy=True)) for p in self.params]
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._taken = False
        self._adopt(
            optimizer_class(
                [{**g, "params": [self.master_of(p) for p in g["params"] if p.requires_grad]} for g in groups],
                **optimizer_kwargs,
            )
        )

    def add_param_group(self, param_group: dict) -> None:
        """A new group of 16-bit parameters: fp32 masters are made for them, and the group steps those."""
        if getattr(self, "_adopting", False):
            return super().add_param_group(param_group)
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        for p in params:
            self._index[id(p)] = len(self.params)
            self.params.append(p)
            self.masters.append(nn.Parameter(p.detach().to(torch.float32, copy=True)))
        self.optimizer.add_param_group({**param_group, "params": [self.master_of(p) for p in params]})
        self._share_wrapped()

    def master_of(self, p: torch.Tensor) -> nn.Parameter:
        """The fp32 master of parameter ``p``."""
        return self.masters[self._index[id(p)]]

    @torch.no_grad()
    def take_gradients(self) -> None:
        """Each parameter's 16-bit gradient, in fp32, as its master's ``.grad`` (once per step).

        A parameter without a gradient leaves its master without one: the
        wrapped optimizer skips it, as it would the parameter.
        """
        if self._taken:
            return
        for p, m in zip(self.params, self.masters):
            m.grad = None if p.grad is None else p.grad.to(torch.float32)
        note_moment("master_grads", sum(tensor_bytes(m.grad) for m in self.masters))
        self._taken = True

    def master_gradient(self, p: torch.Tensor) -> torch.Tensor | None:
        """``p``'s fp32 gradient this step (after :meth:`take_gradients`), or None."""
        return self.master_of(p).grad

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.take_gradients()
        self.optimizer.step()
        for p, m in zip(self.params, self.masters):
            if m.grad is not None:
                p.copy_(m)  # round to the parameter's 16 bits
            m.grad = None  # the fp32 gradients were for this step only
        self._taken = False
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p, m in zip(self.params, self.masters):
            p.grad = m.grad = None
        self._taken = False

    # -- the training state: kept per parameter, for its master
    def state_of(self, p: torch.Tensor) -> dict:
        """The wrapped optimizer's state of parameter ``p`` (kept for its master)."""
        return self.optimizer.state.get(self.master_of(p), {})

    @torch.no_grad()
    def load_state_of(self, p: torch.Tensor, state: dict, weights: torch.Tensor | None = None) -> None:
        """``p``'s master takes ``weights`` (fp32, exact; default: ``p``'s loaded value), ``p`` their rounding,
        and the optimizer ``state`` ({}: none), in fp32."""
        master = self.master_of(p)
        master.copy_(p if weights is None else weights.view_as(master))
        p.copy_(master)
        if state:
            self.optimizer.state[master] = {
                k: v.to(master.device, torch.float32) if v.dim() else v for k, v in state.items()
            }
        else:
            self.optimizer.state.pop(master, None)

    def master_bytes(self) -> int:
        """The fp32 masters: 4 bytes per parameter element held."""
        return sum(tensor_bytes(m) for m in self.masters)

    def state_dict(self) -> dict:
        """The wrapped optimizer's state and the fp32 masters (the authoritative weights)."""
        return {"optimizer": self.optimizer.state_dict(), "master": [m.detach().clone() for m in self.masters]}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self._share_wrapped()
        for p, m, saved in zip(self.params, self.masters, state["master"]):
            m.copy_(saved)
            p.copy_(m)
