"""The docs name real files: every ``dtlab/...`` path in README.md and docs/ exists, and the architecture
page walks a training step through files that are there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PATH = re.compile(r"(?<![\w/.-])dtlab/[\w/]*\w(?:\.py)?/?")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_page_names_exists(page):
    missing = sorted(
        {
            m.group(0)
            for m in PATH.finditer(page.read_text(encoding="utf-8"))
            if not (ROOT / m.group(0).rstrip("/")).exists()
        }
    )
    assert not missing, f"{page.name} names files that are not there: {missing}"


def test_the_architecture_page_covers_every_plane():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    planes = sorted(p.name for p in (ROOT / "dtlab").iterdir() if (p / "__init__.py").is_file())
    assert planes and all(f"`dtlab/{plane}/`" in text for plane in planes), planes
    top = sorted(p.name for p in (ROOT / "dtlab").glob("*.py") if not p.name.startswith("__"))
    assert all(f"`{name}`" in text for name in top), top
