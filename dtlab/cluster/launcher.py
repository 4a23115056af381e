"""One torchrun per node, found by a c10d rendezvous; records streamed back; teardown always.

This is what a cluster job does on real machines, minus the scheduler: every
node runs the *same* command, ::

    torchrun --nnodes N --nproc-per-node K --rdzv-backend c10d \\
             --rdzv-endpoint <node 0's address>:29400 --rdzv-id <job id> \\
             -m dtlab.train --dp 4 ...

Each torchrun starts K ranks on its node and meets the others at the
rendezvous endpoint (a TCPStore that node 0's torchrun hosts), where the
nodes are numbered and every rank learns its global rank (``node * K +
local rank``), the world size, and where the store is. Then the ranks form
their process group over the nodes' network, and training runs.

:class:`ClusterRun` builds the nodes (:mod:`dtlab.cluster.netns`), starts the
torchruns, and yields every JSON line any node prints (rank 0 prints the step
records, on whichever node it is). When the job ends, fails (any node exits
non-zero: a rank raised or was killed), is interrupted or cancelled, it ends
every process and deletes every namespace and link before returning or raising.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Iterator

from dtlab.cluster import netns
from dtlab.cluster.spec import ClusterSpec, check_available
from dtlab.config.command_progress import current
from dtlab.i18n import ConfigError, DtlabError
from dtlab.launch.resources import descendants

RDZV_PORT = 29400
"""torchrun's default rendezvous port; free inside a namespace of our own."""
COMMANDS = {"train": "dtlab.train"}
"""What may follow ``--`` in ``dtlab cluster run``: the module each node's torchrun runs."""
QUIET_LIMIT_S = 300.0
"""A run that prints nothing for this long is declared stuck (start-up on a loaded
2-core machine, six processes importing torch, can take a minute)."""


class ClusterRunError(DtlabError, RuntimeError):
    """A node's torchrun exited non-zero (a rank raised, died or was killed)."""

    def __init__(self, node: int, code: int | None, stderr: str):
        self.node, self.code, self.stderr = node, code, stderr
        super().__init__(
            f"node {node}'s torchrun exited with code {code}; the end of its stderr:\n{stderr}",
            f"节点 {node} 的 torchrun 以退出码 {code} 结束；它的 stderr 末尾见上。",
        )


def torchrun_argv(
    spec: ClusterSpec, node: netns.Node, rdzv_addr: str, job_id: str, module: str, args: list[str]
) -> list[str]:
    """The command one node runs: the same on every node but for ``is_host`` and ``--local-addr``.

    ``is_host`` says which torchrun hosts the rendezvous store (torchrun
    would guess it by comparing host names, which namespaces share).
    ``--local-addr`` is the address this node is known by (its rank order too).
    """
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(spec.nodes),
        "--nproc-per-node",
        str(spec.nproc_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{rdzv_addr}:{RDZV_PORT}",
        "--rdzv-id",
        job_id,
        "--rdzv-conf",
        f"is_host={int(node.index == 0)}",
        "--local-addr",
        node.address,
        "--max-restarts",
        "0",
        "--monitor-interval",
        "0.2",
        "-m",
        module,
        *args,
    ]


def node_env(node: netns.Node) -> dict[str, str]:
    """Each node's environment: use its cluster interface (gloo and NCCL read these)."""
    env = dict(os.environ)
    env.update(
        GLOO_SOCKET_IFNAME=node.interface, NCCL_SOCKET_IFNAME=node.interface, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"
    )
    return env


class ClusterRun:
    """A job on a local cluster. Iterate it for records as they arrive; see the module docstring.

    Iterating yields step records (``records`` keeps them); the line with
    ``"summary": true`` is kept in ``summary``, as the local pool's runs do;
    ``wait()`` runs to the end; ``cancel()`` ends it now.
    """

    def __init__(self, spec: ClusterSpec, module: str, args: list[str]):
        self.spec, self.module, self.args = spec, module, list(args)
        self.records: list[dict] = []
        self.summary: dict | None = None
        self.topology: netns.Topology | None = None
        self.procs: list[subprocess.Popen] = []
        self._lines: queue.Queue = queue.Queue()
        self._stderr: list[collections.deque] = []
        self._readers: list[threading.Thread] = []
        self._finished = False

    # -- lifecycle
    def start(self) -> "ClusterRun":
        """Build the nodes and start one torchrun in each (returns at once)."""
        return self.build().launch()

    def build(self) -> "ClusterRun":
        """Only build the nodes (namespaces, links, shaping), e.g. to measure the link first."""
        n, rate = self.spec.nodes, self.spec.bandwidth
        current().stage(
            f"building {n} nodes: network namespaces and links" + (f", shaped to {rate}" if rate else ""),
            f"搭建 {n} 个节点：网络命名空间与链路" + (f"，限速 {rate}" if rate else ""),
        )
        netns.reap_stale()
        self.topology = netns.create(self.spec.nodes, self.spec.rate_bps)
        return self

    def launch(self) -> "ClusterRun":
        """Start one torchrun in each node of :meth:`build`'s topology."""
        n = len(self.topology.nodes)
        current().stage(f"starting a torchrun on each of {n} nodes", f"在 {n} 个节点上各启动一个 torchrun")
        try:
            rdzv = self.topology.nodes[0].address
            for node in self.topology.nodes:
                argv = torchrun_argv(self.spec, node, rdzv, self.topology.tag, self.module, self.args)
                proc = subprocess.Popen(
                    netns.exec_argv(node, argv),
                    env=node_env(node),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                    text=True,
                    bufsize=1,
                    start_new_session=True,
                )  # Ctrl-C reaches us; we end them
                self.procs.append(proc)
                self._stderr.append(collections.deque(maxlen=40))
                self._readers.append(self._read(proc.stdout, lambda line, i=node.index: self._lines.put((i, line))))
                self._readers.append(self._read(proc.stderr, self._stderr[-1].append))
        except BaseException:
            self.close()
            raise
        return self

    @staticmethod
    def _read(stream, sink) -> threading.Thread:
        def pump():
            for line in stream:
                sink(line.rstrip("\n"))

        thread = threading.Thread(target=pump, daemon=True, name="dtlab-cluster-reader")
        thread.start()
        return thread

    def close(self) -> None:
        """End every process and delete every namespace and link (idempotent).

        Each torchrun, and every process under it (its ranks, which it starts in sessions of their
        own), is killed too, whatever the teardown managed: a user namespace holder that was killed
        leaves its nodes out of reach, with only these processes in them."""
        self._finished = True
        try:
            if self.topology is not None:
                netns.teardown(self.topology)
        finally:
            for proc in self.procs:
                if proc.returncode is None:  # not reaped yet, so its pid is not anyone else's
                    for pid in [proc.pid, *descendants(proc.pid)]:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except (ProcessLookupError, PermissionError):
                            pass
                proc.wait()

    cancel = close

    @property
    def finished(self) -> bool:
        return self._finished

    # -- records
    def __iter__(self) -> Iterator[dict]:
        try:
            for record in self._stream():
                if record.get("summary"):
                    self.summary = record  # kept, not yielded: as the local pool's runs do
                else:
                    self.records.append(record)
                    yield record
        except GeneratorExit:
            raise
        except BaseException:  # a failure, KeyboardInterrupt, SystemExit: leave nothing behind
            self.close()
            raise
        self.close()

    def _stream(self) -> Iterator[dict]:
        quiet_since = time.monotonic()
        while not self._finished:
            try:
                _, line = self._lines.get(timeout=0.1)
            except queue.Empty:
                if self._all_exited_ok():
                    return
                if time.monotonic() - quiet_since > QUIET_LIMIT_S:
                    raise DtlabError(
                        f"the cluster printed nothing for {QUIET_LIMIT_S:.0f} s",
                        f"集群 {QUIET_LIMIT_S:.0f} 秒内没有任何输出",
                    ) from None
                continue
            quiet_since = time.monotonic()
            if line.startswith("{"):
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:  # a log line that happens to start with a brace
                    continue

    def _all_exited_ok(self) -> bool:
        """True once every node exited 0 and its output is read; raises if one failed."""
        codes = [proc.poll() for proc in self.procs]
        for node, code in enumerate(codes):
            if code not in (None, 0):
                self._readers[2 * node + 1].join(2.0)  # the rest of its traceback
                raise ClusterRunError(node, code, "\n".join(self._stderr[node]))
        return (
            all(code == 0 for code in codes)
            and self._lines.empty()
            and not any(reader.is_alive() for reader in self._readers)
        )

    def wait(self) -> "ClusterRun":
        for _ in self:
            pass
        return self

    def losses(self) -> list[float]:
        return [r["loss"] for r in self.records]

    def pids(self) -> list[int]:
        """Every process of this job now alive in its namespaces (torchruns and ranks)."""
        return (
            []
            if self.topology is None
            else [p for ns in self.topology.namespaces for p in netns.pids(ns, self.topology.host)]
        )


def start(spec: ClusterSpec, command: list[str]) -> ClusterRun:
    """Validate, check this machine can, and start ``command`` (``["train", "--dp", "4", ...]``)."""
    current().stage("checking the job and whether this machine can build the nodes", "检查任务，以及本机能否搭建节点")
    spec.validate()
    if not command or command[0] not in COMMANDS:
        got = command[0] if command else ""
        raise ConfigError(
            f"after `--`, expected one of {', '.join(COMMANDS)} and its flags, got {got!r}",
            f"`--` 之后应为 {', '.join(COMMANDS)} 之一及其参数，收到的是 {got!r}",
        )
    if command[0] == "train":
        _validate_train(command[1:], spec)
    check_available(shaped=spec.bandwidth is not None)
    return ClusterRun(spec, COMMANDS[command[0]], command[1:]).start()


def _validate_train(args: list[str], spec: ClusterSpec) -> None:
    """Refuse a training job that cannot run on this cluster before any namespace exists."""
    from dtlab.config.command_line import Parser
    from dtlab.config.flags import add_train_arguments, config_from_args

    parser = Parser(prog="dtlab cluster run ... -- train")
    add_train_arguments(parser)
    config = config_from_args(parser.parse_args(args))
    world_size = spec.world_size
    size = f"nodes x nproc_per_node = {spec.nodes} x {spec.nproc_per_node} = {world_size}"
    config.validate(
        max_world_size=world_size,
        limit_reason=(f"the cluster allows at most {size} ranks", f"该集群最多容纳 {size} 个 rank"),
    )
    if config.world_size != world_size:
        raise ConfigError(
            f"the job needs dp x tp x pp = {config.world_size} ranks, but {size}; make them equal",
            f"该任务需要 dp x tp x pp = {config.world_size} 个 rank，但 {size}；两者必须相等",
        )
