"""How much communication a step hid behind computation, for dtlab's wrappers and PyTorch's alike.

``overlap_s`` is the tracer's figure (:mod:`dtlab.comm.tracer`): the time some
collective was in flight while the rank was not waiting for it. dtlab's
components report their calls to the tracer through :mod:`dtlab.comm.calls`;
PyTorch's are measured by the same rule from their own timings:

* FSDP2 calls ``torch.distributed``'s all-gather and reduce-scatter from
  Python, asynchronously, and waits on the works they return: inside
  :func:`torch_calls_traced` those functions are the tracer's, which times
  each call from issue to its finish (gloo's future) or to the wait,
  whichever comes first, exactly as for dtlab's calls.
* DDP all-reduces its buckets from C++ and waits for them inside backward
  itself, so a communication hook (:func:`ddp_timing_hook`) notes when each
  bucket's all-reduce was issued and when it finished; DDP starts waiting
  when backward has produced its last gradient, i.e. when the last bucket
  was issued, so a bucket was hidden from its issue until it finished or
  that moment.

The measuring steps run apart from the timed ones (a Python hook or a
wrapper slows the library it measures).
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

from dtlab.comm.tracer import CommTracer, length, union

_PATCHED = {
    "all_gather_single": ("all_gather", "output", 0),
    "all_gather_into_tensor": ("all_gather", "output_tensor", 0),
    "reduce_scatter_single": ("reduce_scatter", "input", 1),
    "reduce_scatter_tensor": ("reduce_scatter", "input", 1),
    "all_reduce": ("all_reduce", "tensor", 0),
}
"""torch.distributed's name -> (the tracer's kind, the argument whose bytes count, its position)."""


@contextmanager
def torch_calls_traced(tracer: CommTracer):
    """Inside, torch.distributed's all-gather, reduce-scatter and all-reduce (the names in
    ``_PATCHED`` this torch has) are timed into ``tracer`` as dtlab's own calls are (used for
    PyTorch's FSDP2 alone: dtlab's calls, through dtlab.comm.calls, would count twice)."""
    originals = {name: getattr(dist, name) for name in _PATCHED if hasattr(dist, name)}

    def traced(name, original):
        kind, keyword, position = _PATCHED[name]

        def call(*args, async_op=False, group=None, **kwargs):
            tensor = kwargs[keyword] if keyword in kwargs else args[position]
            nbytes = tensor.numel() * tensor.element_size()
            size = dist.get_world_size(group)
            run = lambda: original(*args, async_op=async_op, group=group, **kwargs)  # noqa: E731
            if async_op:
                return tracer.issue(kind, nbytes, group, size, run)
            with tracer.blocking(kind, nbytes, group, size):
                return run()

        return call

    for name, original in originals.items():
        setattr(dist, name, traced(name, original))
    try:
        yield tracer
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


def ddp_timing_hook(calls: list):
    """A DDP communication hook that all-reduces a bucket (the mean, as DDP's own) and appends
    ``[issued, finished]`` to ``calls``."""

    def hook(_state, bucket):
        buffer = bucket.buffer()
        buffer.div_(dist.get_world_size())
        timing = [time.perf_counter(), None]
        calls.append(timing)

        def finished(future):
            timing[1] = time.perf_counter()
            return future.value()[0]

        return dist.all_reduce(buffer, async_op=True).get_future().then(finished)

    return hook


def ddp_overlap_s(calls: list) -> float:
    """Seconds some bucket was in flight before DDP began to wait (when the last bucket was issued)."""
    if not calls:
        return 0.0
    waits_from = max(issued for issued, _ in calls)
    return length(union([(issued, min(done or waits_from, waits_from)) for issued, done in calls]))


def median_overlap(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def steps_overlap(tracer: CommTracer, step, steps: int) -> list[float]:
    """``overlap_s`` of each of ``steps`` calls of ``step()``, each one compute region of ``tracer``."""
    figures = []
    tracer.start()
    for _ in range(steps):
        with tracer.compute():
            step()
        figures.append(tracer.end_step()["overlap_s"])
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return figures
