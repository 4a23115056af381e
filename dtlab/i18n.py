"""Two languages for everything a learner reads: English and Simplified Chinese.

Every user-facing string lives in one of two places:

* ``LABELS`` below: widget labels, plot titles and axis names, looked up with
  :func:`t` in the current language (``set_language("zh")`` switches it).
* :class:`DtlabError` and its subclasses: an error carries both languages at
  once, because an error is read exactly when a learner is stuck, and the
  message names the bad value and what would be accepted.
"""

from __future__ import annotations

import inspect
import os
import threading
import unicodedata
import warnings
import weakref

LANGUAGES = ("en", "zh")
_language = "en"  # until the end of this module: DTLAB_LANG, where set (_starting_language)


def set_language(lang: str) -> None:
    """Switch every label, title and message to ``"en"`` or ``"zh"``."""
    global _language
    if lang not in LANGUAGES:
        raise ConfigError(
            f"language must be one of {LANGUAGES}, got {lang!r}",
            f"语言只能是 {LANGUAGES} 之一，收到的是 {lang!r}",
        )
    _language = lang
    for callback in listeners():
        callback(lang)


def get_language() -> str:
    return _language


_listeners: list[weakref.ref] = []
_listeners_lock = threading.RLock()  # re-entrant: a weak reference may die (and call _forget) while it is held


def on_language_change(callback) -> None:
    """Call ``callback(lang)`` whenever :func:`set_language` runs (widgets relabel).

    The callback is held through a weak reference: a bound method
    (``view.relabel``) for as long as its object lives, any other function
    for as long as the caller keeps it. So a widget whose notebook cell is
    run again, and whose old object is garbage-collected, leaves nothing
    behind here.
    """
    make = weakref.WeakMethod if inspect.ismethod(callback) else weakref.ref
    ref = make(callback, _forget)
    with _listeners_lock:
        _listeners.append(ref)


def _forget(ref: weakref.ref) -> None:
    """Drop a listener whose object was garbage-collected (called by the weak reference)."""
    with _listeners_lock:
        if ref in _listeners:
            _listeners.remove(ref)


def listeners() -> list:
    """The language-change callbacks still alive, in the order they were registered."""
    with _listeners_lock:
        refs = list(_listeners)
    return [callback for ref in refs if (callback := ref()) is not None]


LABELS: dict[str, dict[str, str]] = {}


def register(labels: dict[str, tuple[str, str]]) -> None:
    """Add ``{key: (english, chinese)}`` entries to the catalogue."""
    for key, (en, zh) in labels.items():
        LABELS[key] = {"en": en, "zh": zh}


def t(key: str, lang: str | None = None, **fmt) -> str:
    """The label ``key`` in ``lang`` (default: the current language)."""
    text = LABELS[key][lang or _language]
    return text.format(**fmt) if fmt else text


class DtlabError(Exception):
    """An error a learner should understand: the same message in English and Chinese."""

    def __init__(self, en: str, zh: str):
        self.en = en
        self.zh = zh
        super().__init__(f"{en}\n{zh}")

    def message(self, lang: str | None = None) -> str:
        return self.zh if (lang or _language) == "zh" else self.en


class ConfigError(DtlabError, ValueError):
    """A configuration that cannot run; raised before any process starts."""


def display_width(text: str) -> int:
    """Columns a terminal gives ``text``: a Chinese (wide or fullwidth) character takes two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _starting_language() -> str:
    """``DTLAB_LANG`` where it is set, so that a class can start every kernel in Chinese; English otherwise.

    A value other than ``en`` or ``zh`` is named in a warning (both languages) and English is used.
    """
    lang = os.environ.get("DTLAB_LANG", "").strip()
    if lang and lang not in LANGUAGES:
        warnings.warn(
            f"DTLAB_LANG must be one of {LANGUAGES}, got {lang!r}: using 'en'\n"
            f"DTLAB_LANG 只能是 {LANGUAGES} 之一，收到的是 {lang!r}：使用英文 'en'",
            stacklevel=2,
        )
        return "en"
    return lang or "en"


_language = _starting_language()
