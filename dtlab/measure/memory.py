"""The per-rank memory accountant and step timers.

Memory of a training rank falls into four categories (ZeRO paper, Sec. 3):
the *model states* (parameters, gradients, optimizer state) and the
*residual states*, of which the *activations* saved for backward dominate.

* ``params``, ``grads``, ``optimizer``: bytes of the tensors this rank holds,
  counted from the tensors themselves (a sharded tensor counts only its shard).
  Optimizer state counts per-element state (Adam's ``exp_avg``, ``exp_avg_sq``);
  the scalar step counters (4 bytes per tensor) are left out.
* ``activations``: the *peak* bytes autograd held for backward during the step,
  counted with saved-tensor hooks: each tensor saved for backward is counted
  when saved and released when autograd frees it. Storage shared by several
  saved tensors counts once, and parameters (which matmuls also save) are not
  activations.
* ``copies``: under mixed precision, the peak bytes of the 16-bit compute
  copies of the fp32 weights that autograd saved (``p.to(bf16)`` in
  :mod:`dtlab.numerics.precision`): model state in another dtype, not activations.
  The same saved-tensor hooks tell them apart: a saved tensor whose autograd
  history is a cast of a parameter (through views such as a transpose).
* ``buffers``: communication and flat buffers (DP's gradient buckets, ZeRO-1's
  whole gradients alive during backward, ZeRO-2's buckets (the most alive at
  once), ZeRO-3's gathered units, prefetched ones counted from the moment their
  all-gather is issued, a pipeline's
  buffers in flight) and the model's registered buffers; each component reports
  its own (``memory_bytes()["buffers"]`` of the optimizer protocol).
* ``peak``: the highest total live at one moment of the step. The categories
  peak at different times (activations at the end of forward, ZeRO-1's whole
  gradients during backward), so this is less than their sum. ``params`` and
  ``optimizer`` are the baseline; what changes within the step is followed by
  a :class:`LiveBytes` ledger: the meter's activations and copies as autograd
  saves and frees them, each gradient as backward accumulates it, gathered
  ZeRO-3 units, a pipeline's buffers, and (:func:`note_moment`) a transient a
  component holds for a moment, such as ZeRO-1's flat gradient beside the
  whole ones, or a gradient ZeRO-2 is copying into its buckets.
  ``peak`` = params + optimizer + the ledger's highest total.
* ``logits``: the (B, T, V) logits alive beside everything saved when the loss
  is computed (the softmax saves its own output, not them): the largest
  forward tensor that autograd does not keep, in no other category.
* ``workspace``: what the device's allocator holds at the step's end beyond
  the categories alive then (:func:`workspace_bytes`): library workspaces
  allocated on first use (cuBLAS keeps one per thread that ran a matmul, and
  backward runs on a thread of its own), the caching allocator's rounding,
  and small tensors of no category (the batch, AdamW's step counters). Measured, not
  counted: on the CPU, where no allocator is asked, it is 0.
  :mod:`dtlab.measure.allocator` checks every category against the allocator.

Time of a step splits into ``compute_s``, ``comm_s`` (inside collectives,
including waiting there for slower peers) and ``idle_s`` (the rest of the step's
wall time: data, bookkeeping, waiting outside collectives).
"""

from __future__ import annotations

import time
import weakref
from contextlib import contextmanager

import torch
import torch.nn as nn


def tensor_bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.nbytes  # numel x element size


def model_state_bytes(params, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state held by this rank now.

    ``params`` is an iterable of parameters (each counted once, even if tied).
    """
    unique = {id(p): p for p in params}.values()
    state = 0  # the training loop asks every step: plain loops, no call per tensor
    if optimizer is not None:
        for per_param in optimizer.state.values():
            for v in per_param.values():
                if isinstance(v, torch.Tensor) and v.dim():
                    state += v.nbytes
    return {
        "params": sum(p.nbytes for p in unique),
        "grads": sum(g.nbytes for p in unique if (g := p.grad) is not None),
        "optimizer": state,
    }


class _Saved:
    """A packed saved tensor; its destruction is autograd freeing it."""

    __slots__ = ("tensor", "key", "meter")

    def __init__(self, tensor, key, meter):
        self.tensor, self.key, self.meter = tensor, key, meter

    def __del__(self):
        self.meter._release(self.key)


def _is_weight_copy(t: torch.Tensor, params: set[int]) -> bool:
    """Whether autograd's history of ``t`` is a cast of one of ``params`` (storage ptrs), maybe viewed."""
    fn = t.grad_fn
    for _ in range(4):  # a cast, then at most a few views
        if fn is None:
            return False
        nxt = [f for f, _ in fn.next_functions if f is not None]
        if type(fn).__name__ == "ToCopyBackward0":
            var = getattr(nxt[0], "variable", None) if len(nxt) == 1 else None
            return var is not None and var.untyped_storage().data_ptr() in params
        if len(nxt) != 1:
            return False
        fn = nxt[0]
    return False


class ActivationMeter:
    """Counts the bytes autograd keeps for backward; ``peak`` is the most held at once.

    ``current``/``peak`` are activations; the 16-bit copies of parameters that
    autograd saves under mixed precision are counted apart, in
    ``copies``/``copies_peak``. Use ``with meter.track():`` around forward
    *and* backward of a step.
    """

    def __init__(self, exclude: nn.Module | None = None):
        self._excluded: set[int] = set()
        if exclude is not None:
            self.exclude(exclude.parameters())
        self._refs: dict[int, list[int]] = {}  # storage ptr -> [bytes, refcount, is a copy]
        self.current = self.peak = 0
        self.copies = self.copies_peak = 0

    def exclude(self, tensors) -> None:
        """Never count these tensors' storage (parameters are model state, not activations)."""
        self._excluded.update(t.untyped_storage().data_ptr() for t in tensors)

    def reset_peak(self) -> None:
        self.peak, self.copies_peak = self.current, self.copies

    def _pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self._excluded or storage.nbytes() == 0:
            return t
        entry = self._refs.get(key)
        if entry is None:
            copy = _is_weight_copy(t, self._excluded)
            self._refs[key] = [storage.nbytes(), 1, copy]
            if copy:
                self.copies += storage.nbytes()
                self.copies_peak = max(self.copies_peak, self.copies)
            else:
                self.current += storage.nbytes()
                self.peak = max(self.peak, self.current)
            note("copies" if copy else "activations", storage.nbytes())
        else:
            entry[1] += 1
        return _Saved(t.detach(), key, self)  # detached: no reference cycle through grad_fn

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Saved) else packed

    def _release(self, key: int) -> None:
        entry = self._refs.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            if entry[2]:
                self.copies -= entry[0]
            else:
                self.current -= entry[0]
            note("copies" if entry[2] else "activations", -entry[0])
            del self._refs[key]

    @contextmanager
    def track(self):
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield self


class LiveBytes:
    """A running total of the bytes that come and go within a step, and its highest value.

    Sources (``"activations"``, ``"grads"``, ``"gathered"``, ...) change their
    level with :meth:`add` or :meth:`set`; every change is one moment, and
    ``high`` is the highest total seen since :meth:`start`. Components report
    through the module's :func:`note`, :func:`note_level` and
    :func:`note_moment` while the ledger is active (:func:`counting`).
    """

    def __init__(self):
        self.levels: dict[str, int] = {}
        self.moments: dict[str, int] = {}  # source -> the most it held for a moment this step
        self.total = self.high = 0
        self._grads: dict[int, int] = {}  # id(parameter) -> bytes of its .grad counted

    def start(self, levels: dict[str, int]) -> None:
        """A new step: the levels live now (anything not named is 0); the high starts here."""
        self.levels, self.moments, self._grads = dict(levels), {}, {}
        self.total = self.high = sum(self.levels.values())

    def add(self, source: str, delta: int) -> None:
        self.levels[source] = self.levels.get(source, 0) + delta
        self.total += delta
        self.high = max(self.high, self.total)

    def set(self, source: str, level: int) -> None:
        self.add(source, level - self.levels.get(source, 0))

    def moment(self, source: str, extra: int) -> None:
        """``source`` holds ``extra`` bytes beyond the levels, only now."""
        self.high = max(self.high, self.total + extra)
        self.moments[source] = max(self.moments.get(source, 0), extra)

    def watch_gradients(self, params) -> None:
        """Count each parameter's ``.grad`` as backward accumulates it (post-accumulate hooks).

        Freed gradients are not seen here: whoever frees them sets ``"grads"``
        again (the training loop, after the gradient sync). The hooks hold the
        ledger weakly, as a hook on a tensor is out of the garbage collector's sight.
        """
        ref = weakref.ref(self)
        for p in params:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda q: (ledger := ref()) and ledger._grad_arrived(q))

    def _grad_arrived(self, p: torch.Tensor) -> None:
        now = tensor_bytes(p.grad)
        self.add("grads", now - self._grads.get(id(p), 0))
        self._grads[id(p)] = now


_ledger: LiveBytes | None = None


@contextmanager
def counting(ledger: LiveBytes):
    """Make ``ledger`` the one :func:`note`, :func:`note_level` and :func:`note_moment` report to."""
    global _ledger
    previous, _ledger = _ledger, ledger
    try:
        yield ledger
    finally:
        _ledger = previous


def note(source: str, delta: int) -> None:
    """``delta`` bytes of ``source`` came (> 0) or went (< 0); nothing when no ledger is active."""
    if _ledger is not None:
        _ledger.add(source, delta)


def note_level(source: str, level: int) -> None:
    if _ledger is not None:
        _ledger.set(source, level)


def note_moment(source: str, extra: int) -> None:
    if _ledger is not None:
        _ledger.moment(source, extra)


def workspace_bytes(device: str, counted: int) -> int:
    """What the allocator of ``device`` holds now beyond ``counted``, the bytes of the categories alive now.

    On CUDA, ``torch.cuda.memory_allocated`` (every live block, each rounded up
    by the caching allocator) minus ``counted``: the record's ``workspace``. On
    the CPU there is no allocator to ask: the categories are all dtlab's meter
    sees, and this is 0.
    """
    if not str(device).startswith("cuda"):
        return 0
    return max(0, torch.cuda.memory_allocated(device) - counted)


def module_buffer_bytes(module: nn.Module) -> int:
    """Bytes of a module's registered buffers (a causal mask, say), each storage once."""
    seen = {b.untyped_storage().data_ptr(): b.untyped_storage().nbytes() for b in module.buffers()}
    return sum(seen.values())


class StepTimer:
    """Splits one step's wall time into compute, communication and idle seconds."""

    def __init__(self, device: str = "cpu"):
        self.device = device
        self.compute_s = self.comm_s = 0.0
        self._t0 = time.perf_counter()

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)

    @contextmanager
    def _measure(self, attr: str):
        self._sync()
        t = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            setattr(self, attr, getattr(self, attr) + time.perf_counter() - t)

    def compute(self):
        return self._measure("compute_s")

    def comm(self):
        return self._measure("comm_s")

    def finish(self) -> dict[str, float]:
        wall = time.perf_counter() - self._t0
        return {
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "idle_s": max(0.0, wall - self.compute_s - self.comm_s),
            "wall_s": wall,
        }
