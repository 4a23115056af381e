"""`python benchmarks/hsdp.py [--bandwidth RATE] [--steps N] [--json]`: ZeRO-3 across two nodes against HSDP.

Two namespace nodes of 2 ranks joined by a shaped link (`dtlab cluster run`, root or a user
namespace), the small GPT at --dp 4 --zero 3, then the same with --dp-shard 2 (a shard group per
node: only the all-reduce of each gradient shard crosses the link). Prints each one's steady step
time, the bytes a rank sent per step on each group (the tracer's comm_groups), and the ratio
HSDP / ZeRO-3 (lower is better). A benchmark, never a test: the figures are this machine's.
"""

from __future__ import annotations

import argparse
import json
import sys

from dtlab.course.experiments.cluster import cluster_reason, hsdp_against_zero3


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bandwidth", default="20mbit", help="the link between the nodes / 节点间链路的带宽")
    parser.add_argument("--steps", type=int, default=4, help="steps of each run / 每次运行的步数")
    parser.add_argument("--json", action="store_true", help="one JSON object / 输出一个 JSON 对象")
    args = parser.parse_args(argv)
    print(
        f"ZeRO-3 vs HSDP on 2 nodes x 2 ranks, {args.bandwidth} ... / 两节点上比较 ZeRO-3 与 HSDP ……", file=sys.stderr
    )
    result = hsdp_against_zero3(args.bandwidth, args.steps)
    if result is None:
        print(f"skipped: {cluster_reason()} / 跳过：{cluster_reason('zh')}", file=sys.stderr)
        return 1
    ratio = result["hsdp"]["step_s"] / result["zero3"]["step_s"]
    summary = {name: {"step_s": r["step_s"], "bytes": r["bytes"]} for name, r in result.items()}
    if args.json:
        print(json.dumps({**summary, "bandwidth": args.bandwidth, "ratio": ratio}))
        return 0
    for name, r in summary.items():
        groups = ", ".join(f"{g} {b / 1e6:.2f} MB" for g, b in r["bytes"].items())
        print(f"{name:6s} step {r['step_s'] * 1e3:8.0f} ms   bytes per rank and step / 每 rank 每步字节: {groups}")
    print(f"ratio HSDP / ZeRO-3 step time / 单步时间之比: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
