"""Gradient buckets: many small gradients packed into a few flat tensors, one collective each.

Every collective pays a fixed start-up cost (the alpha of the alpha-beta
model in :mod:`dtlab.planner.communication`) on top of its cost per byte. A model has
hundreds of parameters, many tiny (biases, LayerNorm scales): all-reducing
them one at a time pays alpha hundreds of times, in messages too small to
reach the link's bandwidth. Copying the gradients into a few flat *buckets* of
some megabytes each and all-reducing each bucket pays it a few times (Li et
al., "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training", VLDB 2020, Sec. 3.2.2 "Gradient Bucketing").

A bucket's buffer is one flat tensor; each of its parameters owns a slice of
it, viewed in the parameter's shape::

    buffer (numel,)  [ head.weight ........ | ln_f.bias | ln_f.weight | ... ]
    views            (V, C)                  (C,)        (C,)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn


@dataclass(eq=False)
class Bucket:
    """Some parameters whose gradients travel together in one flat tensor."""

    params: list[nn.Parameter]
    buffer: torch.Tensor
    """(numel,): every parameter's gradient, end to end."""
    views: list[torch.Tensor] = field(default_factory=list)
    """One view of ``buffer`` per parameter, in that parameter's shape."""
    ready: int = 0
    """How many of ``params`` have their gradient ready this step (when all have, the bucket is staged
    with :meth:`stage_all` and launched)."""
    work: object = None
    """The asynchronous all-reduce in flight on ``buffer``, if any."""

    @property
    def full(self) -> bool:
        return self.ready == len(self.params)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def stage_all(self) -> None:
        """Copy every parameter's gradient into the buffer (zeros for one with none on this rank).

        One ``torch._foreach_copy_`` for the whole bucket: a copy per parameter
        would pay Python's and the dispatcher's overhead per tensor, more than
        the small model's copies themselves cost on a CPU."""
        grads = [p.grad for p in self.params]
        if all(g is not None for g in grads):
            torch._foreach_copy_(self.views, grads)
        else:
            for view, grad in zip(self.views, grads):
                view.zero_() if grad is None else view.copy_(grad)
        self.ready = len(self.params)

    def unstage(self) -> None:
        """Copy the (now averaged) buffer back into every parameter's ``.grad``."""
        grads = [p.grad for p in self.params]
        if all(g is not None for g in grads):
            torch._foreach_copy_(grads, self.views)
            return
        for p, view in zip(self.params, self.views):
            if p.grad is None:
                p.grad = view.clone()
            else:
                p.grad.copy_(view)


def make_buckets(params, *, cap_bytes: int) -> list[Bucket]:
    """Pack ``params``, in the order given, into buckets of about ``cap_bytes`` each, as DDP does.

    A bucket takes parameters until it holds at least ``cap_bytes``; then it
    is closed, so its last parameter may take it past the cap (the rule of
    DDP's ``compute_bucket_assignment_by_size``: the fewest buckets, since
    each costs one collective's start-up). A bucket is also closed whenever
    the dtype or device changes, since one flat tensor has one of each.
    ``cap_bytes=0`` gives one bucket per parameter.
    """
    groups: list[list[nn.Parameter]] = []
    size = 0
    for p in params:
        same_kind = groups and (groups[-1][0].dtype, groups[-1][0].device) == (p.dtype, p.device)
        if not groups or not same_kind or size >= cap_bytes:
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += p.numel() * p.element_size()
    buckets = []
    for group in groups:
        buffer = torch.zeros(sum(p.numel() for p in group), dtype=group[0].dtype, device=group[0].device)  # (numel,)
        views, offset = [], 0
        for p in group:
            views.append(buffer[offset : offset + p.numel()].view_as(p))  # p's shape
            offset += p.numel()
        buckets.append(Bucket(params=group, buffer=buffer, views=views))
    return buckets
