"""The docs name real files: every ``dtlab/...`` path in README.md and docs/ exists, and the architecture
page walks a training step through files that are there."""

from __future__ import annotations

import re
import shlex
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


def _commands(page: Path) -> list[str]:
    """The ``dtlab ...`` lines of a page's shell blocks (untagged, sh or bash; ``text`` blocks are output)."""
    found, shell = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            shell = not shell and line.strip("`").strip() in ("", "sh", "bash")
            continue
        text = re.sub(r"^\$\s*", "", line.strip())
        if shell and text.startswith("dtlab ") and "[" not in text:  # "[--json]": a synopsis, not a command
            found.append(text.split(" #")[0].rstrip(" \\"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_a_page_shows_is_one_dtlab_accepts(page):
    """Each command parses with dtlab's own parser, and each ``dtlab train`` job passes validation: the
    docs' commands still run (nothing is started here)."""
    from dtlab import cli
    from dtlab.config.flags import config_from_args

    parser = cli.build_parser()
    for command in _commands(page):
        argv = shlex.split(command)[1:]
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{page.name}: dtlab does not accept `{command}`")
        if argv[0] == "train":
            config_from_args(args).validate()


def test_the_pages_show_commands():
    assert sum(len(_commands(page)) for page in PAGES) >= 20  # 27 when written
