"""The ``dtlab`` command: ``train``, ``plan``, ``bench``, ``lab``, ``glossary``, ``progress``."""
from __future__ import annotations

import argparse
import os
import sys

from dtlab.config_flags import add_train_arguments, config_from_args  # noqa: F401 - re-exported
from dtlab.i18n import DtlabError, get_language


def run_lab(args: argparse.Namespace) -> int:
    """Open JupyterLab on the lessons (headless-friendly: prints the URL)."""
    import subprocess

    notebooks = args.notebooks or _find_notebooks()
    cmd = [sys.executable, "-m", "jupyter", "lab", f"--notebook-dir={notebooks}",
           f"--ip={args.ip}", f"--port={args.port}"]
    if args.no_browser:
        cmd.append("--no-browser")
    env = dict(os.environ)
    if args.solutions:  # instructor mode: the lessons show and grade dtlab's reference solutions
        env["DTLAB_SOLUTIONS"] = "1"
        print("dtlab lab: instructor mode, solutions shown / 教师模式：显示参考答案")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    print(f"dtlab lab: serving {notebooks} — JupyterLab prints the URL (with its token) below.")
    return subprocess.call(cmd, env=env)


def _find_notebooks() -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    candidate = os.path.join(here, "notebooks")
    return candidate if os.path.isdir(candidate) else os.getcwd()


def run_bench(args: argparse.Namespace) -> int:
    from dtlab import bench

    return bench.main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dtlab", description="Learn distributed training by running it.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_arguments(sub.add_parser("train", help="train the small GPT on local ranks"))
    lab = sub.add_parser("lab", help="open JupyterLab on the lessons")
    lab.add_argument("--notebooks", default=None)
    lab.add_argument("--ip", default="127.0.0.1")
    lab.add_argument("--port", default="8888")
    lab.add_argument("--no-browser", action="store_true")
    lab.add_argument("--solutions", action="store_true",
                     help="instructor mode: show and grade the exercises' reference solutions")
    bench = sub.add_parser("bench", help="dtlab beside PyTorch's built-ins")
    bench.add_argument("name", help="pool | allreduce | dp | zero")
    bench.add_argument("--json", action="store_true")
    bench.add_argument("--repeats", type=int, default=3)
    from dtlab.cluster.cli import add_cluster_arguments, add_spec_arguments
    bench.add_argument("--cluster", action="store_true", help="allreduce across namespace nodes (root)")
    add_spec_arguments(bench)
    add_cluster_arguments(sub.add_parser("cluster", help="torchrun on N network-namespace nodes (root)"))
    try:
        from dtlab.planner.cli import add_plan_arguments
        add_plan_arguments(sub.add_parser("plan", help="the analytical planner (no processes)"))
    except ImportError:
        pass
    try:
        from dtlab.course.glossary_cli import add_glossary_arguments
        add_glossary_arguments(sub.add_parser("glossary", help="bilingual glossary"))
    except ImportError:
        pass
    from dtlab.course.exercises.report import add_progress_arguments
    add_progress_arguments(sub.add_parser(
        "progress", help="your predictions and exercises per lesson / 每课的预测与练习进度"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "train":
            from dtlab.train.command import run_train

            return run_train(args)
        if args.command == "lab":
            return run_lab(args)
        if args.command == "bench":
            return run_bench(args)
        if args.command == "cluster":
            from dtlab.cluster.cli import run_cluster
            return run_cluster(args)
        if args.command == "plan":
            from dtlab.planner.cli import run_plan
            return run_plan(args)
        if args.command == "progress":
            from dtlab.course.exercises.report import run_progress
            return run_progress(args)
        if args.command == "glossary":
            from dtlab.course.glossary_cli import run_glossary
            return run_glossary(args)
    except DtlabError as error:
        print(f"dtlab: {error.en}\ndtlab: {error.zh}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dtlab: interrupted; every rank was ended / 已中断，所有 rank 均已结束", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
