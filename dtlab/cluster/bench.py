"""``dtlab bench allreduce --cluster``: intra- vs inter-node bandwidth, hierarchical vs flat, measured.

On a local cluster (2 nodes x 2 ranks by default, each node's link shaped to
100 Mbit/s unless ``--bandwidth`` says otherwise) this

1. measures the shaped link with one TCP stream (rate asked vs rate measured);
2. runs :mod:`dtlab.cluster.allreduce_bench` on every rank under torchrun;
3. fits the alpha-beta model ``time(n) = alpha + n / beta`` to each link's
   ping-pong (:func:`fit_link`), and predicts the flat and hierarchical
   all-reduce times from those two links with :mod:`dtlab.planner.communication`'s
   ring formulas, printed beside the measured times.

busbw is nccl-tests' bus bandwidth: algbw x 2(n-1)/n for an all-reduce over n
ranks, whatever the algorithm, so flat and hierarchical compare directly.
The headline ``ratio``: hierarchical busbw over PyTorch's flat gloo ring.
"""

from __future__ import annotations

from dtlab.cluster.cli import spec_from_args
from dtlab.cluster.hierarchical import inter_node_bytes
from dtlab.cluster.launcher import ClusterRun
from dtlab.cluster.probe import measure_bandwidth
from dtlab.cluster.spec import ClusterSpec, check_available, format_rate
from dtlab.config.command_progress import current
from dtlab.planner.communication import (
    bus_bandwidth,
    ring_all_gather_time,
    ring_allreduce_time,
    ring_reduce_scatter_time,
)
from dtlab.planner.hardware import Link

DEFAULT_BANDWIDTH = "100mbit"
NBYTES = 4 << 20
"""The all-reduce size timed: 4 MiB, large enough to be bandwidth-bound on the shaped link."""


def fit_link(name: str, one_way_s: dict) -> Link:
    """Least-squares fit of ``time = alpha + n / beta`` to ``{nbytes: seconds}`` (alpha >= 0).

    If noise makes the slope useless (not positive), beta falls back to the
    largest message's size over its time.
    """
    sizes = [float(n) for n in one_way_s]
    times = [one_way_s[n] for n in one_way_s]
    mean_n, mean_t = sum(sizes) / len(sizes), sum(times) / len(times)
    slope = sum((n - mean_n) * (t - mean_t) for n, t in zip(sizes, times)) / sum(
        (n - mean_n) ** 2 for n in sizes
    )  # seconds per byte = 1 / beta
    if slope <= 0:
        slope = times[sizes.index(max(sizes))] / max(sizes)
    alpha = max(0.0, mean_t - slope * mean_n)
    return Link(name=name, latency_s=alpha, bandwidth_Bps=1.0 / slope)


def predict(nbytes: int, nodes: int, k: int, intra: Link, inter: Link) -> dict[str, float]:
    """Seconds the alpha-beta model gives each case of the benchmark on these links.

    Flat: every ring step waits for its slowest hop, the inter-node one.
    Hierarchical: the K cross-node rings run at once and share the node's link,
    so each sees beta / K.
    """
    shared = Link(name="shared", latency_s=inter.latency_s, bandwidth_Bps=inter.bandwidth_Bps / k)
    return {
        "intra": ring_allreduce_time(nbytes, k, intra),
        "inter": ring_allreduce_time(nbytes, nodes, inter),
        "flat": ring_allreduce_time(nbytes, nodes * k, inter),
        "hierarchical": (
            ring_reduce_scatter_time(nbytes, k, intra)
            + ring_allreduce_time(nbytes / k, nodes, shared)
            + ring_all_gather_time(nbytes, k, intra)
        ),
    }


def measure(spec: ClusterSpec, nbytes: int = NBYTES, repeats: int = 3) -> dict:
    """Build the cluster, measure the link, run the ranks' benchmark; teardown always."""
    check_available(shaped=spec.bandwidth is not None)
    run = ClusterRun(spec, "dtlab.cluster.allreduce_bench", ["--bytes", str(nbytes), "--repeats", str(repeats)])
    try:
        run.build()
        rate = spec.rate_bps
        current().stage("the shaped link, measured with one TCP stream", "用一条 TCP 流测量限速链路")
        tcp_bps = (
            measure_bandwidth(run.topology, max(1 << 20, int(rate / 8))) if spec.nodes > 1 and rate else None
        )  # about a second of traffic
        run.launch()
        current().stage(
            "all-reduce, flat and hierarchical, and ping-pong within and across nodes",
            "全归约（扁平与分层），以及节点内与节点间的乒乓测试",
        )
        run.wait()
    finally:
        run.close()
    return {**run.summary, "asked_bps": rate, "tcp_bps": tcp_bps}


def report(spec: ClusterSpec, measured: dict) -> dict:
    """The benchmark's JSON: busbw per case, the fitted links, predictions, the headline ratio."""
    n, k, nbytes = spec.nodes, spec.nproc_per_node, measured["bytes"]
    ranks = {"intra": k, "inter": n, "flat": n * k, "flat_torch": n * k, "hierarchical": n * k}
    busbw = {
        case: bus_bandwidth(nbytes / s, ranks[case], "all_reduce") if ranks[case] > 1 else None
        for case, s in measured["seconds"].items()
    }
    links = {
        f"{where}_node": fit_link(f"cluster-{where}", {int(b): s for b, s in ping.items()})
        for where, ping in measured["ping"].items()
        if ping
    }
    out = {
        "bench": "allreduce",
        "cluster": {"nodes": n, "nproc_per_node": k, "bandwidth": spec.bandwidth},
        "bytes": nbytes,
        "seconds": measured["seconds"],
        "busbw_Bps": busbw,
        "asked_bps": measured["asked_bps"],
        "tcp_bps": measured["tcp_bps"],
        "links": {
            key: {"latency_s": link.latency_s, "bandwidth_Bps": link.bandwidth_Bps} for key, link in links.items()
        },
        "inter_node_bytes": {
            "flat": inter_node_bytes(nbytes, n, k, hierarchical=False),
            "hierarchical": inter_node_bytes(nbytes, n, k, hierarchical=True),
        },
    }
    if len(links) == 2:
        out["predicted_s"] = predict(nbytes, n, k, links["intra_node"], links["inter_node"])
    flat, hier, torch_flat = (measured["seconds"][c] for c in ("flat", "hierarchical", "flat_torch"))
    out["hierarchical_over_flat"] = flat / hier
    out["headline"] = (
        f"busbw of a {nbytes >> 20} MiB all-reduce on {n} nodes x {k} ranks, "
        "dtlab hierarchical / torch.distributed.all_reduce (gloo, flat ring)"
    )
    out["ratio"] = torch_flat / hier
    return out


def run(args) -> dict:
    """``dtlab bench allreduce --cluster [--nodes N --nproc-per-node K --bandwidth RATE]``."""
    spec = spec_from_args(args, bandwidth=DEFAULT_BANDWIDTH)
    current().more(4)  # build, the link, torchrun, the ranks' measurement
    out = report(spec, measure(spec, NBYTES, max(1, getattr(args, "repeats", 3))))
    print_report(out)
    return out


def print_report(out: dict) -> None:
    c, mib = out["cluster"], out["bytes"] / (1 << 20)
    print(
        f"\nlocal cluster: {c['nodes']} nodes x {c['nproc_per_node']} ranks, each node's link "
        f"shaped to {c['bandwidth']} (tbf); all-reduce of {mib:g} MiB, float32, gloo"
    )
    print(
        f"本地集群：{c['nodes']} 个节点 x 每节点 {c['nproc_per_node']} 个 rank，每个节点的链路"
        f"限速 {c['bandwidth']}（tbf）；{mib:g} MiB float32 全归约，gloo"
    )
    if out["tcp_bps"]:
        print(
            f"link / 链路: asked {format_rate(out['asked_bps'])}, one TCP stream measured "
            f"{format_rate(out['tcp_bps'])} ({out['tcp_bps'] / out['asked_bps']:.0%} of asked / 占设定值)"
        )
    for key, link in out["links"].items():
        alpha = (
            f"{link['latency_s'] * 1e6:.0f} us"
            if link["latency_s"] > 0
            else "- (clamped to 0: no per-message cost above the noise / 截为 0：固定开销没有超出噪声)"
        )
        print(
            f"alpha-beta fit, {key.replace('_', '-')} / 拟合: alpha = {alpha}, "
            f"beta = {format_rate(8 * link['bandwidth_Bps'])}"
        )
    labels = {
        "intra": "intra-node ring (loopback) / 节点内",
        "inter": "inter-node ring (shaped) / 节点间",
        "flat": "flat ring, dtlab / 扁平环",
        "flat_torch": "flat ring, torch gloo / 扁平环",
        "hierarchical": "hierarchical, dtlab / 分层",
    }
    predicted = out.get("predicted_s", {})
    print(f"{'':40}{'time (ms)':>11}{'busbw (MB/s)':>14}{'predicted (ms)':>16}")
    for case, label in labels.items():
        bw = out["busbw_Bps"][case]
        guess = f"{predicted[case] * 1e3:16.1f}" if case in predicted else ""
        print(f"{label:40}{out['seconds'][case] * 1e3:11.1f}{(f'{bw / 1e6:.1f}' if bw else '-'):>14}{guess}")
    ratio, hier_mib, flat_mib = (
        out["hierarchical_over_flat"],
        out["inter_node_bytes"]["hierarchical"] / (1 << 20),
        out["inter_node_bytes"]["flat"] / (1 << 20),
    )
    if ratio >= 1:
        verdict_en, verdict_zh = f"{ratio:.2f}x faster than", f"比扁平环快 {ratio:.2f} 倍"
    else:  # a ratio below 1 is a slowdown: say so, as the time it takes against the flat ring's
        verdict_en, verdict_zh = f"{1 / ratio:.2f}x slower than", f"比扁平环慢：用时是扁平环的 {1 / ratio:.2f} 倍"
    print(
        f"hierarchical is {verdict_en} the flat ring; the slow link carries {hier_mib:.1f} MiB instead of "
        f"{flat_mib:.1f} MiB each way (formula)"
    )
    print(
        f"分层全归约{verdict_zh}；慢速链路每个方向只需传输 {hier_mib:.1f} MiB，而不是 {flat_mib:.1f} MiB（公式）",
        flush=True,
    )
