"""What a ZeroOptimizer (stages 1 and 2) holds on this rank, by the memory accountant's categories.

:class:`Stage12Memory` is the part of :class:`dtlab.parallel.zero.stage12.ZeroOptimizer` that
answers :meth:`~dtlab.parallel.dp_optimizer.DPOptimizer.memory_bytes` and ``host_memory_bytes``
(:mod:`dtlab.measure.memory` defines the categories). It reads what the optimizer sets: ``params``,
``flat``, ``layout``, ``stage``, ``offload``, ``master_weights``, ``optimizer``, ``bucket_mb``,
``_flat_grad``, ``_shard_grad`` and, with buckets, stage 2's peaks.
"""

from __future__ import annotations

from dtlab.measure.memory import model_state_bytes, tensor_bytes
from dtlab.parallel.dp_optimizer import no_bytes


class Stage12Memory:
    """The bytes a ZeroOptimizer holds: model states on the device and the host, and backward's buffers."""

    def memory_bytes(self) -> dict[str, int]:
        """Bytes of model states on this rank's device: ``{"params", "grads", "optimizer"}``.

        Read it after :meth:`step` (before :meth:`zero_grad`): stage 1 then
        holds the whole flat gradient (L), stage 2 only its shard (S).
        Padding counts: it is allocated. Offloaded optimizer state is on the
        host (:meth:`host_memory_bytes`), not here.
        """
        grads = sum(tensor_bytes(p.grad) for p in self.params)  # accumulated, not reduced yet
        # At stage 1 the shard's gradient is a view into the flat one: count the flat one once.
        grads += tensor_bytes(self._flat_grad) if self.stage == 1 else tensor_bytes(self._shard_grad)
        optimizer = 0 if self.offload else model_state_bytes([], self.optimizer)["optimizer"]
        held = {
            "params": tensor_bytes(self.flat),
            "grads": grads,
            "optimizer": optimizer,
            "buffers": self._backward_gradient_bytes(),
        }
        if self.master_weights:
            held["master"] = self.optimizer.master_bytes()  # this rank's 1/N of the fp32 masters
        return held

    def _backward_gradient_bytes(self) -> int:
        """``buffers``: the whole gradients alive during backward, gone by the step's end.

        Each parameter's ``.grad`` (Ψ) lives until :meth:`reduce_gradients`
        flattens it, beside the flat (L,) gradient; stage 2 then frees the flat
        one too (stage 1 keeps it, counted in ``grads``). Stage 2 with buckets:
        the most bytes of buckets alive at once this step (two windows, one in
        flight and one filling), plus the largest gradient a hook copied into
        them (each parameter's ``.grad`` lives from autograd's accumulation
        until its hook has staged it), plus the whole gradients that micro-batches
        accumulated through ``no_sync``, if any (as stage 1's). What backward
        holds beside the shard is at most this.
        """
        if self.bucket_mb is not None:
            return self.bucket_peak + self.staged_peak + self.kept_bytes
        whole = sum(p.numel() * p.element_size() for p in self.params)
        flat = self.layout.padded_numel * self.flat.element_size() if self.stage == 2 else 0
        return whole + flat

    def host_memory_bytes(self) -> dict[str, int]:
        """Bytes held on the host for this rank: the offloaded master shard, its gradient and state."""
        return self.optimizer.host_memory_bytes() if self.offload else no_bytes()
