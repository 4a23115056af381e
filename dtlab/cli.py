"""The ``dtlab`` command: ``train``, ``plan``, ``calibrate``, ``bench``, ``lab``, ``glossary``, ``progress``."""

from __future__ import annotations

import argparse
import os
import sys

from dtlab.config.command_line import Parser, run_command
from dtlab.config.flags import add_train_arguments, config_from_args  # noqa: F401 - re-exported
from dtlab.i18n import ConfigError, DtlabError, get_language  # noqa: F401 - DtlabError: what run_command reports


def run_lab(args: argparse.Namespace) -> int:
    """Open JupyterLab on the lessons (headless-friendly: prints the URL)."""
    import subprocess

    _check_lab_arguments(args, args.ip, args.port)  # before the workspace is written
    notebooks = args.notebooks or _learner_notebooks(args)
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        f"--notebook-dir={notebooks}",
        f"--ip={args.ip}",
        f"--port={args.port}",
    ]
    if args.no_browser:
        cmd.append("--no-browser")
    from dtlab.launch.resources import is_loopback

    if not (is_loopback(args.ip) or args.ip == "localhost"):
        print(
            f"dtlab lab: --ip {args.ip} serves JupyterLab beyond this machine (only its token protects it); "
            "the default, 127.0.0.1, serves this machine only"
        )
        print(
            f"dtlab lab：--ip {args.ip} 会让本机以外的机器也能访问 JupyterLab（只靠 token 保护）；"
            "默认的 127.0.0.1 只对本机开放"
        )
    env = dict(os.environ)
    if args.solutions:  # instructor mode: the lessons show and grade dtlab's reference solutions
        env["DTLAB_SOLUTIONS"] = "1"
        print("dtlab lab: instructor mode, solutions shown / 教师模式：显示参考答案")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    print(f"dtlab lab: serving {notebooks} — JupyterLab prints the URL (with its token) below.")
    return subprocess.call(cmd, env=env)


def _check_lab_arguments(args: argparse.Namespace, ip: str, port: str) -> None:
    """Refuse, before JupyterLab starts, what it would only fail on later (or misread)."""
    import ipaddress
    import re

    from dtlab.course.exercises.progress import check_home

    check_home()  # DTLAB_HOME: where the learner's progress goes, refused now rather than at the first check
    notebooks = args.notebooks
    if (notebooks or args.reference) and (args.reset or args.workspace):
        given = "--notebooks" if notebooks else "--reference"
        raise ConfigError(
            f"--reset and --workspace apply to your copy of the lessons, not to {given}; allowed: one or the other",
            f"--reset 和 --workspace 作用于你的课程副本，不能与 {given} 同时使用；只能二选一",
        )
    if notebooks is not None and not os.path.isdir(notebooks):
        raise ConfigError(
            f"--notebooks {notebooks!r} is not allowed; expected an existing directory",
            f"--notebooks {notebooks!r} 不合法；应为已存在的目录",
        )
    try:
        ipaddress.ip_address(ip)
    except ValueError:
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?", ip):
            raise ConfigError(
                f"--ip {ip!r} is not allowed; expected an IP address (127.0.0.1, the "
                f"default, serves this machine only) or a host name",
                f"--ip {ip!r} 不合法；应为 IP 地址（默认 127.0.0.1，只对本机开放）或主机名",
            ) from None
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):  # not '²', which isdigit() takes
        raise ConfigError(
            f"--port {port!r} is not allowed; expected a port number from 1 to 65535",
            f"--port {port!r} 不合法；应为 1 到 65535 之间的端口号",
        )


def _learner_notebooks(args: argparse.Namespace) -> str:
    """The lessons as run when built (``--reference``), or the learner's copy with no outputs (the default)."""
    from dtlab.course import workspace

    if args.reference:
        return str(workspace.lessons_dir())
    where = workspace.workspace_dir(args.workspace)
    written = workspace.prepare(where, reset=tuple(args.reset))
    print(
        f"dtlab lab: your copy of the lessons, outputs cleared, is {where} ({len(written)} copied now; "
        "a lesson already there is never overwritten: --reset NN copies it afresh)"
    )
    print(
        f"dtlab lab：你的课程副本（已清除输出）在 {where}（本次复制 {len(written)} 课；"
        "已有的课程不会被覆盖：用 --reset NN 重新复制）"
    )
    return str(where)


def run_bench(args: argparse.Namespace) -> int:
    from dtlab import bench

    return bench.main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="dtlab", description="Learn distributed training by running it. / 动手运行，学习分布式训练。")
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        help="dtlab COMMAND --help describes each / 用 dtlab COMMAND --help 查看各子命令的说明",
    )
    add_train_arguments(
        sub.add_parser("train", help="train the small GPT on local ranks / 在本机的多个 rank 上训练小 GPT")
    )
    _add_lab_arguments(sub.add_parser("lab", help="open JupyterLab on the lessons / 用 JupyterLab 打开课程"))
    from dtlab.bench import add_bench_arguments
    from dtlab.cluster.cli import add_cluster_arguments

    add_bench_arguments(
        sub.add_parser("bench", help="dtlab beside PyTorch's built-ins / dtlab 的实现与 PyTorch 内置实现对照")
    )
    add_cluster_arguments(
        sub.add_parser(
            "cluster",
            help="torchrun on N network-namespace nodes (root or user namespaces) / "
            "在 N 个网络命名空间节点上运行 torchrun（需要 root 或用户命名空间）",
        )
    )
    try:
        from dtlab.planner.cli import add_plan_arguments

        add_plan_arguments(
            sub.add_parser("plan", help="the analytical planner (no processes) / 解析式规划器（不启动进程）")
        )
    except ImportError:
        pass
    from dtlab.planner.calibrate import add_calibrate_arguments

    add_calibrate_arguments(
        sub.add_parser(
            "calibrate", help="measure this machine's FLOP/s and links for plan --gpu local / 测量本机算力与链路"
        )
    )
    try:
        from dtlab.course.glossary_cli import add_glossary_arguments

        add_glossary_arguments(sub.add_parser("glossary", help="bilingual glossary / 中英双语术语表"))
    except ImportError:
        pass
    from dtlab.course.exercises.report import add_progress_arguments

    add_progress_arguments(
        sub.add_parser("progress", help="your predictions and exercises per lesson / 每课的预测与练习进度")
    )
    return parser


def _add_lab_arguments(lab: argparse.ArgumentParser) -> None:
    """The flags of ``dtlab lab``."""
    lab.add_argument(
        "--notebooks", default=None, help="serve this directory as it is / 直接打开这个目录（不复制到工作区）"
    )
    lab.add_argument(
        "--workspace",
        default=None,
        help="where your copy of the lessons lives (default: $DTLAB_WORKSPACE or ~/dtlab-lessons) / "
        "你的课程副本所在的目录",
    )
    lab.add_argument(
        "--reset",
        action="append",
        default=[],
        metavar="LESSON",
        help="copy this lesson (a number such as 03) into the workspace afresh; repeatable / "
        "把这一课（如 03）重新复制到工作区，覆盖你的副本；可重复使用",
    )
    lab.add_argument(
        "--reference",
        action="store_true",
        help="serve the lessons as stored, with the outputs of the run that built them / "
        "打开仓库中保存的课程，带有构建时运行得到的输出",
    )
    lab.add_argument(
        "--ip",
        default="127.0.0.1",
        help="the address to serve on (default: 127.0.0.1, this machine only) / "
        "JupyterLab 监听的地址（默认只对本机开放）",
    )
    lab.add_argument("--port", default="8888", help="the port to serve on (default: 8888) / JupyterLab 的端口")
    lab.add_argument("--no-browser", action="store_true", help="do not open a web browser / 不自动打开浏览器")
    lab.add_argument(
        "--solutions",
        action="store_true",
        help="instructor mode: show and grade the exercises' reference solutions / "
        "教师模式：显示练习的参考答案，并用它评分",
    )


def main(argv: list[str] | None = None) -> int:
    """``dtlab COMMAND ...``: the exit code (2 for bad input, 128 + N after signal N; see dtlab/config/command_line.py)."""
    args = build_parser().parse_args(argv)
    return run_command(lambda: _dispatch(args))


def _dispatch(args: argparse.Namespace) -> int:
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
    if args.command == "calibrate":
        from dtlab.planner.calibrate import run_calibrate

        return run_calibrate(args)
    if args.command == "progress":
        from dtlab.course.exercises.report import run_progress

        return run_progress(args)
    if args.command == "glossary":
        from dtlab.course.glossary_cli import run_glossary

        return run_glossary(args)
    return 1


if __name__ == "__main__":
    sys.exit(main())
