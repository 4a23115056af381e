"""The ring all-reduce as data: which chunk each rank sends and receives at each step.

Pure Python, no process group and no torch, so a lesson can draw the ring step
by step and a test can check the schedule's rules in one process; the
collectives in :mod:`dtlab.comm.collectives` execute exactly this schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

REDUCE_SCATTER = "reduce_scatter"
ALL_GATHER = "all_gather"


@dataclass(frozen=True)
class RingStep:
    """One rank's part in one step of a ring: send a chunk right, receive one from the left."""

    phase: str
    """``"reduce_scatter"`` (the received chunk is added) or ``"all_gather"`` (it is copied)."""
    step: int
    """0 .. N-2 within the phase."""
    rank: int
    """Rank in the group; it sends to rank + 1 and receives from rank - 1 (mod N)."""
    send_chunk: int
    """Index of the chunk it sends."""
    recv_chunk: int
    """Index of the chunk it receives (the one its left neighbour sends in this step)."""


@lru_cache(maxsize=None)
def ring_schedule(world_size: int) -> tuple[RingStep, ...]:
    """Every rank's sends and receives in a ring all-reduce over ``world_size`` ranks.

    Ordered by phase, then step, then rank: 2(N-1) steps of N transfers each.
    In reduce-scatter step s, rank r sends chunk (r - s - 1) mod N, so chunk c
    starts at rank c + 1 and, after N-1 hops, ends complete on rank c (rank r
    owns chunk r, as ``reduce_scatter_tensor`` leaves it). In all-gather step s,
    rank r forwards chunk (r - s) mod N: first its own, then what it just got.
    """
    n = world_size
    steps = []
    for phase, shift in ((REDUCE_SCATTER, 1), (ALL_GATHER, 0)):
        for s in range(n - 1):
            for r in range(n):
                steps.append(RingStep(phase, s, r, send_chunk=(r - s - shift) % n, recv_chunk=(r - s - shift - 1) % n))
    return tuple(steps)
