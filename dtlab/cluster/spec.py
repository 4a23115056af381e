"""What a local cluster is made of, validated once, and whether this machine can build one.

A *node* is one machine of a cluster: it has its own network address and
runs one ``torchrun``, which starts ``nproc_per_node`` ranks (one per GPU on
a real node). Ranks on one node talk over fast local links (NVLink on a GPU
server; here, the kernel's loopback), ranks on different nodes over the
network (InfiniBand or Ethernet; here, a veth link shaped to ``bandwidth``).

Building nodes needs Linux network namespaces and iproute2's ``ip`` (and
``tc`` to shape links): as root, or as any user the system allows a user
namespace of their own (:mod:`dtlab.cluster.userns`). :func:`check_available`
says, in both languages, why a machine cannot, before anything is created.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

from dtlab.cluster import userns
from dtlab.config.rank_limit import local_limit_reason, local_rank_limit
from dtlab.i18n import ConfigError, DtlabError

MAX_NODES = 8
"""Node addresses are 198.18.0.1 .. 198.18.0.8: as strings they sort in node order,
which is the order torchrun's c10d rendezvous gives nodes their ranks in."""

_RATE_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "kb/s": 8e3, "mb/s": 8e6, "gb/s": 8e9}
"""Accepted units of ``bandwidth``: bits per second (tc's spelling) or bytes per second."""
MIN_RATE_BPS, MAX_RATE_BPS = 1e6, 100e9


class ClusterUnavailable(DtlabError, RuntimeError):
    """This machine cannot build network namespaces (not root, no iproute2, no permission)."""


def parse_rate(text: str) -> int:
    """``"100mbit"`` -> 100_000_000 bits per second; also ``kbit``, ``gbit``, ``MB/s``, ``GB/s``.

    Decimal units, as tc and network vendors use them (1 Gbit/s = 10^9 bit/s).
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z/]+)\s*", str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _RATE_UNITS:
        raise ConfigError(
            f"--bandwidth {text!r}: expected a number and a unit, one of "
            f"{', '.join(_RATE_UNITS)} (e.g. 100mbit, 1gbit, 50MB/s)",
            f"--bandwidth {text!r}：应为数字加单位，单位可选 {', '.join(_RATE_UNITS)}（例如 100mbit、1gbit、50MB/s）",
        )
    bits = float(match.group(1)) * _RATE_UNITS[unit]
    if not MIN_RATE_BPS <= bits <= MAX_RATE_BPS:
        raise ConfigError(
            f"--bandwidth {text!r} is {bits:g} bit/s; allowed: 1mbit to 100gbit",
            f"--bandwidth {text!r} 即 {bits:g} bit/s；允许的范围是 1mbit 到 100gbit",
        )
    return int(bits)


def format_rate(bits_per_s: float) -> str:
    """100e6 -> ``"100 Mbit/s"``: how the lesson and the benchmark print a rate."""
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits_per_s >= scale:
            return f"{bits_per_s / scale:.3g} {unit}"
    return f"{bits_per_s:.3g} bit/s"


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """N nodes of K ranks each, every node's link to the switch shaped to ``bandwidth``."""

    nodes: int = 2
    """How many nodes (network namespaces, one torchrun each). 1 to 8."""
    nproc_per_node: int = 2
    """Ranks per node (torchrun's ``--nproc-per-node``). Nodes x ranks is at most the local pool's
    limit, ``DTLAB_MAX_RANKS`` (dtlab/config/rank_limit.py): the same cores run them."""
    bandwidth: str | None = None
    """Each node's link rate in each direction (``"100mbit"``, ``"1gbit"``); None: unshaped."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def rate_bps(self) -> int | None:
        """``bandwidth`` in bits per second, or None when links are not shaped."""
        return None if self.bandwidth is None else parse_rate(self.bandwidth)

    def validate(self) -> "ClusterSpec":
        """Refuse, in both languages, what cannot run; returns ``self``."""
        max_ranks = local_rank_limit()
        for name, value, top in (("nodes", self.nodes, MAX_NODES), ("nproc_per_node", self.nproc_per_node, max_ranks)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise ConfigError(
                    f"{name}={value!r}: expected an integer from 1 to {top}",
                    f"{name}={value!r}：应为 1 到 {top} 之间的整数",
                )
        if self.world_size > max_ranks:
            reason_en, reason_zh = local_limit_reason(max_ranks)
            raise ConfigError(
                f"nodes x nproc_per_node = {self.world_size} ranks, but {reason_en}",
                f"nodes x nproc_per_node = {self.world_size} 个 rank，但{reason_zh}",
            )
        self.rate_bps  # noqa: B018 - parses, so a bad rate is refused here
        return self


def check_available(shaped: bool = True) -> None:
    """Raise :class:`ClusterUnavailable` (bilingual) unless namespaces can be built here."""
    reason = unavailable_reason(shaped)
    if reason is not None:
        raise ClusterUnavailable(*reason)


NO_CLUSTER_ENV = "DTLAB_NO_CLUSTER"
"""Set to 1, no local cluster is built even as root: how a teacher (or a test) sees lesson 16 as a learner
without root does."""


def build_way() -> tuple[str, str]:
    """(English, Chinese): how nodes are built here, when they can be (:func:`unavailable_reason` is None)."""
    if userns.wanted():
        return (
            "nodes are built inside a user namespace of your own (no root needed)",
            "节点建在你自己的用户命名空间里（不需要 root）",
        )
    return "nodes are built as root, with ip netns", "以 root 身份用 ip netns 搭建节点"


def unavailable_reason(shaped: bool = True) -> tuple[str, str] | None:
    """(English, Chinese) reason this machine cannot build a local cluster, or None if it can.

    As root the nodes are built directly; otherwise inside a user namespace of the user's own
    (:mod:`dtlab.cluster.userns`), where the system allows one."""
    if os.environ.get(NO_CLUSTER_ENV, "") not in ("", "0"):
        return (
            f"local clusters are turned off here ({NO_CLUSTER_ENV}=1); use the local pool (dtlab train)",
            f"本机关闭了本地集群（{NO_CLUSTER_ENV}=1）；请改用本地进程池（dtlab train）",
        )
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    if not root and not userns.wanted():
        return (
            f"a local cluster needs root, or user namespaces ({userns.ENV}=0 turns them off here); "
            "run as root, or use the local pool (dtlab train)",
            f"本地集群需要 root 权限或用户命名空间（此处 {userns.ENV}=0 关闭了后者）；请以 root 运行，"
            "或改用本地进程池（dtlab train）",
        )
    for tool in ("ip",) + (("tc",) if shaped else ()):
        if userns.command(tool) is None:
            return (
                f"a local cluster needs iproute2's `{tool}` command, which is not on PATH "
                f"(Debian/Ubuntu: apt-get install iproute2)",
                f"本地集群需要 iproute2 的 `{tool}` 命令，但 PATH 中没有（Debian/Ubuntu：apt-get install iproute2）",
            )
    return _namespace_probe(userns.wanted())


_CAN: set[bool] = set()
"""The ways (in a user namespace or not) the probe has seen work; a refusal is asked again next time
(it costs a failed ``unshare``, and a machine that was too busy to answer may answer later)."""


def _namespace_probe(in_user_namespace: bool) -> tuple[str, str] | None:
    """Create and delete one namespace: root in a container may still lack CAP_SYS_ADMIN, and a
    system may refuse an ordinary user a user namespace."""
    if in_user_namespace in _CAN:
        return None
    name = f"dtlab-probe-{os.getpid()}"
    try:
        prefix = userns.holder().prefix if in_user_namespace else []
    except userns.UsernsError as error:
        return _refused(in_user_namespace, error.en, error.zh)
    ip = userns.command("ip")
    made = subprocess.run([*prefix, ip, "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        why = made.stderr.strip()
        return _refused(in_user_namespace, f"`ip netns add` failed ({why})", f"`ip netns add` 失败（{why}）")
    subprocess.run([*prefix, ip, "netns", "del", name], capture_output=True)
    _CAN.add(in_user_namespace)
    return None


def _refused(in_user_namespace: bool, why_en: str, why_zh: str) -> tuple[str, str]:
    """The bilingual reason, for root (no namespaces at all) or for a user (no user namespace)."""
    if in_user_namespace:
        return (
            f"a local cluster needs root, or network namespaces inside a user namespace of your own, "
            f"which this system refuses ({why_en}); run as root, or use the local pool (dtlab train)",
            f"本地集群需要 root 权限，或在你自己的用户命名空间里创建网络命名空间，而本系统不允许"
            f"（{why_zh}）；请以 root 运行，或改用本地进程池（dtlab train）",
        )
    return (
        f"{why_en} here; this machine cannot make network namespaces, use the local pool (dtlab train)",
        f"{why_zh}：本机无法创建网络命名空间，请改用本地进程池（dtlab train）",
    )
