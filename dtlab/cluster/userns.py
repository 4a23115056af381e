"""Namespace nodes without root: everything built inside one *user namespace* of this process's own.

Making network namespaces, veth links and token buckets needs ``CAP_SYS_ADMIN``
and ``CAP_NET_ADMIN``. Root has them; so does any user *inside a user
namespace it created*, for the namespaces that user namespace owns
(user_namespaces(7)). Most Linux distributions let an ordinary user create one
(``unshare --user``). Some do not: Ubuntu from 24.04 on (the sysctl
``kernel.apparmor_restrict_unprivileged_userns``), Debian up to 10
(``kernel.unprivileged_userns_clone=0``), RHEL 7 (``user.max_user_namespaces=0``),
and containers under Docker's default seccomp profile; there the cluster
stays root's.

A *holder* process is started once per owner process::

    unshare --user --map-root-user --mount --net  sh -c '<a private /run/netns>; wait for EOF'

* ``--user --map-root-user``: a user namespace in which this user is uid 0,
  with every capability over the namespaces it owns (none over the machine);
* ``--mount``: ``ip netns add`` names a namespace by bind-mounting it under
  ``/run/netns``, which an ordinary user may not write. Inside the holder's
  own mount namespace ``/run`` becomes a tmpfs with a fresh ``netns``, and
  every other entry of the machine's ``/run`` bound back in, so a node still
  sees ``/run/user``, ``/run/systemd/resolve`` and the rest;
* ``--net``: a network namespace the holder owns, for ``ip`` to return to
  after creating each node (it may not enter the machine's own).

Every ``ip``, ``tc`` and ``ip netns exec`` of :mod:`dtlab.cluster.netns`
then runs through ``nsenter`` into the holder (:attr:`Holder.prefix`), so the
same code builds the same topology either way. Nothing outside the holder
changes. The holder reads its standard input until the owner closes it (the
owner stops it, or dies: the kernel closes a dead process's pipes) or until
it is sent SIGTERM, SIGINT or SIGHUP; then it kills every process in its
nodes, again until none is left, deletes the nodes and exits, and with it go
its ``/run`` and every namespace, link and token bucket in it.
"""

from __future__ import annotations

import atexit
import glob
import os
import re
import select
import shutil
import subprocess
import tempfile
import threading

from dtlab.i18n import DtlabError
from dtlab.launch.resources import process_exists

ENV = "DTLAB_CLUSTER_USERNS"
"""``1``: build nodes inside a user namespace even as root (what a test uses to run that path);
``0``: never (a machine that refuses them; root builds nodes directly); unset: only when not root."""

START_TIMEOUT_S = 30.0
SBIN = ("/usr/sbin", "/sbin")
"""Where iproute2's ``tc`` (and on some systems ``ip``) lives: not on an ordinary user's PATH on Debian."""

_SCRIPT = r"""
ip="$1"; run_copy="$2"
mount --rbind /run "$run_copy" && mount -t tmpfs dtlab-run /run || {
    echo "could not mount a private /run (mount --rbind /run; mount -t tmpfs)" >&2; exit 1; }
for entry in "$run_copy"/* "$run_copy"/.[!.]*; do     # the machine's /run, bound back in, but netns
    [ -e "$entry" ] || [ -L "$entry" ] || continue
    name="/run/${entry##*/}"
    [ "$name" = /run/netns ] && continue
    if [ -L "$entry" ]; then ln -s "$(readlink "$entry")" "$name"
    elif [ -d "$entry" ]; then mkdir -p "$name" && mount --rbind "$entry" "$name"
    else : > "$name" && mount --bind "$entry" "$name"; fi
done
mkdir -p /run/netns || { echo "could not make /run/netns" >&2; exit 1; }
cleanup() {
    for attempt in 1 2 3 4 5 6 7 8 9 10; do                # until no process is left in a node
        left=""
        for ns in $("$ip" netns list | cut -d' ' -f1); do left="$left $("$ip" netns pids "$ns")"; done
        set -- $left
        [ $# -eq 0 ] && break
        kill -KILL "$@" 2>/dev/null
        sleep 0.2
    done
    for ns in $("$ip" netns list | cut -d' ' -f1); do "$ip" netns del "$ns"; done
    exit 0
}
trap cleanup HUP INT TERM
echo ready
while read -r line; do :; done
cleanup
"""
"""The holder (module docstring): a private /run/netns, "ready", then stdin read to its end, then the cleanup."""


RESTRICTIONS = (
    (
        "kernel.apparmor_restrict_unprivileged_userns",
        "1",
        "AppArmor restricts user namespaces here (Ubuntu 24.04 and later)",
        "本机的 AppArmor 限制了用户命名空间（Ubuntu 24.04 起）",
    ),
    (
        "kernel.unprivileged_userns_clone",
        "0",
        "the kernel refuses user namespaces to ordinary users",
        "内核不允许普通用户创建用户命名空间",
    ),
    ("user.max_user_namespaces", "0", "the kernel allows no user namespaces at all", "内核完全不允许创建用户命名空间"),
)
"""The sysctls by which a system refuses user namespaces, the value that refuses, and what it means."""


class UsernsError(DtlabError, RuntimeError):
    """The user namespace could not be made (the reason is the system's)."""


def restriction(sysctl_root: str = "/proc/sys") -> tuple[str, str] | None:
    """(English, Chinese): the sysctl of :data:`RESTRICTIONS` that refuses user namespaces here, if one does."""
    for name, refusing, en, zh in RESTRICTIONS:
        try:
            with open(os.path.join(sysctl_root, *name.split("."))) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value == refusing:
            return f"{name} = {value}: {en}", f"{name} = {value}：{zh}"
    return None


def wanted() -> bool:
    """Whether new nodes are built inside a user namespace here (see :data:`ENV`)."""
    choice = os.environ.get(ENV, "")
    if choice in ("0", "1"):
        return choice == "1"
    return not (hasattr(os, "geteuid") and os.geteuid() == 0)


def command(name: str) -> str | None:
    """The absolute path of ``name`` on PATH or in /usr/sbin, /sbin; None where it is in neither."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN]))


class Holder:
    """The process whose user, mount and network namespaces the nodes are built in (module docstring)."""

    def __init__(self):
        missing = [tool for tool in ("unshare", "nsenter", "ip") if command(tool) is None]
        if missing:
            raise UsernsError(
                f"`{missing[0]}` is not on PATH (util-linux: unshare, nsenter; iproute2: ip); install it, "
                "or use the local pool (dtlab train)",
                f"PATH 中没有 `{missing[0]}`（unshare、nsenter 属于 util-linux，ip 属于 iproute2）；"
                "请安装它，或改用本地进程池（dtlab train）",
            )
        _remove_stale_copies()
        self.run_copy = tempfile.mkdtemp(prefix=f"dtlab-userns-{os.getpid()}-")
        self.proc = subprocess.Popen(
            [
                command("unshare"),
                "--user",
                "--map-root-user",
                "--mount",
                "--net",
                "--propagation",
                "private",
                "sh",
                "-c",
                _SCRIPT,
                "dtlab-holder",
                command("ip"),
                self.run_copy,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            self.proc.kill()
            try:
                err = self.proc.communicate(timeout=10)[1]
            except subprocess.TimeoutExpired:
                err = ""
            self._remove_copy()
            why = (err or "").strip() or f"no answer in {START_TIMEOUT_S:.0f} s"
            cause_en, cause_zh = restriction() or ("", "")
            raise UsernsError(
                f"`unshare --user --mount --net` failed: {why}" + (f"; {cause_en}" if cause_en else ""),
                f"`unshare --user --mount --net` 失败：{why}" + (f"；{cause_zh}" if cause_zh else ""),
            )
        self.prefix = [
            command("nsenter"),
            f"--target={self.proc.pid}",
            "--user",
            "--mount",
            "--net",
            "--preserve-credentials",
        ]
        """Put before a command to run it inside the holder's namespaces."""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """Close its input: it ends what is left in its nodes and exits, taking every namespace with it."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._remove_copy()

    def _remove_copy(self) -> None:
        try:
            os.rmdir(self.run_copy)  # empty outside the holder: its /run was mounted there inside
        except OSError:
            pass


def _remove_stale_copies() -> None:
    """Remove the empty mount points that holders of owners now gone left in the temporary directory."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "dtlab-userns-*-*")):
        match = re.fullmatch(r"dtlab-userns-(\d+)-.*", os.path.basename(path))
        if match and not process_exists(int(match.group(1))):
            try:
                os.rmdir(path)
            except OSError:
                pass


_holder: Holder | None = None
_lock = threading.Lock()


def holder() -> Holder:
    """This process's holder, started on first use (and again if it ended); stopped at exit."""
    global _holder
    with _lock:
        if _holder is None or not _holder.alive():
            _holder = Holder()
        return _holder


def stop() -> None:
    """Stop this process's holder, if one runs (every namespace built in it goes)."""
    global _holder
    with _lock:
        if _holder is not None:
            _holder.stop()
            _holder = None


def _forget_in_child() -> None:
    """A process forked from the owner (a DataLoader worker, multiprocessing's fork) must not hold the
    holder's input open, or the holder would outlive the owner; the child forgets it."""
    global _holder
    if _holder is not None and _holder.proc.stdin is not None:
        try:
            _holder.proc.stdin.close()  # the child's copy of the pipe's end only
        except OSError:
            pass
    _holder = None


atexit.register(stop)
os.register_at_fork(after_in_child=_forget_in_child)
