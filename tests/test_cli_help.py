"""Every help text of the ``dtlab`` command is bilingual: "English / 中文", as its errors are.

The walk covers every subcommand's parser (``dtlab cluster run`` too), every
option and positional argument, argparse's own ``-h``, the section titles and
the descriptions. ``dtlab train``'s help comes from TrainConfig: the English
from each field's docstring, the Chinese from dtlab/config/help_zh.py, so a new
field with a flag and no Chinese entry fails here.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import unicodedata

import pytest

from dtlab.cli import build_parser
from dtlab.config import TrainConfig
from dtlab.config.command_line import wrap_columns
from dtlab.config.flags import flag_name
from dtlab.config.help_zh import HELP_ZH

CJK = re.compile(r"[\u4e00-\u9fff]")


def _parsers(parser: argparse.ArgumentParser, name: str = "dtlab"):
    """``(name, parser)`` for ``parser`` and every subcommand's parser under it, depth first."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, subparser in action.choices.items():
                yield from _parsers(subparser, f"{name} {command}")


def _english_only(parser: argparse.ArgumentParser) -> list[str]:
    """What in one parser's help has no Chinese: options, subcommands, section titles, the description."""
    missing = []
    for action in parser._actions:
        shown = [action] + list(getattr(action, "_choices_actions", []))  # a subcommand's one-line help
        for item in shown:
            if item.help != argparse.SUPPRESS and not CJK.search(item.help or ""):
                missing.append("/".join(item.option_strings) or item.dest or item.metavar)
    for group in parser._action_groups:
        if group._group_actions and not CJK.search(group.title or ""):
            missing.append(f"section {group.title!r}")
    if parser.description and not CJK.search(parser.description):
        missing.append("description")
    return missing


PARSERS = dict(_parsers(build_parser()))


def test_the_walk_reaches_every_subcommand():
    expected = {"train", "lab", "bench", "cluster", "plan", "calibrate", "glossary", "progress"}
    assert {name.split()[1] for name in PARSERS if " " in name} == expected
    assert "dtlab cluster run" in PARSERS


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_option_of_every_command_has_chinese_help(name):
    assert _english_only(PARSERS[name]) == [], f"{name}: help in English only"


def test_python_m_dtlab_train_is_bilingual_too(capsys):
    from dtlab.train.command import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "Train the small GPT" in out and "训练小 GPT" in out


def test_every_train_flag_has_a_chinese_entry_and_no_entry_is_stale():
    flagged = {option.name for option in dataclasses.fields(TrainConfig) if flag_name(option)}
    assert sorted(flagged - set(HELP_ZH)) == [], "TrainConfig fields with a flag but no HELP_ZH entry"
    assert sorted(set(HELP_ZH) - flagged) == [], "HELP_ZH entries for no flag of dtlab train"
    assert [name for name, text in HELP_ZH.items() if not CJK.search(text)] == []


def test_train_help_is_english_then_chinese():
    actions = {action.dest: action for action in PARSERS["dtlab train"]._actions}
    english, chinese = actions["tp"].help.split(" / ")
    assert english == "Tensor-parallel degree. 1 means disabled. (default: 1)"
    assert chinese == HELP_ZH["tp"] and "张量并行" in chinese
    assert "数据并行" in actions["dp"].help and "微批次" in actions["micro_batches"].help
    assert "梯度累积" in actions["grad_accum"].help and "激活重计算" in actions["recompute"].help


def test_a_field_without_chinese_is_caught(monkeypatch):
    monkeypatch.delitem(HELP_ZH, "dp")
    train = dict(_parsers(build_parser()))["dtlab train"]
    assert _english_only(train) == ["--dp"]


def _columns(line: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in line)


def test_help_wraps_chinese_by_the_columns_it_takes(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    for name in ("dtlab train", "dtlab plan", "dtlab lab"):
        text = PARSERS[name].format_help()
        assert CJK.search(text)
        wide = [line for line in text.splitlines() if _columns(line) > 80]
        assert wide == [], (name, wide)


def test_wrap_columns_keeps_every_character_and_its_punctuation():
    text = (
        "Megatron sequence parallelism (needs tp > 1) / Megatron 序列并行（需要 tp > 1）：LayerNorm、dropout 和残差连接"
    )
    for width in (12, 20, 33, 57):
        lines = wrap_columns(text, width)
        assert all(_columns(line) <= width for line in lines), (width, lines)
        assert "".join(lines).replace(" ", "") == text.replace(" ", "")
        assert not any(line[0] in "，。、；：）" or line[-1] == "（" for line in lines), lines
