"""The ring all-reduce drawn one step at a time, from :func:`dtlab.comm.collectives.ring_schedule`.

A table with a row per rank and a column per chunk: each cell lists the ranks
whose contribution that rank's copy of that chunk already holds. White: only
its own; orange: partially reduced; green: fully reduced (all N ranks).
**Step** applies one ring step (every rank sends one chunk to its right
neighbour at once), **Reset** goes back to the start. After N-1 steps of
reduce-scatter each rank owns one complete chunk; after N-1 more of all-gather
every rank has all of them.

:func:`busbw_figure` plots an nccl-tests style sweep (bus bandwidth against
message size) measured by :func:`dtlab.bench.allreduce.measure`.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go

from dtlab.comm.collectives import REDUCE_SCATTER, ring_schedule
from dtlab.i18n import register, t
from dtlab.lab.fit import wrap_title
from dtlab.lab.view import StepView
from dtlab.planner.communication import bus_bandwidth

register(
    {
        "ring.rank": ("rank {r}", "{r} 号 rank"),
        "ring.chunk": ("chunk {c}", "块 {c}"),
        "ring.phase.reduce_scatter": (
            "reduce-scatter (received chunks are added)",
            "归约散射 reduce-scatter（收到的块相加）",
        ),
        "ring.phase.all_gather": ("all-gather (received chunks are copied)", "全收集 all-gather（收到的块直接复制）"),
        "ring.start": (
            "start: every rank holds only its own tensor, cut into {n} chunks",
            "开始：每个 rank 只有自己的张量，切成 {n} 块",
        ),
        "ring.status": ("step {k} of {total} — {phase}", "第 {k} 步，共 {total} 步 —— {phase}"),
        "ring.sends": ("rank {r} → rank {right}: chunk {c}", "rank {r} → rank {right}：块 {c}"),
        "ring.sent": (
            "each rank has sent {k} chunks = {k}/{n} of the tensor (all-reduce total: 2(N−1)/N = {full}/{n})",
            "每个 rank 已发送 {k} 块 = 张量的 {k}/{n}（整个全归约：2(N−1)/N = {full}/{n}）",
        ),
        "ring.legend": (
            "white: own only · orange: partially reduced · green: fully reduced",
            "白色：只有自己的 · 橙色：部分归约 · 绿色：完全归约",
        ),
        "ring.bw.title": (
            "All-reduce bus bandwidth on {n} ranks (measured on this machine)",
            "{n} 个 rank 上全归约的总线带宽（本机实测）",
        ),
        "ring.bw.x": ("message size (bytes)", "消息大小（字节）"),
        "ring.bw.y": ("busbw = algbw × 2(N−1)/N (GB/s)", "总线带宽 busbw = algbw × 2(N−1)/N（GB/s）"),
        "ring.bw.dtlab": (
            "dtlab ring_all_reduce over gloo (TCP)",
            "dtlab 的环形全归约 ring_all_reduce，经 gloo（TCP）",
        ),
        "ring.bw.by_size": (
            "dtlab by size over gloo: recursive doubling up to 1 MiB, then the ring",
            "dtlab 经 gloo 按大小选择：不超过 1 MiB 用递归倍增，更大的用环",
        ),
        "ring.bw.shared": ("dtlab ring_all_reduce over shared memory", "dtlab 的环形全归约，经共享内存"),
        "ring.bw.torch": ("torch.distributed.all_reduce", "PyTorch 内置的 torch.distributed.all_reduce"),
    }
)

COLORS = {"own": "#FFFFFF", "partial": "#F8C471", "full": "#82E0AA"}


def ring_steps(n: int) -> list[list]:
    """``ring_schedule(n)`` grouped by step: 2(N-1) lists of the N simultaneous transfers."""
    steps: dict = {}
    for s in ring_schedule(n):
        steps.setdefault((s.phase != REDUCE_SCATTER, s.step), []).append(s)
    return [steps[k] for k in sorted(steps)]


def holdings(n: int, steps_done: int) -> list[list[frozenset]]:
    """[rank][chunk] -> the ranks whose contribution that copy holds after ``steps_done`` steps.

    All N transfers of a step happen at once, so each reads the state before the step.
    """
    held = [[frozenset([r]) for _ in range(n)] for r in range(n)]
    for transfers in ring_steps(n)[:steps_done]:
        before = [row[:] for row in held]
        for s in transfers:
            left = (s.rank - 1) % n
            incoming = before[left][s.recv_chunk]
            held[s.rank][s.recv_chunk] = (
                before[s.rank][s.recv_chunk] | incoming if s.phase == REDUCE_SCATTER else incoming
            )
    return held


class RingView(StepView):
    """Step through a ring all-reduce over N ranks. ``step()``/``reset()`` are what the buttons call."""

    def __init__(self, ranks: int = 4):
        self.step_table(ranks)
        self.start()

    @property
    def total_steps(self) -> int:
        return 2 * (self.ranks.value - 1)

    def state(self) -> list[list[frozenset]]:
        return holdings(self.ranks.value, self.steps_done)

    def complete_chunks(self) -> list[list[int]]:
        """Per rank, the chunks it holds fully reduced now."""
        n = self.ranks.value
        return [[c for c, held in enumerate(row) if len(held) == n] for row in self.state()]

    def _draw(self) -> None:
        n, k = self.ranks.value, self.steps_done
        held = self.state()
        current = ring_steps(n)[k - 1] if k else []
        fresh = {(s.rank, s.recv_chunk) for s in current}
        cell = "border:1px solid #999;padding:4px 8px;text-align:center;font-family:monospace"
        head = "".join(f"<th style='{cell}'>{t('ring.chunk', c=c)}</th>" for c in range(n))
        rows = []
        for r in range(n):
            tds = []
            for c in range(n):
                kind = "own" if len(held[r][c]) == 1 else "full" if len(held[r][c]) == n else "partial"
                bold = ";font-weight:bold;outline:2px solid #333" if (r, c) in fresh else ""
                text = "+".join(str(x) for x in sorted(held[r][c]))
                tds.append(f"<td style='{cell};background:{COLORS[kind]}{bold}'>{text}</td>")
            rows.append(f"<tr><th style='{cell}'>{t('ring.rank', r=r)}</th>{''.join(tds)}</tr>")
        if k:
            phase = t(f"ring.phase.{current[0].phase}")
            status = t("ring.status", k=k, total=self.total_steps, phase=phase)
            sends = "<br>".join(t("ring.sends", r=s.rank, right=(s.rank + 1) % n, c=s.send_chunk) for s in current)
        else:
            status, sends = t("ring.start", n=n), ""
        sent = t("ring.sent", k=k, n=n, full=2 * (n - 1))
        self.table.value = (
            f"<b>{html.escape(status)}</b><table style='border-collapse:collapse;"
            f"margin:6px 0'><tr><th></th>{head}</tr>{''.join(rows)}</table>"
            f"<div style='font-size:90%'>{sends}</div><div>{html.escape(sent)}</div>"
            f"<div style='font-size:85%;color:#555'>{html.escape(t('ring.legend'))}</div>"
        )

    def refresh(self, lang: str) -> None:
        self._draw()


def busbw_figure(seconds: dict, n: int) -> go.Figure:
    """Bus bandwidth against message size, one line per implementation.

    ``seconds`` is :func:`dtlab.bench.allreduce.measure`'s result:
    ``{nbytes: {"dtlab": s, "by_size": s, "shared": s, "torch": s}}`` (seconds per all-reduce;
    an implementation missing from it is left out).
    """
    sizes = sorted(seconds)
    fig = go.Figure(
        layout=go.Layout(
            height=360,
            autosize=True,  # no width of its own: it takes its output area's
            margin=dict(l=70, r=10, t=50, b=50),
            title=dict(text=wrap_title(t("ring.bw.title", n=n)), automargin=True, yref="paper"),
            legend=dict(orientation="h", y=-0.25),
            xaxis=dict(type="log", title=t("ring.bw.x")),
            yaxis=dict(title=t("ring.bw.y")),
        )
    )
    for name in [name for name in ("dtlab", "by_size", "shared", "torch") if name in seconds[sizes[0]]]:
        busbw = [bus_bandwidth(b / seconds[b][name], n, "all_reduce") / 1e9 for b in sizes]
        fig.add_scatter(x=sizes, y=busbw, mode="lines+markers", name=t(f"ring.bw.{name}"))
    return fig
