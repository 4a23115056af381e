"""Data parallelism (DP): every rank holds the whole model, trains on its slice of the batch,
and the ranks average their gradients before each optimizer step.

Why averaging is enough: the loss is a mean over the batch, so the gradient on
the whole batch is the mean of the gradients on N equal slices of it. After
the average every replica holds the gradient a single process would have
computed on the whole batch, takes the same optimizer step, and the replicas
stay identical (Goyal et al., "Accurate, Large Minibatch SGD", 2017).

Three versions of the same idea, each faster than the last, to compare:

    PerParameterDP   after backward, one all-reduce per parameter
    BucketedDP       after backward, one all-reduce per bucket of gradients
    OverlappedDP     during backward: each bucket is all-reduced as soon as its
                     last gradient exists, while autograd computes the rest

``OverlappedDP`` is what ``torch.nn.parallel.DistributedDataParallel`` does
(Li et al., "PyTorch Distributed", VLDB 2020, Sec. 3.2). All three
are used the same way, like DDP::

    model = OverlappedDP(build_model(cfg, seed=0), group=dp_group)
    optimizer = torch.optim.AdamW(model.parameters())
    for i, (x, y) in enumerate(micro_batches):          # gradient accumulation
        with model.no_sync() if i < K - 1 else contextlib.nullcontext():
            (model(x, y) / K).backward()
    optimizer.step()                  # every .grad is already the mean: backward's end averaged them, as DDP's

The trainer drives every layout through one protocol
(:class:`dtlab.parallel.dp_optimizer.DPOptimizer`); for these wrappers that is
:class:`ReplicatedOptimizer`, a torch optimizer beside the wrapped model
whose ``finish_gradient_sync()`` is the model's.

A world of one rank communicates nothing. By default the bucket all-reduce
is PyTorch's ``dist.all_reduce``; ``use_ring=True`` uses dtlab's own
:func:`dtlab.comm.collectives.ring_all_reduce` instead (synchronous, so with it
OverlappedDP communicates inside backward but no longer alongside it), and
``link=`` then simulates a slower interconnect (see :mod:`dtlab.comm.collectives`).
"""

from __future__ import annotations

import functools
import weakref
from contextlib import contextmanager

import torch
import torch.nn as nn

from dtlab.comm import calls as comm
from dtlab.comm.collectives import AVG, CommMeter, global_rank, group_size_and_rank, ring_all_reduce
from dtlab.i18n import ConfigError, DtlabError
from dtlab.parallel.buckets import make_buckets
from dtlab.planner.hardware import Link


def broadcast_from_rank0(module: nn.Module, *, group=None, params=None) -> None:
    """Every rank starts from rank 0's parameters (``params``, default all) and buffers, as DDP does
    (ZeRO too).

    The same seed already makes them equal; this makes it certain.
    """
    world_size, _ = group_size_and_rank(group)
    if world_size == 1:
        return
    src = global_rank(group, 0)
    for tensor in [*(module.parameters() if params is None else params), *module.buffers()]:
        comm.broadcast(tensor.detach(), src, group=group, kind="broadcast.init")


class _DataParallel(nn.Module):
    """What the three versions share: the wrapped model, the start, ``no_sync`` and the average."""

    def __init__(
        self,
        module: nn.Module,
        *,
        group=None,
        meter: CommMeter | None = None,
        use_ring: bool = False,
        link: Link | None = None,
        params=None,
    ):
        super().__init__()
        if link is not None and not use_ring:
            raise ConfigError(
                "link= simulates dtlab's ring all-reduce; pass use_ring=True with it",
                "link= 模拟的是 dtlab 自己的环形全归约；请同时传入 use_ring=True",
            )
        self.module = module
        self.group = group
        self.world_size, _ = group_size_and_rank(group)
        self.meter = meter if meter is not None else CommMeter()
        self.use_ring, self.link = use_ring, link
        # parameters() yields a tied (shared) Parameter once, so its gradient
        # is averaged once; a frozen one has no gradient to average.
        # ``params``: the ones replicated over ``group`` (default all). A mixture of experts
        # passes all but its experts, which are averaged over another group
        # (dtlab/parallel/moe/expert_parallel.py).
        params = list(module.parameters() if params is None else params)
        self.grad_params = [p for p in params if p.requires_grad]
        for p in self.grad_params:  # averaged here over this many ranks: a ZeRO-1 optimizer beside it need not
            p.dtlab_averaged_over = self.world_size
        self._sync = True
        broadcast_from_rank0(module, group=group, params=params)  # every replica starts from rank 0's
        # As DDP does, the gradients are the mean when backward() returns: a parameter's first gradient
        # in a synced backward queues the sync on autograd's engine, to run when that backward ends.
        # Each hook holds this wrapper only weakly: a hook stored on a tensor is out of sight of
        # Python's garbage collector, so a strong reference back here would keep the wrapper, its
        # process group and the group's sockets and threads alive after the run (the pool runs many).
        me = self._me = weakref.ref(self)
        self._queued = False  # the end of this backward is to finish the sync (an autograd callback)
        self._finished = False  # that callback finished it since the last finish_gradient_sync()
        for i, p in enumerate(self.grad_params):
            p.register_post_accumulate_grad_hook(functools.partial(_gradient_ready, me, i))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        """Gradient accumulation: backward passes in here only add into ``.grad``, locally.

        Averaging is linear, so averaging the sum of K micro-steps' gradients
        once equals averaging each of them: run the first K-1 micro-steps in
        here and only the last one communicates (Li et al. 2020, Sec. 3.2.4).
        """
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def finish_gradient_sync(self) -> None:
        """Make sure each ``.grad`` is the mean over ranks: usually the end of backward already did it.

        Backward does it when any of this rank's parameters got a gradient in a
        backward outside ``no_sync``; otherwise (no gradient at all on this rank,
        or a pipeline stage whose last backward touched none of them) this
        communicates now, a parameter without a gradient counting as zeros.
        Calling it is optional, and cheap when there is nothing left to do.
        """
        if self._finished:
            self._finished = False
            return
        if self._sync and self.world_size > 1:
            self._sync_gradients()
        self._queued = False

    def _on_gradient_ready(self, i: int) -> None:
        """Parameter ``grad_params[i]`` has its gradient of this backward; queue the sync at its end, once."""
        if self._sync and self.world_size > 1 and not self._queued:
            self._queue_sync()

    def _queue_sync(self) -> None:
        self._queued, self._finished = True, False
        torch.autograd.Variable._execution_engine.queue_callback(functools.partial(_backward_done, self._me))

    def _sync_gradients(self) -> None:
        raise NotImplementedError

    def _average(self, flat: torch.Tensor, *, async_op: bool = False):
        """g <- (1/N) sum over ranks of g, in place: data parallelism's one collective.

        Returns the in-flight work when ``async_op`` (``wait()`` on it), else None.
        """
        if self.use_ring:
            ring_all_reduce(flat, AVG, group=self.group, meter=self.meter, link=self.link)
            return None
        self.meter.record_call("all_reduce", flat)
        # Divide first, then sum (as DDP does): gloo has no AVG, and a sum of
        # N means stays in the range of one gradient, which fp16 will need.
        flat.div_(self.world_size)
        # OverlappedDP moves its buckets on from its gradient hooks and waits for them right after
        # backward: they may be left in flight on this thread (weak progress, --collectives dtlab).
        return comm.all_reduce(flat, group=self.group, async_op=async_op, caller_progresses=async_op)


class PerParameterDP(_DataParallel):
    """(a) After backward, one all-reduce per parameter: the simplest correct DP.

    "After": when autograd has finished the whole backward pass (a callback
    queued on its engine), every gradient is sent, one collective each.

    As many collectives per step as the model has parameters that need a
    gradient, each paying the collective's start-up cost, most of them tiny.
    """

    def _sync_gradients(self) -> None:
        for p in self.grad_params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self._average(p.grad)  # p's shape, in place


class BucketedDP(_DataParallel):
    """(b) After backward, gradients packed into flat buckets of ``bucket_cap_mb``, one all-reduce each.

    Fewer, larger messages (Li et al. 2020, Sec. 3.2.2), but the network still
    idles during backward and the processor idles during communication: the
    buckets are sent when the whole backward pass has finished.
    ``bucket_cap_mb`` is in MiB (2^20 bytes), as DDP's argument of that name is.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        bucket_cap_mb: float = 25.0,
        group=None,
        meter: CommMeter | None = None,
        use_ring: bool = False,
        link: Link | None = None,
        params=None,
    ):
        super().__init__(module, group=group, meter=meter, use_ring=use_ring, link=link, params=params)
        # Backward produces the last layer's gradients first, so buckets are
        # filled from the last parameter to the first (DDP's order too).
        self.buckets = make_buckets(reversed(self.grad_params), cap_bytes=int(bucket_cap_mb * 2**20))

    def _sync_gradients(self) -> None:
        for bucket in self.buckets:
            bucket.stage_all()  # grads -> buffer (numel,)
            self._average(bucket.buffer)
            bucket.unstage()  # buffer -> grads


class OverlappedDP(BucketedDP):
    """(c) Buckets all-reduced asynchronously *during* backward, as DDP does.

    A hook on each parameter (``register_post_accumulate_grad_hook``) counts
    its gradient the moment autograd has accumulated it; when a bucket's count
    is full, its gradients are copied into its buffer, its all-reduce starts
    with ``async_op=True``, and backward
    carries on computing earlier layers' gradients while the bytes move (Li et
    al. 2020, Sec. 3.2.3). The end of that backward waits for them (an autograd
    callback, as DDP queues), so :meth:`finish_gradient_sync` is then a no-op.

    Buckets are launched strictly in index order, on every rank: collectives
    must be issued in the same order everywhere, and the order in which hooks
    fire may differ between ranks. A full bucket whose predecessor is not yet
    full waits for it (Li et al. 2020, Sec. 3.2.3: no rank may launch bucket
    i+1 before bucket i).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        bucket_cap_mb: float = 25.0,
        group=None,
        meter: CommMeter | None = None,
        use_ring: bool = False,
        link: Link | None = None,
        params=None,
    ):
        super().__init__(
            module, bucket_cap_mb=bucket_cap_mb, group=group, meter=meter, use_ring=use_ring, link=link, params=params
        )
        self._next_bucket = 0  # buckets before this one have been launched this step
        bucket_of = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket.params}
        self._bucket_of = [bucket_of[id(p)] for p in self.grad_params]  # grad_params[i] -> its bucket

    def _on_gradient_ready(self, i: int) -> None:
        """One more gradient of ``grad_params[i]``'s bucket is accumulated; launch every bucket, in order, that is full.

        This runs once per parameter per backward, inside autograd: it only
        counts. A bucket's gradients are copied into its buffer all at once,
        when it is launched (:meth:`Bucket.stage_all`). Then it lets buckets
        already in flight move on (:func:`dtlab.comm.calls.progress`: where dtlab's
        all-reduce was left in flight on this thread, nothing else moves it
        while backward computes)."""
        if not self._sync or self.world_size == 1:
            return  # accumulating locally, or alone
        b = self._bucket_of[i]
        if b < self._next_bucket:
            raise DtlabError(
                "a gradient arrived for a bucket already sent in this backward (a parameter used by two "
                "backward passes running at once?)",
                "本次反向传播中该梯度所在的桶已经发出（是否有两个反向传播同时使用了同一参数？）",
            )
        if not self._queued:  # the end of this backward waits for every bucket (Li et al. 2020, Sec. 3.2.3)
            self._queue_sync()
        self.buckets[b].ready += 1
        while self._next_bucket < len(self.buckets) and self.buckets[self._next_bucket].full:
            launched = self.buckets[self._next_bucket]
            launched.stage_all()  # grads -> buffer (numel,)
            launched.work = self._average(launched.buffer, async_op=True)
            self._next_bucket += 1
        comm.progress()  # buckets in flight on this thread (--collectives dtlab) move on meanwhile

    def _sync_gradients(self) -> None:
        # Buckets still unsent hold a parameter that got no gradient in this
        # backward; send them now, with zeros in its place.
        for bucket in self.buckets[self._next_bucket :]:
            bucket.stage_all()
            bucket.work = self._average(bucket.buffer, async_op=True)
        for bucket in self.buckets:
            if bucket.work is not None:
                bucket.work.wait()  # the only time spent waiting on the network
            bucket.unstage()
            bucket.ready, bucket.work = 0, None  # the finished all-reduce, and what it holds, let go here
        self._next_bucket = 0


def _backward_done(wrapper: "weakref.ref[_DataParallel]") -> None:
    """Queued on autograd's engine by the first gradient of a synced backward: at its end, average every
    gradient (OverlappedDP: wait for the buckets in flight) into ``.grad`` (DDP's ``finalize_backward``)."""
    dp = wrapper()
    if dp is not None and dp._queued:
        dp._sync_gradients()
        dp._queued, dp._finished = False, True


def _gradient_ready(wrapper: "weakref.ref[_DataParallel]", i: int, param: nn.Parameter) -> None:
    """A parameter's post-accumulate-grad hook: tell its wrapper, if it still exists, that
    ``grad_params[i]`` has its gradient."""
    dp = wrapper()
    if dp is not None:
        dp._on_gradient_ready(i)


DP_VERSIONS = {"overlapped": OverlappedDP, "bucketed": BucketedDP, "per_parameter": PerParameterDP}
"""``TrainConfig.dp_mode`` -> the wrapper that implements it."""


def apply_data_parallel(
    module: nn.Module, *, mode: str = "overlapped", group=None, bucket_mb: float | None = None, **options
) -> _DataParallel:
    """Wrap ``module`` for data parallelism over ``group`` with the version named ``mode``.

    ``bucket_mb`` (or ``bucket_cap_mb``, DDP's name): the bucket cap of the bucketed versions
    (``TrainConfig.bucket_mb``; unset, 25 as DDP's).
    """
    bucket_mb = options.pop("bucket_cap_mb", bucket_mb)
    if mode not in DP_VERSIONS:
        raise ConfigError(
            f"dp_mode={mode!r} is not allowed; expected one of {list(DP_VERSIONS)}",
            f"dp_mode={mode!r} 不合法；应为 {list(DP_VERSIONS)} 之一",
        )
    if bucket_mb is not None and mode != "per_parameter":
        options["bucket_cap_mb"] = bucket_mb
    return DP_VERSIONS[mode](module, group=group, **options)
