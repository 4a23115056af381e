"""``dtlab bench NAME``: a dtlab component beside PyTorch's built-in version of it.

Each benchmark is a module ``dtlab.bench.NAME`` with ``run(args) -> dict``:
it prints a table and returns a dict whose ``ratio`` is dtlab's figure over
PyTorch's for the headline case (time: lower is better; bandwidth: higher is
better). ``args`` carries ``json`` and ``repeats``. With ``--json`` the dict is
printed as the last line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil

from dtlab.i18n import DtlabError


def available() -> list[str]:
    """The benchmarks in this package, by name."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def main(args: argparse.Namespace) -> int:
    """Run the benchmark ``args.name``; print its dict as JSON last when ``args.json``."""
    names = available()
    if args.name not in names:
        raise DtlabError(
            f"unknown benchmark {args.name!r}; available: {', '.join(names)}",
            f"没有名为 {args.name!r} 的基准测试；可选的有：{', '.join(names)}",
        )
    repeats = getattr(args, "repeats", 3)
    if not 1 <= repeats <= 1000:
        raise DtlabError(
            f"--repeats {repeats} is not allowed; expected an integer from 1 to 1000",
            f"--repeats {repeats} 不合法；应为 1 到 1000 之间的整数",
        )
    if getattr(args, "calibrate", False) and args.name != "planner":
        raise DtlabError(
            f"--calibrate is for `dtlab bench planner` only, not {args.name!r}",
            f"--calibrate 只用于 `dtlab bench planner`，不能用于 {args.name!r}",
        )
    _check_cluster_flags(args)
    result = importlib.import_module(f"{__name__}.{args.name}").run(args)
    if args.json:
        print(json.dumps(result), flush=True)
    return 0


def _check_cluster_flags(args: argparse.Namespace) -> None:
    """``--cluster`` is allreduce's, and ``--nodes --nproc-per-node --bandwidth`` shape its cluster: a flag
    that would be ignored is refused (one not typed is None, see dtlab/cluster/cli.py)."""
    from dtlab.cluster.cli import given_spec_flags

    cluster, given = getattr(args, "cluster", False), given_spec_flags(args)
    if cluster and args.name != "allreduce":
        raise DtlabError(
            f"--cluster is for `dtlab bench allreduce` only, not {args.name!r}",
            f"--cluster 只用于 `dtlab bench allreduce`，不能用于 {args.name!r}",
        )
    if given and not cluster:
        flags = ", ".join(given)
        raise DtlabError(
            f"{flags} without --cluster: only `dtlab bench allreduce --cluster` builds a local "
            f"cluster for them to shape (allowed: add --cluster to `dtlab bench allreduce`, "
            f"or leave {flags} out)",
            f"{flags} 未与 --cluster 同时使用：只有 `dtlab bench allreduce --cluster` 会建立由它们设置的"
            f"本地集群（允许：在 `dtlab bench allreduce` 中加上 --cluster，或去掉 {flags}）",
        )
