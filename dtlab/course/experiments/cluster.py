"""Lesson 16: the same training run on the local pool, under torchrun, and on two namespace nodes.

Everything here is a caller-side experiment (nothing runs inside the pool's
ranks): it starts jobs the three ways a learner meets, and returns plain
numbers. Where this machine cannot build namespaces (neither root nor a
user namespace of the learner's own, or no iproute2), the cluster parts return ``None`` and :func:`cluster_reason` says
why, so a notebook can fall back to the local pool, and to
:func:`link_seconds`: the time a link would add, from the bytes the local
run's ranks sent (a formula, labelled so).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from dtlab.cluster import ClusterSpec, start, unavailable_reason
from dtlab.cluster.spec import build_way, parse_rate
from dtlab.config.flags import add_train_arguments, config_from_args

LAYOUTS = {"dp": ["--dp", "2"], "tp": ["--tp", "2"], "pp": ["--pp", "2", "--micro-batches", "2"]}
"""Two ranks each, so each layout fits two nodes of one rank: all its traffic crosses the link."""


def cluster_reason(lang: str = "en") -> str | None:
    """Why this machine cannot build a local cluster (in ``lang``), or None if it can."""
    reason = unavailable_reason()
    return None if reason is None else reason[1 if lang == "zh" else 0]


def cluster_way(lang: str = "en") -> str:
    """How this machine builds nodes, where it can (in ``lang``): as root, or in the learner's user namespace."""
    return build_way()[1 if lang == "zh" else 0]


def config_for(flags: list[str]):
    """The TrainConfig that ``dtlab train FLAGS`` would run (for the local pool)."""
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    return config_from_args(parser.parse_args(flags))


def local_pool(flags: list[str]) -> list[dict]:
    """``dtlab.train(config)`` on the notebook's warm pool; the step records."""
    import dtlab

    return dtlab.train(config_for(flags)).wait().records


def torchrun_one_node(flags: list[str], nproc: int) -> list[dict]:
    """``torchrun --standalone --nproc-per-node N -m dtlab.train FLAGS --json``; the step records."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "-m",
            "dtlab.train",
            *flags,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    ).stdout
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [line for line in lines if not line.get("summary")]


def on_cluster(flags: list[str], nodes: int, nproc_per_node: int, bandwidth: str | None) -> list[dict] | None:
    """The same job on namespace nodes (None where they cannot be made); the step records."""
    if unavailable_reason() is not None:
        return None
    spec = ClusterSpec(nodes=nodes, nproc_per_node=nproc_per_node, bandwidth=bandwidth)
    return start(spec, ["train", *flags, "--json"]).wait().records


def steady_tokens_per_s(records: list[dict]) -> float:
    """Median tokens/s over the steps after the first (which pays for warm-up)."""
    return statistics.median(r["tokens_per_s"] for r in records[1:] or records)


def steady_step_s(records: list[dict]) -> float:
    """Median step time over the steps after the first."""
    return statistics.median(r["step_time_s"] for r in records[1:] or records)


def link_seconds(records: list[dict], bandwidth: str) -> float:
    """A formula: seconds a link of ``bandwidth`` (each way) adds to a step, if every byte a rank sent
    crossed it and nothing overlapped with computing.

    The bytes are measured: each rank's ``wire_bytes`` per step, as its tracer
    counted them (every kind, the records' own gathering included), the
    largest rank's, median over the steps after the first. Time is bits over
    the rate: the link's latency and any overlap with backward are left out.
    """
    sent = [
        max(sum(kind["wire_bytes"] for kind in rank["comm"].values()) for rank in record["ranks"])
        for record in records[1:] or records
    ]
    return statistics.median(sent) * 8 / parse_rate(bandwidth)


def layouts_across_nodes(bandwidth: str, steps: int = 4) -> dict[str, dict]:
    """Each of :data:`LAYOUTS` on the local pool and on two one-rank nodes over ``bandwidth``.

    Returns, per layout, the steady step time both ways and ``added_s``, the
    seconds the link adds to each step (cluster minus local: the layouts
    compute different amounts, so the time added compares them fairly);
    the cluster figures are None where it cannot run. ``local_records``: the
    local run's step records (for :func:`link_seconds`).
    """
    out = {}
    for name, layout in LAYOUTS.items():
        flags = [*layout, "--steps", str(steps), "--seed", "0"]
        records = local_pool(flags)
        local = steady_step_s(records)
        remote = on_cluster(flags, 2, 1, bandwidth)
        across = steady_step_s(remote) if remote else None
        out[name] = {
            "local_s": local,
            "cluster_s": across,
            "added_s": across - local if across else None,
            "local_records": records,
        }
    return out


HSDP_FLAGS = ["--dp", "4", "--zero", "3", "--model", "small", "--seed", "0"]
"""ZeRO-3 over 4 ranks on two nodes of 2; HSDP adds ``--dp-shard 2``: one shard group per node."""


def slow_link_bytes(records: list[dict]) -> dict[str, int]:
    """Per group, the most wire bytes one rank sent in a step (median over the steps after the first):
    the tracer's ``comm_groups``. ``dp`` (ZeRO-3 over both nodes) and ``dp_replicate`` (HSDP's
    all-reduce) cross the link between the nodes; ``dp_shard`` stays inside one."""
    steps = records[1:] or records
    groups = {g for r in steps for rank in r["ranks"] for g in rank["comm_groups"]} - {"world"}
    return {
        g: int(
            statistics.median(
                max(rank["comm_groups"].get(g, {}).get("wire_bytes", 0) for rank in r["ranks"]) for r in steps
            )
        )
        for g in sorted(groups)
    }


def hsdp_against_zero3(bandwidth: str = "20mbit", steps: int = 4) -> dict[str, dict] | None:
    """ZeRO-3 across both nodes and HSDP (a shard group per node), one after the other on the same two
    namespace nodes of 2 ranks over ``bandwidth``: each one's steady step time and bytes per group.
    None where nodes cannot be built (:func:`cluster_reason`)."""
    out = {}
    for name, extra in (("zero3", []), ("hsdp", ["--dp-shard", "2"])):
        records = on_cluster([*HSDP_FLAGS, *extra, "--steps", str(steps)], 2, 2, bandwidth)
        if records is None:
            return None
        out[name] = {"step_s": steady_step_s(records), "bytes": slow_link_bytes(records), "records": records}
    return out
