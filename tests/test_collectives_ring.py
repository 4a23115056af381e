"""``--collectives ring`` and ``dtlab``: dtlab's own algorithms carry the training path's collectives, equal to
torch's (``dtlab``: on one machine the ring over shared memory; across machines recursive doubling for small
all-reduces, the ring for the rest).

The primitives through :mod:`dtlab.comm.calls` (all-reduce, reduce-scatter,
all-gather, synchronous and asynchronous) against torch's own on the same
inputs at world sizes 2 and 4, uneven sizes included: bit-identical on
integer-valued tensors (every partial sum is exact), within reduction-order
rounding on random ones. Then whole training runs, ring against torch, at
DP 2, ZeRO-3 over DP 2 and TP 2: the same losses and the same saved weights
and Adam moments. On two ranks every sum is a + b in either order, which
IEEE addition makes identical, so those are compared exactly.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections import Counter

import pytest
import torch
import torch.distributed as dist

import dtlab
from dtlab.comm import calls as comm
from dtlab.comm import ring_backend as comm_ring
from dtlab.comm.recursive_doubling import SMALL_BYTES
from dtlab.comm.ring_backend import Ring, check_backend, collectives
from dtlab.comm.tracer import CommTracer, tracing
from dtlab.config import TrainConfig
from dtlab.i18n import ConfigError
from dtlab.state.checkpoint import load_all
from dtlab.train.loop import train_rank
from tests.harness import cores_per_rank, run_ranks, session_pool

SIZES = (1, 3, 8, 13, 4099)  # smaller than the ring, uneven, even, and several chunks of segments


def _inputs(rank: int, numel: int, integer: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + numel)
    if integer:
        return torch.randint(-50, 50, (numel,), generator=g).float()
    return torch.randn(numel, generator=g)


def _torch_reduced(x: torch.Tensor, op) -> torch.Tensor:
    """torch's all-reduce of ``x`` (gloo has no AVG: the sum, divided)."""
    out = x.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM if op == dist.ReduceOp.AVG else op)
    return out / dist.get_world_size() if op == dist.ReduceOp.AVG else out


def _compare(ctx, name: str = "ring", cores: bool | None = None) -> dict:
    """Every primitive on ``name``'s collectives against torch's; returns the worst errors and what was traced."""
    with cores_per_rank(cores):
        return _compare_all(ctx, name)


def _compare_all(ctx, name: str) -> dict:
    n, rank = ctx.world_size, ctx.rank
    exact, worst, tracer = True, 0.0, CommTracer()
    # dtlab's: recursive doubling up to SMALL_BYTES, one element more goes round the ring
    sizes = SIZES + ((SMALL_BYTES // 4 + 1,) if name == "dtlab" else ())
    for numel in sizes:
        for integer in (True, False):
            x = _inputs(rank, numel, integer)
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.MIN):
                want = _torch_reduced(x, op)
                got, async_got = x.clone(), x.clone()
                with collectives(name), tracing(tracer):
                    comm.all_reduce(got, op)
                    comm.all_reduce(async_got, op, async_op=True, caller_progresses=True).wait()
                mine = torch.tensor_split(want, n)[rank]
                scattered = torch.empty_like(mine)
                with collectives(name):
                    comm.reduce_scatter_single(scattered, x, op)
                results = (got, async_got, scattered)
                wants = (want, want, mine)
                if integer:
                    exact &= all(torch.equal(a, b) for a, b in zip(results, wants))
                worst = max(
                    [worst] + [float((a - b).abs().max()) if a.numel() else 0.0 for a, b in zip(results, wants)]
                )
            piece = torch.tensor_split(x, n)[rank].clone()
            placed = torch.zeros(numel)  # torch's gather of uneven pieces: each in its
            torch.tensor_split(placed, n)[rank].copy_(piece)  # place, zeros elsewhere, summed (exact)
            dist.all_reduce(placed)
            gathered = torch.empty(numel)
            with collectives(name):
                comm.all_gather_single(gathered, piece)
            exact &= torch.equal(gathered, placed)
    return {
        "exact": exact,
        "worst": worst,
        "kinds": sorted({c.kind for c in tracer.calls}),
        "calls": len(tracer.calls),
        "sizes": len(sizes),
        "torch_after": not comm.ring_selected(),
    }


@pytest.mark.parametrize(
    "name, world_size, cores",
    [
        ("ring", 2, None),
        ("ring", 4, None),
        ("dtlab", 2, True),
        ("dtlab", 2, False),
        ("dtlab", 3, None),
        ("dtlab", 4, True),
        ("dtlab", 4, False),
    ],
)
def test_ring_primitives_through_comm_equal_torch(name, world_size, cores):
    for got in run_ranks(_compare, world_size, name, cores, timeout=120):
        assert got["exact"], got
        assert got["worst"] < 1e-5, got
        # One traced call per collective, its point-to-point messages inside it, not beside it.
        assert got["kinds"] == ["all_reduce"] and got["calls"] == 2 * 4 * 2 * got["sizes"], got
        assert got["torch_after"]


def _which_algorithm(ctx, shared: bool, cores: bool = False) -> list[str]:
    """Under ``dtlab``, the algorithm each all-reduce took and over what: SMALL_BYTES, one float more,
    SMALL_BYTES again. ``shared``: whether the ranks may use shared memory (DTLAB_SHARED_MEMORY);
    ``cores``: whether they have a core each (:func:`cores_per_rank`)."""
    from dtlab.comm import recursive_doubling

    taken, originals = [], []
    for module, name in (
        (recursive_doubling, "recursive_doubling_all_reduce"),
        (recursive_doubling, "ring_all_reduce"),
        (comm_ring, "ring_all_reduce"),
        (comm_ring, "start_ring_all_reduce"),
    ):
        original = getattr(module, name)
        originals.append((module, name, original))
        setattr(
            module,
            name,
            lambda *a, _n=name, _f=original, **k: (
                taken.append(f"{_n} over {'shared memory' if k.get('wire') else 'gloo'}") or _f(*a, **k)
            ),
        )
    if not shared:
        os.environ["DTLAB_SHARED_MEMORY"] = "0"
    try:
        with collectives("dtlab"), cores_per_rank(cores):
            for numel in (SMALL_BYTES // 4, SMALL_BYTES // 4 + 1, SMALL_BYTES // 4):
                comm.all_reduce(torch.ones(numel), async_op=True, caller_progresses=True).wait()
    finally:
        os.environ.pop("DTLAB_SHARED_MEMORY", None)
        for module, name, original in originals:
            setattr(module, name, original)
    return taken


def test_dtlab_all_reduces_on_one_machine_by_the_ring_over_shared_memory():
    for taken in run_ranks(_which_algorithm, 4, True, timeout=120):
        assert taken == ["ring_all_reduce over shared memory"] * 3


def test_with_a_core_per_rank_dtlab_starts_all_reduces_on_the_calling_thread():
    """The first call sets the wire up on the worker; the next ones start where they are called."""
    for taken in run_ranks(_which_algorithm, 2, True, True, timeout=120):
        assert taken == ["ring_all_reduce over shared memory"] + ["start_ring_all_reduce over shared memory"] * 2


def test_dtlab_all_reduces_small_tensors_by_recursive_doubling_and_larger_ones_on_the_ring():
    """Without shared memory (ranks on several machines): chosen by size, over gloo."""
    for taken in run_ranks(_which_algorithm, 4, False, timeout=120):
        assert taken == [
            "recursive_doubling_all_reduce over gloo",
            "ring_all_reduce over gloo",
            "recursive_doubling_all_reduce over gloo",
        ]


def test_ring_and_dtlab_share_one_worker_thread():
    """Calls issued under one choice and then the other run one at a time, in order."""
    with collectives("ring"):
        with collectives("dtlab"):
            assert comm_ring._rings["ring"].worker is comm_ring._rings["dtlab"].worker


def test_an_unknown_collectives_name_is_refused_in_both_languages():
    with pytest.raises(ConfigError, match="collectives='nccl'") as error:
        TrainConfig(collectives="nccl").validate()
    assert "之一" in str(error.value)
    with pytest.raises(ConfigError, match="'torch', 'ring' or 'dtlab'"):
        with collectives("mpi"):
            pass


def test_the_ring_is_refused_off_gloo_in_both_languages():
    check_backend("ring", "gloo")
    check_backend("torch", "nccl")
    with pytest.raises(ConfigError, match="gloo backend only, not on 'nccl'") as error:
        check_backend("ring", "nccl")
    assert "只能在 gloo 后端上运行" in str(error.value)
    for name in ("ring", "dtlab"):
        with pytest.raises(ConfigError, match=f"collectives='{name}' runs on the gloo backend only"):
            with collectives(name, "nccl"):
                pass
    assert not comm.ring_selected()


def test_the_ring_drains_on_exit_and_is_dropped_after_an_error():
    gate, ran = threading.Event(), []
    with collectives("ring"):
        ring = comm_ring._rings["ring"]
        assert comm.ring_selected()
        ring.worker.submit(lambda: ran.append(gate.wait(120)))
        submit = ring.worker.submit
        ring.worker.submit = lambda job: gate.set() or submit(job)  # the gate opens when the exit drains
    del ring.worker.submit
    assert ran == [True] and comm_ring._rings.get("ring") is ring  # every queued call ran; ring kept
    gate.clear()
    with pytest.raises(RuntimeError, match="a rank failed"):
        with collectives("ring"):
            ring.worker.submit(gate.wait)  # the worker is busy until gate is set
            late = ring.worker.submit(lambda: "ran")
            with pytest.raises(TimeoutError):  # it cannot have run: wait() honours timeout
                late.wait(timeout=0.01)
            raise RuntimeError("a rank failed")
    assert "ring" not in comm_ring._rings and not comm.ring_selected()
    gate.set()
    ring.worker.thread.join(timeout=120)
    assert not ring.worker.thread.is_alive() and late.future.cancelled()


def _train_counting(ctx, config: TrainConfig) -> dict:
    """``train_rank`` with each call of the ring's counted, and rank 0's losses as it emits them."""
    counts, losses, originals = Counter(), [], {}
    for name in ("all_reduce", "reduce_scatter", "all_gather"):
        originals[name] = getattr(Ring, name)
        setattr(Ring, name, lambda self, *a, _n=name: counts.update([_n]) or originals[_n](self, *a))
    emit = ctx._emit
    ctx = dataclasses.replace(ctx, _emit=lambda r: (r.get("summary") or losses.append(r["loss"]), emit(r)))
    try:
        train_rank(ctx, config)
    finally:
        for name, method in originals.items():
            setattr(Ring, name, method)
    return {"losses": losses, "ring_calls": dict(counts)}


def _run(config: TrainConfig, folder) -> tuple[list[float], list[dict]]:
    if config.collectives != "torch":
        ranks = run_ranks(_train_counting, config.world_size, config)
        assert all(sum(r["ring_calls"].values()) > 0 for r in ranks), ranks  # the ring did run
        losses = ranks[0]["losses"]
    else:
        losses = dtlab.train.start(config, pool=session_pool()).wait().losses()
    _, files = load_all(folder)
    return losses, [piece for f in files for piece in f["pieces"]]


@pytest.mark.parametrize(
    "layout", [dict(dp=2), dict(dp=2, zero=2, bucket_mb=0.01), dict(dp=2, zero=3), dict(tp=2)], ids=str
)
def test_training_on_the_ring_equals_training_on_torch(layout, tmp_path):
    results = {}
    for name in ("torch", "ring", "dtlab"):
        folder = tmp_path / name
        config = TrainConfig(model="tiny", steps=3, seed=0, collectives=name, save=str(folder), save_every=3, **layout)
        results[name] = _run(config, folder)
    torch_losses, torch_pieces = results["torch"]
    for name in ("ring", "dtlab"):
        losses, pieces = results[name]
        assert losses == torch_losses and len(losses) == 3, name
        assert len(pieces) == len(torch_pieces) > 0
        for a, b in zip(torch_pieces, pieces):
            assert a["name"] == b["name"]
            for key, tensor in a["tensors"].items():
                assert torch.equal(tensor, b["tensors"][key]), (name, a["name"], key)
