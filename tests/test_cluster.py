"""The local cluster: namespace nodes equal the local pool, teardown is total, shaping is real.

Tests that build namespaces need iproute2, and root (CI has both) or, for the
ones of the last section, user namespaces (which root may make too); elsewhere
they skip, giving the reason :func:`dtlab.cluster.unavailable_reason` gives.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import dtlab.train
from dtlab.cluster import ClusterSpec, netns, spec, start, unavailable_reason, userns
from dtlab.cluster.launcher import ClusterRunError
from dtlab.cluster.probe import measure_bandwidth
from dtlab.config import TrainConfig
from dtlab.i18n import ConfigError
from tests.harness import alive, session_pool

REASON = unavailable_reason()
needs_namespaces = pytest.mark.skipif(
    REASON is not None or userns.wanted(),
    reason=(REASON or ("nodes are built in a user namespace here, not by root",))[0],
)
"""Root's namespaces, which the machine's own ``ip netns`` sees."""


def _links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip() for line in out.splitlines()}


def _rank_pid(run, node: int) -> int:
    """A rank of ``node`` (not its torchrun): the process running ``-m dtlab.train``."""
    for pid in netns.pids(run.topology.nodes[node].namespace):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        if b"dtlab.train" in argv and b"torch.distributed.run" not in argv:
            return pid
    raise AssertionError("no rank found")


def _assert_nothing_left(tag: str, pids: list[int], links_before: set[str]) -> None:
    assert not [ns for ns in netns.namespaces() if ns.startswith(tag)]
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)]
    assert _links() <= links_before


# --------------------------------------------------------------------------- no root needed


def test_rates_and_shapes_are_validated_in_both_languages():
    assert spec.parse_rate("100mbit") == 100_000_000
    assert spec.parse_rate("1.5gbit") == 1_500_000_000
    assert spec.parse_rate("50MB/s") == 400_000_000
    for bad in ("fast", "100", "100mbps", "0.5mbit", "1000gbit"):
        with pytest.raises(ConfigError) as error:
            spec.parse_rate(bad)
        assert bad in error.value.en and bad in error.value.zh
    for kwargs in (
        {"nodes": 0},
        {"nodes": 9},
        {"nproc_per_node": 0},
        {"nodes": 4, "nproc_per_node": 4},
        {"bandwidth": "slow"},
    ):
        with pytest.raises(ConfigError) as error:
            ClusterSpec(**kwargs).validate()
        assert any("\u4e00" <= ch <= "\u9fff" for ch in error.value.zh)


def test_the_report_says_slower_when_the_hierarchical_all_reduce_loses(capsys):
    """A ratio below 1 (flat / hierarchical) is a slowdown, printed as one: not "0.98x faster"."""
    from dtlab.cluster.bench import print_report

    def report_with(flat_s: float, hierarchical_s: float) -> str:
        seconds = {"intra": 0.004, "inter": 0.05, "flat": flat_s, "flat_torch": flat_s, "hierarchical": hierarchical_s}
        print_report(
            {
                "cluster": {"nodes": 2, "nproc_per_node": 2, "bandwidth": "1gbit"},
                "bytes": 4 << 20,
                "tcp_bps": None,
                "links": {},
                "seconds": seconds,
                "busbw_Bps": dict.fromkeys(seconds),
                "hierarchical_over_flat": flat_s / hierarchical_s,
                "inter_node_bytes": {"flat": 6 << 20, "hierarchical": 4 << 20},
            }
        )
        return capsys.readouterr().out

    slower = report_with(0.0590, 0.0599)
    assert "hierarchical is 1.02x slower than the flat ring" in slower and "faster" not in slower
    assert "比扁平环慢：用时是扁平环的 1.02 倍" in slower and "快" not in slower
    faster = report_with(0.5436, 0.3782)
    assert "hierarchical is 1.44x faster than the flat ring" in faster and "比扁平环快 1.44 倍" in faster


def test_a_job_that_does_not_fit_is_refused_before_any_namespace_exists():
    before = set(netns.namespaces()) if REASON is None else set()
    for command, needle in (
        (["train", "--dp", "2"], "dp x tp x pp = 2"),
        (["train", "--dp", "4", "--tp", "3"], "tp"),
        (["bench"], "train"),
        ([], "train"),
    ):
        with pytest.raises(ConfigError) as error:
            start(ClusterSpec(nodes=2, nproc_per_node=2), command)
        assert needle in error.value.en
    if REASON is None:
        assert set(netns.namespaces()) == before


def test_without_root_or_user_namespaces_the_cluster_refuses_bilingually(monkeypatch):
    """Not root, and user namespaces turned off (as on a system that refuses them): refused before
    anything is made, in both languages, pointing to the local pool."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv(userns.ENV, "0")
    en, zh = unavailable_reason()
    assert "root" in en and "root" in zh and "dtlab train" in en and "用户命名空间" in zh
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; os.geteuid = lambda: 1000; from dtlab.cli import main; sys.exit(main(sys.argv[1:]))",
            "cluster",
            "run",
            "--nodes",
            "2",
            "--",
            "train",
            "--dp",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, userns.ENV: "0"},
    )
    assert proc.returncode == 2 and "root" in proc.stderr
    assert any("\u4e00" <= ch <= "\u9fff" for ch in proc.stderr)


def test_a_system_that_refuses_user_namespaces_is_named_in_the_reason(monkeypatch):
    """Not root, and the user namespace cannot be made (Ubuntu 24.04, Binder): the system's own
    reason is passed on, in both languages."""

    def refuse():
        raise userns.UsernsError(
            "`unshare --user --mount --net` failed: Operation not permitted",
            "`unshare --user --mount --net` 失败：Operation not permitted",
        )

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.delenv(userns.ENV, raising=False)
    monkeypatch.delenv(spec.NO_CLUSTER_ENV, raising=False)
    monkeypatch.setattr(userns, "holder", refuse)
    monkeypatch.setattr(spec, "_CAN", set())  # not what an earlier probe found
    monkeypatch.setattr(userns, "command", lambda name: f"/usr/bin/{name}")  # iproute2 is there
    en, zh = unavailable_reason(shaped=False)
    assert "user namespace" in en and "Operation not permitted" in en and "dtlab train" in en
    assert "用户命名空间" in zh and "Operation not permitted" in zh


def test_cluster_check_says_how_nodes_are_built_or_why_not(monkeypatch):
    """``dtlab cluster check``: exit 0 and the way (as root, or in a user namespace), or exit 1 and the
    reason, in both languages."""

    def check(**env: str) -> tuple[int, str]:
        proc = subprocess.run(
            [sys.executable, "-m", "dtlab.cli", "cluster", "check"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **env},
        )
        return proc.returncode, proc.stdout

    code, out = check(DTLAB_NO_CLUSTER="1")
    assert code == 1 and "no: local clusters are turned off here" in out and "不能：" in out
    root = os.geteuid() == 0
    code, out = check(**{userns.ENV: "0"})
    if root and REASON is None:
        assert code == 0 and "as root" in out and "以 root 身份" in out
    elif not root:
        assert code == 1 and "root" in out and "用户命名空间" in out
    monkeypatch.setenv(userns.ENV, "1")
    can = spec.unavailable_reason() is None  # what this process finds, the check must say too
    code, out = check(**{userns.ENV: "1"})
    userns.stop()
    assert code == (0 if can else 1) and ("user namespace of your own" in out) == can


def test_the_sysctl_that_refuses_user_namespaces_is_named(tmp_path):
    """Ubuntu's AppArmor switch, Debian's old clone switch, a limit of zero: each is named, in both
    languages, with what it means; a system that allows them names none."""

    def sysctls(**values: str) -> str:
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        for name, value in values.items():
            path = root.joinpath(*name.split("__"))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(value + "\n")
        return str(root)

    allowed = sysctls(kernel__apparmor_restrict_unprivileged_userns="0", user__max_user_namespaces="96362")
    assert userns.restriction(allowed) is None
    en, zh = userns.restriction(sysctls(kernel__apparmor_restrict_unprivileged_userns="1"))
    assert "kernel.apparmor_restrict_unprivileged_userns = 1" in en and "Ubuntu 24.04" in en and "AppArmor" in zh
    en, zh = userns.restriction(sysctls(kernel__unprivileged_userns_clone="0"))
    assert "kernel.unprivileged_userns_clone = 0" in en and "普通用户" in zh
    en, _ = userns.restriction(sysctls(user__max_user_namespaces="0"))
    assert "user.max_user_namespaces = 0" in en


# --------------------------------------------------------------------------- root and iproute2


@needs_namespaces
def test_shaping_takes_effect():
    """The same transfer between two nodes is slower on a 50 Mbit/s link than unshaped.

    Only that comparison is asserted; how close the measured rate comes to the
    rate asked for is a benchmark (`dtlab bench allreduce --cluster`), not a test.
    """
    seconds = {}
    for rate in (None, 50_000_000):
        topology = netns.create(2, rate)
        try:
            nbytes = 2_000_000
            seconds[rate] = 8 * nbytes / measure_bandwidth(topology, nbytes)
        finally:
            netns.teardown(topology)
        assert topology.tag not in " ".join(netns.namespaces())
    assert seconds[50_000_000] > seconds[None]


@needs_namespaces
@pytest.mark.slow
def test_two_nodes_of_two_ranks_equal_the_local_pool():
    """TP inside each node, DP across the two nodes: the same losses as the same layout locally."""
    links_before = _links()
    run = start(
        ClusterSpec(nodes=2, nproc_per_node=2, bandwidth="1gbit"),
        ["train", "--dp", "2", "--tp", "2", "--steps", "3", "--seed", "0", "--json"],
    )
    tag = run.topology.tag
    run.wait()
    local = dtlab.train(TrainConfig(dp=2, tp=2, steps=3, seed=0), pool=session_pool()).wait()
    assert run.losses() == local.losses() and len(run.losses()) == 3
    assert run.summary["world_size"] == 4
    _assert_nothing_left(tag, [], links_before)


@needs_namespaces
@pytest.mark.slow
def test_a_killed_rank_fails_the_run_and_leaves_nothing():
    links_before = _links()
    run = start(ClusterSpec(nodes=2, nproc_per_node=1), ["train", "--dp", "2", "--steps", "100000", "--json"])
    records = iter(run)
    next(records)
    pids = run.pids()
    os.kill(_rank_pid(run, 1), signal.SIGKILL)
    with pytest.raises(ClusterRunError) as error:
        for _ in records:
            pass
    assert error.value.code not in (0, None) and "节点" in error.value.zh
    _assert_nothing_left(run.topology.tag, pids, links_before)


@needs_namespaces
@pytest.mark.slow
def test_sigint_tears_everything_down():
    links_before = _links()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dtlab.cli",
            "cluster",
            "run",
            "--nodes",
            "2",
            "--nproc-per-node",
            "1",
            "--bandwidth",
            "100mbit",
            "--",
            "train",
            "--dp",
            "2",
            "--steps",
            "100000",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # SIGABRT prints every thread
        # Ctrl-C as a terminal delivers it: a test run started in the background
        # (`pytest &` in a script) passes SIGINT on ignored, and then so would this.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert json.loads(proc.stdout.readline())["step"] == 0
    tag = f"{netns.PREFIX}{proc.pid}-"
    pids = [p for ns in netns.namespaces() if ns.startswith(tag) for p in netns.pids(ns)]
    assert len(pids) >= 4  # two torchruns, two ranks
    proc.send_signal(signal.SIGINT)
    # Read both pipes to the end while waiting (a ~4 KB record per step fills an unread 64 KiB pipe). If
    # it does not exit, where its threads were is printed before the test fails.
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        pytest.fail("no exit 60 s after SIGINT; where each thread was:\n" + proc.communicate(timeout=30)[1][-6000:])
    assert proc.returncode == 130, err
    assert "已中断" in err
    _assert_nothing_left(tag, pids, links_before)


@needs_namespaces
def test_what_a_killed_owner_left_behind_is_reaped():
    """A cluster whose owning process died (SIGKILL: no teardown ran) is removed by the next run."""
    owner = subprocess.Popen([sys.executable, "-c", "pass"])
    owner.wait()  # a pid that no longer exists
    orphan = f"{netns.PREFIX}{owner.pid}-0-n0"
    subprocess.run(["ip", "netns", "add", orphan], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", orphan, "sleep", "600"])
    try:
        deadline = time.monotonic() + 30
        while not netns.pids(orphan) and time.monotonic() < deadline:  # wait until it is inside
            time.sleep(0.05)
        assert orphan in netns.reap_stale()
        assert orphan not in netns.namespaces()
        assert sleeper.wait(timeout=10) != 0  # ended by the reaper
    finally:
        sleeper.kill()
        subprocess.run(["ip", "netns", "del", orphan], capture_output=True)


# --------------------------------------------------------------------------- a user namespace (no root)


@pytest.fixture
def in_user_namespace(monkeypatch):
    """Nodes built as an ordinary user builds them, inside a user namespace (DTLAB_CLUSTER_USERNS=1;
    root may make one too); skipped where this system refuses them."""
    monkeypatch.setenv(userns.ENV, "1")
    reason = spec.unavailable_reason()
    if reason is not None:
        pytest.skip(reason[0])
    yield
    userns.stop()


@pytest.mark.slow
def test_nodes_in_a_user_namespace_train_as_the_local_pool_does(in_user_namespace):
    """The same job as an ordinary user would run it: the same losses as the local pool, shaped links,
    and nothing of it visible to the machine's own ``ip netns`` while it runs or left after."""
    links_before, host_before = _links(), set(netns.namespaces(()))
    run = start(
        ClusterSpec(nodes=2, nproc_per_node=1, bandwidth="100mbit"),
        ["train", "--dp", "2", "--steps", "3", "--seed", "0", "--json"],
    )
    records = iter(run)
    first = next(records)
    inside = netns.namespaces()
    assert {f"{run.topology.tag}-n0", f"{run.topology.tag}-n1"} <= set(inside)
    assert set(netns.namespaces(())) == host_before  # built inside the holder only
    qdisc = subprocess.run(
        [*run.topology.host, "tc", "-n", run.topology.nodes[0].namespace, "qdisc", "show"],
        capture_output=True,
        text=True,
    ).stdout
    assert "tbf" in qdisc and "100Mbit" in qdisc  # the node's link is shaped
    pids = run.pids()
    assert len(pids) >= 4  # two torchruns, two ranks
    losses = [first["loss"]] + [r["loss"] for r in records]
    local = dtlab.train(TrainConfig(dp=2, steps=3, seed=0), pool=session_pool()).wait()
    assert losses == local.losses()
    assert not [ns for ns in netns.namespaces() if ns.startswith(run.topology.tag)]
    _assert_nothing_left(run.topology.tag, pids, links_before)


def test_a_killed_owner_takes_its_user_namespace_nodes_with_it(in_user_namespace):
    """The owner dies without tearing down (SIGKILL): its holder sees its pipe close, ends what runs in
    the nodes and exits, and the node's network namespace goes with it (no process is left in it)."""
    script = (
        "import os, subprocess, sys, time\n"
        "from dtlab.cluster import netns, userns\n"
        "topology = netns.create(2, None)\n"
        "sleeper = subprocess.Popen(netns.exec_argv(topology.nodes[1], ['sleep', '600']))\n"
        "while not netns.pids(topology.nodes[1].namespace):\n"
        "    time.sleep(0.05)\n"
        "print(sleeper.pid, userns.holder().proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env={**os.environ, userns.ENV: "1"}
    )
    try:
        sleeper, holder = map(int, owner.stdout.readline().split())
        node = os.stat(f"/proc/{sleeper}/ns/net").st_ino
        assert alive(sleeper) and alive(holder) and _in_network_namespace(node)
        owner.kill()
        owner.wait()
        _wait_until_dead([sleeper, holder])
        assert not alive(sleeper) and not alive(holder) and not _in_network_namespace(node)
    finally:
        owner.kill()


def test_a_holder_sent_sigterm_ends_its_nodes_first(in_user_namespace):
    """Killed politely (SIGTERM, as a session's end sends it), the holder still ends every process in
    its nodes before it exits; a topology whose holder ended has nothing left to tear down."""
    topology = netns.create(2, None)
    sleeper = subprocess.Popen(netns.exec_argv(topology.nodes[0], ["sleep", "600"]))
    try:
        deadline = time.monotonic() + 30
        while not netns.pids(topology.nodes[0].namespace, topology.host) and time.monotonic() < deadline:
            time.sleep(0.05)
        holder = topology.holder.proc
        holder.send_signal(signal.SIGTERM)
        assert sleeper.wait(timeout=20) != 0 and holder.wait(timeout=20) == 0
        netns.teardown(topology)  # nothing to do, and no error
    finally:
        sleeper.kill()


@pytest.mark.slow
def test_a_job_whose_holder_was_killed_still_ends_every_process(in_user_namespace):
    """The holder SIGKILLed mid-run (nothing in it can clean up; its nodes are out of reach by name):
    closing the run still ends every torchrun and rank, by the process tree."""
    run = start(ClusterSpec(nodes=2, nproc_per_node=1), ["train", "--dp", "2", "--steps", "100000", "--json"])
    try:
        next(iter(run))
        pids = run.pids()
        assert len(pids) >= 4  # two torchruns, two ranks
        run.topology.holder.proc.kill()
        run.topology.holder.proc.wait()
        run.close()
        _wait_until_dead(pids)
        assert not [p for p in pids if alive(p)]
    finally:
        run.close()


def _in_network_namespace(inode: int) -> bool:
    """Whether some process still lives in the network namespace of this inode."""
    for ns in glob.glob("/proc/[0-9]*/ns/net"):
        try:
            if os.stat(ns).st_ino == inode:
                return True
        except OSError:
            continue
    return False


def _wait_until_dead(pids: list[int], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
