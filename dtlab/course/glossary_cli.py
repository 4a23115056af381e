"""``dtlab glossary [TERM] [--lang en|zh]``: one entry, or every term, printed for a terminal."""

from __future__ import annotations

import argparse
import sys

from dtlab.course.glossary import lookup, render, render_index
from dtlab.i18n import LANGUAGES, ConfigError, get_language


def add_glossary_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of ``dtlab glossary [TERM] [--lang en|zh]``."""
    parser.add_argument(
        "term",
        nargs="*",
        metavar="TERM",
        help="a term in English or Chinese, an abbreviation or alias; none lists all"
        " / 英文或中文术语、缩写或别名；不填则列出全部",
    )
    parser.add_argument(
        "--lang",
        choices=LANGUAGES,
        default=None,
        help="language to print in (default: the current language) / 输出语言",
    )
    return parser


def run_glossary(args: argparse.Namespace) -> int:
    """Print one entry, or the list of all terms; 0 on success, 2 for an unknown term."""
    lang = getattr(args, "lang", None) or get_language()
    words = getattr(args, "term", None) or []
    name = " ".join([words] if isinstance(words, str) else words).strip()
    if not name:
        print(render_index(lang))
        return 0
    try:
        term = lookup(name)
    except ConfigError as err:
        print(f"dtlab: {err.en}\ndtlab: {err.zh}", file=sys.stderr)  # as dtlab.cli reports errors
        return 2
    print(render(term, lang))
    return 0
