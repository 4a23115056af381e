"""Progress per lesson, as data, as text for ``dtlab progress``, and as a table in lesson 17.

Counts come from the answer key (what each lesson asks) and the learner's
progress file (what they did): predictions made and right, exercises passed.
"""

from __future__ import annotations

import argparse
import html
import json

from dtlab.course.exercises import progress, registry
from dtlab.course.index import LESSONS


def summary(data: dict | None = None) -> list[dict]:
    """One row per lesson that asks anything: its counts, from ``data`` (the progress file by default)."""
    data = progress.load() if data is None else data
    titles = {lesson.number: lesson for lesson in LESSONS}
    rows = []
    for number, (predictions, exercises) in registry.by_lesson().items():
        made = [data["predictions"].get(p.key, {}) for p in predictions]
        passed = [data["exercises"].get(e.key, {}).get("passed", False) for e in exercises]
        lesson = titles.get(number)
        rows.append(
            {
                "lesson": number,
                "title_en": lesson.title_en if lesson else "",
                "title_zh": lesson.title_zh if lesson else "",
                "predictions": len(predictions),
                "made": sum(bool(m.get("made")) for m in made),
                "right": sum(bool(m.get("right")) for m in made),
                "exercises": len(exercises),
                "passed": sum(passed),
            }
        )
    return rows


HEADER = {
    "en": ("lesson", "predictions made", "right", "exercises passed"),
    "zh": ("课程", "已做预测", "预测正确", "通过的练习"),
}


def format_text(rows: list[dict], lang: str = "en") -> str:
    head = HEADER[lang]
    lines = [f"{head[0]:<44} {head[1]:>16} {head[2]:>8} {head[3]:>16}"]
    for r in rows:
        title = f"{r['lesson']:02d} " + (r["title_zh"] if lang == "zh" else r["title_en"])
        lines.append(
            f"{title:<44} {r['made']:>9} / {r['predictions']:<4} {r['right']:>8} {r['passed']:>9} / {r['exercises']:<4}"
        )
    totals = {k: sum(r[k] for r in rows) for k in ("made", "predictions", "right", "passed", "exercises")}
    label = "all lessons" if lang == "en" else "全部课程"
    lines.append(
        f"{label:<44} {totals['made']:>9} / {totals['predictions']:<4} {totals['right']:>8} "
        f"{totals['passed']:>9} / {totals['exercises']:<4}"
    )
    return "\n".join(lines)


def format_html(rows: list[dict]) -> str:
    """A bilingual table (lesson 17 shows it)."""
    head = "".join(f"<th>{html.escape(en)}<br>{html.escape(zh)}</th>" for en, zh in zip(HEADER["en"], HEADER["zh"]))
    body = "".join(
        f"<tr><td>{r['lesson']:02d} {html.escape(r['title_en'])}<br>{html.escape(r['title_zh'])}</td>"
        f"<td>{r['made']} / {r['predictions']}</td><td>{r['right']}</td>"
        f"<td>{r['passed']} / {r['exercises']}</td></tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def show_progress() -> None:
    """Display the learner's progress table in a notebook (plain text outside one)."""
    rows = summary()
    try:
        from IPython.display import HTML, display
    except ImportError:  # pragma: no cover - IPython comes with the lab
        print(format_text(rows))
        return
    display(HTML(format_html(rows)))
    print(f"progress file / 进度文件: {progress.progress_path()}")


def add_progress_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lang",
        choices=("en", "zh", "both"),
        default="both",
        help="language to print in (default: both) / 输出语言（默认中英双语）",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per lesson / 每课一个 JSON 对象")
    parser.add_argument(
        "--reset", action="store_true", help="forget every prediction and exercise / 清空所有预测与练习记录"
    )


def run_progress(args: argparse.Namespace) -> int:
    """``dtlab progress``: per lesson, predictions made and right and exercises passed."""
    if args.reset:
        progress.reset()
        print(f"progress reset / 进度已清空: {progress.progress_path()}")
        return 0
    rows = summary()
    if args.json:
        for row in rows:
            print(json.dumps(row, ensure_ascii=False))
        return 0
    for lang in ("en", "zh") if args.lang == "both" else (args.lang,):
        print(format_text(rows, lang))
        print()
    print(f"progress file / 进度文件: {progress.progress_path()}")
    return 0
