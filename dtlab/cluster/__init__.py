"""A cluster on one machine: nodes as network namespaces, shaped links, one torchrun per node.

``dtlab cluster run --nodes 2 --nproc-per-node 2 --bandwidth 100mbit -- train --dp 4``
runs exactly what a two-node job runs, on this machine: each node is a Linux
network namespace with its own address, joined to the others through a
switch by a link shaped to the bandwidth asked for; each runs one torchrun,
and the torchruns find each other by a c10d rendezvous (iproute2; as root, or as
a user inside a user namespace of their own where the system allows one).

* :mod:`dtlab.cluster.spec`: what a cluster is (nodes, ranks per node, link rate),
  validated once; whether this machine can build one.
* :mod:`dtlab.cluster.netns`: namespaces, veth links, the switch, token-bucket shaping, teardown.
* :mod:`dtlab.cluster.userns`: the same without root, inside a user namespace of this process's own.
* :mod:`dtlab.cluster.launcher`: the torchruns, the record stream, teardown on every exit path.
* :mod:`dtlab.cluster.hierarchical`: the hierarchical all-reduce that crosses the slow link once.
* :mod:`dtlab.cluster.bench`: intra- vs inter-node bandwidth, hierarchical vs flat, the alpha-beta fit.
"""

from dtlab.cluster.spec import ClusterSpec, ClusterUnavailable, check_available, unavailable_reason


def start(spec: ClusterSpec, command: list[str]):
    """Start ``command`` (``["train", "--dp", "4", ...]``) on a local cluster; see :mod:`.launcher`."""
    from dtlab.cluster.launcher import start as _start

    return _start(spec, command)


__all__ = ["ClusterSpec", "ClusterUnavailable", "check_available", "start", "unavailable_reason"]
