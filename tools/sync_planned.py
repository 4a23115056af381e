"""Drop from dtlab/course/index.py's PLANNED lists every file that now exists (run after building one)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
course = ROOT / "dtlab" / "course" / "index.py"
text = course.read_text(encoding="utf-8")
for name in ("PLANNED_MODULES", "PLANNED_LESSONS"):
    block = re.search(rf"{name}: tuple\[str, \.\.\.\] = \((.*?)\n\)", text, re.S)
    entries = re.findall(r'"([^"]+)"', block.group(1))
    kept = [e for e in entries if not (ROOT / e).exists()]
    body = "".join(f'\n    "{e}",' for e in kept)
    text = text[: block.start(1)] + body + text[block.end(1) :]
course.write_text(text, encoding="utf-8")
print("still planned:", [e for e in re.findall(r'"((?:dtlab|notebooks)/[^"]+)"', text.split("PLANNED_MODULES")[1])])
