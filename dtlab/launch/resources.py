"""What a process holds, read from Linux's /proc: descriptors, threads, memory, listening sockets.

The soak benchmark (``benchmarks/soak.py``) and the pool's tests use these to
show that a run gives back everything it took: a warm pool runs hundreds of
jobs in one notebook kernel, so a socket or a thread left behind per run
adds up. Linux only (elsewhere every reading is None or empty).
"""

from __future__ import annotations

import glob
import os


def usage(pid: int) -> dict | None:
    """``{"fds", "threads", "rss_mib"}`` of process ``pid``, or None where /proc cannot tell."""
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        threads = len(os.listdir(f"/proc/{pid}/task"))
        with open(f"/proc/{pid}/statm") as f:
            rss_pages = int(f.read().split()[1])
    except OSError:
        return None
    return {"fds": fds, "threads": threads, "rss_mib": round(rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)}


def listening_sockets(pids: list[int]) -> list[tuple[int, str, int]]:
    """``(pid, address, port)`` for every TCP socket in LISTEN state that one of ``pids`` holds.

    /proc/net/tcp{,6} list every socket with its inode; /proc/PID/fd links
    name the inodes a process holds (``socket:[INODE]``).
    """
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    found = []
    for table, decode in (("/proc/net/tcp", _ipv4), ("/proc/net/tcp6", _ipv6)):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: TCP_LISTEN
                address, port = local.split(":")
                found.append((inodes[inode], decode(address), int(port, 16)))
    return found


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4-mapped loopback address."""
    return address.startswith("127.") or address in ("::1", "::ffff:127.0.0.1") or address.startswith("::ffff:127.")


def _ipv4(hex_address: str) -> str:
    """/proc's little-endian hex (``0100007F``) as dotted quad (``127.0.0.1``)."""
    return ".".join(str(int(hex_address[i : i + 2], 16)) for i in (6, 4, 2, 0))


def _ipv6(hex_address: str) -> str:
    """/proc's hex, four little-endian 32-bit words, as an IPv6 address."""
    import ipaddress

    words = [hex_address[i : i + 8] for i in range(0, 32, 8)]
    raw = b"".join(bytes.fromhex(w)[::-1] for w in words)
    address = ipaddress.IPv6Address(raw)
    return f"::ffff:{address.ipv4_mapped}" if address.ipv4_mapped else str(address)


def process_exists(pid: int) -> bool:
    """True while a process ``pid`` runs (one of another user's counts: signal 0 is refused, not failed).

    A zombie does not count: a process killed (SIGKILL) under a parent that has not reaped it yet, as
    ``subprocess.run(..., capture_output=True)`` does only after reading its output to the end, still
    answers ``kill(pid, 0)``; it is dead all the same."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not is_zombie(pid)


def is_zombie(pid: int) -> bool:
    """True if ``pid`` has exited and waits to be reaped (Linux ``/proc``; False where it cannot be told)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def watch_for_exit(pid: int, interval: float = 0.5):
    """A function that waits up to ``interval`` seconds and returns True once ``pid`` has exited.

    Linux: a pidfd (``os.pidfd_open``), which becomes readable the moment the process exits, reaped or
    not; elsewhere :func:`process_exists` every ``interval``."""
    import select
    import time

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is None:

        def poll() -> bool:
            time.sleep(interval)
            return not process_exists(pid)

        return poll
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return lambda: bool(poller.poll(interval * 1000))


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` now: its children, theirs, and so on (``/proc/PID/task/TID/children``)."""
    found, parents = [], [pid]
    while parents:
        parent = parents.pop()
        for listing in glob.glob(f"/proc/{parent}/task/*/children"):
            try:
                with open(listing) as f:
                    children = [int(child) for child in f.read().split()]
            except OSError:  # it ended meanwhile
                continue
            found += children
            parents += children
    return found


RENDEZVOUS_PREFIX = "dtlab-rendezvous-"
"""A pool's rendezvous folder is ``$TMPDIR/dtlab-rendezvous-PID-XXXXXXXX``, PID the launcher's."""


def sweep_rendezvous() -> list[str]:
    """Remove the rendezvous folders of this user's launchers that no longer run (killed with SIGKILL, a
    pool never closes its own); returns what was removed."""
    import shutil
    import tempfile

    removed = []
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), RENDEZVOUS_PREFIX + "*-*")):
        pid = os.path.basename(folder)[len(RENDEZVOUS_PREFIX) :].split("-")[0]
        try:
            mine = os.lstat(folder).st_uid == os.getuid()
        except OSError:
            continue
        if mine and pid.isdigit() and not process_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def sweep_semaphores(min_age_s: float = 60.0, shm: str = "/dev/shm") -> list[str]:
    """Remove multiprocessing's named semaphores (``/dev/shm/sem.mp-*``) of this user that no process maps
    any more and that are older than ``min_age_s``: what a process group killed whole (SIGKILL, its resource
    tracker with it) leaves behind. A semaphore in use is mapped by every process using it
    (``/proc/PID/maps``). Returns what was removed."""
    import time

    candidates = []
    for path in glob.glob(os.path.join(shm, "sem.mp-*")):
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if info.st_uid == os.getuid() and time.time() - info.st_mtime > min_age_s:
            candidates.append(path)
    if not candidates:
        return []
    mapped = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps, encoding="utf-8", errors="replace") as f:
                mapped.update(line.split(None, 5)[-1].strip() for line in f if "/sem.mp-" in line)
        except OSError:
            continue
    removed = []
    for path in candidates:
        if path not in mapped:
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed
