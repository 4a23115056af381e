"""dtlab's ring all-reduce and its choice by size beside ``torch.distributed.all_reduce``, as nccl-tests reports.

For each message size: the time of one all-reduce, the *algorithm bandwidth*
algbw = nbytes / time, and the *bus bandwidth* busbw = algbw x 2(N-1)/N, the
rate at which each rank's link actually carried data in an optimal ring, so
figures stay comparable across rank counts (nccl-tests, PERFORMANCE.md).
Small messages are latency-bound (busbw far below the link's), large ones
bandwidth-bound. Four implementations: dtlab's ring over gloo's sends and
receives (lesson 01's), dtlab's algorithm chosen by size over gloo (what
``--collectives dtlab`` does across machines: recursive doubling up to 1 MiB,
where its log2 N messages beat the ring's 2(N-1), the ring above), the same
ring over shared memory (what ``--collectives dtlab`` does on one machine,
:mod:`dtlab.comm.shared_memory`) and PyTorch's (gloo's own ring, over TCP even
between processes of one machine). Headline: busbw of dtlab's ring over PyTorch
at the largest size on the most ranks, over shared memory (the ratio over gloo
is printed beside it).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from dtlab.comm.collectives import ring_all_reduce
from dtlab.comm.recursive_doubling import all_reduce_by_size
from dtlab.comm.shared_memory_setup import wire_for
from dtlab.config.command_progress import current
from dtlab.launch import RankPool
from dtlab.planner.communication import bus_bandwidth

WORLD_SIZES = (2, 4)
SIZES = tuple(4**k for k in range(5, 14))  # 1 KiB, 4 KiB, ..., 64 MiB
IMPLEMENTATIONS = {
    "dtlab": lambda t: ring_all_reduce(t),
    "by_size": lambda t: all_reduce_by_size(t),
    "shared": lambda t: ring_all_reduce(t, wire=wire_for(None)),
    "torch": lambda t: dist.all_reduce(t),
}
"""dtlab's ring over gloo, dtlab's algorithm chosen by size over gloo, dtlab's ring over shared memory,
torch's (row keys ``{name}_us``, ``_busbw_GBps``...)."""
RATIOS = ("dtlab", "by_size", "shared")


def _iterations(nbytes: int) -> int:
    """Calls per timing: about 64 MiB reduced, at least 3 and at most 64 calls.

    Four ranks share two cores here, so a single call's time swings with the
    scheduler by tens of percent; a timing that spans a few hundred
    milliseconds averages over many of its time slices (at 4 MiB, 4 calls
    per timing gave ratios from 0.75 to 1.01 between runs of the same code)."""
    return max(3, min(64, (64 << 20) // nbytes))


def measure(ctx, sizes: tuple[int, ...], repeats: int) -> dict:
    """On each rank: seconds per all-reduce for every size and implementation (median of repeats).

    Each timing is the slowest rank's, as a collective is only done when every
    rank is; the implementations take turns so that drift hits all alike.
    """
    seconds: dict = {}
    implementations = dict(IMPLEMENTATIONS)
    if wire_for(None) is None:  # one rank, or ranks on NCCL: no shared-memory column
        del implementations["shared"]
    for nbytes in sizes:
        x = torch.zeros(nbytes // 4, device=ctx.device)  # (nbytes / 4,) float32
        iters = _iterations(nbytes)
        for run in implementations.values():  # warm-up: buffers, connections
            run(x)
        samples = {name: [] for name in implementations}
        for repeat in range(repeats):
            names = list(implementations)
            for name in names if repeat % 2 == 0 else names[::-1]:
                dist.barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    implementations[name](x)
                elapsed = torch.tensor([(time.perf_counter() - start) / iters])
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                samples[name].append(elapsed.item())
        seconds[nbytes] = {name: statistics.median(v) for name, v in samples.items()}
    return seconds


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def run(args) -> dict:
    if getattr(args, "cluster", False):  # across namespace nodes: dtlab/cluster/bench.py
        from dtlab.cluster.bench import run as run_on_cluster

        return run_on_cluster(args)
    repeats = max(1, getattr(args, "repeats", 3))
    progress = current()
    progress.more(len(WORLD_SIZES) * len(SIZES))
    pool = RankPool(max_size=max(WORLD_SIZES))
    results: dict = {}
    try:
        for n in WORLD_SIZES:
            seconds = {}
            for nbytes in SIZES:  # a run per size, so that each is a stage said on stderr
                progress.stage(f"{n} ranks, {_size(nbytes)}", f"{n} 个 rank，{_size(nbytes)}")
                seconds.update(pool.run(measure, n, (nbytes,), repeats, timeout=300.0, backend="gloo").wait()[0])
            rows = []
            for nbytes, s in seconds.items():
                row = {"bytes": nbytes, "count": nbytes // 4}
                for name, t in s.items():
                    row[f"{name}_us"] = t * 1e6
                    row[f"{name}_algbw_GBps"] = nbytes / t / 1e9
                    row[f"{name}_busbw_GBps"] = bus_bandwidth(nbytes / t, n, "all_reduce") / 1e9
                rows.append(row)
            results[str(n)] = rows
            _print_table(n, rows)
    finally:
        pool.close()
    largest = results[str(max(WORLD_SIZES))][-1]
    shared = "shared_busbw_GBps" in largest  # not where shared memory is off (DTLAB_SHARED_MEMORY=0)
    return {
        "bench": "allreduce",
        "backend": "gloo",
        "dtype": "float32",
        "headline": f"busbw at {_size(largest['bytes'])} on {max(WORLD_SIZES)} ranks, dtlab ring over "
        f"{'shared memory' if shared else 'gloo'} / torch.distributed.all_reduce (higher is better)",
        "ratio": largest["shared_busbw_GBps" if shared else "dtlab_busbw_GBps"] / largest["torch_busbw_GBps"],
        "ratio_over_gloo": largest["dtlab_busbw_GBps"] / largest["torch_busbw_GBps"],
        "repeats": repeats,
        "results": results,
    }


def _print_table(n: int, rows: list[dict]) -> None:
    print(f"\nall-reduce (SUM, float32) on {n} ranks, gloo; busbw = algbw x 2(N-1)/N (nccl-tests)")
    print(f"全归约（SUM，float32），{n} 个 rank，gloo；总线带宽 busbw = algbw x 2(N-1)/N")
    shown = [k for k in IMPLEMENTATIONS if f"{k}_us" in rows[0]]  # "shared" only where it could run
    titles = {
        "dtlab": "dtlab ring",
        "by_size": "dtlab by size",
        "shared": "dtlab ring, shm",
        "torch": "torch.distributed",
    }
    ratio_titles = {"dtlab": "ring", "by_size": "by size", "shared": "ring, shm"}
    ratios_shown = [k for k in RATIOS if k in shown]
    print(f"{'':>20}{''.join(f'{titles[k]:^21}' for k in shown)}{'busbw / torch':^{12 * len(ratios_shown)}}")
    head = f"{'time(us)':>10}{'busbw':>11}"
    print(f"{'size':>10}{'count':>10}{head * len(shown)}{''.join(f'{ratio_titles[k]:>12}' for k in ratios_shown)}")
    for r in rows:
        cells = "".join(f"{r[f'{k}_us']:>10.0f}{r[f'{k}_busbw_GBps']:>11.3f}" for k in shown)
        ratios = "".join(f"{r[f'{k}_busbw_GBps'] / r['torch_busbw_GBps']:>12.2f}" for k in ratios_shown)
        print(f"{_size(r['bytes']):>10}{r['count']:>10}{cells}{ratios}")
    print(f"{'':>20}(busbw in GB/s; ring and by size: over gloo's sends and receives (TCP); by size: recursive")
    print(f"{'':>20} doubling up to 1 MiB, the ring above; ring, shm: the same ring over shared memory,")
    print(f"{'':>20} dtlab/comm/shared_memory.py, what --collectives dtlab uses on one machine)")
    print(f"{'':>20}（busbw 单位 GB/s；ring 与 by size：经 gloo 的点对点收发（TCP）；by size：不超过 1 MiB")
    print(f"{'':>20} 用递归倍增，更大的用环；ring, shm：同一个环改经共享内存，见 dtlab/comm/shared_memory.py，")
    print(f"{'':>20} 即 --collectives dtlab 在单机上的做法）", flush=True)
