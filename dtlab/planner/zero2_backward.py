"""ZeRO-2's fullest moment in backward, walked one gradient at a time as dtlab/parallel/zero/stage2_buckets.py runs it.

Backward produces the last parameters' gradients first (nearly: see below), and frees each
layer's saved activations once that layer's backward is done. Stage 2 copies
each new gradient into the bucket of every window of the flat gradient it
overlaps (a bucket is made when its window's first gradient comes, at most
two alive: the older one in flight is waited for before a third is made),
frees the gradient, and reduce-scatters a bucket once it is full into the
rank's shard (made at the first send). The walk replays this on the plan's
numbers and keeps the largest total of

    activations still saved + shard + buckets alive + the gradient being staged

The fullest moment is early, when the first buckets are made while almost
every activation is still saved; counting all the activations beside two
buckets there (the bound :func:`dtlab.planner.step_memory.peak_bytes` uses
otherwise) overstates it by the layers backward has already passed.

Layers, in backward order: what the loss saves (freed before any gradient),
the final LayerNorm and the head, each block from the last, the embeddings.
A layer's share of ``activations`` is its share of what dtlab's meter counts
(:func:`dtlab.planner.local.activation_parts`), so the walk applies to the
plan's own activation figure; a layer is freed only after its last gradient
(a slight overstatement: a block frees some tensors before its first
parameter's gradient).

Backward does not keep the parameters' reverse order exactly (a LayerNorm's
weight gradient comes before its bias's): with more than one rank at most
two buckets are alive whatever the order, and with one, where a full bucket
is copied and freed at once, the walk counts the last one freed beside the
next one made, in case a gradient out of order made it first. So the walk
never falls below the run; tests/test_planner_vs_measured.py checks it.

It applies to one pipeline stage, one micro-batch at a time, ZeRO-2 alone
(no context or expert parallelism), no vocabulary-parallel head under TP, and
where :func:`activation_parts` counts the activations (fp32, no recompute,
LayerNorm and GELU, no experts); elsewhere it returns None and the bound stands.
"""

from __future__ import annotations

from dtlab.planner.architectures import Architecture
from dtlab.planner.local import activation_parts, tensor_groups

FP32 = 4


def layers_in_model_order(arch: Architecture, tp: int) -> list[list[int]]:
    """Each layer's parameter tensors (elements, on one TP rank): the embeddings, every block, then the
    final LayerNorm and the head (:func:`dtlab.planner.local.tensor_groups`)."""
    first, block, last = tensor_groups(arch, tp=tp)
    return [first, *[block] * arch.layers, last]


def window_elements(bucket_mb: float, dp: int, value_bytes: int = FP32) -> int:
    """C: the elements of one of stage 2's windows, ``bucket_mb`` MiB of fp32 (or of ``value_bytes``-byte
    gradients) rounded up to a multiple of dp (dtlab/parallel/zero/stage2_buckets.py's ``windows``)."""
    return -(-max(1, -(-int(bucket_mb * 2**20) // value_bytes)) // dp) * dp


def backward_high(arch: Architecture, layout, *, activations: int, micro_batch: int, bucket_mb: float) -> int | None:
    """The most stage 2 holds at once during backward beside params and optimizer (module docstring)."""
    if (
        layout.zero != 2
        or layout.pp > 1
        or layout.micro_batches > 1
        or layout.cp > 1
        or layout.ep > 1
        or (arch.vocab_parallel and layout.tp > 1)
    ):
        return None
    parts = activation_parts(arch, layout, micro_batch)
    if parts is None:
        return None
    block, first, (loss, final_norm) = parts
    layers = layers_in_model_order(arch, layout.tp)
    counted = [first, *[block] * arch.layers, final_norm]  # per layer, model order
    scale = activations / (loss + sum(counted))  # the plan's figure, shared alike
    dp = layout.zero_ranks
    numel = sum(map(sum, layers))
    padded = -(-numel // dp) * dp
    size = window_elements(bucket_mb, dp)
    windows = [(start, min(start + size, padded)) for start in range(0, padded, size)]
    n = len(windows)
    expected, where, begin = [0] * n, [], 0  # where[t]: the buckets tensor t fills, its last first
    for tensor in (t for layer in layers for t in layer):
        mine = sorted(n - 1 - k for k, (lo, hi) in enumerate(windows) if max(begin, lo) < min(begin + tensor, hi))
        for i in mine:
            expected[i] += 1
        where.append(mine)
        begin += tensor
    alive: dict[int, int] = {}  # bucket -> bytes
    in_flight, ready, sent, shard, last_sent = [], [0] * n, 0, 0, 0
    saved = activations - loss * scale  # the loss's part is freed before the first gradient
    high, t = 0, sum(map(len, layers))
    for layer, share in zip(reversed(layers), reversed(counted)):
        for tensor in reversed(layer):
            t -= 1
            staged = FP32 * tensor
            high = max(high, saved + shard + sum(alive.values()) + staged)
            for i in where[t]:
                if i not in alive:
                    while in_flight and len(alive) >= 2:
                        alive.pop(in_flight.pop(0))
                    lo, hi = windows[n - 1 - i]
                    alive[i] = FP32 * (hi - lo)
                    high = max(high, saved + shard + sum(alive.values()) + staged + last_sent)
                ready[i] += 1
                while sent < n and ready[sent] == expected[sent]:
                    shard = shard or FP32 * padded // dp
                    high = max(high, saved + shard + sum(alive.values()) + staged)  # made beside the bucket
                    if dp > 1:
                        in_flight.append(sent)
                    else:  # one rank: copied into the shard and freed at once; a
                        last_sent = alive.pop(sent)  # gradient out of order may yet make the next first
                    sent += 1
        saved -= share * scale
    return round(high)
