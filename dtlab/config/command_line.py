"""How every dtlab command reads its arguments and ends: in both languages, and never with a traceback for bad input.

:class:`Parser` is argparse's parser with two changes, used by ``dtlab`` and
all its subcommands (and ``python -m dtlab.train``):

* its errors ("invalid int value", "unrecognized arguments", ...) are printed
  in English and Simplified Chinese, the bad value named, exit code 2;
* its own help texts (``-h``, the section titles) are in both languages too,
  as every option's help is ("English / 中文": tests/test_cli_help.py);
* abbreviations are off (``allow_abbrev=False``): argparse would otherwise
  accept ``--sp`` for ``--spike`` until a ``--sp`` option exists, so a new
  option could silently change what an old command line means.

:func:`run_command` runs a command's function and turns how it can end into
an exit code and a message in both languages: a :class:`DtlabError` (bad
input, a failed rank) is 2; Ctrl-C (SIGINT), SIGTERM and SIGHUP end every
rank through the same path as an interrupt, 128 + the signal's number; a
reader that closes the pipe early (``dtlab glossary | head -1``) ends the
command quietly, as it would any Unix tool (141, SIGPIPE's). Anything else is
a bug in dtlab and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from typing import Callable

from dtlab.i18n import DtlabError, display_width

_TYPES_ZH = {"int": "整数", "float": "数字"}
_ZH = [
    (r"unrecognized arguments: (.*)", lambda m: f"无法识别的参数：{m[1]}"),
    (
        r"argument (\S+): invalid (\w+) value: (.*)",
        lambda m: f"参数 {m[1]} 的值 {m[3]} 无效（应为{_TYPES_ZH.get(m[2], m[2])}）",
    ),
    (
        r"argument (\S+): invalid choice: (.*?) \(choose from (.*)\)",
        lambda m: f"参数 {m[1]} 的取值 {m[2]} 无效（可选：{m[3]}）",
    ),
    (r"the following arguments are required: (.*)", lambda m: f"缺少必需的参数：{m[1]}"),
    (r"argument (\S+): expected one argument", lambda m: f"参数 {m[1]} 需要一个值"),
    (r"argument (\S+): expected (.*) arguments?", lambda m: f"参数 {m[1]} 的值的个数不对"),
    (r"argument (\S+): ignored explicit argument (.*)", lambda m: f"参数 {m[1]} 不接受值 {m[2]}"),
    (r"argument (\S+): not allowed with argument (\S+)", lambda m: f"参数 {m[1]} 不能与 {m[2]} 同时使用"),
    (r"ambiguous option: (\S+) could match (.*)", lambda m: f"选项 {m[1]} 有歧义，可能是：{m[2]}"),
]


def translate(message: str) -> tuple[str, str]:
    """argparse's error ``message`` as (English, Chinese).

    A type converter that raised a :class:`DtlabError` already carries its
    Chinese after the first line (``argument --straggler: EN\\nZH``).
    """
    first, _, chinese = message.partition("\n")
    if chinese:
        argument = re.match(r"argument (\S+): ", first)
        return first, (f"参数 {argument[1]}：" if argument else "") + chinese
    for pattern, zh in _ZH:
        match = re.fullmatch(pattern, message, flags=re.DOTALL)
        if match:
            return message, zh(match)
    return message, f"命令行参数有误：{message}"


_CJK = "\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef"  # CJK characters, fullwidth punctuation
_OPENING, _CLOSING = "（「『", "，。、；：）！？」』"
_TOKENS = re.compile(rf"\s+|[{_OPENING}]*(?:[{_CJK}]|[^\s{_CJK}]+)[{_CLOSING}]*")


def wrap_columns(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` terminal columns (a long word may exceed it): a Chinese
    character counts two and a line may break between two of them, as Chinese has no spaces (textwrap,
    which argparse uses, breaks only at spaces and counts characters). Punctuation stays with the
    character it opens or closes."""
    lines, line, used, space = [], "", 0, False
    for token in _TOKENS.findall(text):
        if token.isspace():
            space = True
            continue
        size = display_width(token)
        gap = " " if space and line else ""
        if line and used + len(gap) + size > width:
            lines.append(line)
            line, used, gap = "", 0, ""
        line, used, space = line + gap + token, used + len(gap) + size, False
    return lines + [line] if line else lines


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help layout, wrapping English and Chinese text by the columns it takes (:func:`wrap_columns`)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return wrap_columns(" ".join(text.split()), width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(indent + line for line in wrap_columns(" ".join(text.split()), width - len(indent)))


HELP_HELP = "show this help message and exit / 显示本帮助信息并退出"


class Parser(argparse.ArgumentParser):
    """argparse's parser with bilingual errors and help, and no abbreviated options (see the module docstring)."""

    def __init__(self, *args, add_help: bool = True, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, add_help=False, **kwargs)
        self._positionals.title = "positional arguments / 位置参数"
        self._optionals.title = "options / 选项"
        if add_help:  # argparse's own -h, with its help in both languages
            self.add_argument("-h", "--help", action="help", default=argparse.SUPPRESS, help=HELP_HELP)

    def error(self, message: str):
        en, zh = translate(message)
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {en}\n{self.prog}: 错误：{zh}\n")


def count(flag: str, low: int = 1, high: int = 10**9):
    """An argparse ``type``: an integer from ``low`` to ``high``, refused in both languages otherwise.

    ``high`` keeps a typo of many digits from becoming a number no one meant.
    """

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{flag} {text!r} is not allowed; expected an integer from "
                f"{low} to {high}\n{flag} {text!r} 不合法；应为 {low} 到 "
                f"{high} 之间的整数"
            )
        return value

    convert.__name__ = "count"
    return convert


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the command is, so that it unwinds (and ends its ranks) as Ctrl-C does."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum, frame):
    raise Stopped(signum)


def run_command(command: Callable[[], int]) -> int:
    """Run ``command()``; every way a command can end becomes an exit code and a bilingual line."""
    handled = [s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    previous = {}
    try:
        for signum in handled:
            previous[signum] = signal.signal(signum, _raise_stopped)
    except ValueError:  # not the main thread: leave signals alone
        pass
    try:
        return command()
    except DtlabError as error:
        print(f"dtlab: {error.en}\ndtlab: {error.zh}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        signum = interrupt.signum if isinstance(interrupt, Stopped) else signal.SIGINT
        name = signal.Signals(signum).name
        print(
            f"dtlab: interrupted by {name}; every rank was ended / 已中断（{name}），所有 rank 均已结束",
            file=sys.stderr,
        )
        return 128 + signum
    except BrokenPipeError:
        # The reader went away. Point stdout at /dev/null so that Python's own
        # flush at exit does not fail again, and end quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + getattr(signal, "SIGPIPE", 13)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
