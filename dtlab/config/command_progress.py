"""What a long command is doing while it works, said on stderr: a bar on a terminal, a line per stage otherwise.

``dtlab calibrate``, every ``dtlab bench`` and ``dtlab cluster run``'s set-up
take seconds to minutes; each opens a :class:`Progress` and names every stage
as it begins (``progress.stage(english, chinese)``): what is being measured,
and how far along it is (stage k of n, the seconds since the command began).
Where stderr is a terminal, one line is redrawn as a bar; otherwise (a log, a
pipe, CI) each stage is a line of its own. Only stderr: stdout stays the
command's result, and :func:`stdout_to_stderr` keeps it pure JSON under
``--json`` by sending a command's tables to stderr too.

A stage is said in the user's language, one of the two (:func:`language`):
Chinese when ``dtlab.set_language("zh")`` was called or the locale
(``LC_ALL``, ``LC_MESSAGES``, ``LANG``, the first one set) is Chinese.

A command's parts report into the command's progress: :func:`current` is the
innermost one open (a silent one outside any command, so a library call says
nothing), and a :class:`Progress` opened inside another is shown after it
(``dtlab bench all [2/7] › dp [1/5] ...``). A part that learns how many stages
it has calls ``progress.more(n)``.

In a notebook the same long calls (``calibrate()``, a cluster's set-up) show
a progress widget instead: :func:`library_call` opens, for a function called
outside any command, a progress drawn by the view that :mod:`dtlab.lab`
registers with :func:`set_notebook_view` (the engine never imports the lab),
or a silent one where no view is registered or none can be shown.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time

from dtlab.i18n import display_width, get_language

BAR_WIDTH = 20
_open: list[Progress] = []
_notebook_view: list = [None]  # a callable: () -> a view (show(index, total, text); end(text, ok)) or None
_bar_drawn = [False]  # a bar is on the terminal's last line now (every progress draws on the same one)


def language() -> str:
    """``"zh"`` where the user reads Chinese (see the module docstring), else ``"en"``."""
    if get_language() == "zh":
        return "zh"
    for name in ("LC_ALL", "LC_MESSAGES", "LANG"):
        value = os.environ.get(name)
        if value:
            return "zh" if value.lower().startswith("zh") else "en"
    return "en"


class Progress:
    """One command's (or one part's) stages on stderr; a context manager (see the module docstring).

    ``title``: what works (``"dtlab bench dp"``); ``total``: how many stages, if known yet; ``done``: what
    the last line says the work is, in English and Chinese, once it ended well.
    """

    def __init__(
        self,
        title: str,
        total: int | None = None,
        *,
        done: tuple[str, str] = ("done", "完成"),
        stream=None,
        silent=False,
        view=None,
    ):
        self.title, self.total, self.index, self.done = title, total, 0, done
        self.label = ""
        self.stream = stream if stream is not None else sys.stderr
        self.silent = silent
        self.view = view  # a notebook's widget draws the stages instead of the stream (set_notebook_view)
        self.started = time.monotonic()
        self.parent = _open[-1] if _open and not silent else None
        self.zh = language() == "zh"
        isatty = getattr(self.stream, "isatty", None)
        self.bar = view is None and bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"
        self.closed = False
        self._stdout = None  # the stdout this progress wrapped, put back on close

    def __enter__(self) -> Progress:
        if not self.silent:
            if self.bar and not isinstance(sys.stdout, _ClearBarFirst):  # a print never lands on the bar
                self._stdout = sys.stdout
                sys.stdout = _ClearBarFirst(sys.stdout, self.stream)
            _open.append(self)
        return self

    def __exit__(self, kind, value, tb) -> None:
        self.close(ok=kind is None)

    def more(self, stages: int) -> None:
        """``stages`` more stages follow the one now running (the total becomes known)."""
        self.total = self.index + stages

    def stage(self, en: str, zh: str) -> None:
        """A stage begins: say what it measures, in the user's language."""
        self.index += 1
        if self.total is not None and self.index > self.total:
            self.total = self.index
        self.label = zh if self.zh else en
        self._say(self._where(), self.label)

    def close(self, ok: bool = True) -> None:
        """The work ended (``ok``: finished, else stopped by an error); says so, once."""
        if self in _open:
            _open.remove(self)
        if self._stdout is not None:
            sys.stdout, self._stdout = self._stdout, None
        if self.silent or self.closed:
            return
        self.closed = True
        seconds = time.monotonic() - self.started
        if ok:
            end = f"{self.done[1]}，用时 {seconds:.0f} 秒" if self.zh else f"{self.done[0]} in {seconds:.0f} s"
        else:
            end = f"{seconds:.0f} 秒后中止" if self.zh else f"stopped after {seconds:.0f} s"
        if self.view is not None:
            self.view.end(f"{self._path()} {end}", ok)
        elif self.bar and self.parent is not None:
            self.clear()  # the enclosing bar is drawn again at its next stage
        else:
            self._say(self._path(), end, final=True)

    def clear(self) -> None:
        """Wipe the bar from the terminal (before other text is written there); no-op for lines."""
        if self.bar:
            _clear_bar(self.stream)

    # -- drawing
    def _count(self) -> str:
        return f"[{self.index}/{self.total if self.total is not None else '?'}]"

    def _path(self) -> str:
        """The enclosing parts, each with its stage, then this one's title."""
        outer = []
        parent = self.parent
        while parent is not None:
            outer.insert(0, f"{parent.title} {parent._count()}")
            parent = parent.parent
        return " › ".join([*outer, self.title])

    def _where(self) -> str:
        if not self.bar:
            return f"{self._path()} {self._count()}"
        done = (self.index - 1) / self.total if self.total else 0.0
        filled = round(BAR_WIDTH * min(1.0, done))
        return f"{self._path()} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self._count()[1:-1]}"

    def _say(self, where: str, what: str, final: bool = False) -> None:
        if self.silent:
            return
        seconds = time.monotonic() - self.started
        elapsed = "" if final else (f"（{seconds:.0f} 秒）" if self.zh else f" ({seconds:.0f} s)")
        text = f"{where} {what}{elapsed}"
        if self.view is not None:
            self.view.show(self.index, self.total, text)
            return
        if not self.bar:
            self._write(text + "\n")
            return
        width = shutil.get_terminal_size((100, 24)).columns - 1
        while display_width(text) > width and len(text) > 1:
            text = text[:-2] + "…"
        self._write("\r\x1b[K" + text + ("\n" if final else ""))
        _bar_drawn[0] = not final

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # stderr closed or gone: the work goes on without a word
            pass


def _clear_bar(stream) -> None:
    if _bar_drawn[0]:
        _bar_drawn[0] = False
        try:
            stream.write("\r\x1b[K")
            stream.flush()
        except (OSError, ValueError):
            pass


class _ClearBarFirst:
    """stdout while a bar is shown: each write first wipes the bar (drawn again at the next stage)."""

    def __init__(self, stream, bar_stream):
        self._stream, self._bar_stream = stream, bar_stream

    def write(self, text: str) -> int:
        _clear_bar(self._bar_stream)
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def set_notebook_view(factory) -> None:
    """Register how a notebook shows a library call's progress: ``factory()`` returns a view (an object with
    ``show(index, total, text)`` for a stage and ``end(text, ok)``) or None where it cannot show one."""
    _notebook_view[0] = factory


def library_call(title: str):
    """The progress of a long library function, a context manager: inside a command, the command's own
    progress (the function's stages are the command's); called from a notebook, a widget
    (:func:`set_notebook_view`); else silent. The function says its stages on :func:`current`."""
    if _open:
        return contextlib.nullcontext(_open[-1])
    factory = _notebook_view[0]
    view = factory() if factory is not None else None
    return Progress(title, view=view, silent=view is None)


def current() -> Progress:
    """The innermost progress open now, or a silent one (a library call, not a command)."""
    return _open[-1] if _open else Progress("", silent=True)


@contextlib.contextmanager
def stdout_to_stderr():
    """Inside, whatever is printed goes to stderr, this process's and its children's (file descriptor 1
    too): the command then prints its one JSON object to the stdout it had (``--json``)."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no file descriptors (an embedded interpreter): Python's own stream only
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)
