"""Layouts run side by side on one warm pool, to check the planner's predictions against.

:func:`run_in_passes` trains each configuration for a few steps on the same
pool, every configuration once per pass (so that a change in the machine's
load falls on all of them, not on the last ones), and keeps the step times
after the warm-up steps. :func:`kendall_tau`
says how far two orders agree: the layouts ranked by predicted and by
measured step time.

``dtlab bench planner`` (:mod:`dtlab.bench.planner`) and the lab's layout race
(:mod:`dtlab.lab.layout_race`) both use these.
"""

from __future__ import annotations

import math


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-b of two rankings given as scores (ties counted as neither agreeing nor not).

    1: the same order, -1: reversed, 0: no relation (Kendall 1938; tau-b's tie correction,
    Kendall 1945). With fewer than two distinct scores on a side there is no order: 0.
    """
    concordant = discordant = ties_a = ties_b = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            da, db = a[i] - a[j], b[i] - b[j]
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif (da > 0) == (db > 0):
                concordant += 1
            else:
                discordant += 1
    pairs = math.sqrt((concordant + discordant + ties_a) * (concordant + discordant + ties_b))
    return (concordant - discordant) / pairs if pairs else 0.0


def run_in_passes(configs: dict, pool, *, warmup: int, passes: int, on_run=None) -> dict[str, dict]:
    """Train every ``configs[name]`` (a TrainConfig of ``warmup`` + n steps) ``passes`` times on ``pool``,
    all of them once per pass, in order.

    Returns, per name, ``step_times`` (every pass's steps after the first ``warmup``, in order) and
    ``runs`` (each pass's step records, the warm-up steps included). ``on_run(name, pass_index)`` is
    called before each run (a status line).
    """
    import dtlab.train

    measured = {name: {"step_times": [], "runs": []} for name in configs}
    for k in range(passes):
        for name, config in configs.items():
            if on_run is not None:
                on_run(name, k)
            records = dtlab.train.start(config, pool=pool).wait().records
            measured[name]["step_times"] += [r["step_time_s"] for r in records[warmup:]]
            measured[name]["runs"].append(records)
    return measured
