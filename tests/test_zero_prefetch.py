"""ZeRO-3 prefetch (FSDP2's): the next unit's all-gather in flight while this one computes.

Prefetch changes when parameters arrive, never what they are, so on real
ranks (gloo; 1, 2 and 4 of them) every figure of a run with prefetch 1 or 2
is bitwise the figure with prefetch 0 (the strict one-unit-at-a-time
schedule), which itself equals the single-process reference within fp32
rounding; the collectives per step are the same (one all-gather per unit in
forward, one in backward, one reduce-scatter per unit); the gathered bytes
at the step's peak are exactly the largest p + 1 consecutive units; and the
tracer shows each prefetched all-gather issued before the unit ahead of it
has finished computing, so ``overlap_s`` counts it.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import pytest
import torch
import torch.distributed as dist

from dtlab.comm.tracer import CommTracer, tracing
from dtlab.config import MODEL_PRESETS, TrainConfig
from dtlab.data import global_batch, shard
from dtlab.i18n import ConfigError
from dtlab.measure.memory import LiveBytes, counting
from dtlab.model import build_model
from dtlab.parallel.zero import ZeroStage3, apply_zero
from tests.harness import run_ranks

CFG = dataclasses.replace(MODEL_PRESETS["tiny"], d_model=9, n_head=3)  # Ψ and a block not multiples of 4
BATCH, STEPS = 8, 4
OPT = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
PREFETCHES = (0, 1, 2)


def _batch(ctx, step: int):
    x, y = global_batch(step, batch_size=BATCH, seq_len=CFG.seq_len, seed=0)  # (B, T) each
    return shard(x, index=ctx.rank, count=ctx.world_size), shard(y, index=ctx.rank, count=ctx.world_size)


def _reference() -> dict:
    model = build_model(CFG, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), **OPT)
    losses, grads = [], None
    for step in range(STEPS):
        optimizer.zero_grad()
        loss = model(*global_batch(step, batch_size=BATCH, seq_len=CFG.seq_len, seed=0))
        loss.backward()
        grads = grads or {n: p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "grads": grads, "params": model.state_dict()}


def _run(ctx, prefetch: int) -> dict:
    """STEPS steps of stage 3 with this prefetch: losses, first gradients, final parameters, and per
    step the collectives and the gathered peak (the wrapper's and the memory ledger's)."""
    model, optimizer = apply_zero(build_model(CFG, seed=0), stage=3, prefetch=prefetch, **OPT)
    losses, calls, peaks, ledger_peaks, grads = [], [], [], [], None
    for step in range(STEPS):
        optimizer.zero_grad()
        optimizer.meter.reset()
        ledger = _GatheredLedger()
        ledger.start({})
        with counting(ledger):
            loss = model(*_batch(ctx, step))
            loss.backward()
        grads = grads or {name: shard.grad.clone() for name, shard, *_ in model.named_shards()}
        optimizer.step()
        calls.append(dict(optimizer.meter.calls))
        peaks.append(model.memory_bytes()["gathered_peak"])
        ledger_peaks.append(ledger.gathered_high)
        mean = torch.tensor([loss.item() / ctx.world_size])
        dist.all_reduce(mean)
        losses.append(mean.item())
    units = [{"name": u.name, "bytes": u.layout.padded_numel * 4} for u in model.units]
    return {
        "losses": losses,
        "grads": grads,
        "params": model.full_state_dict(),
        "calls": calls,
        "peaks": peaks,
        "ledger_peaks": ledger_peaks,
        "units": units,
        "held_after": model.shared.held_bytes,
    }


class _GatheredLedger(LiveBytes):
    """The step's memory ledger, also keeping the most bytes its ``gathered`` source reached."""

    gathered_high = 0

    def add(self, source: str, delta: int) -> None:
        super().add(source, delta)
        if source == "gathered":
            self.gathered_high = max(self.gathered_high, self.levels[source])


def _timeline(ctx, prefetch: int) -> dict:
    """One traced step, with each unit's forward compute timed by hooks of its own (registered after
    ZeroStage3's, so its pre-hook, which issues the prefetch, runs first): the all-gathers' spans
    beside each unit's compute, all on the tracer's clock."""
    model, optimizer = apply_zero(build_model(CFG, seed=0), stage=3, prefetch=prefetch, **OPT)
    compute = {}
    for unit in model.units:
        module = model.module if unit.name == "root" else model.module.get_submodule(unit.name)
        module.register_forward_pre_hook(
            lambda m, a, name=unit.name: compute.setdefault(name, []).append(time.perf_counter())
        )  # (hooks that return None change nothing)
        module.register_forward_hook(lambda m, a, o, name=unit.name: compute[name].append(time.perf_counter()))
    tracer = CommTracer()
    x, y = _batch(ctx, 0)
    with tracing(tracer):
        tracer.start()
        with tracer.compute():
            model(x, y).backward()
        record = tracer.end_step()
        calls = sorted(tracer_calls(record), key=lambda c: c["start"])
    return {
        "compute": {k: [round(t - tracer.origin, 6) for t in v] for k, v in compute.items()},
        "order": [u.name for u in model.units],
        "calls": calls,
        "overlap_s": record["overlap_s"],
    }


def tracer_calls(record: dict) -> list[dict]:
    return [c for c in record["spans"]["comm"] if c["kind"] == "all_gather"]


def prefetch_checks(ctx) -> dict:
    return {
        "reference": _reference(),
        "runs": {p: _run(ctx, p) for p in PREFETCHES},
        "timeline": {p: _timeline(ctx, p) for p in (0, 1)} if ctx.world_size > 1 else {},
    }


@functools.lru_cache(maxsize=None)
def results(world_size: int) -> list[dict]:
    return run_ranks(prefetch_checks, world_size, timeout=600.0)


WORLD_SIZES = [1, 2, 4]


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_prefetch_changes_no_number(n):
    for r in results(n):
        strict, ref = r["runs"][0], r["reference"]
        assert max(abs(a - b) / b for a, b in zip(strict["losses"], ref["losses"])) < 1e-5
        assert max((strict["params"][k] - v).abs().max().item() for k, v in ref["params"].items()) < 2e-5
        for p in PREFETCHES[1:]:
            run = r["runs"][p]
            assert run["losses"] == strict["losses"], (n, p)
            for key in ("grads", "params"):
                for name, value in strict[key].items():
                    assert torch.equal(run[key][name], value), (n, p, key, name)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_prefetch_keeps_the_collectives_of_each_step(n):
    for r in results(n):
        units = len(r["runs"][0]["units"])
        expected = {} if n == 1 else {"all_gather": 2 * units, "reduce_scatter": units}
        for p in PREFETCHES:
            assert r["runs"][p]["calls"] == [expected] * STEPS, (n, p, r["runs"][p]["calls"])


def _window_peak(sizes: list[int], width: int) -> int:
    """The most bytes of ``width`` consecutive units (the order they run in, which backward reverses)."""
    return max(sum(sizes[i : i + width]) for i in range(len(sizes)))


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_gathered_bytes_at_the_peak_are_prefetch_plus_one_units(n):
    for r in results(n):
        sizes = [u["bytes"] for u in r["runs"][0]["units"]]
        assert "root" not in [u["name"] for u in r["runs"][0]["units"]]  # the tiny GPT's head is untied
        for p in PREFETCHES:
            run = r["runs"][p]
            want = _window_peak(sizes, p + 1)  # p = 0: the largest unit
            assert run["peaks"] == [want] * STEPS, (n, p, run["peaks"], sizes)
            assert run["ledger_peaks"] == [want] * STEPS, (n, p, run["ledger_peaks"])
            assert run["held_after"] == 0
        # Here: the token table alone (9 x 256 x 4 bytes) strictly, and with prefetch 1 the token and
        # position tables (+ 9 x 16 x 4), the largest two units that run one after the other.
        assert r["runs"][0]["peaks"][0] == max(sizes) == 9 * 256 * 4
        assert r["runs"][1]["peaks"][0] == sizes[0] + sizes[1] == 9 * 256 * 4 + 9 * 16 * 4


@pytest.mark.parametrize("n", [2, 4])
def test_the_trace_shows_the_next_gather_issued_while_this_unit_computes(n):
    for r in results(n):
        for p, t in r["timeline"].items():
            order, calls, compute = t["order"], t["calls"], t["compute"]
            forward = calls[: len(order)]  # issue order: each unit once in forward, then backward
            assert len(calls) == 2 * len(order)
            for k in range(len(order) - 1):
                this, next_gather = compute[order[k]], forward[k + 1]
                if p:  # issued before unit k's compute began, waited on after it ended
                    assert next_gather["start"] < this[1] <= next_gather["wait"], (k, next_gather, this)
                else:  # issued (and waited on at once) only after unit k has computed
                    assert this[1] <= next_gather["start"] == next_gather["wait"], (k, next_gather, this)
            prefetched = [c for c in calls if c["wait"] > c["start"]]
            assert len(prefetched) == (2 * (len(order) - 1) if p else 0), (p, calls)
            assert (t["overlap_s"] > 0) == bool(p), t["overlap_s"]


def _bad_prefetch(ctx):
    for value in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="prefetch"):
            ZeroStage3(build_model(CFG, seed=0), prefetch=value)
    with pytest.raises(ConfigError, match="stage 3"):
        apply_zero(build_model(CFG, seed=0), stage=2, prefetch=1)
    return True


def test_bad_prefetch_is_refused_in_both_languages():
    assert run_ranks(_bad_prefetch, 1) == [True]


# --------------------------------------------------------------------------- through dtlab train


def _unit_bytes(config: TrainConfig) -> list[int]:
    """Each ZeRO-3 unit of the run's GPT in fp32, padded to a multiple of dp, in the order they run."""
    from dtlab.parallel.zero import unit_modules

    net, dp = build_model(config.model_config(), seed=0), config.dp
    return [-(-sum(p.numel() for p in m.parameters()) // dp) * dp * 4 for m in unit_modules(net)]


@functools.lru_cache(maxsize=None)
def _trained(prefetch: int, collectives: str = "torch"):
    import dtlab.train
    from tests.harness import session_pool

    # The small GPT, whose blocks are its largest units (the planner counts the final norm with the
    # head, one unit, so with the tiny GPT, whose head is its largest unit, it says 64 bytes more).
    config = TrainConfig(
        steps=2, dp=2, zero=3, zero3_prefetch=prefetch, batch_size=4, seq_len=16, collectives=collectives
    )
    return config, dtlab.train(config, pool=session_pool()).wait()


@pytest.mark.parametrize("prefetch", [0, 1])
def test_train_records_count_the_prefetched_units_and_the_hidden_communication(prefetch):
    from dtlab.planner import plan_for_config

    config, run = _trained(prefetch)
    units = _unit_bytes(config)
    want = _window_peak(units, prefetch + 1)  # prefetch 1: two blocks
    assert want == (prefetch + 1) * max(units)
    predicted = plan_for_config(config).memory
    strict = _trained(0)[1]
    for record, same in zip(run.records, strict.records):
        assert record["loss"] == same["loss"]
        for rank in record["ranks"]:
            assert rank["mem"]["buffers"] == want == predicted["buffers"], (prefetch, rank["mem"], want)
            gathers = [c for c in rank["spans"]["comm"] if c["kind"] == "all_gather"]
            ahead = [c for c in gathers if c["wait"] > c["start"]]
            assert len(gathers) == 2 * len(units)
            assert len(ahead) == (len(gathers) - 2 if prefetch else 0)  # all but each pass's first
            if prefetch:
                assert rank["overlap_s"] > 0
    # The Chrome trace: each all-gather on the communication lane from its issue, and its wait on the
    # compute lane; a prefetched one was issued before its wait began (the unit before it computed).
    from dtlab.measure.chrome_trace import chrome_trace

    events = chrome_trace(run.records[-1:])["traceEvents"]
    for pid in (0, 1):
        issued = [e["ts"] for e in events if e.get("pid") == pid and e["name"] == "all_gather"]
        waited = [e["ts"] for e in events if e.get("pid") == pid and e["name"] == "wait all_gather"]
        assert len(issued) == len(waited) == 2 * len(units)
        ahead = sum(i < w for i, w in zip(issued, waited))
        assert ahead == (len(issued) - 2 if prefetch else 0) and all(i <= w for i, w in zip(issued, waited))


def test_prefetch_on_dtlab_ring_changes_no_number():
    """--collectives ring runs every all-gather on one worker thread per rank, in the order issued:
    the prefetched ones too, so the run is the strict one's, bit for bit."""
    strict, ahead = _trained(0, "ring")[1], _trained(1, "ring")[1]
    assert [r["loss"] for r in ahead.records] == [r["loss"] for r in strict.records]
    ranks = ahead.records[-1]["ranks"]
    assert all(r["overlap_s"] > 0 for r in ranks)
    assert all(
        r["comm"]["all_gather"]["count"] == s["comm"]["all_gather"]["count"]
        for r, s in zip(ranks, strict.records[-1]["ranks"])
    )
