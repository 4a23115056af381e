"""Faults a real cluster has, injected on purpose so a learner can watch them.

A *straggler* (the word comes from MapReduce, Dean and Ghemawat, 2004) is a
worker slower than the rest. In synchronous training every rank meets the
others at the gradient all-reduce, so one slow rank makes every rank wait:
the step runs at the pace of the slowest.
"""

from __future__ import annotations

import statistics
import time


def inject_straggler(rank: int, straggler: tuple[int, float] | None) -> None:
    """Sleep for the configured seconds if this rank is the straggler."""
    if straggler is not None and straggler[0] == rank and straggler[1] > 0:
        time.sleep(straggler[1])


def detect_stragglers(ranks: list[dict], *, ratio: float = 2.0, margin_s: float = 0.2) -> list[int]:
    """Ranks whose compute time is far above the others' (from the step's per-rank records).

    A rank is flagged when its ``compute_s`` is above ``ratio`` times the median
    of the *other* ranks and above it by at least ``margin_s`` seconds (the
    margin keeps scheduler noise on a busy laptop from being called a straggler:
    8 ranks sharing two cores saw up to 0.15 s). ``compute_s`` excludes the time
    a rank waited in communication (:mod:`dtlab.comm.tracer`), so the healthy ranks
    that wait for a straggler are not slow themselves.
    """
    if len(ranks) < 2:
        return []
    flagged = []
    for r in ranks:
        others = [o["compute_s"] for o in ranks if o is not r]
        median = statistics.median(others)
        if r["compute_s"] > ratio * median and r["compute_s"] - median > margin_s:
            flagged.append(r["rank"])
    return flagged
