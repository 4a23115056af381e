"""Looking up the planner's preset tables (models, GPUs, links) by name, one way for all three."""

from __future__ import annotations

from dtlab.i18n import ConfigError


def preset(table: dict, name: str, *, what: str, what_zh: str):
    """``table[name]``; for a name not in it, a bilingual ConfigError naming it and the known ones.

    ``what`` is the kind in English (``"model"``: the message says "unknown model ...;
    known models: ..."), ``what_zh`` in Chinese.
    """
    if name not in table:
        known, gap = ", ".join(table), " " if what_zh.isascii() else ""
        raise ConfigError(
            f"unknown {what} {name!r}; known {what}s: {known}",
            f"未知的{gap}{what_zh} {name!r}；可选的{gap}{what_zh}{gap}有：{known}",
        )
    return table[name]
