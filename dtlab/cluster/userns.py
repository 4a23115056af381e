"""Namespace nodes without root: everything built inside one *user namespace* of this process's own.

Making network namespaces, veth links and token buckets needs ``CAP_SYS_ADMIN``
and ``CAP_NET_ADMIN``. Root has them; so does any user *inside a user
namespace it created*, for the namespaces that user namespace owns
(user_namespaces(7)). On most Linux systems an ordinary user may create one
(``unshare --user``); Ubuntu from 24.04 on (AppArmor) and containers under
Docker's default seccomp profile refuse, and there the cluster stays root's.

A *holder* process is started once per owner process::

    unshare --user --map-root-user --mount --net  sh -c '<mount a tmpfs on /run/netns>; wait for EOF'

* ``--user --map-root-user``: a user namespace in which this user is uid 0,
  with every capability over the namespaces it owns (none over the machine);
* ``--mount``: ``ip netns add`` names a namespace by bind-mounting it under
  ``/run/netns``, which an ordinary user may not write, so a private tmpfs is
  mounted there, seen only inside the holder's mount namespace;
* ``--net``: a network namespace the holder owns, for ``ip`` to return to
  after creating each node (it may not enter the machine's own).

Every ``ip``, ``tc`` and ``ip netns exec`` of :mod:`dtlab.cluster.netns`
then runs through ``nsenter`` into the holder (:attr:`Holder.prefix`), so the
same code builds the same topology either way. Nothing outside the holder
changes. The holder reads its standard input until the owner closes it: when
the owner stops it, or dies (the kernel closes a dead process's pipes), the
holder ends every process still in its nodes and exits, and with it go the
mount of ``/run/netns`` and every namespace, link and token bucket in it.
"""
from __future__ import annotations

import atexit
import os
import select
import shutil
import subprocess
import threading

from dtlab.i18n import DtlabError

ENV = "DTLAB_CLUSTER_USERNS"
"""``1``: build nodes inside a user namespace even as root (what a test uses to run that path);
``0``: never (a machine that refuses them; root builds nodes directly); unset: only when not root."""

START_TIMEOUT_S = 30.0

_SCRIPT = """
if [ -d /run/netns ]; then mount -t tmpfs dtlab-netns /run/netns || exit 1
else mount -t tmpfs dtlab-run /run && mkdir /run/netns || exit 1; fi
echo ready
cat > /dev/null
for ns in $(ip netns list | cut -d' ' -f1); do kill -KILL $(ip netns pids "$ns") 2>/dev/null; done
"""
"""The holder: a private /run/netns, "ready", then wait for EOF on stdin; at EOF end what is left."""


class UsernsError(DtlabError, RuntimeError):
    """The user namespace could not be made (the reason is the system's)."""


def wanted() -> bool:
    """Whether nodes are built inside a user namespace here (see :data:`ENV`)."""
    choice = os.environ.get(ENV, "")
    if choice in ("0", "1"):
        return choice == "1"
    return not (hasattr(os, "geteuid") and os.geteuid() == 0)


class Holder:
    """The process whose user, mount and network namespaces the nodes are built in (module docstring)."""

    def __init__(self):
        self.proc = subprocess.Popen(["unshare", "--user", "--map-root-user", "--mount", "--net",
                                      "--propagation", "private", "sh", "-c", _SCRIPT],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            why = (err or "").strip() or "no answer"
            raise UsernsError(f"`unshare --user --mount --net` failed: {why}",
                              f"`unshare --user --mount --net` 失败：{why}")
        self.prefix = ["nsenter", f"--target={self.proc.pid}", "--user", "--mount", "--net",
                       "--preserve-credentials"]
        """Put before a command to run it inside the holder's namespaces."""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """Close its input: it ends what is left in its nodes and exits, taking every namespace with it."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_holder: Holder | None = None
_lock = threading.Lock()


def holder() -> Holder:
    """This process's holder, started on first use (and again if it ended); stopped at exit."""
    global _holder
    with _lock:
        if _holder is None or not _holder.alive():
            missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
            if missing:
                raise UsernsError(f"`{missing[0]}` (util-linux) is not on PATH",
                                  f"PATH 中没有 `{missing[0]}`（util-linux）")
            _holder = Holder()
        return _holder


def stop() -> None:
    """Stop this process's holder, if one runs (every namespace built in it goes)."""
    global _holder
    with _lock:
        if _holder is not None:
            _holder.stop()
            _holder = None


atexit.register(stop)
