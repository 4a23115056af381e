"""ZeRO stage 2 with buckets, reduce-scattered during backward: DeepSpeed's ``overlap_comm``.

Stage 2 with buckets (``bucket_mb``, DeepSpeed's ``reduce_bucket_size`` with
``overlap_comm``): reduce-scattering the whole flat gradient after backward
means the whole gradient (Ψ) and the flat copy of it (L) are alive together,
about 2Ψ, only to keep Ψ/N of it. Instead the flat buffer is cut into
*windows* of C elements (``bucket_mb`` MiB, a multiple of N), and each window
is sharded N ways on its own::

    L = 24, N = 2, C = 8: three windows, each cut in two equal chunks

    flat (L,)    [ w0 ........ | w1 ........ | w2 ........ ]   the parameters end to end, as always
    owner        [ r0  | r1    | r0  | r1    | r0  | r1    ]   rank r owns chunk r of every window

A post-accumulate-grad hook on each parameter copies its gradient into the
bucket of every window it overlaps (a (C,) buffer, made when the window's first
gradient arrives) and frees it; when a window has all its gradients, its
bucket is reduce-scattered (async: backward goes on), so each rank receives
exactly its own chunk of that window, in place in its (S,) shard gradient.
Backward produces the last parameters first, so the windows are sent from
the last to the first; at most two buckets are alive (one in flight, one
filling: the oldest in flight is waited for before a third is made), so the
gradient memory of backward is Ψ/N + 2C plus one parameter's gradient at a
time, not 2Ψ. ``finish_gradient_sync()`` only waits (and sends what backward
did not: a parameter without a gradient counts as zeros). One reduce-scatter
per window, and after the update one all-gather per window (rank r's shard is
no longer one contiguous range of the buffer); the bytes are the same as the
whole buffer's. Gradient accumulation: backward passes inside :meth:`no_sync`
only add into ``.grad`` locally (as DDP's), the last one sends. Stage 1 keeps
the whole gradient anyway (that is what P_os is), so it keeps the one
reduce-scatter after backward and takes no bucket.

:class:`Stage2Buckets` is the part of :class:`dtlab.parallel.zero.stage12.ZeroOptimizer`
that does this; it reads the optimizer's flat buffer, windows and shard.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn as nn

from dtlab.comm import calls as comm
from dtlab.comm.collectives import REDUCE_SCATTER
from dtlab.i18n import DtlabError
from dtlab.measure.memory import note, note_moment, tensor_bytes
from dtlab.parallel.zero.flat import FlatLayout


class Stage2Buckets:
    """Stage 2's buckets, one per window of the flat buffer, each reduce-scattered as soon as it is full.

    A mixin of :class:`dtlab.parallel.zero.stage12.ZeroOptimizer`, which sets what
    these methods read: ``params``, ``layout``, ``flat``, ``windows``,
    ``slices``, ``offsets`` (this rank's chunk of each window and where it
    lies in the (S,) shard gradient), ``group``, ``world_size``, ``mean_over`` (the ranks averaged over), ``meter``,
    ``_shard_grad``, ``_sync`` (False inside ``no_sync``) and ``_reduced``.
    """

    def _start_buckets(self) -> None:
        """Where each parameter's gradient goes in the buckets, and the hooks that send them."""
        n = len(self.windows)
        # Backward produces the last parameters first: bucket i is window n - 1 - i.
        self._parts: dict[int, list[tuple[int, slice, slice]]] = {}  # id(p) -> (bucket, in p, in bucket)
        self._expected = [0] * n  # parameter parts each bucket waits for
        begin = 0
        for p, numel in zip(self.params, self.layout.numels):
            parts = []
            for k, w in enumerate(self.windows):
                lo, hi = max(begin, w.start), min(begin + numel, w.stop)
                if lo < hi:
                    parts.append((n - 1 - k, slice(lo - begin, hi - begin), slice(lo - w.start, hi - w.start)))
                    self._expected[n - 1 - k] += 1
            self._parts[id(p)] = sorted(parts, key=lambda part: part[0])  # its last elements first
            begin += numel
        self._reset_buckets()
        # The hook holds this optimizer only weakly (a hook on a tensor is out of the garbage
        # collector's sight; a strong reference would keep the process group alive), as OverlappedDP's.
        ready = weakref.WeakMethod(self._on_gradient_ready)
        for p in self.params:
            p.register_post_accumulate_grad_hook(lambda param: (hook := ready()) and hook(param))

    def _reset_buckets(self) -> None:
        n = len(self.windows)
        self._buffers: list[torch.Tensor | None] = [None] * n  # bucket i's (C_i,) buffer while alive
        self._ready, self._works = [0] * n, [None] * n
        self._next = 0  # buckets before this one have been sent this step
        self._in_flight: list[int] = []  # sent, not yet waited for, oldest first
        self._staged: set[int] = set()  # id(p) of the parameters staged this step
        self._kept: set[int] = set()  # id(p) whose .grad stayed through a no_sync backward
        self._alive = self.bucket_peak = 0  # bytes of buckets alive now, and the most this step
        self.staged_peak = 0  # the largest new gradient a hook staged this step
        self.kept_bytes = 0  # the whole gradients accumulated through no_sync
        self._moment = 0  # bytes of the gradient being staged, if the ledger lacks it

    def _on_gradient_ready(self, param: nn.Parameter) -> None:
        if not self._sync:
            if id(param) not in self._kept:  # it stays in .grad (the ledger counts it there)
                self._kept.add(id(param))
                self.kept_bytes += tensor_bytes(param.grad)
            return
        if self._reduced:
            raise DtlabError(
                "a gradient arrived after this step's gradients were reduced: call step() (or zero_grad()) "
                "before the next backward",
                "本步梯度已归约后又来了新的梯度：下一次反向传播之前请先调用 step()（或 zero_grad()）",
            )
        if self._parts[id(param)][0][0] < self._next:
            raise DtlabError(
                "a gradient arrived for a bucket already sent this step: run every backward of a step "
                "but the last inside no_sync()",
                "本步中该梯度所在的桶已经发出：一步中除最后一次之外的反向传播都要放在 no_sync() 之内",
            )
        # A new tensor, alive only until it is staged (one kept through no_sync is in the ledger's grads).
        self._moment = 0 if id(param) in self._kept else tensor_bytes(param.grad)
        self.staged_peak = max(self.staged_peak, self._moment)
        note_moment("grads", self._moment)
        self._stage(param, param.grad)
        param.grad = None  # in its buckets now: only Ψ/N of the gradient stays
        self._moment = 0

    @torch.no_grad()
    def _stage(self, param: nn.Parameter, grad: torch.Tensor | None) -> None:
        """Copy ``grad`` (zeros if None) into the bucket of every window it overlaps, sending each full one."""
        flat = None if grad is None else grad.reshape(-1)
        for i, in_param, in_bucket in self._parts[id(param)]:
            buffer = self._bucket(i)
            if flat is None:
                buffer[in_bucket].zero_()
            else:
                buffer[in_bucket].copy_(flat[in_param])
            self._ready[i] += 1
            self._send_full()  # before the next window's bucket is made
        self._staged.add(id(param))

    def _bucket(self, i: int) -> torch.Tensor:
        """Bucket ``i``'s buffer, made now if it is not alive; at most two are, while one is in flight."""
        if self._buffers[i] is None:
            while self._in_flight and sum(b is not None for b in self._buffers) >= 2:
                self._wait(self._in_flight[0])
            w = self.windows[len(self.windows) - 1 - i]
            buffer = torch.empty(w.stop - w.start, dtype=self.flat.dtype, device=self.flat.device)  # (C,)
            buffer[self.layout.numel - w.start :].zero_()  # padding (the last window's only)
            self._buffers[i] = buffer
            self._alive += tensor_bytes(buffer)
            self.bucket_peak = max(self.bucket_peak, self._alive)
            note("buffers", tensor_bytes(buffer))
            note_moment("grads", self._moment)  # beside the gradient being staged
        return self._buffers[i]

    @torch.no_grad()
    def _send_full(self) -> None:
        """Send every full bucket, strictly in order (every rank must issue the same collectives in turn)."""
        while self._next < len(self.windows) and self._ready[self._next] == self._expected[self._next]:
            self._send(self._next)
            self._next += 1

    def _send(self, i: int) -> None:
        """Reduce-scatter bucket ``i``: this rank receives the mean of its chunk, into its shard gradient."""
        k = len(self.windows) - 1 - i
        if self._shard_grad is None:  # what stage 2 keeps: (S,), from the first bucket on
            self._shard_grad = torch.empty(self.layout.shard_numel, dtype=self.flat.dtype, device=self.flat.device)
            note("grads", tensor_bytes(self._shard_grad))
        out = self._shard_grad[self.offsets[k] : self.offsets[k] + self.slices[k].stop - self.slices[k].start]
        buffer = self._buffers[i]
        buffer.div_(self.mean_over)  # mean = sum of (g / N), as the whole buffer's path
        if self.world_size > 1:
            self.meter.record_call(REDUCE_SCATTER, buffer)
            self._works[i] = comm.reduce_scatter_single(out, buffer, group=self.group, async_op=True)
            self._in_flight.append(i)
        else:
            out.copy_(buffer)
            self._free(i)

    def _wait(self, i: int) -> None:
        self._works[i].wait()  # the only time spent waiting on the network
        self._works[i] = None
        self._in_flight.remove(i)
        self._free(i)

    def _free(self, i: int) -> None:
        self._alive -= tensor_bytes(self._buffers[i])
        note("buffers", -tensor_bytes(self._buffers[i]))
        self._buffers[i] = None

    @torch.no_grad()
    def _finish_buckets(self) -> None:
        """Send what backward did not (a parameter without a gradient: zeros), wait for every bucket."""
        for p in reversed(self.params):  # the last first, so the windows fill in their order
            if id(p) not in self._staged:
                self._stage(p, p.grad)
        for i in list(self._in_flight):
            self._wait(i)
        for p in self.params:
            p.grad = None
        peaks = self.bucket_peak, self.staged_peak, self.kept_bytes
        self._reset_buckets()
        self.bucket_peak, self.staged_peak, self.kept_bytes = peaks  # the step's, until zero_grad


def windows(layout: FlatLayout, element_size: int, bucket_mb: float | None) -> list[slice]:
    """The flat buffer (L,) cut into windows of C elements, ``bucket_mb`` MiB rounded up to a multiple
    of N (the last window takes the rest); without buckets, one window: the whole buffer."""
    length, n = layout.padded_numel, layout.world_size
    if bucket_mb is None:
        return [slice(0, length)]
    size = max(1, -(-int(bucket_mb * 2**20) // element_size))  # elements in bucket_mb MiB
    size = -(-size // n) * n  # C: N equal chunks
    return [slice(start, min(start + size, length)) for start in range(0, length, size)]


def bucket_windows(numel: int, world_size: int, element_size: int, bucket_mb: float | None) -> list[int]:
    """Elements of each of stage 2's buckets for ``numel`` parameters, in the order they are sent
    (the last window first): what :class:`ZeroOptimizer` cuts, for the planner and the tests."""
    layout = FlatLayout((torch.Size([numel]),), world_size)
    return [w.stop - w.start for w in reversed(windows(layout, element_size, bucket_mb))]
