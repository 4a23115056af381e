"""The ring over shared memory (dtlab.shared_memory): the same bits as over gloo, and safe.

The ring's steps and additions are the same whichever wire carries its
messages, so over shared memory it must give exactly what it gives over
gloo's sends and receives, for every op and size, at world sizes 2, 3 and 4
(and nothing to do at 1). Beside that: the set-up leaves nothing in the file
system, ranks that cannot share memory all fall back together, a neighbour
that ends is reported at once, a silent one after the group's timeout, and
a rank killed mid-run leaves no file behind.
"""
from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from dtlab import shared_memory
from dtlab.collectives import ring_all_gather, ring_all_reduce, ring_reduce_scatter
from dtlab.i18n import DtlabError
from dtlab.launch.errors import RankDied
from dtlab.shared_memory import SLOT_BYTES, wire_for
from tests.harness import run_ranks, session_pool

# smaller than the ring, uneven, and several segments of SLOT_BYTES per chunk (4 ranks: 3 segments)
NUMELS = (1, 3, 1000, 3 * SLOT_BYTES + 7)


def _ours() -> set[str]:
    return {name for name in os.listdir(shared_memory.ROOT) if name.startswith("dtlab-shm-")}


def _both_wires(ctx) -> dict:
    """Every op over gloo and over the wire on the same inputs; True where the bits are the same."""
    wire = wire_for(None)
    same = {"wire": wire is not None or ctx.world_size == 1}
    for numel in NUMELS:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(ctx.rank))      # (numel,)
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX):
            gloo, shm = x.clone(), x.clone()
            ring_all_reduce(gloo, op)
            ring_all_reduce(shm, op, wire=wire)
            same[f"all_reduce {op} {numel}"] = torch.equal(gloo, shm)
        mine = torch.tensor_split(x, ctx.world_size)[ctx.rank]
        gloo, shm = torch.empty_like(mine), torch.empty_like(mine)
        ring_reduce_scatter(gloo, x)
        ring_reduce_scatter(shm, x, wire=wire)
        same[f"reduce_scatter {numel}"] = torch.equal(gloo, shm)
        gloo, shm = torch.empty(numel), torch.empty(numel)
        ring_all_gather(gloo, mine)
        ring_all_gather(shm, mine, wire=wire)
        same[f"all_gather {numel}"] = torch.equal(gloo, shm) and torch.equal(
            torch.tensor_split(shm, ctx.world_size)[ctx.rank], mine)
    half = x[:1000].to(torch.bfloat16)                    # another dtype through the same slots
    gloo, shm = half.clone(), half.clone()
    ring_all_reduce(gloo)
    ring_all_reduce(shm, wire=wire)
    same["all_reduce bfloat16"] = torch.equal(gloo, shm)
    return same


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_the_ring_over_shared_memory_gives_the_bits_it_gives_over_gloo(world_size):
    before = _ours()
    for rank, same in enumerate(run_ranks(_both_wires, world_size, timeout=300)):
        assert all(same.values()), (rank, [k for k, v in same.items() if not v])
    assert _ours() - before == set()                      # set up, and nothing left in /dev/shm


def _wire_when(ctx, case: str) -> bool:
    if case == "switched off":
        os.environ["DTLAB_SHARED_MEMORY"] = "0"
    elif case == "rank 1 elsewhere" and ctx.rank == 1:
        shared_memory.this_machine = lambda: "another machine"
    try:
        return wire_for(None) is not None
    finally:
        os.environ.pop("DTLAB_SHARED_MEMORY", None)
        shared_memory.this_machine = _this_machine


_this_machine = shared_memory.this_machine


@pytest.mark.parametrize("case", ["switched off", "rank 1 elsewhere"])
def test_ranks_that_cannot_share_memory_all_use_gloo(case):
    assert run_ranks(_wire_when, 3, case, timeout=120) == [False, False, False]


def _neighbour_leaves(ctx) -> str:
    """Rank 1 closes its wire (as a rank that ended does); rank 0, receiving from it, hears at once."""
    wire = wire_for(None)
    if ctx.rank == 1:
        wire.close()
        return "closed"
    start = time.monotonic()
    try:
        ring_all_reduce(torch.ones(10), wire=wire)
    except DtlabError as error:
        return f"{error} after {time.monotonic() - start:.0f} s"
    return "no error"


def test_a_neighbour_that_ends_is_reported_at_once_in_both_languages():
    message = run_ranks(_neighbour_leaves, 2, timeout=120)[0]
    assert "rank 1 has ended" in message and "rank 1 已经结束" in message
    assert float(message.split(" after ")[1].split()[0]) < 30          # not the group's 60 s timeout


def _neighbour_silent(ctx) -> str:
    wire = wire_for(None)
    if ctx.rank == 1:
        time.sleep(8)                                 # alive, but sends nothing
        return "slept"
    wire.timeout_s = 1.0
    try:
        ring_all_reduce(torch.ones(10), wire=wire)
    except DtlabError as error:
        return str(error)
    return "no error"


def test_a_silent_neighbour_ends_the_wait_at_the_timeout():
    message = run_ranks(_neighbour_silent, 2, timeout=120)[0]
    assert "within 1 s" in message and "1 秒" in message


def _killed_mid_ring(ctx) -> None:
    wire = wire_for(None)
    if ctx.rank == 1:
        os.kill(os.getpid(), 9)
    ring_all_reduce(torch.ones(1 << 20), wire=wire)


def test_a_rank_killed_mid_ring_fails_the_run_and_leaves_no_file():
    before = _ours()
    with pytest.raises(RankDied):
        session_pool().run(_killed_mid_ring, 2, timeout=120).wait()
    assert _ours() - before == set()
