"""A rank that destroys its process group right after a step must exit 0 (issue 36, item 5).

One run: 2 ranks, each a fresh process, join a gloo group over loopback (a
FileStore), take one step of a layout, call ``dist.destroy_process_group()``
and return from ``__main__``, so the interpreter finalizes with gloo's threads
alive. Repeated, it counts the runs in which a rank did not exit 0 (the abort
seen: SIGABRT, "terminate called without an active exception", gloo's worker
destroying a finished collective that still held Python objects).

    python -m tests.clean_exit --mode overlapped --runs 200      # fresh processes, as a user's script
    python -m tests.clean_exit --mode all --runs 20 --fork       # children forked from one importer (fast)

``--fork``: a parent imports torch once and forks each run's two ranks; a child
still finalizes its interpreter (``sys.exit``), which is what the abort needs.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dtlab.config import MODEL_PRESETS
from dtlab.launch.worker import loopback_interface
from dtlab.model import build_model
from dtlab.parallel.data_parallel import apply_data_parallel
from dtlab.parallel.replicated import ReplicatedOptimizer
from dtlab.parallel.tensor_parallel import apply_tensor_parallel
from dtlab.parallel.zero import apply_zero

torch.optim.SGD([nn.Parameter(torch.zeros(1))])  # a first optimizer imports torch._dynamo: once, here
MODES = ("per_parameter", "bucketed", "overlapped", "zero1", "zero2", "zero3", "tp")
VOCAB = 32


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)) for _ in range(3))
        self.head = nn.Linear(16, VOCAB)

    def forward(self, x, y):
        h = self.emb(x)  # (B, T, 16)
        for block in self.blocks:
            h = h + block(h)
        return F.cross_entropy(self.head(h).flatten(0, 1), y.flatten())


def _batch(rank: int):
    g = torch.Generator().manual_seed(rank)
    return torch.randint(0, VOCAB, (4, 8), generator=g), torch.randint(0, VOCAB, (4, 8), generator=g)


def one_step(mode: str, rank: int) -> None:
    """One training step of ``mode`` on the world group (already initialized)."""
    torch.manual_seed(0)
    x, y = _batch(rank)
    if mode == "tp":
        cfg = MODEL_PRESETS["tiny"]
        model = apply_tensor_parallel(build_model(cfg, seed=0))
        x, y = x % cfg.vocab_size, y % cfg.vocab_size
        model(x, y).backward()
        return
    if mode.startswith("zero"):
        stage = int(mode[-1])
        model, optimizer = apply_zero(_Net(), stage=stage, bucket_mb=1e-3 if stage == 2 else None, lr=1e-3)
    else:
        model = apply_data_parallel(_Net(), mode=mode, bucket_mb=1e-3)
        optimizer = ReplicatedOptimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    model(x, y).backward()
    optimizer.finish_gradient_sync()
    optimizer.step()


def rank_main(mode: str, rank: int, world: int, store: str) -> None:
    """``store``: the TCP port rank 0 listens on (a FileStore's destructor can wait for a peer that is gone)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{store}", rank=rank, world_size=world)
    one_step(mode, rank)
    dist.destroy_process_group()


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _spawned_run(mode: str) -> list[int]:
    store = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.clean_exit", "--rank", str(r), "--mode", mode, "--store", store],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for r in range(2)
    ]
    try:
        codes = [p.wait(timeout=60) for p in procs]
        if any(codes):
            print([p.stderr.read().decode()[-600:] for p in procs], file=sys.stderr, flush=True)
        return codes
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
            p.wait()
        return ["hung", "hung"]


def _forked_run(mode: str) -> list[int]:
    store = _free_port()
    pids = []
    for r in range(2):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                rank_main(mode, r, 2, store)
                code = 0
            finally:
                sys.stdout.flush()
                # A normal exit of the child's interpreter (finalization included), not os._exit.
                raise SystemExit(code)
        pids.append(pid)
    return [_wait(pid, time.monotonic() + 60) for pid in pids]  # generous: a loaded 2-core box


def _wait(pid: int, deadline: float):
    """The child's exit code, or "hung" (killed) if it has not exited by ``deadline``."""
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    if os.environ.get("CLEAN_EXIT_GDB"):  # where a hung rank is: every thread's native stack
        subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 12"], timeout=60)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung"


def count_unclean(mode: str, runs: int, *, fork: bool) -> tuple[int, list]:
    """Run ``runs`` 2-rank runs of ``mode``; return how many had a rank exit non-zero, and those codes."""
    bad = []
    for _ in range(runs):
        codes = _forked_run(mode) if fork else _spawned_run(mode)
        if any(codes):
            bad.append(codes)
    return len(bad), bad


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="overlapped")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--fork", action="store_true")
    parser.add_argument("--rank", type=int)
    parser.add_argument("--store")
    args = parser.parse_args()
    interface = loopback_interface()  # gloo on loopback: the host name may resolve slowly, or publicly
    if interface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    if args.rank is not None:
        rank_main(args.mode, args.rank, 2, args.store)
        return
    for mode in MODES if args.mode == "all" else args.mode.split(","):
        n, bad = count_unclean(mode, args.runs, fork=args.fork)
        print(f"{mode}: {n} of {args.runs} runs unclean {bad[:5]}", flush=True)


if __name__ == "__main__":
    main()
