"""The memory accountant against the allocator: each category beside what the allocator saw it add.

:mod:`dtlab.measure.memory` counts bytes from the tensors themselves. This
module checks those counts against what the device holds: on CUDA,
``torch.cuda.memory_allocated``; on the CPU, which has no allocator to ask, a
census of every storage alive (each once, found through the garbage
collector, as with the meter's hooks every tensor autograd saves is a Python
object). :func:`check_accountant` trains a model for two steps and, phase by
phase, takes the difference the allocator saw:

* ``params`` and ``buffers``: placing the model's parameters, then its buffers;
* ``activations``: forward, against what the meter counts saved at its end;
* ``grads``: forward and backward (the activations are freed by then);
* ``optimizer``: the first ``optimizer.step()``, which creates AdamW's moments.

What the allocator holds beyond the categories after a step is the
``workspace``: library workspaces allocated on first use (cuBLAS keeps one per
thread that ran a matmul, and backward runs on a thread of its own), the
caching allocator's rounding (``allocated_bytes`` against
``requested_bytes``), the batch, and AdamW's step counters (a scalar per
parameter, which :func:`dtlab.measure.memory.model_state_bytes` leaves out). A first step therefore adds
more than its categories: that extra is named (``first_step_extra``), not
failed; the categories are compared on the second step, after a warm-up one.
"""

from __future__ import annotations

import gc
import warnings

import torch
import torch.nn as nn

from dtlab.measure.memory import ActivationMeter, model_state_bytes, module_buffer_bytes

TOLERANCE = 0.05
"""A category passes within 5% of what the allocator saw it add."""
SLACK_BYTES = 4096
"""...or within this many bytes: a small category (no buffers at all, say) against the allocator's 512-byte blocks."""
FIRST_USE = (
    "what the first step added beyond its categories: library workspaces allocated on first use (cuBLAS, "
    "one per thread that runs a matmul: forward's and backward's) and the caching allocator's first "
    "segments; held from then on as workspace / 首步超出各类别的部分：首次使用时分配的库工作区（cuBLAS "
    "每个执行矩阵乘的线程一份：前向与反向各一份）以及缓存分配器的首批内存段；此后计入 workspace"
)


def live_bytes(device: str) -> int:
    """Bytes alive on ``device`` now: CUDA's allocated bytes, or on the CPU every storage once."""
    if str(device).startswith("cuda"):
        return torch.cuda.memory_allocated(device)
    storages: dict[int, int] = {}
    with warnings.catch_warnings():  # isinstance() touches deprecated torch.distributed objects
        warnings.simplefilter("ignore")
        tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.device.type == "cpu"]
    for obj in tensors:
        for t in (obj, obj.grad if obj.is_leaf else None):
            if t is not None and not _traced(t):
                storage = t.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    storages.pop(0, None)  # empty storages
    return sum(storages.values())


def _traced(tensor: torch.Tensor) -> bool:
    """A tensor torch.compile traced with (a FakeTensor, a FunctionalTensor): it holds no memory, and a
    process that compiled a model keeps some alive until the next ``torch.compiler.reset()``."""
    try:
        tensor.untyped_storage().data_ptr()
    except RuntimeError:
        return True
    return False


def rounding_bytes(device: str) -> int:
    """The caching allocator's rounding now: bytes allocated beyond those requested (0 on the CPU)."""
    if not str(device).startswith("cuda"):
        return 0
    stats = torch.cuda.memory_stats(device)
    return stats.get("allocated_bytes.all.current", 0) - stats.get("requested_bytes.all.current", 0)


def place(model: nn.Module, device: str) -> dict[str, int]:
    """Put a copy of ``model``'s parameters, then of its buffers, on ``device``; the bytes each added there.

    The old tensors stay alive until both are measured, so that on the CPU too
    the difference is the new copies (each tied parameter or shared buffer once).
    """
    keep, added, copies = [], {}, {}
    before = live_bytes(device)
    for p in {id(p): p for p in model.parameters()}.values():
        keep.append(p.data)
        p.data = p.data.to(device, copy=True)
    added["params"] = live_bytes(device) - before
    before = live_bytes(device)
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None:
                keep.append(buffer)
                if id(buffer) not in copies:
                    copies[id(buffer)] = buffer.to(device, copy=True)
                module._buffers[name] = copies[id(buffer)]
    added["buffers"] = live_bytes(device) - before
    return added


def _one_step(model: nn.Module, optimizer, x: torch.Tensor, y: torch.Tensor, device: str) -> dict:
    """One step, measured phase by phase: (allocator, counted, of which rounding) for activations,
    grads and optimizer state, and what is alive at its end."""

    def now() -> tuple[int, int]:
        return live_bytes(device), rounding_bytes(device)

    optimizer.zero_grad(set_to_none=True)
    meter = ActivationMeter(model)
    state_before = model_state_bytes(model.parameters(), optimizer)["optimizer"]
    start = now()
    with meter.track():
        loss = model(x, y)
        forward, saved = now(), meter.current
        loss.backward()
    del loss
    backward = now()
    optimizer.step()
    end = now()
    counted = model_state_bytes(model.parameters(), optimizer)
    return {
        "activations": (forward[0] - start[0], saved, forward[1] - start[1]),
        "grads": (backward[0] - start[0], counted["grads"], backward[1] - start[1]),
        "optimizer": (end[0] - backward[0], counted["optimizer"] - state_before, end[1] - backward[1]),
        "end": end[0],
    }


def _compare(seen: int, counted: int, rounding: int = 0) -> dict:
    """A category's counted bytes beside those the allocator saw it add, of which ``rounding`` the allocator's."""
    ok = abs(seen - counted) <= max(TOLERANCE * counted, SLACK_BYTES)
    ratio = seen / counted if counted else None
    return {"counted": counted, "allocator": seen, "of_which_rounding": rounding, "ratio": ratio, "ok": ok}


def check_accountant(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: str, optimizer_class=None) -> dict:
    """Train ``model`` (on the CPU, not yet placed) two steps on ``device``; each category against the allocator.

    ``x``, ``y``: a (B, T) batch and its targets. ``optimizer_class``: AdamW unless given.
    The categories are compared on the second step; the optimizer's state on the
    first, which creates it. ``workspace`` is what the allocator holds after
    each step beyond every category, ``first_step_extra`` what the first step's
    phases added beyond theirs, less what the second step's did.
    """
    gc.collect()
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)
    placed = place(model, device)
    base = live_bytes(device) - sum(placed.values())  # all but the model (on the CPU its old copy is gone now)
    optimizer = (optimizer_class or torch.optim.AdamW)(model.parameters(), lr=1e-3)
    x, y = x.to(device), y.to(device)
    batch = live_bytes(device) - base - sum(placed.values())
    steps = [_one_step(model, optimizer, x, y, device) for _ in range(2)]
    counted = {**model_state_bytes(model.parameters(), optimizer), "buffers": module_buffer_bytes(model)}
    categories = {
        "params": _compare(placed["params"], counted["params"]),
        "buffers": _compare(placed["buffers"], counted["buffers"]),
        "activations": _compare(*steps[1]["activations"]),
        "grads": _compare(*steps[1]["grads"]),
        "optimizer": _compare(*steps[0]["optimizer"]),
    }
    categories["optimizer"]["measured_at"] = "first step (it creates the state)"
    held = sum(counted.values())
    workspace = [s["end"] - base - held for s in steps]
    beyond = {phase: [s[phase][0] - s[phase][1] for s in steps] for phase in ("activations", "grads")}
    forward = beyond["activations"][0] - beyond["activations"][1]  # held on: the next phases start above it
    backward = beyond["grads"][0] - beyond["grads"][1] - forward
    return {
        "ok": all(c["ok"] for c in categories.values()),
        "device": str(device),
        "categories": categories,
        "workspace": {
            "after_first_step": workspace[0],
            "after_second_step": workspace[1],
            "of_which_rounding": rounding_bytes(device),
            "of_which_batch": batch,
        },
        "first_step_extra": {"forward": forward, "backward": backward, "why": FIRST_USE},
        "steps": steps,
    }
