"""Expert load, live: the share of tokens each expert receives per step, and the dropped tokens.

Drawn from the ``experts`` field of the step records (dtlab/parallel/moe/records.py)
while a mixture-of-experts run streams. Left: one line per expert, its share
of the step's assignments (``tokens[i] / sum(tokens)``), with the balanced
share 1/E dashed; a router that collapses shows as lines pulling apart.
Right: the share of the router's assignments dropped for lack of capacity,
and the balance term E x sum f_i P_i (1.0 when balanced). Redrawn at most a
few times a second, like the dashboard.
"""

from __future__ import annotations

import time

import plotly.graph_objects as go

from dtlab.i18n import register, t
from dtlab.lab.fit import FigureWidget, fitting_grid, responsive
from dtlab.lab.view import FigureLabels, View

register(
    {
        "moe.load.title": (
            "Tokens per expert, each step (share of assignments)",
            "每步各专家接收的 token（占分配的比例）",
        ),
        "moe.load.y": ("share of assignments", "分配占比"),
        "moe.expert": ("expert {i}", "专家 {i}"),
        "moe.balanced": ("balanced: 1/E", "均衡：1/E"),
        "moe.drop.title": ("Dropped assignments and the balance term", "被丢弃的分配与均衡项"),
        "moe.drop.y": ("share dropped / balance", "丢弃比例 / 均衡项"),
        "moe.dropped": ("dropped (share of routed)", "丢弃（占路由分配的比例）"),
        "moe.balance": ("balance E·Σ f·P (1 = balanced)", "均衡项 E·Σ f·P（1 表示均衡）"),
        "moe.step": ("step", "步"),
    }
)


def _figure() -> go.FigureWidget:
    return responsive(
        FigureWidget(
            layout=go.Layout(height=300, margin=dict(l=60, r=10, t=40, b=40), legend=dict(orientation="h", y=-0.25))
        )
    )


def shares(record: dict) -> list[float]:
    """Each expert's share of the step's assignments (what the left plot draws)."""
    tokens = record["experts"]["tokens"]
    total = sum(tokens)
    return [n / total if total else 0.0 for n in tokens]


class ExpertLoadView(View):
    """Live expert-load plots for one mixture-of-experts run (``experts`` experts).

    ``view.watch(run)`` draws ``run`` as it streams and returns it; pass
    ``dashboard=`` to feed a :class:`dtlab.lab.Dashboard` from the same records.
    """

    figures = {
        "load": FigureLabels("moe.load.title", "moe.step", "moe.load.y"),
        "drops": FigureLabels("moe.drop.title", "moe.step", "moe.drop.y", ("moe.dropped", "moe.balance")),
    }

    def __init__(self, experts: int, *, min_interval_s: float = 0.25):
        self.experts, self.min_interval_s = experts, min_interval_s
        self.load, self.drops = _figure(), _figure()
        with self.load.batch_update():
            for _ in range(experts):
                self.load.add_scatter(x=[], y=[], mode="lines+markers", marker=dict(size=4))
            self.load.add_scatter(x=[], y=[], mode="lines", line=dict(dash="dash", color="black"))
        with self.drops.batch_update():
            self.drops.add_scatter(x=[], y=[], mode="lines+markers", marker=dict(size=4))
            self.drops.add_scatter(x=[], y=[], mode="lines", line=dict(dash="dot"))
        self.widget = fitting_grid([self.load, self.drops])
        self.steps: list[int] = []
        self.history: list[list[float]] = []
        self.dropped: list[float] = []
        self.balance: list[float] = []
        self._drawn_at = 0.0
        self.start()

    def refresh(self, lang: str) -> None:
        for i, trace in enumerate(self.load.data[: self.experts]):
            trace.name = t("moe.expert", lang, i=i)
        self.load.data[-1].name = t("moe.balanced", lang)

    def push(self, record: dict, *, force: bool = False) -> None:
        """Add one step record (ignored if it has no ``experts``); redraw now and then."""
        if record is not None and "experts" in record:
            experts = record["experts"]
            self.steps.append(record["step"])
            self.history.append(shares(record))
            routed = sum(experts["routed"])
            self.dropped.append(experts["dropped"] / routed if routed else 0.0)
            self.balance.append(experts["balance"])
        now = time.monotonic()
        if force or now - self._drawn_at >= self.min_interval_s:
            self._drawn_at = now
            self._draw()

    def _draw(self) -> None:
        steps = list(self.steps)
        with self.load.batch_update():
            for i, trace in enumerate(self.load.data[: self.experts]):
                trace.x, trace.y = steps, [row[i] for row in self.history]
            self.load.data[-1].x = steps
            self.load.data[-1].y = [1 / self.experts] * len(steps)
        with self.drops.batch_update():
            self.drops.data[0].x, self.drops.data[0].y = steps, list(self.dropped)
            self.drops.data[1].x, self.drops.data[1].y = steps, list(self.balance)

    def watch(self, run, *, dashboard=None, label: str | None = None):
        """Draw ``run`` live until it ends (and ``dashboard`` too, when given); returns the run."""
        entry = dashboard.add_run(label or "moe") if dashboard is not None else None
        for record in run:
            self.push(record)
            if entry is not None:
                dashboard.push(entry, record)
        self.push(None, force=True)
        if entry is not None:
            dashboard.push(entry, None, force=True)
        return run
