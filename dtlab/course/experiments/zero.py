"""Lesson 04: what ZeRO stage 3 gathers and frees, unit by unit, on real ranks.

:func:`stage3_trace` wraps the small GPT in :class:`dtlab.parallel.zero.stage3.ZeroStage3`
(the world is one data-parallel group), runs one forward and one backward on
this rank's slice of a batch, and returns the order in which the units were
all-gathered, freed and reduce-scattered, with the bytes of gathered
parameters held after each event. Rajbhandari et al. 2019, Sec. 5.3: a
layer's whole parameters exist only while that layer computes.

The trace is taken by wrapping each unit's own ``gather``, ``free`` and
``reduce_scatter`` methods, so what it records is exactly what ZeroStage3
does; the methods themselves are unchanged. Everything returned is an
integer, a name or a list of them, the same on every machine.
"""

from __future__ import annotations

import functools

import torch

from dtlab.comm.collectives import group_size_and_rank
from dtlab.config import MODEL_PRESETS
from dtlab.data import global_batch, shard
from dtlab.model import build_model
from dtlab.parallel.zero import apply_zero


def _traced(wrapped, unit, kind: str, log: list, phase: list):
    """Wrap ``unit.<kind>`` so that every call appends one event to ``log``."""
    original = getattr(unit, kind)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        held_before = unit.full is not None
        result = original(*args, **kwargs)
        if kind != "free" or held_before:  # free() of a unit not held does nothing
            log.append(
                {
                    "phase": phase[0],
                    "action": kind,
                    "unit": unit.name,
                    "held_bytes": wrapped.shared.held_bytes,
                    "held_units": [u.name for u in wrapped.units if u.full is not None],
                }
            )
        return result

    setattr(unit, kind, wrapper)


def stage3_trace(ctx, model: str = "small", batch_size: int = 8, seed: int = 0, prefetch: int = 0) -> dict:
    """One forward and backward of ZeRO stage 3 over the whole world; the gather/free order of its units.

    Returns ``units`` (name, parameters Ψ_u, shard S, padded length L of each
    unit, in gathering order), ``events`` (phase ``forward``/``backward``,
    action ``gather``/``free``/``reduce_scatter``, unit, gathered bytes held
    after it, units held after it), ``peak`` (most gathered bytes at once),
    ``shard_bytes`` (what this rank holds between layers) and the meter's
    ``comm`` (calls and bytes per collective kind). ``prefetch``: units whose all-gather is
    issued ahead (:class:`dtlab.parallel.zero.stage3.ZeroStage3`'s; 0, the strict order, by default).
    """
    cfg = MODEL_PRESETS[model]
    world, rank = group_size_and_rank(None)
    torch.manual_seed(seed)
    wrapped, optimizer = apply_zero(build_model(cfg, seed=seed).to(ctx.device), stage=3, lr=1e-3, prefetch=prefetch)
    log, phase = [], ["forward"]
    for unit in wrapped.units:
        for kind in ("gather", "free", "reduce_scatter"):
            _traced(wrapped, unit, kind, log, phase)
    x, y = global_batch(0, batch_size=batch_size, seq_len=cfg.seq_len, seed=seed)
    x = shard(x, index=rank, count=world).to(ctx.device)  # (B / N, T)
    y = shard(y, index=rank, count=world).to(ctx.device)
    wrapped.reset_peak()
    loss = wrapped(x, y)
    phase[0] = "backward"
    loss.backward()
    return {
        "rank": rank,
        "world_size": world,
        "units": [
            {"name": u.name, "numel": u.layout.numel, "shard": u.layout.shard_numel, "padded": u.layout.padded_numel}
            for u in wrapped.units
        ],
        "events": log,
        "peak": wrapped.memory_bytes()["gathered_peak"],
        "shard_bytes": sum(u.flat_shard.numel() * u.flat_shard.element_size() for u in wrapped.units),
        "comm": wrapped.meter.as_dict(),
    }
