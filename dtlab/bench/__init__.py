"""``dtlab bench NAME``: a dtlab component beside PyTorch's built-in version of it.

Each benchmark is a module ``dtlab.bench.NAME`` with ``run(args) -> dict``:
it prints a table and returns a dict whose ``ratio`` is dtlab's figure over
PyTorch's for the headline case (time: lower is better; bandwidth: higher is
better). ``args`` carries ``json``, ``repeats`` and ``quick``. With ``--json`` the dict is
printed alone on stdout (the tables go to stderr), and ``--out FILE`` writes it to FILE too.

While it measures, a benchmark names each stage on stderr
(:mod:`dtlab.config.command_progress`: ``current().stage(english, chinese)``).
``dtlab bench all`` runs every one of them (:mod:`dtlab.bench._all`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import pkgutil

from dtlab.config.command_progress import Progress, stdout_to_stderr
from dtlab.i18n import DtlabError

QUICK_REPEATS = 1
"""``--quick``: timed repeats per case (unless ``--repeats`` is given), and each bench's own short form."""


def available() -> list[str]:
    """The benchmarks in this package, by name."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def add_bench_arguments(bench: argparse.ArgumentParser) -> None:
    """The flags of ``dtlab bench NAME``."""
    bench.add_argument("name", help=" | ".join([*available(), "all"]) + " / 要运行的基准测试（all：全部）")
    bench.add_argument(
        "--json",
        action="store_true",
        help="print the result as one JSON object, alone on stdout (tables on stderr) / "
        "把结果作为一个 JSON 对象单独输出到 stdout（表格输出到 stderr）",
    )
    bench.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"timed repeats per case, 1 to 1000 (default 3; {QUICK_REPEATS} with --quick) / 每种情形计时的重复次数",
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help="fewer repeats and a shorter calibration, the same cases (for a short visit to a machine) / "
        "减少重复次数、缩短校准，情形不变（适合在一台机器上短暂测量）",
    )
    bench.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="also write the result (JSON) to FILE / 同时把结果（JSON）写入 FILE",
    )
    from dtlab.cluster.cli import add_spec_arguments

    bench.add_argument(
        "--cluster",
        action="store_true",
        help="allreduce across namespace nodes (root or user namespaces) / "
        "在网络命名空间节点之间做全归约（需要 root 或用户命名空间）",
    )
    bench.add_argument(
        "--calibrate",
        action="store_true",
        help="planner: run dtlab calibrate first on the same ranks (saves the profile as it does; "
        "`all` always does) / planner：先在同样的 rank 上运行 dtlab calibrate（并像它一样保存测量结果；all 总是如此）",
    )
    add_spec_arguments(bench)


def main(args: argparse.Namespace) -> int:
    """Run the benchmark ``args.name`` (or ``all``); print its dict as JSON, alone on stdout, when
    ``args.json``; write it to ``args.out`` when given. ``all``: 1 when a benchmark failed."""
    names = available()
    if args.name not in names and args.name != "all":
        raise DtlabError(
            f"unknown benchmark {args.name!r}; available: {', '.join(names)}, all",
            f"没有名为 {args.name!r} 的基准测试；可选的有：{', '.join(names)}, all",
        )
    if getattr(args, "repeats", None) is None:  # not typed: the default, or --quick's
        args.repeats = QUICK_REPEATS if getattr(args, "quick", False) else 3
    repeats = args.repeats
    if not 1 <= repeats <= 1000:
        raise DtlabError(
            f"--repeats {repeats} is not allowed; expected an integer from 1 to 1000",
            f"--repeats {repeats} 不合法；应为 1 到 1000 之间的整数",
        )
    if getattr(args, "calibrate", False) and args.name not in ("planner", "all"):
        raise DtlabError(
            f"--calibrate is for `dtlab bench planner` only, not {args.name!r}",
            f"--calibrate 只用于 `dtlab bench planner`，不能用于 {args.name!r}",
        )
    _check_cluster_flags(args)
    out = getattr(args, "out", None)
    if out is not None:
        from dtlab.config.output_paths import check_output_file

        check_output_file("--out", out)  # before minutes of measuring, not after them
    with stdout_to_stderr() if args.json else contextlib.nullcontext():
        if args.name == "all":
            from dtlab.bench._all import run_all

            result = run_all(args, names, run_one)
        else:
            result = run_one(args.name, args, title=f"dtlab bench {args.name}")
    if args.json:
        print(json.dumps(result), flush=True)
    if out is not None:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 1 if result.get("failed") else 0


def run_one(name: str, args: argparse.Namespace, *, title: str | None = None) -> dict:
    """The benchmark ``name``'s ``run(args)``, its stages said on stderr under ``title`` (default: ``name``)."""
    with Progress(title or name) as progress:
        progress.stage("loading the benchmark (torch)", "加载基准测试（导入 torch）")
        return importlib.import_module(f"{__name__}.{name}").run(args)


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
