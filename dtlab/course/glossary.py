"""The bilingual glossary: one JSON entry per term, English and 简体中文.

Each file ``glossary/<slug>.json`` holds a term, its Chinese name as engineers
say it, a definition and an example sentence in both languages, the paper or
documentation it comes from, and links: the dtlab modules that implement it,
the lessons that run it, and related slugs. This module loads the entries,
finds one by any of its names (:func:`lookup`), prints it for a terminal
(:func:`render`) or a notebook (:func:`render_markdown`), and reports links to
files that do not exist (:func:`missing_links`). The ``dtlab glossary``
command is :mod:`dtlab.course.glossary_cli`.
"""

from __future__ import annotations

import difflib
import json
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, NamedTuple

from dtlab.course.index import PLANNED_LESSONS, PLANNED_MODULES, lesson
from dtlab.i18n import ConfigError, display_width, get_language, register, t

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # dtlab/
REPO_ROOT = PACKAGE_DIR.parent
# A checkout keeps the entries in the repository's glossary/; an installed
# package carries the same files as package data in dtlab/_glossary/.
SEARCH_PATH = (REPO_ROOT / "glossary", PACKAGE_DIR / "_glossary")

FIELDS = ("term", "abbr", "zh", "aliases", "definition", "example", "source", "modules", "lessons", "related")

register(
    {
        "glossary.aliases": ("Also called", "又称"),
        "glossary.example": ("Example", "例句"),
        "glossary.example_en": ("In English", "英文原句"),
        "glossary.source": ("Source", "出处"),
        "glossary.modules": ("Code", "代码"),
        "glossary.lessons": ("Lessons", "课程"),
        "glossary.related": ("Related", "相关术语"),
        "glossary.planned": ("planned", "待建"),
        "glossary.count": (
            "{n} terms. `dtlab glossary TERM` shows one in full.",
            "共 {n} 个术语。运行 `dtlab glossary 术语` 查看完整词条。",
        ),
    }
)


class Text(NamedTuple):
    """The same text in both languages."""

    en: str
    zh: str

    def in_lang(self, lang: str) -> str:
        return self.zh if lang == "zh" else self.en


@dataclass(frozen=True)
class Term:
    """One glossary entry, as stored in ``glossary/<slug>.json``."""

    slug: str
    term: str
    abbr: str | None
    zh: str
    aliases: tuple[str, ...]
    definition: Text
    example: Text
    source: str
    modules: tuple[str, ...]
    lessons: tuple[str, ...]
    related: tuple[str, ...]

    def names(self) -> tuple[str, ...]:
        """Every name :func:`lookup` accepts for this term."""
        return (self.slug, self.term, self.abbr or "", self.zh, *self.aliases)

    def title(self, lang: str = "en") -> str:
        """``"data parallelism (DP)"`` in English, ``"数据并行"`` in Chinese."""
        if lang == "zh":
            return self.zh
        return f"{self.term} ({self.abbr})" if self.abbr else self.term

    def _repr_markdown_(self) -> str:
        return render_markdown(self)


# ------------------------------------------------------------------ loading


def glossary_dir() -> Path:
    """The folder the entries are read from: the checkout's, else the installed copy."""
    for folder in SEARCH_PATH:
        if any(folder.glob("*.json")):
            return folder
    raise ConfigError(
        f"no glossary entries found; looked in {', '.join(map(str, SEARCH_PATH))}",
        f"找不到术语表词条，已查找：{'、'.join(map(str, SEARCH_PATH))}",
    )


def load_entry(path: Path) -> Term:
    """Read and check one ``<slug>.json`` file; a malformed one names itself."""

    def bad(en: str, zh: str) -> ConfigError:
        return ConfigError(f"glossary entry {path}: {en}", f"术语表词条 {path}：{zh}")

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise bad(f"not valid JSON ({err})", f"不是合法的 JSON（{err}）") from err
    if not isinstance(data, dict) or set(data) != set(FIELDS):
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise bad(f"fields must be {list(FIELDS)}, got {got}", f"字段必须是 {list(FIELDS)}，实际是 {got}")
    for field in ("definition", "example"):
        if not isinstance(data[field], dict) or set(data[field]) != {"en", "zh"}:
            raise bad(f"{field!r} must hold exactly 'en' and 'zh'", f"{field!r} 必须恰好包含 'en' 和 'zh'")
    return Term(
        slug=path.stem,
        term=data["term"],
        abbr=data["abbr"],
        zh=data["zh"],
        aliases=tuple(data["aliases"]),
        definition=Text(**data["definition"]),
        example=Text(**data["example"]),
        source=data["source"],
        modules=tuple(data["modules"]),
        lessons=tuple(data["lessons"]),
        related=tuple(data["related"]),
    )


def load(folder: Path) -> tuple[Term, ...]:
    """Every entry in ``folder``, sorted by English term."""
    terms = [load_entry(path) for path in folder.glob("*.json")]
    return tuple(sorted(terms, key=lambda term: term.term.casefold()))


@lru_cache(maxsize=None)
def all_terms() -> tuple[Term, ...]:
    """Every glossary entry, sorted by English term (read once, then cached)."""
    return load(glossary_dir())


# ------------------------------------------------------------------- lookup

_SEPARATORS = re.compile(r"[\s\-_]+")


def normalize(name: str) -> str:
    """The form names are compared in: case, width, spaces, '-' and '_' ignored.

    NFKC folds full-width input from a Chinese keyboard (``ＺｅＲＯ``) to ASCII,
    so ``"ZeRO-3"``, ``"zero 3"`` and ``"zero_3"`` are all ``"zero3"``.
    """
    return _SEPARATORS.sub("", unicodedata.normalize("NFKC", name).casefold())


def build_index(terms: Iterable[Term]) -> dict[str, Term]:
    """Map every normalized name to its term; a name shared by two terms is an error."""
    index: dict[str, Term] = {}
    for term in terms:
        for name in term.names():
            key = normalize(name)
            if not key:
                continue
            other = index.setdefault(key, term)
            if other.slug != term.slug:
                raise ConfigError(
                    f"glossary name {name!r} belongs to both {other.slug!r} and {term.slug!r}",
                    f"术语名 {name!r} 同时属于 {other.slug!r} 和 {term.slug!r}",
                )
    return index


@lru_cache(maxsize=None)
def _index() -> dict[str, Term]:
    return build_index(all_terms())


def by_slug(slug: str) -> Term:
    """The entry stored as ``glossary/<slug>.json`` (KeyError if there is none)."""
    return {term.slug: term for term in all_terms()}[slug]


def suggestions(name: str, limit: int = 5) -> list[Term]:
    """Terms whose names are close to ``name`` or contain it."""
    key, index = normalize(name), _index()
    keys = difflib.get_close_matches(key, index, n=limit, cutoff=0.6)
    if len(key) >= 2:
        keys += [k for k in index if key in k]
    return list(dict.fromkeys(index[k] for k in keys))[:limit]


def lookup(name: str) -> Term:
    """Find a term by English name, abbreviation, alias, slug or Chinese name.

    Case, surrounding spaces and the difference between '-', '_' and ' ' are
    ignored. An unknown name raises a bilingual :class:`ConfigError` that
    lists the closest terms.
    """
    term = _index().get(normalize(name))
    if term is not None:
        return term
    close = suggestions(name)
    en = f"no glossary entry for {name!r}."
    zh = f"术语表中没有 {name!r}。"
    if close:
        en += " Did you mean: " + ", ".join(c.title("en") for c in close) + "?"
        zh += "你要找的是不是：" + "、".join(f"{c.zh}（{c.abbr or c.term}）" for c in close) + "？"
    en += " `dtlab glossary` lists every term."
    zh += "运行 `dtlab glossary` 可列出全部术语。"
    raise ConfigError(en, zh)


# -------------------------------------------------------------------- links


def missing_links(terms: Iterable[Term] | None = None, root: Path | None = None) -> dict[str, tuple[str, ...]]:
    """Linked modules and lessons that do not exist under ``root``.

    Returns ``{path: slugs that link to it}``, sorted by path. ``root`` is
    the repository (default: the checkout this module lives in).
    """
    root = REPO_ROOT if root is None else Path(root)
    missing: dict[str, list[str]] = {}
    for term in all_terms() if terms is None else terms:
        for path in (*term.modules, *term.lessons):
            if not (root / path).exists():
                missing.setdefault(path, []).append(term.slug)
    return {path: tuple(missing[path]) for path in sorted(missing)}


def _planned(path: str, lang: str) -> str:
    """`` (planned)`` / ``（待建）`` after a link to a file that is not built yet."""
    if path not in PLANNED_MODULES and path not in PLANNED_LESSONS:
        return ""
    return f"（{t('glossary.planned', lang)}）" if lang == "zh" else f" ({t('glossary.planned', lang)})"


def _lesson_label(path: str, lang: str) -> str:
    try:
        item = lesson(path)
    except KeyError:
        return path
    return f"{item.number:02d} {item.title(lang)}"


# ---------------------------------------------------------------- rendering


def _heading(term: Term, lang: str) -> str:
    other = term.title("en") if lang == "zh" else term.zh
    return f"{term.title(lang)} · {other}"


def _related(term: Term, lang: str) -> list[str]:
    known = {item.slug: item for item in all_terms()}
    return [known[slug].title(lang) if slug in known else slug for slug in term.related]


def render(term: Term, lang: str | None = None) -> str:
    """The entry as plain text for a terminal, in ``lang`` (default: current language)."""
    lang = lang or get_language()
    sep, colon = ("、", "：") if lang == "zh" else (", ", ": ")

    def line(key: str, items: Iterable[str]) -> str:
        return f"{t(key, lang)}{colon}{sep.join(items)}"

    lines = [_heading(term, lang)]
    if term.aliases:
        lines.append(line("glossary.aliases", term.aliases))
    lines += ["", term.definition.in_lang(lang), "", line("glossary.example", [term.example.in_lang(lang)])]
    if lang == "zh":  # the sentence as it will be heard in the meeting
        lines.append(line("glossary.example_en", [term.example.en]))
    lines += [
        line("glossary.source", [term.source]),
        line("glossary.modules", [m + _planned(m, lang) for m in term.modules]),
        line("glossary.lessons", [f"{_lesson_label(p, lang)} — {p}{_planned(p, lang)}" for p in term.lessons]),
    ]
    if term.related:
        lines.append(line("glossary.related", _related(term, lang)))
    return "\n".join(lines)


def render_markdown(term: Term, lang: str | None = None) -> str:
    """The entry as Markdown for a notebook; lesson links are relative to ``notebooks/``."""
    lang = lang or get_language()
    sep, colon = ("、", "：") if lang == "zh" else (", ", ": ")

    def label(key: str) -> str:
        return f"**{t(key, lang)}{colon}**"

    parts = [f"### {_heading(term, lang)}"]
    if term.aliases:
        parts.append(label("glossary.aliases") + sep.join(term.aliases))
    parts.append(term.definition.in_lang(lang))
    example = f"> {label('glossary.example')}{term.example.in_lang(lang)}"
    if lang == "zh":
        example += f"  \n> {label('glossary.example_en')}{term.example.en}"
    parts.append(example)
    facts = [
        label("glossary.source") + term.source,
        label("glossary.modules") + sep.join(f"`{m}`{_planned(m, lang)}" for m in term.modules),
        label("glossary.lessons")
        + sep.join(f"[{_lesson_label(p, lang)}]({Path(p).name}){_planned(p, lang)}" for p in term.lessons),
    ]
    if term.related:
        facts.append(label("glossary.related") + sep.join(_related(term, lang)))
    parts.append("  \n".join(facts))
    return "\n\n".join(parts)


def render_index(lang: str | None = None) -> str:
    """Every term on a line, in ``lang`` first and its counterpart beside it."""
    lang = lang or get_language()
    rows = [(term.title(lang), term.title("en" if lang == "zh" else "zh")) for term in all_terms()]
    width = max(display_width(first) for first, _ in rows) + 2
    lines = [first + " " * (width - display_width(first)) + second for first, second in rows]
    return "\n".join([t("glossary.count", lang, n=len(rows)), "", *lines])
