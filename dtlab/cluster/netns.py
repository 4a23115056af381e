"""Nodes as Linux network namespaces, joined through a switch by shaped veth links.

A *network namespace* is a private copy of the kernel's network stack: its
own interfaces, addresses, routes and loopback. A process started inside one
(``ip netns exec NAME cmd``) sees only that copy, exactly as if it ran on a
separate machine. A *veth pair* is a virtual cable: two interfaces, what
enters one leaves the other. A *bridge* is a virtual switch.

For ``nodes=2`` this module builds (every name prefixed by the run's tag)::

      namespace n0            namespace sw (the switch)          namespace n1
    +---------------+        +--------------------------+       +---------------+
    | ranks 0,1     |  veth  |  n0 --+          +-- n1  | veth  | ranks 2,3     |
    | eth0 ----------------------    |  br0     |    ----------------- eth0     |
    | 198.18.0.1/24 |  tbf   |       +----------+       |  tbf  | 198.18.0.2/24 |
    +---------------+        +--------------------------+       +---------------+

* The switch lives in a namespace of its own, so nothing is added to the
  machine's own network: no interface, no address, no route. Addresses come
  from 198.18.0.0/15, the range RFC 2544 reserves for benchmarking networks.
* Ranks of one node reach each other over the node's loopback, which is never
  shaped (the fast intra-node link, like NVLink); every byte between nodes
  crosses two veth links (the slow inter-node link, like the NIC).
* Each veth end gets a *token bucket filter* (``tc qdisc ... tbf``) on the
  traffic it sends: tokens accrue at ``rate``, a packet leaves only when it
  can pay for its bytes, so a node's link carries at most ``rate`` in each
  direction. netem is not available here, so only bandwidth is shaped:
  latency stays the kernel's (tens of microseconds), not a datacenter's.

Teardown ends every process inside the namespaces, then deletes them, which
deletes the links in them too. Namespaces are named ``dtlab-<pid>-<k>-...``
after the process that made them, so :func:`reap_stale` can remove what a
killed owner left behind.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from dataclasses import dataclass

from dtlab.cluster import userns
from dtlab.i18n import DtlabError
from dtlab.launch.resources import process_exists

PREFIX = "dtlab-"
SUBNET = "198.18.0"
INTERFACE = "eth0"
"""Every node's interface has the same name, inside its own namespace (as on real machines)."""
_counter = itertools.count()


class NetnsError(DtlabError, RuntimeError):
    """An ``ip``/``tc`` command failed while building the cluster."""


@dataclass(frozen=True)
class Node:
    """One node: its namespace, its address on the cluster network, and its interface."""

    index: int
    namespace: str
    address: str
    interface: str = INTERFACE
    host: tuple[str, ...] = ()
    """What runs a command where the namespace is: nothing as root, ``nsenter`` into a user namespace
    holder otherwise (:mod:`dtlab.cluster.userns`)."""


@dataclass(frozen=True)
class Topology:
    """What :func:`create` built: the switch namespace and the nodes. Pass it to :func:`teardown`."""

    tag: str
    switch: str
    nodes: tuple[Node, ...]
    rate_bps: int | None
    holder: userns.Holder | None = None
    """The user namespace holder it was built in; None: built by root, directly."""

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (*(n.namespace for n in self.nodes), self.switch)

    @property
    def host(self) -> tuple[str, ...]:
        return () if self.holder is None else tuple(self.holder.prefix)


def host_prefix() -> tuple[str, ...]:
    """What runs a command where new nodes are built: nothing as root; ``nsenter`` into this process's
    user namespace holder otherwise (:mod:`dtlab.cluster.userns`)."""
    return tuple(userns.holder().prefix) if userns.wanted() else ()


def _tool(name: str) -> str:
    """``ip`` or ``tc`` by absolute path: an ordinary user's PATH may lack /usr/sbin, where tc lives."""
    return userns.command(name) or name


def _ip(host: tuple[str, ...], tool: str, *args: str) -> None:
    proc = subprocess.run([*host, _tool(tool), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        command = " ".join((tool, *args))
        raise NetnsError(f"`{command}` failed: {proc.stderr.strip()}", f"命令 `{command}` 失败：{proc.stderr.strip()}")


def tbf_args(rate_bps: int) -> list[str]:
    """tc's token bucket filter at ``rate_bps`` bits/s.

    ``burst`` (the bucket) must hold at least one timer tick of tokens
    (rate / HZ) and a 64 KiB segment, or tbf cannot reach its rate; 2 ms of
    traffic is both. ``limit`` (bytes queued waiting for tokens) of 50 ms of
    traffic keeps TCP from seeing drops long before the link is full.
    """
    rate_Bps = rate_bps / 8
    burst = max(64 << 10, int(rate_Bps * 0.002))
    limit = max(4 * burst, int(rate_Bps * 0.05))
    return ["tbf", "rate", f"{rate_bps}bit", "burst", str(burst), "limit", str(limit)]


def create(nodes: int, rate_bps: int | None = None) -> Topology:
    """Build ``nodes`` namespaces behind a switch; on any failure remove what was made, then raise."""
    tag = f"{PREFIX}{os.getpid()}-{next(_counter)}"
    holder = userns.holder() if userns.wanted() else None
    host = () if holder is None else tuple(holder.prefix)
    topology = Topology(
        tag=tag,
        switch=f"{tag}-sw",
        rate_bps=rate_bps,
        holder=holder,
        nodes=tuple(Node(i, f"{tag}-n{i}", f"{SUBNET}.{i + 1}", host=host) for i in range(nodes)),
    )
    try:
        _ip(host, "ip", "netns", "add", topology.switch)
        _ip(host, "ip", "-n", topology.switch, "link", "add", "br0", "type", "bridge")
        _ip(host, "ip", "-n", topology.switch, "link", "set", "br0", "up")
        for node in topology.nodes:
            _add_node(topology, node)
    except BaseException:
        teardown(topology)
        raise
    return topology


def _add_node(topology: Topology, node: Node) -> None:
    """A namespace, a veth pair from it to the switch, an address, and the shaping."""
    port, ns, sw = f"n{node.index}", node.namespace, topology.switch
    host = topology.host
    _ip(host, "ip", "netns", "add", ns)
    _ip(host, "ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", node.interface, "netns", ns)
    _ip(host, "ip", "-n", sw, "link", "set", port, "master", "br0", "up")
    _ip(host, "ip", "-n", ns, "addr", "add", f"{node.address}/24", "dev", node.interface)
    _ip(host, "ip", "-n", ns, "link", "set", node.interface, "up")
    _ip(host, "ip", "-n", ns, "link", "set", "lo", "up")
    if topology.rate_bps is not None:  # both directions: what the node sends, what it receives
        _ip(host, "tc", "-n", ns, "qdisc", "add", "dev", node.interface, "root", *tbf_args(topology.rate_bps))
        _ip(host, "tc", "-n", sw, "qdisc", "add", "dev", port, "root", *tbf_args(topology.rate_bps))


def exec_argv(node: Node, argv: list[str]) -> list[str]:
    """``argv`` run inside ``node``'s namespace."""
    return [*node.host, _tool("ip"), "netns", "exec", node.namespace, *argv]


def pids(namespace: str, host: tuple[str, ...] | None = None) -> list[int]:
    """Processes living in ``namespace`` right now (``host``: where it is, by default where new nodes go)."""
    host = host_prefix() if host is None else host
    proc = subprocess.run([*host, _tool("ip"), "netns", "pids", namespace], capture_output=True, text=True)
    return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []


def namespaces(host: tuple[str, ...] | None = None) -> list[str]:
    """Every network namespace name (``ip netns list``) on this machine, or in ``host``'s user namespace."""
    host = host_prefix() if host is None else host
    proc = subprocess.run([*host, _tool("ip"), "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def teardown(topology: Topology, grace_s: float = 2.0) -> None:
    """End every process in the cluster (SIGTERM, then SIGKILL), then delete every namespace.

    Safe to call twice and on a half-built topology. A namespace outlives its
    name while a process still holds it, hence processes first. A topology
    built in a user namespace whose holder has ended has nothing left to
    delete: the holder ended its processes and deleted its namespaces on the
    way out (:mod:`dtlab.cluster.userns`), or was killed, and then only the
    processes remain, which their launcher ends.
    """
    if topology.holder is not None and not topology.holder.alive():
        return
    host = topology.host
    present = set(namespaces(host))
    ours = [ns for ns in topology.namespaces if ns in present]
    _end_processes(ours, grace_s, host)
    for ns in ours:
        subprocess.run([*host, _tool("ip"), "netns", "del", ns], capture_output=True)


def _end_processes(names: list[str], grace_s: float, host: tuple[str, ...] = ()) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        living = [p for ns in names for p in pids(ns, host)]
        for pid in living:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while living and time.monotonic() < deadline:
            time.sleep(0.05)
            living = [p for ns in names for p in pids(ns, host)]
        if not living:
            return


def reap_stale() -> list[str]:
    """Tear down clusters whose owning process is gone (it was killed); returns their namespaces.

    Root's namespaces only: those built in a user namespace went with their owner's holder."""
    if userns.wanted():
        return []
    stale = []
    for ns in namespaces(()):
        parts = ns[len(PREFIX) :].split("-") if ns.startswith(PREFIX) else []
        if len(parts) >= 2 and parts[0].isdigit() and not process_exists(int(parts[0])):
            stale.append(ns)
    _end_processes(stale, 1.0)
    for ns in stale:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    return stale
