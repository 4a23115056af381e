"""Pipeline schedules as data: the ordered actions each rank runs, and their ideal timeline.

Pipeline parallelism (PP) puts consecutive layers on consecutive ranks, the
*stages*, and cuts the batch into m *micro-batches* so that the stages can
work on different micro-batches at the same time. An action is one stage
running the forward (F) or backward (B) pass of one micro-batch, written like
PyTorch's ``torch.distributed.pipelining``: ``1F0`` is stage 1, forward,
micro-batch 0.

Two schedules, both flushing at the end of every step (so the optimizer sees
exactly the gradient of the whole batch):

* **GPipe** (Huang et al. 2018): every forward, then every backward. Each
  stage holds the activations of all m micro-batches at once.
* **1F1B** (Narayanan et al. 2021, Megatron-LM, Sec. 2.2, "PipeDream-Flush"):
  stage s runs p - s - 1 warm-up forwards, then alternates one forward and
  one backward, then drains the remaining backwards. A micro-batch's
  activations are freed as soon as its backward ran, so stage s never holds
  more than p - s micro-batches, whatever m is.

Both leave the same idle time, the *pipeline bubble*: the first stage waits
for the last to finish its first forward, and so on. With p stages and equal
per-stage times it is (p - 1) slots out of (m + p - 1), GPipe's bubble
fraction (Huang et al. 2018, Sec. 2.3): 3/7 for p = 4, m = 4; 3/19 for
m = 16. More micro-batches shrink it; 1F1B does not, it saves memory.

A third schedule shrinks the bubble itself:

* **Interleaved 1F1B** (Narayanan et al. 2021, Sec. 2.2.2): the model is cut
  into p x v *virtual stages* (model chunks), and rank r holds v of them, r,
  r + p, r + 2p, ..., so a micro-batch goes round the ranks v times. Each
  action is a chunk, 1/v of a stage's work, and the bubble shrinks by v:
  (p - 1) / (v m) of the ideal time (the paper's t_pb / t_id), (p - 1) /
  (v m + p - 1) of the whole step, at the price of v times as many
  point-to-point sends. Here an action's ``stage`` is its virtual stage,
  run by rank ``stage % p``; ``0F0`` ... ``(pv-1)B(m-1)`` as PyTorch numbers
  the stages of its interleaved schedules. m must be a multiple of p, as in
  the paper's schedule (Megatron-LM's first implementation required it).

The same arithmetic in closed form, which the planner (:mod:`dtlab.planner`)
uses at scales no simulation needs to run: :func:`stage_layers` (which blocks
each stage holds), :func:`ideal_bubble_fraction` and :func:`bubble_over_ideal`,
and :func:`peak_in_flight` (the micro-batches a stage holds at once). It is
written here once; the tests check each closed form against the schedules.

This module is a little long because the three schedules, their closed forms
and the simulation that checks one against the other read best side by side.
Everything here is pure Python: no process group, no tensors, and importing
it does not import torch. The runtime (:mod:`dtlab.parallel.pipeline.runtime`)
executes these lists, and the dashboard draws the same data.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from dtlab.i18n import ConfigError, DtlabError

FORWARD, BACKWARD = "F", "B"


@dataclass(frozen=True)
class Action:
    """One stage's forward or backward pass of one micro-batch."""

    stage: int
    kind: str  # "F" or "B"
    micro_batch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.micro_batch}"


Schedule = list[list[Action]]
"""``actions[r]``: what rank r (which runs stage r; interleaved: stages r, r + p, ...) does, in order."""


def _check(stages: int, micro_batches: int) -> None:
    for name, value in (("stages", stages), ("micro_batches", micro_batches)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"{name}={value!r} is not allowed; expected a positive integer", f"{name}={value!r} 不合法；应为正整数"
            )


def gpipe(stages: int, micro_batches: int) -> Schedule:
    """GPipe: all m forwards, then all m backwards, on every stage."""
    _check(stages, micro_batches)
    return [
        [Action(s, FORWARD, i) for i in range(micro_batches)] + [Action(s, BACKWARD, i) for i in range(micro_batches)]
        for s in range(stages)
    ]


def one_f_one_b(stages: int, micro_batches: int) -> Schedule:
    """1F1B: p - s - 1 warm-up forwards, then one forward / one backward, then the rest."""
    _check(stages, micro_batches)
    actions = []
    for s in range(stages):
        warmup = min(stages - s - 1, micro_batches)
        mine = [Action(s, FORWARD, i) for i in range(warmup)]
        for i in range(micro_batches - warmup):  # steady state: 1F, then 1B
            mine += [Action(s, FORWARD, warmup + i), Action(s, BACKWARD, i)]
        mine += [Action(s, BACKWARD, i) for i in range(micro_batches - warmup, micro_batches)]
        actions.append(mine)
    return actions


def interleaved(stages: int, micro_batches: int, virtual_stages: int = 2) -> Schedule:
    """Interleaved 1F1B: v chunks per rank; warm-up, one forward / one backward, drain, chunk by chunk.

    Rank r's k-th forward is micro-batch (k // pv) p + k % p on its chunk
    (k // p) % v: p micro-batches through one chunk, then the same p through
    the next. Backwards take the chunks in reverse. Rank r runs 2 (p - r - 1)
    + (v - 1) p warm-up forwards (Megatron-LM's schedule, Narayanan et al.
    2021, Sec. 2.2.2 and Fig. 4), then alternates, then drains.
    """
    check_interleaved(stages, micro_batches, virtual_stages)
    p, v, total = stages, virtual_stages, micro_batches * virtual_stages

    def action(r: int, k: int, kind: str) -> Action:
        chunk = (k // p) % v
        chunk = chunk if kind == FORWARD else v - 1 - chunk
        return Action(chunk * p + r, kind, (k // (p * v)) * p + k % p)

    actions = []
    for r in range(p):
        warmup = min(2 * (p - r - 1) + (v - 1) * p, total)
        mine = [action(r, k, FORWARD) for k in range(warmup)]
        for k in range(total - warmup):  # steady state: 1F, then 1B
            mine += [action(r, warmup + k, FORWARD), action(r, k, BACKWARD)]
        mine += [action(r, k, BACKWARD) for k in range(total - warmup, total)]
        actions.append(mine)
    return actions


def check_interleaved(stages: int, micro_batches: int, virtual_stages: int) -> None:
    """Interleaving needs a pipeline (p >= 2), v >= 2 chunks per rank, and m a multiple of p."""
    _check(stages, micro_batches)
    if isinstance(virtual_stages, bool) or not isinstance(virtual_stages, int) or virtual_stages < 2:
        raise ConfigError(
            f"virtual_stages={virtual_stages!r} is not allowed for the interleaved schedule; "
            f"expected an integer >= 2 (model chunks per rank)",
            f"交错调度下 virtual_stages={virtual_stages!r} 不合法；应为 >= 2 的整数（每个 rank 的模型块数）",
        )
    if stages < 2 or micro_batches % stages:
        raise ConfigError(
            f"the interleaved schedule needs pp >= 2 and micro_batches a multiple of pp; got "
            f"pp={stages}, micro_batches={micro_batches} (allowed: micro_batches = "
            f"{max(stages, 2)}, {2 * max(stages, 2)}, ...)",
            f"交错调度需要 pp >= 2 且 micro_batches 是 pp 的倍数；收到的是 pp={stages}、"
            f"micro_batches={micro_batches}（允许：micro_batches = {max(stages, 2)}、"
            f"{2 * max(stages, 2)} ……）",
        )


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved}


def schedule(kind: str, stages: int, micro_batches: int, virtual_stages: int = 1) -> Schedule:
    """The schedule named ``kind`` (``"gpipe"``, ``"1f1b"``, or ``"interleaved"`` with ``virtual_stages`` >= 2)."""
    check_kind(kind, virtual_stages)
    if kind == "interleaved":
        return interleaved(stages, micro_batches, virtual_stages)
    return SCHEDULES[kind](stages, micro_batches)


def check_kind(kind: str, virtual_stages: int = 1) -> None:
    """A schedule's name, and virtual stages only with the interleaved one."""
    if kind not in SCHEDULES:
        raise ConfigError(
            f"schedule={kind!r} is not allowed; expected one of {list(SCHEDULES)}",
            f"schedule={kind!r} 不合法；应为 {list(SCHEDULES)} 之一",
        )
    if kind != "interleaved" and virtual_stages != 1:
        raise ConfigError(
            f"virtual_stages={virtual_stages!r} needs schedule='interleaved' (got {kind!r}); "
            f"allowed: virtual_stages=1 with 'gpipe' or '1f1b'",
            f"virtual_stages={virtual_stages!r} 需要 schedule='interleaved'（收到的是 {kind!r}）；"
            f"允许：'gpipe' 或 '1f1b' 时 virtual_stages=1",
        )


# --------------------------------------------------------------------------- closed forms


def stage_layers(n_layer: int, stages: int) -> list[range]:
    """Which blocks each stage holds: ``stages`` contiguous ranges, sizes differing by at most one,
    the first ``n_layer % stages`` stages taking one block more."""
    if not 1 <= stages <= n_layer:
        raise ConfigError(
            f"pp={stages} is not allowed for a model of {n_layer} blocks: every stage "
            f"needs at least one (allowed: 1 .. {n_layer})",
            f"pp={stages} 不适用于 {n_layer} 个 block 的模型：每个阶段至少要有一个 block（允许：1 .. {n_layer}）",
        )
    per, extra = divmod(n_layer, stages)
    bounds = [0]
    for s in range(stages):
        bounds.append(bounds[-1] + per + (1 if s < extra else 0))
    return [range(bounds[s], bounds[s + 1]) for s in range(stages)]


def ideal_bubble_fraction(stages: int, micro_batches: int, virtual_stages: int = 1) -> Fraction:
    """Share of a step each stage sits idle, (p - 1) / (m + p - 1), exact; interleaved, (p - 1) / (v m + p - 1).

    GPipe (Huang et al. 2018, Sec. 2.3 and Fig. 2c, K = p stages, M = m
    micro-batches): a step lasts m + p - 1 slots, of which each stage is busy
    for m. 1F1B reorders the work but leaves the same bubble (Narayanan et al.
    2021, Sec. 2.2.1). Interleaving v chunks per rank makes each slot 1/v as
    long (Sec. 2.2.2): v m busy chunk-slots and p - 1 idle ones. ``float()``
    of it is the planner's ``bubble_fraction``.
    """
    return Fraction(stages - 1, virtual_stages * micro_batches + stages - 1)


def bubble_over_ideal(stages: int, micro_batches: int, virtual_stages: int = 1) -> Fraction:
    """The same idle time relative to the ideal (bubble-free) step: (p - 1) / m, exact; interleaved,
    (1 / v) (p - 1) / m.

    Narayanan et al. 2021, Sec. 2.2.1 define the bubble this way (t_pb / t_id),
    and Sec. 2.2.2 gives the interleaved one; it is :func:`ideal_bubble_fraction`
    with the bubble left out of the total.
    """
    return Fraction(stages - 1, virtual_stages * micro_batches)


def peak_in_flight(kind: str, stages: int, micro_batches: int, stage: int = 0, virtual_stages: int = 1) -> int:
    """Micro-batches whose activations stage ``stage`` holds at its peak: the closed form of
    :func:`max_in_flight` for the schedule named ``kind`` (interleaved: rank ``stage``'s
    (chunk, micro-batch) pairs, each 1/v of a stage's activations).

    GPipe runs all m forwards before any backward, so every stage holds m.
    1F1B (Narayanan et al. 2021, Sec. 2.2.1) starts each backward as soon as it
    can: stage s holds at most p - s, so stage 0 holds min(p, m). Interleaved,
    rank r holds its warm-up forwards and one more, min(2 (p - r - 1) + (v - 1)
    p + 1, v m) chunks: rank 0's v p + p - 1 chunks are p (1 + (p - 1) / (p v))
    micro-batches of a whole stage, Korthikanti et al. 2022's factor (Sec. 4.2.3, whose m is this v).
    """
    check_kind(kind, virtual_stages)
    if kind == "interleaved":
        p, v = stages, virtual_stages
        return min(2 * (p - stage - 1) + (v - 1) * p + 1, v * micro_batches)
    return micro_batches if kind == "gpipe" else min(stages - stage, micro_batches)


def peak_layers_in_flight(n_layer: int, kind: str, stages: int, micro_batches: int, virtual_stages: int = 1) -> int:
    """(block, micro-batch) pairs whose activations the fullest rank holds at its peak.

    GPipe and 1F1B: :func:`peak_in_flight` x the blocks of each stage
    (:func:`stage_layers`), the most over the stages. Interleaved: rank r's
    (chunk, micro-batch) pairs x its largest chunk (the model cut into p x v
    chunks by :func:`stage_layers`): exact when p x v divides the blocks, an
    upper bound otherwise. For rank 0 that is (L / p) p (1 + (p - 1) / (p v))
    micro-batches of blocks (Korthikanti et al. 2022, Sec. 4.2.3).
    """
    if kind != "interleaved":
        return max(
            peak_in_flight(kind, stages, micro_batches, r, virtual_stages) * len(blocks)
            for r, blocks in enumerate(stage_layers(n_layer, stages))
        )
    chunks = stage_layers(n_layer, stages * virtual_stages)
    return max(
        peak_in_flight(kind, stages, micro_batches, r, virtual_stages)
        * max(len(chunks[c * stages + r]) for c in range(virtual_stages))
        for r in range(stages)
    )


# --------------------------------------------------------------------------- the ideal timeline


def dependencies(action: Action, stages: int) -> list[Action]:
    """What must have finished before ``action`` can start (on other stages, or its own forward).

    F of stage s needs stage s-1's output for that micro-batch; B of stage s
    needs stage s+1's gradient for it, and its own forward's activations.
    ``stages`` counts every stage (interleaved: the p x v virtual ones).
    """
    s, i = action.stage, action.micro_batch
    if action.kind == FORWARD:
        return [Action(s - 1, FORWARD, i)] if s > 0 else []
    needs = [Action(s, FORWARD, i)]
    return needs + [Action(s + 1, BACKWARD, i)] if s < stages - 1 else needs


@dataclass(frozen=True)
class Timed:
    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class Simulation:
    """Each rank's actions placed in time; ``bubble_fraction`` = idle / (ranks x makespan)."""

    timeline: list[list[Timed]]
    makespan: float
    bubble_fraction: float


class Deadlock(DtlabError):
    """No rank can run its next action: each waits for one that another rank has not reached."""

    def __init__(self, waiting: list[str]):
        self.waiting = waiting
        super().__init__(
            f"the schedule deadlocks: every unfinished rank waits on another; next actions {waiting}",
            f"该调度会死锁：每个未完成的 rank 都在等待别的 rank；下一个动作为 {waiting}",
        )


def simulate(
    actions: Schedule, *, f_time: float = 1, b_time: float = 2, durations: dict[Action, float] | None = None
) -> Simulation:
    """Run ``actions`` on an ideal machine: each action starts once its rank is free and its
    :func:`dependencies` have ended; communication takes no time.

    ``b_time = 2 f_time`` is the usual ratio (a backward computes two
    gradients per matmul); the bubble fraction is the same for any ratio.
    ``durations`` gives actions their own times instead (measured ones: ``dtlab bench pipeline``
    lays out each action's measured CPU time as the dependencies allow).
    """
    stages = len(actions)
    chained = 1 + max((a.stage for mine in actions for a in mine), default=0)  # p, or p x v interleaved
    ended: dict[Action, float] = {}
    timeline: list[list[Timed]] = [[] for _ in range(stages)]
    free, nxt = [0.0] * stages, [0] * stages
    progress = True
    while progress:
        progress = False
        for r in range(stages):
            while nxt[r] < len(actions[r]):
                action = actions[r][nxt[r]]
                needs = dependencies(action, chained)
                if any(d not in ended for d in needs):
                    break  # blocked: try the other ranks
                start = max([free[r]] + [ended[d] for d in needs])
                end = start + (
                    durations[action] if durations is not None else f_time if action.kind == FORWARD else b_time
                )
                ended[action], free[r] = end, end
                timeline[r].append(Timed(action, start, end))
                nxt[r] += 1
                progress = True
    if any(nxt[r] < len(actions[r]) for r in range(stages)):
        raise Deadlock([str(actions[r][nxt[r]]) for r in range(stages) if nxt[r] < len(actions[r])])
    makespan = max(free)
    busy = sum(t.end - t.start for rank in timeline for t in rank)
    return Simulation(timeline, makespan, 1 - busy / (stages * makespan) if makespan else 0.0)


def check_deadlock_free(actions: Schedule) -> bool:
    """True when every rank can finish its list (run in lockstep: no cycle of waits)."""
    try:
        simulate(actions)
    except Deadlock:
        return False
    return True


def max_in_flight(actions: Schedule) -> list[int]:
    """Per rank, the most micro-batches whose forward ran but whose backward has not yet:
    the activations it must hold at once (GPipe: m; 1F1B: at most p - stage; interleaved:
    (chunk, micro-batch) pairs)."""
    peaks = []
    for mine in actions:
        held = peak = 0
        for action in mine:
            held += 1 if action.kind == FORWARD else -1
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


def format_grid(actions: Schedule, *, f_time: int = 1, b_time: int = 1) -> str:
    """The simulated timeline as text: a row per rank, a column per time step, ``.`` = idle.

    For ``format_grid(gpipe(2, 2))``::

        t       0   1   2   3   4   5
        rank 0 0F0 0F1  .   .  0B0 0B1
        rank 1  .  1F0 1F1 1B0 1B1  .
    """
    sim = simulate(actions, f_time=f_time, b_time=b_time)
    steps = int(sim.makespan)
    width = max([3] + [len(str(a)) for mine in actions for a in mine])
    rows = [f"{'t':<6} " + " ".join(f"{t:^{width}}" for t in range(steps))]
    for r, mine in enumerate(sim.timeline):
        cells = [f"{'.':^{width}}"] * steps
        for timed in mine:
            for t in range(int(timed.start), int(timed.end)):
                cells[t] = f"{str(timed.action):^{width}}"
        rows.append(f"rank {r:<1} " + " ".join(cells))
    return "\n".join(row.rstrip() for row in rows)
