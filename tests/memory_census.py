"""A census of the tensors alive on a rank, against the memory accountant (dtlab.measure.memory).

Run on ranks by tests/test_layouts.py: for each layout, the rank builds the
trainer's rank state and runs three steps. In the last one it counts every
tensor the garbage collector can reach (and each tensor's ``.grad``), each
storage once, twice: at the moment the activations peak, and after the step.
On CUDA it reads ``torch.cuda.memory_allocated`` instead.
"""

from __future__ import annotations

import gc

import torch.distributed as dist

from dtlab.comm.tracer import tracing
from dtlab.config import TrainConfig
from dtlab.measure.allocator import live_bytes
from dtlab.numerics.loss_spikes import SpikeGuard
from dtlab.train.loop import _train_step
from dtlab.train.rank import build_rank

STEPS = 3


def _census_at_activation_peak(meter, device: str, found: dict):
    """Wrap the meter's pack hook: count the live tensors when its activations reach last step's peak."""
    pack, target = meter._pack, meter.peak + meter.copies_peak

    def counting_pack(t):
        packed = pack(t)
        if "mid" not in found and meter.current + meter.copies >= target:
            found["mid"] = live_bytes(device)
        return packed

    meter._pack = counting_pack


def census_rank(ctx, layouts: list[dict]) -> list[dict]:
    """Per layout: this rank's memory record of the last step and the two censuses."""
    results = []
    for layout in layouts:
        config = TrainConfig(steps=STEPS, seed=0, **layout)
        gc.collect()
        # A warm rank of the shared pool may hold what earlier runs left (caches, a compiled run's
        # graphs): the census counts what this run adds to that.
        before = live_bytes(ctx.device)
        state = build_rank(ctx, config)
        guard, found = SpikeGuard(config.spike_policy), {}
        metrics = dist.new_group(backend="gloo")
        with tracing(state.tracer):
            state.tracer.start()
            for step in range(STEPS):
                if step == STEPS - 1:
                    _census_at_activation_peak(state.meter, ctx.device, found)
                mine, _ = _train_step(ctx, config, state, guard, step, metrics)
        found["end"] = live_bytes(ctx.device)
        found = {k: v - before for k, v in found.items()}
        # Offloaded state lives on the host: on a CPU rank, in the memory the census counts too.
        host = sum(mine.get("host_mem", {}).values()) if not ctx.device.startswith("cuda") else 0
        results.append({"layout": layout, "mem": mine["mem"], "host": host, **found})
        del state
    return results
