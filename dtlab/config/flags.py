"""``dtlab train``'s flags, derived from TrainConfig's fields: one flag per field.

A field such as ``micro_batches: int = 1`` with the docstring under it becomes
``--micro-batches MICRO_BATCHES``, its help that docstring and the default,
then " / " and the field's Chinese from dtlab/config/help_zh.py, and its
default the field's. A ``Literal`` field shows its choices (``--schedule gpipe|1f1b``); a
``bool`` field is a switch (``--recompute``); the field's metadata renames a
flag, leaves it out, or parses its text (dtlab/config/train_config.py lists the keys).
So a new training option is written once, in ``TrainConfig``.

argparse does not enforce the choices: ``TrainConfig.validate()`` refuses a
bad value in English and Chinese, the same way for the command line, Python
and the control panel. Two flags are about the command rather than the job,
so they are not fields: ``--deepspeed-config`` and ``--json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import types
import typing

from dtlab.config import TrainConfig, field_types
from dtlab.config.field_docs import field_docs
from dtlab.config.help_zh import HELP_ZH
from dtlab.i18n import DtlabError

COMMAND_FLAGS: tuple[tuple[str, dict], ...] = (
    (
        "--deepspeed-config",
        dict(
            default=None,
            metavar="FILE",
            help=(
                "Read batch sizes (and, without --dp, the data-parallel degree), ZeRO, offload, "
                "precision, the optimizer's params, gradient_clipping and the scheduler from a DeepSpeed "
                "ds_config.json; the other flags give the rest, and every key not acted on is listed / "
                "从 DeepSpeed 的 ds_config.json 读取 batch 大小（未给 --dp 时还有数据并行度）、ZeRO、卸载、精度、"
                "优化器参数、gradient_clipping 和学习率调度；其余由别的参数给出，没有用到的键会逐一列出"
            ),
        ),
    ),
    (
        "--json",
        dict(
            action="store_true",
            help=(
                "Print one JSON object per line: one line per step, then the summary / "
                "每行输出一个 JSON 对象：每步一行，最后是汇总"
            ),
        ),
    ),
)


def flag_name(option: dataclasses.Field) -> str | None:
    """``--micro-batches`` for ``micro_batches``, or the metadata's ``flag`` (None: no flag)."""
    return option.metadata.get("flag", "--" + option.name.replace("_", "-"))


def train_options() -> list[dataclasses.Field]:
    """The fields of TrainConfig that ``dtlab train`` takes as flags, in declaration order."""
    return [option for option in dataclasses.fields(TrainConfig) if flag_name(option)]


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field (DESIGN.md's public contract), then the command's own."""
    docs = field_docs(TrainConfig)
    for option in train_options():
        text = _help(docs.get(option.name, ""), option.default, HELP_ZH.get(option.name))
        action = parser.add_argument(flag_name(option), dest=option.name, help=text, **_kind(option))
        action.__class__ = _noting_given(type(action))
    for flag, kwargs in COMMAND_FLAGS:
        parser.add_argument(flag, **kwargs)


GIVEN = "given_options"
"""The attribute of the parsed namespace listing the fields whose flag was typed."""


def given_options(args: argparse.Namespace) -> frozenset[str]:
    """The TrainConfig fields whose flag was on the command line (a default is not a choice:
    ``--deepspeed-config`` infers ``dp`` only when ``--dp`` was not given)."""
    return frozenset(getattr(args, GIVEN, ()))


@functools.cache
def _noting_given(action_class: type) -> type:
    """``action_class`` that also adds its field's name to the namespace's :data:`GIVEN` set."""

    def __call__(self, parser, namespace, values, option_string=None):
        action_class.__call__(self, parser, namespace, values, option_string)
        setattr(namespace, GIVEN, given_options(namespace) | {self.dest})

    return type(action_class.__name__, (action_class,), {"__call__": __call__})


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig the parsed flags describe (not yet validated)."""
    return TrainConfig(**{option.name: getattr(args, option.name) for option in train_options()})


def _kind(option: dataclasses.Field) -> dict:
    """argparse's ``type`` or ``action``, ``default`` and ``metavar`` for one field."""
    value_type = _value_type(option.name)
    if value_type is bool:
        action = argparse.BooleanOptionalAction if option.default else "store_true"
        return {"action": action, "default": option.default}
    parse = option.metadata.get("parse")
    if parse is None and value_type not in (int, float, str):
        raise TypeError(f"TrainConfig.{option.name}: a {value_type} needs a 'parse' in its metadata")
    allowed = TrainConfig.choices(option.name)
    metavar = option.metadata.get("metavar") or ("|".join(map(str, allowed)) if allowed else None)
    return {"type": _reporting(parse) if parse else value_type, "default": option.default, "metavar": metavar}


def _value_type(name: str) -> type:
    """``int`` for ``int | None``, ``str`` for ``Literal['gpipe', '1f1b']``, ``int`` for ``Literal[0, 1]``."""
    hint = field_types(TrainConfig)[name]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    if typing.get_origin(hint) is typing.Literal:
        return type(typing.get_args(hint)[0])
    return hint


def _help(doc: str, default, chinese: str | None) -> str:
    """The docstring on one line, plus the default when there is one worth showing, then " / " and the
    Chinese (English only where a field has none: tests/test_cli_help.py refuses that)."""
    text = " ".join(doc.replace("``", "").split())
    if default is not None and default is not False:
        text += f" (default: {default})"
    if chinese:
        text += f" / {chinese}"
    return text.replace("%", "%%")  # argparse formats help with %


def _reporting(parse):
    """``parse`` as an argparse type: its bilingual error becomes the usage error's text."""

    def convert(text: str):
        try:
            return parse(text)
        except DtlabError as error:
            raise argparse.ArgumentTypeError(f"{error.en}\n{error.zh}") from error  # see dtlab.config.command_line

    convert.__name__ = parse.__name__
    return convert
