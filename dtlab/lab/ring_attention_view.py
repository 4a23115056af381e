"""Ring attention drawn one step at a time, from :func:`dtlab.parallel.ring_attention.ring_schedule`.

Two pictures of the same step:

* the **ring**: a row per rank, with the sequence chunks whose queries it
  keeps, the K/V block it holds at this step (rank r holds rank r - s's at
  step s) and where it sends that block next;
* the **attention matrix**, cut into chunk x chunk tiles (rows: query
  chunks, columns: key chunks). A tile is coloured by the rank that computed
  it, bold if in this step; the triangle above the diagonal stays grey (the
  causal mask hides it, so it is never computed); diagonal tiles carry the
  mask inside them (◣).

**Step** runs one step of the ring; after N steps every unmasked tile is
done and each rank has passed its K/V N-1 times. Switch **zigzag** off to see
the causal imbalance it fixes: with one contiguous chunk per rank, rank 0
computes one tile and rank N-1 computes N.
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from dtlab.i18n import register, t
from dtlab.lab.view import StepView
from dtlab.parallel.ring_attention import chunks_of, ring_schedule

register(
    {
        "ringattn.ctl.ranks": ("ranks N (CP)", "rank 数 N（CP）"),
        "ringattn.ctl.zigzag": ("zigzag (two opposite chunks per rank)", "zigzag（每个 rank 持有相对的两块）"),
        "ringattn.col.rank": ("rank", "rank 编号"),
        "ringattn.col.queries": ("query chunks (kept)", "查询块（保留在本地）"),
        "ringattn.col.holds": ("K/V held now", "当前持有的 K/V"),
        "ringattn.col.next": ("sends it to", "下一步发给"),
        "ringattn.kv_of": ("rank {src}'s (chunks {chunks})", "rank {src} 的（块 {chunks}）"),
        "ringattn.rank_n": ("rank {r}", "{r} 号 rank"),
        "ringattn.none": ("—", "—"),
        "ringattn.start": (
            "start: every rank holds its own queries and K/V; nothing computed yet",
            "开始：每个 rank 持有自己的查询和 K/V；还没有任何计算",
        ),
        "ringattn.status": (
            "step {k} of {n}: rank r attends to the K/V of rank r−{s}",
            "第 {k} 步，共 {n} 步：rank r 与 rank r−{s} 的 K/V 计算注意力",
        ),
        "ringattn.passes": (
            "K/V passes so far per rank: {passes} of N−1 = {total}; tiles computed per rank: {tiles}",
            "到目前为止每个 rank 传递 K/V 的次数：{passes}（共 N−1 = {total} 次）；每个 rank 已计算的块数：{tiles}",
        ),
        "ringattn.axis": ("rows: query chunk · columns: key chunk", "行：查询块 · 列：键块"),
        "ringattn.legend": (
            "colour: the rank that computed the tile · bold: this step · grey: hidden by the "
            "causal mask, never computed · ◣: causal mask inside the tile",
            "颜色：计算该块的 rank · 粗体：本步计算 · 灰色：被因果掩码完全遮住，从不计算 · ◣：块内带因果掩码",
        ),
    }
)

RANK_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D")
MASKED, PENDING = "#DDDDDD", "#FFFFFF"


def tiles_done(n: int, *, zigzag: bool, steps: int) -> dict[tuple[int, int], tuple[int, int]]:
    """After ``steps`` ring steps: (query chunk, key chunk) -> (rank that computed it, step)."""
    return {
        (tile.q_chunk, tile.k_chunk): (s.rank, s.step)
        for s in ring_schedule(n, zigzag=zigzag)
        if s.step < steps
        for tile in s.tiles
    }


class RingAttentionView(StepView):
    """Step through ring attention over N ranks. ``step()``/``reset()`` are what the buttons call."""

    labels = {
        "ranks": "ringattn.ctl.ranks",
        "zigzag": "ringattn.ctl.zigzag",
        "step_button": "ctl.step",
        "reset_button": "ctl.reset",
    }
    changes = {"ranks": "reset", "zigzag": "reset"}

    def __init__(self, ranks: int = 4, *, zigzag: bool = True):
        self.step_controls(ranks)
        self.zigzag = widgets.Checkbox(value=zigzag)
        self.ring = widgets.HTML()
        self.matrix = widgets.HTML()
        self.widget = widgets.VBox(
            [
                widgets.HBox([self.ranks, self.zigzag]),
                widgets.HBox([self.step_button, self.reset_button]),
                self.ring,
                self.matrix,
            ]
        )
        self.start()

    # -- state
    @property
    def total_steps(self) -> int:
        return self.ranks.value

    def passes(self) -> int:
        """K/V passes each rank has made: one after every step but the last."""
        return min(self.steps_done, self.ranks.value - 1)

    def tiles_per_rank(self) -> list[int]:
        counts = [0] * self.ranks.value
        for rank, _ in tiles_done(self.ranks.value, zigzag=self.zigzag.value, steps=self.steps_done).values():
            counts[rank] += 1
        return counts

    # -- drawing
    def refresh(self, lang: str | None = None) -> None:
        self.ring.value = self._ring_html(lang)
        self.matrix.value = self._matrix_html(lang)

    def _ring_html(self, lang) -> str:
        n, k, zz = self.ranks.value, self.steps_done, self.zigzag.value
        cell = "border:1px solid #999;padding:3px 8px;font-family:monospace"
        head = "".join(
            f"<th style='{cell}'>{html.escape(t(key, lang))}</th>"
            for key in ("ringattn.col.rank", "ringattn.col.queries", "ringattn.col.holds", "ringattn.col.next")
        )
        rows = []
        for r in range(n):
            src = (r - max(k - 1, 0)) % n  # the block used in the step just run
            chunks = ", ".join(map(str, chunks_of(src, n, zigzag=zz)))
            holds = t("ringattn.kv_of", lang, src=src, chunks=chunks)
            nxt = t("ringattn.rank_n", lang, r=(r + 1) % n) if 0 < k < n else t("ringattn.none", lang)
            mine = ", ".join(map(str, chunks_of(r, n, zigzag=zz)))
            color = RANK_COLORS[r % len(RANK_COLORS)]
            rows.append(
                f"<tr><td style='{cell};color:white;background:{color}'>{r}</td>"
                f"<td style='{cell}'>{mine}</td><td style='{cell}'>{html.escape(holds)}</td>"
                f"<td style='{cell}'>{html.escape(nxt)}</td></tr>"
            )
        status = t("ringattn.status", lang, k=k, n=n, s=k - 1) if k else t("ringattn.start", lang)
        passes = t("ringattn.passes", lang, passes=self.passes(), total=n - 1, tiles=self.tiles_per_rank())
        return (
            f"<b>{html.escape(status)}</b><table style='border-collapse:collapse;margin:6px 0'>"
            f"<tr>{head}</tr>{''.join(rows)}</table><div>{html.escape(passes)}</div>"
        )

    def _matrix_html(self, lang) -> str:
        n, zz = self.ranks.value, self.zigzag.value
        chunks = 2 * n if zz else n
        done = tiles_done(n, zigzag=zz, steps=self.steps_done)
        size = "width:26px;height:22px;text-align:center;font-size:11px;border:1px solid #bbb"
        rows = []
        for q in range(chunks):
            cells = []
            for kc in range(chunks):
                if kc > q:
                    cells.append(f"<td style='{size};background:{MASKED}'></td>")
                    continue
                who = done.get((q, kc))
                mark = "◣" if kc == q else ""
                if who is None:
                    cells.append(f"<td style='{size};background:{PENDING}'>{mark}</td>")
                else:
                    rank, step = who
                    fresh = ";font-weight:bold;outline:2px solid #000" if step == self.steps_done - 1 else ""
                    cells.append(
                        f"<td style='{size};color:white;background:"
                        f"{RANK_COLORS[rank % len(RANK_COLORS)]}{fresh}'>{mark or rank}</td>"
                    )
            rows.append(f"<tr><th style='font-size:11px;padding-right:4px'>q{q}</th>{''.join(cells)}</tr>")
        head = "".join(f"<th style='font-size:11px'>k{c}</th>" for c in range(chunks))
        return (
            f"<div style='font-size:90%'>{html.escape(t('ringattn.axis', lang))}</div>"
            f"<table style='border-collapse:collapse;margin:4px 0'><tr><th></th>{head}</tr>"
            f"{''.join(rows)}</table><div style='font-size:85%;color:#555'>"
            f"{html.escape(t('ringattn.legend', lang))}</div>"
        )
