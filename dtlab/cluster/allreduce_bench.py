"""The rank side of ``dtlab bench allreduce --cluster``: what each rank runs under each node's torchrun.

``python -m dtlab.cluster.allreduce_bench --bytes N --repeats R`` (started by
:mod:`dtlab.cluster.bench` in every node) times, on the same shaped cluster:

* ``intra``: an all-reduce inside every node at once (K ranks over loopback);
* ``inter``: an all-reduce across the nodes, one rank per node (the shaped link);
* ``flat`` / ``flat_torch``: one ring over all N x K ranks, dtlab's and gloo's;
* ``hierarchical``: :func:`dtlab.cluster.hierarchical.hierarchical_all_reduce`;
* a ping-pong between two ranks of one node and two ranks of different nodes
  at several sizes, for the alpha-beta fit of each link.

Each timing is the slowest rank's (a collective is done when every rank is),
the median of the repeats. Rank 0 prints one JSON line with everything.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from dtlab.cluster.hierarchical import NodeGroups, build_node_groups, hierarchical_all_reduce
from dtlab.comm.collectives import ring_all_reduce

PING_SIZES = {
    "intra": (1 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20),
    "inter": (1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20),
}
"""Message sizes of the ping-pong behind each alpha-beta fit, from latency-bound (1 KiB) to
bandwidth-bound: larger inside a node, where a megabyte takes about a millisecond."""


def _slowest(seconds: float) -> float:
    """The largest of every rank's ``seconds`` (ranks that took no part give 0)."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def time_case(run, x: torch.Tensor | None, repeats: int, iters: int) -> float:
    """Median over ``repeats`` of the slowest rank's seconds per call; ``x=None``: sit this one out."""
    if x is not None:
        run(x)  # warm-up: connections, buffers
    samples = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters if x is not None else 0):
            run(x)
        samples.append(_slowest((time.perf_counter() - start) / iters))
    return statistics.median(samples)


def ping_pong(a: int, b: int, sizes: tuple[int, ...], repeats: int) -> dict[int, float]:
    """One-way seconds per message size between ranks ``a`` and ``b`` (half a round trip)."""
    rank, out = dist.get_rank(), {}
    for nbytes in sizes:
        buf = torch.zeros(nbytes, dtype=torch.uint8)  # (nbytes,)
        samples = []
        for i in range(repeats + 1):  # the first is a warm-up
            dist.barrier()
            start = time.perf_counter()
            if rank == a:
                dist.send(buf, b)
                dist.recv(buf, b)
            elif rank == b:
                dist.recv(buf, a)
                dist.send(buf, a)
            if i:
                samples.append(_slowest((time.perf_counter() - start) / 2 if rank == a else 0.0))
        out[nbytes] = statistics.median(samples)
    return out


def measure(nbytes: int, repeats: int, groups: NodeGroups) -> dict:
    """Every case of the module docstring on this rank; the result is the same on every rank."""
    rank, k = dist.get_rank(), groups.nproc_per_node
    x = torch.zeros(nbytes // 4)  # (nbytes / 4,) float32
    first_of_node = rank % k == 0
    cases = {
        "intra": (lambda t: ring_all_reduce(t, group=groups.intra), x),
        "inter": (lambda t: ring_all_reduce(t, group=groups.inter), x if first_of_node else None),
        "flat": (lambda t: ring_all_reduce(t), x),
        "flat_torch": (lambda t: dist.all_reduce(t), x),
        "hierarchical": (lambda t: hierarchical_all_reduce(t, groups=groups), x),
    }
    seconds = {name: time_case(run, arg, repeats, iters=2) for name, (run, arg) in cases.items()}
    ping = {
        "intra": ping_pong(0, 1, PING_SIZES["intra"], repeats) if k > 1 else {},
        "inter": ping_pong(0, k, PING_SIZES["inter"], repeats) if dist.get_world_size() > k else {},
    }
    return {"seconds": seconds, "ping": ping}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dtlab.cluster.allreduce_bench")
    parser.add_argument("--bytes", type=int, default=4 << 20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        groups = build_node_groups(int(os.environ["LOCAL_WORLD_SIZE"]))
        result = measure(args.bytes, args.repeats, groups)
        if dist.get_rank() == 0:
            print(
                json.dumps(
                    {
                        "summary": True,
                        "bytes": args.bytes,
                        "repeats": args.repeats,
                        "world_size": dist.get_world_size(),
                        "nproc_per_node": groups.nproc_per_node,
                        **result,
                    }
                ),
                flush=True,
            )
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
