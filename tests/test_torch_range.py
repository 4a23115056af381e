"""The supported torch range is stated once and true: the same everywhere, and every torch.distributed
name dtlab reads exists across it."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch
import torch.distributed as dist

from dtlab.config.torch_support import TORCH_BELOW, TORCH_MIN, TORCH_SPEC, check_torch, release
from dtlab.i18n import DtlabError

ROOT = pathlib.Path(__file__).resolve().parents[1]
NEWER_THAN_THE_LOWER_BOUND = {"all_gather_single", "reduce_scatter_single"}
"""torch.distributed names of later releases: dtlab may use them only through a getattr fallback."""


def test_the_range_is_the_same_in_every_place_that_installs_or_states_it():
    for path in ("pyproject.toml", "Makefile", "binder/postBuild", "README.md"):
        text = (ROOT / path).read_text(encoding="utf-8")
        assert TORCH_SPEC in text, path
        assert "torch>=" not in text.replace(TORCH_SPEC, ""), f"{path} states another torch range"


def test_the_installed_torch_is_in_the_range_and_a_release_outside_it_is_refused(monkeypatch):
    assert TORCH_MIN <= release(torch.__version__) < TORCH_BELOW
    check_torch()
    assert release("2.13.0+cpu") == (2, 13) and release("2.6.0a0+git1234") == (2, 6)
    monkeypatch.setattr(torch, "__version__", "2.4.1")
    with pytest.raises(DtlabError) as info:
        check_torch()
    assert "2.4.1" in info.value.en and "2.4.1" in info.value.zh and TORCH_SPEC in info.value.en


def _names_read_from_dist(tree: ast.AST) -> set[str]:
    """``X`` of every ``dist.X`` (and ``torch.distributed.X``) in a module."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            value = node.value
            if isinstance(value, ast.Name) and value.id == "dist":
                names.add(node.attr)
            elif (
                isinstance(value, ast.Attribute)
                and value.attr == "distributed"
                and isinstance(value.value, ast.Name)
                and value.value.id == "torch"
            ):
                names.add(node.attr)
    return names


def test_every_torch_distributed_name_dtlab_reads_exists_from_the_lower_bound_on():
    from dtlab.course.exercises.ranks import CURRENT_NAMES

    used = set()
    for path in (ROOT / "dtlab").rglob("*.py"):
        names = _names_read_from_dist(ast.parse(path.read_text(encoding="utf-8")))
        if path.parent.name == "exercises":  # their ``dist`` is the learner's, which maps these onto any torch
            names -= set(CURRENT_NAMES)
        used |= names
    assert used, "found no torch.distributed name at all: the scan is broken"
    assert sorted(name for name in used if not hasattr(dist, name)) == []
    assert sorted(used & NEWER_THAN_THE_LOWER_BOUND) == []  # only through comm/calls.py's getattr fallback
