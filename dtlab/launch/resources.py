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
    """True while a process ``pid`` exists (one of another user's counts: signal 0 is refused, not failed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
