"""The ring over shared memory (dtlab.comm.shared_memory): the same bits as over gloo, and safe.

The ring's steps and additions are the same whichever wire carries its
messages, so over shared memory it must give exactly what it gives over
gloo's sends and receives, for every op and size, at world sizes 2, 3 and 4
(and nothing to do at 1). Beside that: the set-up leaves nothing in the file
system, ranks that cannot share memory all fall back together, a neighbour
that ends is reported at once, a silent one after the group's timeout, and
a rank killed mid-run leaves no file behind. All-reduces left in flight on the
wire (weak progress) give the same bits and keep their place in its order.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from dtlab.comm import calls as comm
from dtlab.comm import shared_memory, shared_memory_setup
from dtlab.comm.collectives import ring_all_gather, ring_all_reduce, ring_reduce_scatter
from dtlab.comm.ring_backend import collectives, start_ring_all_reduce
from dtlab.comm.shared_memory import SLOT_BYTES
from dtlab.comm.shared_memory_setup import wire_for
from dtlab.i18n import DtlabError
from dtlab.launch.errors import RankDied
from tests.harness import run_ranks, session_pool

# smaller than the ring, uneven, and several segments of at most SLOT_BYTES per chunk (4 at 4 ranks,
# 5 at 3, 7 at 2: more messages than an inbox has slots, so sends wait for room)
NUMELS = (1, 3, 1000, 3 * SLOT_BYTES + 7)


def _ours() -> set[str]:
    return {name for name in os.listdir(shared_memory.ROOT) if name.startswith("dtlab-shm-")}


def _both_wires(ctx) -> dict:
    """Every op over gloo and over the wire on the same inputs; True where the bits are the same."""
    wire = wire_for(None)
    same = {"wire": wire is not None or ctx.world_size == 1}
    for numel in NUMELS:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(ctx.rank))  # (numel,)
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
            torch.tensor_split(shm, ctx.world_size)[ctx.rank], mine
        )
    half = x[:1000].to(torch.bfloat16)  # another dtype through the same slots
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
    assert _ours() - before == set()  # set up, and nothing left in /dev/shm


def _wire_when(ctx, case: str) -> bool:
    before = os.environ.get("DTLAB_SHARED_MEMORY")
    if case == "switched off" or (case == "switched off on rank 1" and ctx.rank == 1):
        os.environ["DTLAB_SHARED_MEMORY"] = "0"
    elif case == "rank 1 elsewhere" and ctx.rank == 1:
        shared_memory_setup.this_machine = lambda: "another machine"
    elif case == "no room on rank 2" and ctx.rank == 2:
        shared_memory.SLOTS = 1 << 40  # its inbox cannot be allocated: ENOSPC / EFBIG
    try:
        return wire_for(None) is not None
    finally:
        if before is None:
            os.environ.pop("DTLAB_SHARED_MEMORY", None)
        else:
            os.environ["DTLAB_SHARED_MEMORY"] = before
        shared_memory_setup.this_machine, shared_memory.SLOTS = _this_machine, _slots


_this_machine, _slots = shared_memory_setup.this_machine, shared_memory.SLOTS


@pytest.mark.parametrize("case", ["switched off", "switched off on rank 1", "rank 1 elsewhere", "no room on rank 2"])
def test_ranks_that_cannot_share_memory_all_use_gloo(case):
    """Whatever keeps one rank from it, every rank learns so and falls back, promptly (no timeout)."""
    before = _ours()
    run_ranks(_wire_when, 3, "as it is", timeout=120)  # warm: starting the ranks is not what is timed
    start = time.monotonic()
    assert run_ranks(_wire_when, 3, case, timeout=120) == [False, False, False]
    assert time.monotonic() - start < 60
    assert _ours() - before == set()


def _in_flight(ctx) -> dict:
    """All-reduces begun on the wire and left in flight (weak progress): the same bits as over gloo,
    finished in order whichever is waited for first, before any later message on the wire, even one
    sent by the ring's worker thread, and moved on by ``advance`` alone."""
    wire = wire_for(None)
    xs = [
        torch.randn(numel, generator=torch.Generator().manual_seed(10 * ctx.rank + numel))
        for numel in (3, 1000, 70_000, 3 * SLOT_BYTES + 7)
    ]
    want = [x.clone() for x in xs]
    for x in want:
        ring_all_reduce(x, dist.ReduceOp.AVG)  # over gloo
    got = [x.clone() for x in xs]
    first = [start_ring_all_reduce(x, dist.ReduceOp.AVG, group=None, wire=wire) for x in got[:3]]
    first[-1].wait()  # the last: the two before it finish first
    in_order = all(f.future.done() for f in first)
    too_big = start_ring_all_reduce(got[3], dist.ReduceOp.AVG, group=None, wire=wire)  # > a slot a chunk
    again = [x.clone() for x in xs[:2]]
    with collectives("dtlab", "gloo"):
        later = [start_ring_all_reduce(x, dist.ReduceOp.AVG, group=None, wire=wire) for x in again]
        worker = comm.all_reduce(got[3], dist.ReduceOp.AVG, async_op=True)  # on the worker thread
        worker.wait()  # it finished the two in flight first
        later_done = all(f.future.done() for f in later)
    moved_on = start_ring_all_reduce(got[0], dist.ReduceOp.SUM, group=None, wire=wire)
    deadline = time.monotonic() + 60
    while not moved_on.is_completed() and time.monotonic() < deadline:
        wire.advance()  # never blocks
        os.sched_yield()
    sums = got[0].clone()
    ring_all_reduce(want[0], dist.ReduceOp.SUM)
    return {
        "bits": all(torch.equal(a, b) for a, b in zip(want[:3], got[:3]))
        and torch.equal(want[3], got[3])
        and all(torch.equal(a, b) for a, b in zip(want[1:2], again[1:2])),
        "in_order": in_order,
        "later_first": later_done,
        "on_the_worker": type(worker).__name__ == "RingWork",
        "too_big": too_big is None,
        "moved_on": moved_on.is_completed() and torch.equal(sums, want[0]),
        "none_left": not wire.flights,
    }


@pytest.mark.parametrize("world_size", [2, 3])
def test_all_reduces_left_in_flight_give_the_same_bits_and_finish_before_later_messages(world_size):
    assert (
        run_ranks(_in_flight, world_size, timeout=120)
        == [
            {
                "bits": True,
                "in_order": True,
                "later_first": True,
                "on_the_worker": True,
                "too_big": True,
                "moved_on": True,
                "none_left": True,
            }
        ]
        * world_size
    )


def _wait_at_most(ctx) -> str:
    """Rank 1 starts its part a second late: rank 0's wait(0.05) times out, the call stays in flight
    and the wire usable; the plain wait() then finishes it with the right sum."""
    wire = wire_for(None)
    if ctx.rank == 1:
        time.sleep(1.0)
    x = torch.full((100,), float(ctx.rank + 1))
    flight = start_ring_all_reduce(x, dist.ReduceOp.SUM, group=None, wire=wire)
    timed_out = "no timeout"
    if ctx.rank == 0:
        try:
            flight.wait(timeout=0.05)
        except TimeoutError:
            timed_out = "timed out"
    flight.wait()
    return f"{timed_out}, {wire.broken}, {torch.equal(x, torch.full((100,), 3.0))}"


def test_a_wait_with_its_own_timeout_leaves_the_call_in_flight_and_the_wire_usable():
    assert run_ranks(_wait_at_most, 2, timeout=120) == ["timed out, None, True", "no timeout, None, True"]


def _neighbour_leaves_in_flight(ctx) -> str:
    wire = wire_for(None)
    if ctx.rank == 1:
        wire.close()
        return "closed"
    try:  # begun (its first message may already find the pipe closed), then finished
        start_ring_all_reduce(torch.ones(10), dist.ReduceOp.SUM, group=None, wire=wire).wait()
    except DtlabError as error:
        return str(error)
    return "no error"


def test_a_neighbour_that_ends_fails_the_all_reduce_in_flight_in_both_languages():
    message = run_ranks(_neighbour_leaves_in_flight, 2, timeout=120)[0]
    assert "rank 1 has ended" in message and "rank 1 已经结束" in message


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
    assert float(message.split(" after ")[1].split()[0]) < 30  # not the group's 120 s timeout


def _neighbour_silent(ctx) -> str:
    wire = wire_for(None)
    if ctx.rank == 1:
        time.sleep(8)  # alive, but sends nothing
        return "slept"
    group_timeout = wire.timeout_s
    wire.timeout_s = 1.0
    try:
        ring_all_reduce(torch.ones(10), wire=wire)
    except DtlabError as error:
        timed_out = str(error)
    try:
        ring_all_reduce(torch.ones(10), wire=wire)  # its counters no longer match rank 1's: refused
    except DtlabError as error:
        return f"{group_timeout:g} | {timed_out} | {error}"
    return "no error"


def test_a_silent_neighbour_ends_the_wait_at_the_timeout_and_the_wire_is_then_refused():
    group_timeout, timed_out, refused = run_ranks(_neighbour_silent, 2, timeout=120)[0].split(" | ")
    assert group_timeout == "120"  # the group's own timeout, read from the group
    assert "no message from rank 1 within 1 s (timed out)" in timed_out and "1 秒内没有收到 rank 1" in timed_out
    assert "can no longer be used" in refused and "已不能再用" in refused


def _subgroups(ctx) -> dict:
    """A 2 x 2 grid: rows {0, 1}, {2, 3} and columns {0, 2}, {1, 3}, each group its own wire."""
    rows = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    columns = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    same = {}
    for name, group in (("row", rows[ctx.rank // 2]), ("column", columns[ctx.rank % 2])):
        wire = wire_for(group)
        x = torch.randn(5000, generator=torch.Generator().manual_seed(ctx.rank))
        gloo, shm = x.clone(), x.clone()
        ring_all_reduce(gloo, group=group)
        ring_all_reduce(shm, group=group, wire=wire)
        expected = x.clone()
        dist.all_reduce(expected, group=group)
        same[name] = wire is not None and torch.equal(gloo, shm) and torch.allclose(shm, expected)
    return same


def test_every_subgroup_of_a_grid_gets_its_own_wire():
    assert run_ranks(_subgroups, 4, timeout=120) == [{"row": True, "column": True}] * 4


def _killed_mid_ring(ctx, report: str) -> None:
    wire = wire_for(None)
    if ctx.rank == 1:
        deadline = time.monotonic() + 60
        while not os.path.exists(report) and time.monotonic() < deadline:
            time.sleep(0.01)  # until rank 0 is past its set-up and has said so
        os.kill(os.getpid(), 9)
    with open(report + ".part", "w") as f:  # the pool may end this rank before it returns
        f.write(f"{wire is not None}\n")
    os.replace(report + ".part", report)
    start = time.monotonic()
    try:
        ring_all_reduce(torch.ones(1 << 20), wire=wire)
    except DtlabError as error:
        with open(report, "a") as f:
            f.write(f"{time.monotonic() - start:.1f} {error}")
        raise


def test_a_rank_killed_mid_ring_fails_the_run_and_leaves_no_file(tmp_path):
    before = _ours()
    report = tmp_path / "rank0.txt"
    with pytest.raises(RankDied):
        session_pool().run(_killed_mid_ring, 2, str(report), timeout=120).wait()
    assert _ours() - before == set()
    had_wire, heard = report.read_text().split("\n", 1)
    assert had_wire == "True"  # the ring was on shared memory when rank 1 died
    if heard:  # rank 0 heard it before the pool ended it: at once
        seconds, message = heard.split(" ", 1)
        assert float(seconds) < 30 and "rank 1 has ended" in message


def _misused(ctx) -> list[str]:
    """Three mistakes a caller can make, each refused in both languages; the wire still works after."""
    wire = wire_for(None)
    refused = []
    for mistake in (
        lambda: wire.isend(torch.ones(3), wire.left),  # not the right neighbour
        lambda: wire.irecv(torch.ones(3), wire.right),  # not the left neighbour
        lambda: wire.isend(torch.ones(SLOT_BYTES), wire.right),  # 4 slots' worth
        lambda: wire.isend(torch.ones(4, 4).t(), wire.right),
    ):  # not contiguous
        try:
            mistake()
            refused.append("accepted")
        except DtlabError as error:
            refused.append(f"{error.en} / {error.zh}")
    x = torch.ones(1000)
    ring_all_reduce(x, wire=wire)
    return [*refused, f"after: {x[0].item():g}"]


def test_a_misused_wire_says_what_it_carries_and_stays_usable():
    for answers in run_ranks(_misused, 3, timeout=120):
        to_left, from_right, too_big, strided, after = answers
        assert "can only send to its right neighbour" in to_left and "只能发送给它的右邻居" in to_left
        assert "can only receive from its left neighbour" in from_right and "只能从它的左邻居" in from_right
        assert f"not {4 * SLOT_BYTES}" in too_big and "字节" in too_big
        assert "contiguous" in strided and "连续" in strided
        assert after == "after: 3"


def _set_up_fails(ctx) -> list[str]:
    """A set-up that raises is not tried again: every later call raises the same error."""
    real = shared_memory_setup._set_up
    calls = []
    shared_memory_setup._set_up = lambda group: calls.append(1) or (_ for _ in ()).throw(RuntimeError("no luck"))
    try:
        messages = []
        for _ in range(2):
            try:
                wire_for(None)
            except DtlabError as error:
                messages.append(error.en)
        return [*messages, f"set-ups: {len(calls)}"]
    finally:
        shared_memory_setup._set_up = real


def test_a_failed_set_up_is_raised_again_not_retried():
    for answers in run_ranks(_set_up_fails, 2, timeout=120):
        assert answers == ["the shared-memory wire of this group could not be set up: no luck"] * 2 + ["set-ups: 1"]


def test_a_rank_error_gives_the_english_and_the_chinese_line_of_a_bilingual_error():
    from dtlab.launch.errors import is_timeout, last_line

    bilingual = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in f\n    wait()\n'
        "dtlab.i18n.DtlabError: shared-memory ring: no message from rank 1 within 5 s (timed out)\n"
        "共享内存环：5 秒内没有收到 rank 1 的消息（超时）\n"
    )
    assert last_line(bilingual).endswith("(timed out)") and last_line(bilingual, "zh").startswith("共享内存环")
    assert is_timeout(bilingual)
    plain = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in f\n    raise ValueError(name)\n'
        "ValueError: unknown token 你\n"
    )
    assert last_line(plain) == last_line(plain, "zh") == "ValueError: unknown token 你"
