"""``dtlab cluster run --nodes N --nproc-per-node K [--bandwidth RATE] -- train ...``, and ``dtlab cluster check``."""

from __future__ import annotations

import argparse
import itertools
import json
import signal

from dtlab.cluster.spec import ClusterSpec
from dtlab.config.command_progress import Progress


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``cluster`` subcommand's flags (``dtlab cluster run ...``)."""
    sub = parser.add_subparsers(dest="cluster_command", required=True, help="the cluster's command / 集群子命令")
    run = sub.add_parser(
        "run",
        help="run a command on N namespace nodes (iproute2; root or user namespaces) / "
        "在 N 个网络命名空间节点上运行命令（需要 iproute2，以及 root 或用户命名空间）",
    )
    add_spec_arguments(run)
    run.add_argument(
        "job",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND",
        help="after --: train and its flags, as for `dtlab train` / "
        "写在 -- 之后：train 及其参数，与 `dtlab train` 的相同",
    )
    sub.add_parser(
        "check",
        help="whether this machine can build namespace nodes with shaped links, and how "
        "(exit 0), or why not (exit 1) / 本机能否搭建带限速链路的命名空间节点、用哪种方式"
        "（退出码 0），或者为什么不能（退出码 1）",
    )


SPEC_FLAGS = {"nodes": "--nodes", "nproc_per_node": "--nproc-per-node", "bandwidth": "--bandwidth"}
"""The ClusterSpec fields ``dtlab cluster run`` and ``dtlab bench allreduce --cluster`` take, and their flags."""


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    """``--nodes --nproc-per-node --bandwidth``, shared with ``dtlab bench allreduce --cluster``.

    Each defaults to None, meaning not given: :func:`spec_from_args` then takes ClusterSpec's default,
    and ``dtlab bench`` can tell a flag typed without ``--cluster`` from one left alone.
    """
    defaults = ClusterSpec()
    parser.add_argument(
        "--nodes",
        type=int,
        default=None,
        help=f"nodes (network namespaces), 1-8 (default: {defaults.nodes}) / 节点数（每个节点是一个网络命名空间）",
    )
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        help=f"ranks per node (default: {defaults.nproc_per_node}) / 每个节点上的 rank 数",
    )
    parser.add_argument(
        "--bandwidth",
        default=None,
        metavar="RATE",
        help="each node's link rate per direction, e.g. 100mbit, 1gbit, 50MB/s "
        "(default: unshaped) / 每个节点链路的单向速率，例如 100mbit、1gbit、50MB/s（默认不限速）",
    )


def given_spec_flags(args: argparse.Namespace) -> list[str]:
    """The flags of :data:`SPEC_FLAGS` that were typed (a value other than None), with their values
    (``["--nodes 3"]``)."""
    return [
        f"{flag} {getattr(args, name)}" for name, flag in SPEC_FLAGS.items() if getattr(args, name, None) is not None
    ]


def spec_from_args(args: argparse.Namespace, **defaults) -> ClusterSpec:
    """The validated ClusterSpec the flags describe; a flag not given takes ``defaults``' value, else
    ClusterSpec's own default."""
    given = {name: getattr(args, name) for name in SPEC_FLAGS if getattr(args, name, None) is not None}
    return ClusterSpec(**{**defaults, **given}).validate()


def _raise_interrupt(signum, frame):
    from dtlab.config.command_line import Stopped

    raise Stopped(signum)  # a KeyboardInterrupt that remembers the signal: exit code 128 + signum


def check_cluster() -> int:
    """``dtlab cluster check``: can nodes with shaped links be built here, as root or in a user namespace?"""
    from dtlab.cluster.spec import build_way, unavailable_reason

    reason = unavailable_reason(shaped=True)
    if reason is not None:
        print(f"no: {reason[0]}\n不能：{reason[1]}")
        return 1
    en, zh = build_way()
    print(f"yes: {en}\n可以：{zh}")
    return 0


def run_cluster(args: argparse.Namespace) -> int:
    """Run the command on the cluster, printing records as ``dtlab train`` does; teardown always."""
    from dtlab.cluster.launcher import start

    if args.cluster_command == "check":
        return check_cluster()
    command = args.job[1:] if args.job[:1] == ["--"] else args.job
    spec = spec_from_args(args)
    # `kill <pid>` must tear the cluster down too: make SIGTERM unwind like Ctrl-C.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    run = None
    try:
        with Progress("dtlab cluster run", total=4, done=("set up", "搭建完成")) as progress:  # until the first record
            run = start(spec, command)
            progress.stage(
                "waiting for the first step: each rank imports torch, then they meet at the rendezvous",
                "等待第一步：每个 rank 导入 torch，然后在 rendezvous 处会合",
            )
            records = iter(run)
            first = next(records, None)
        as_json = "--json" in command
        for record in itertools.chain([] if first is None else [first], records):
            print(json.dumps(record) if as_json else _line(record), flush=True)
        if run.summary is not None:
            print(json.dumps(run.summary) if as_json else _line(run.summary), flush=True)
    finally:
        if run is not None:
            run.close()
        signal.signal(signal.SIGTERM, previous)
    return 0


def _line(record: dict) -> str:
    if record.get("summary"):
        return (
            f"done: {record['steps']} steps, final loss {record['final_loss']:.4f}, "
            f"{record['mean_tokens_per_s']:.0f} tokens/s, {record['wall_s']:.1f} s"
        )
    return (
        f"step {record['step']:4d}  loss {record['loss']:.4f}  "
        f"{record['tokens_per_s']:8.0f} tok/s  {record['step_time_s'] * 1e3:7.1f} ms/step"
    )
