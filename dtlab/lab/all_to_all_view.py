"""The pairwise-exchange all-to-all drawn one step at a time, from :func:`dtlab.comm.all_to_all.all_to_all_schedule`.

A table with a row per rank and a column per source rank: cell (r, j) is the
piece rank j addresses to rank r, labelled with its row count. It starts
filled only on the diagonal (each rank's piece for itself is a local copy).
**Step** runs one step of the exchange: in step s every rank r sends its piece
for r + s and receives the one from r - s, so one cell per row fills in (bold:
just arrived). After N - 1 steps every rank holds a piece from every rank.
``counts`` (an N x N list, counts[j][r] rows from j to r) shows uneven
pieces, as a mixture-of-experts router produces them; the status line adds up
the rows each rank has sent.
"""

from __future__ import annotations

import html

from dtlab.comm.all_to_all import all_to_all_schedule
from dtlab.i18n import register, t
from dtlab.lab.view import StepView

register(
    {
        "a2a.rank": ("rank {r} holds", "rank {r} 持有"),
        "a2a.from": ("from {j}", "来自 {j}"),
        "a2a.start": (
            "start: each rank holds only its own piece for itself (a local copy)",
            "开始：每个 rank 只持有发给自己的那一块（本地复制）",
        ),
        "a2a.status": (
            "step {k} of {total}: every rank r sends to r+{k} and receives from r−{k}",
            "第 {k} 步，共 {total} 步：每个 rank r 发给 r+{k}，并从 r−{k} 接收",
        ),
        "a2a.sends": ("rank {r} → rank {dst}: {rows} rows", "rank {r} → rank {dst}：{rows} 行"),
        "a2a.sent": (
            "rows sent so far, per rank: {sent} (of {total} each rank sends to others)",
            "到目前为止每个 rank 已发送的行数：{sent}（各自发往其他 rank 的总行数为 {total}）",
        ),
        "a2a.legend": (
            "grey: not here yet · green: arrived · bold: arrived in this step",
            "灰色：尚未到达 · 绿色：已到达 · 粗体：本步刚到达",
        ),
    }
)

COLORS = {"missing": "#EEEEEE", "here": "#82E0AA"}


def arrived(n: int, steps_done: int) -> list[list[bool]]:
    """[rank][source] -> whether the piece from ``source`` has reached ``rank`` after ``steps_done`` steps."""
    held = [[r == j for j in range(n)] for r in range(n)]
    for e in all_to_all_schedule(n):
        if e.step <= steps_done:
            held[e.send_to][e.rank] = True
    return held


class AllToAllView(StepView):
    """Step through an all-to-all over N ranks.

    ``step()``/``reset()`` move the exchange (what a script or a test calls);
    the table shows the learner's own presses of **Step** and **Reset**, so a
    check cell that steps the view to the end does not show the answer its
    prediction asks for: the table stays at step 0 until the learner steps.
    """

    clicks = {"step_button": "press_step", "reset_button": "press_reset"}
    pressed = False

    def __init__(self, ranks: int = 4, counts: list[list[int]] | None = None):
        self.counts = counts
        self.step_table(len(counts) if counts else ranks, disabled=counts is not None)
        self.start()

    @property
    def total_steps(self) -> int:
        return self.ranks.value - 1

    def press_step(self) -> None:
        """The Step button: the first press starts from step 0, whatever a script stepped to."""
        if not self.pressed:
            self.pressed, self.steps_done = True, 0
        self.step()

    def press_reset(self) -> None:
        self.pressed = True
        self.reset()

    @property
    def shown_steps(self) -> int:
        """The step the table shows: the learner's presses (0 before the first)."""
        return self.steps_done if self.pressed else 0

    def rows(self, src: int, dst: int) -> int:
        """Rows rank ``src`` sends rank ``dst`` (1 per pair unless ``counts`` says otherwise)."""
        return self.counts[src][dst] if self.counts else 1

    def state(self) -> list[list[bool]]:
        return arrived(self.ranks.value, self.steps_done)

    def sent_rows(self) -> list[int]:
        """Rows each rank has put on the wire so far (its local piece is not sent)."""
        return self._sent(self.steps_done)

    def _sent(self, k: int) -> list[int]:
        n = self.ranks.value
        return [sum(self.rows(r, (r + s) % n) for s in range(1, k + 1)) for r in range(n)]

    def _draw(self) -> None:
        n, k = self.ranks.value, self.shown_steps
        held = arrived(n, k)
        cell = "border:1px solid #999;padding:4px 8px;text-align:center;font-family:monospace"
        head = "".join(f"<th style='{cell}'>{t('a2a.from', j=j)}</th>" for j in range(n))
        body = []
        for r in range(n):
            tds = []
            for j in range(n):
                fresh = k and (r - j) % n == k
                bold = ";font-weight:bold;outline:2px solid #333" if fresh else ""
                color = COLORS["here" if held[r][j] else "missing"]
                text = f"{j}→{r}: {self.rows(j, r)}" if held[r][j] else ""
                tds.append(f"<td style='{cell};background:{color}{bold}'>{text}</td>")
            body.append(f"<tr><th style='{cell}'>{t('a2a.rank', r=r)}</th>{''.join(tds)}</tr>")
        status = t("a2a.status", k=k, total=self.total_steps) if k else t("a2a.start")
        sends = (
            "<br>".join(t("a2a.sends", r=r, dst=(r + k) % n, rows=self.rows(r, (r + k) % n)) for r in range(n))
            if k
            else ""
        )
        totals = [sum(self.rows(r, j) for j in range(n) if j != r) for r in range(n)]
        sent = t("a2a.sent", sent=self._sent(k), total=totals)
        self.table.value = (
            f"<b>{html.escape(status)}</b><table style='border-collapse:collapse;"
            f"margin:6px 0'><tr><th></th>{head}</tr>{''.join(body)}</table>"
            f"<div style='font-size:90%'>{sends}</div><div>{html.escape(sent)}</div>"
            f"<div style='font-size:85%;color:#555'>{html.escape(t('a2a.legend'))}</div>"
        )

    def refresh(self, lang: str) -> None:
        self._draw()
