"""How fast is the link between two nodes, really? One TCP stream, timed at the receiver.

``measure_bandwidth(topology, nbytes)`` starts a receiver in node 0 and a
sender in node 1 (``python -m dtlab.cluster.probe serve|send``), streams
``nbytes`` of zeros, and returns the rate the receiver saw, from its first
byte to the last: what the shaped link carries as TCP payload, which is a
few percent under the rate asked for (each 1500-byte packet carries 52
bytes of TCP/IP headers, and the token bucket counts them too).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

PORT = 5201
CHUNK = 1 << 20


def serve(host: str, port: int) -> dict:
    """Accept one connection, read to its end, report bytes and seconds (first byte to last)."""
    with socket.create_server((host, port)) as server:
        print("ready", flush=True)
        conn, _ = server.accept()
        with conn:
            buf, total, first = bytearray(CHUNK), 0, None
            while True:
                n = conn.recv_into(buf)
                if first is None:
                    first = time.perf_counter()
                if n == 0:
                    break
                total += n
            seconds = time.perf_counter() - first
            conn.sendall(b"k")  # the sender waits for this, so it exits after the receiver
    return {"bytes": total, "seconds": seconds}


def send(host: str, port: int, nbytes: int) -> None:
    """Connect (retrying while the receiver starts) and send ``nbytes`` of zeros."""
    deadline = time.monotonic() + 20.0
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=60.0)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with conn:
        block, sent = bytes(CHUNK), 0
        while sent < nbytes:
            n = min(CHUNK, nbytes - sent)
            conn.sendall(block[:n])
            sent += n
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)


def measure_bandwidth(topology, nbytes: int, *, src: int = 1, dst: int = 0) -> float:
    """Bits per second from node ``src`` to node ``dst`` over one TCP stream of ``nbytes``."""
    from dtlab.cluster.netns import exec_argv

    receiver_node, sender_node = topology.nodes[dst], topology.nodes[src]
    me = [sys.executable, "-m", "dtlab.cluster.probe"]
    receiver = subprocess.Popen(
        exec_argv(receiver_node, [*me, "serve", receiver_node.address, str(PORT)]), stdout=subprocess.PIPE, text=True
    )
    try:
        receiver.stdout.readline()  # "ready": listening
        subprocess.run(
            exec_argv(sender_node, [*me, "send", receiver_node.address, str(PORT), str(nbytes)]),
            check=True,
            timeout=600,
        )
        result = json.loads(receiver.stdout.readline())
    finally:
        receiver.kill()
        receiver.wait()
    return 8 * result["bytes"] / result["seconds"]


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        print(json.dumps(serve(sys.argv[2], int(sys.argv[3]))), flush=True)
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
