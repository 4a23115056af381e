"""The one protocol the training loop drives (dtlab.parallel.dp_optimizer): every layout implements all of it.

One process, no process group (a world of one): each implementation, driven
exactly as dtlab/train/loop.py drives it, takes the steps plain AdamW takes and
reports its model states under the protocol's keys. The distributed
behaviour of each is checked in test_data_parallel.py, test_zero.py and
test_layouts.py.
"""

from __future__ import annotations

import ast
import copy
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

from dtlab.config import MODEL_PRESETS
from dtlab.data import global_batch, micro_batches
from dtlab.model import build_model
from dtlab.parallel.data_parallel import apply_data_parallel
from dtlab.parallel.dp_optimizer import MODEL_STATES, DPOptimizer
from dtlab.parallel.replicated import ReplicatedOptimizer
from dtlab.parallel.zero import OffloadOptimizer, apply_zero
from dtlab.state.training_state import PieceSource

CFG = MODEL_PRESETS["tiny"]
OPT = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
ROOT = Path(__file__).resolve().parent.parent


def _layouts():
    """name -> (model, optimizer) for every form the trainer builds, plus offloading alone."""
    dp = apply_data_parallel(build_model(CFG, seed=0), mode="overlapped")
    plain = build_model(CFG, seed=0)
    made = {
        "dp": (dp, ReplicatedOptimizer(dp, torch.optim.AdamW(dp.parameters(), **OPT))),
        "offload": (plain, OffloadOptimizer(plain.parameters(), torch.optim.AdamW, **OPT)),
    }
    for stage in (1, 2, 3):
        for offload in (False, True):
            made[f"zero{stage}{'+offload' if offload else ''}"] = apply_zero(
                build_model(CFG, seed=0), stage=stage, offload=offload, **OPT
            )
    return made


LAYOUTS = _layouts()


def _loop_step(model, optimizer, step: int, *, accum: int = 2, protocol: bool = True) -> float:
    """One step as dtlab/train/loop.py takes it: zero_grad, no_sync but for the last backward, sync, step.

    ``protocol=False``: the same step with a plain torch optimizer (the reference).
    """
    optimizer.zero_grad(set_to_none=True)
    x, y = global_batch(step, batch_size=4, seq_len=CFG.seq_len, seed=0)
    total = 0.0
    for i, (mx, my) in enumerate(micro_batches(x, y, accum)):
        with optimizer.no_sync() if protocol and i < accum - 1 else nullcontext():
            loss = model(mx, my) / accum
            loss.backward()
        total += loss.item()
    if protocol:
        optimizer.finish_gradient_sync()
    optimizer.step()
    return total


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_layout_is_a_dp_optimizer_and_trains_like_adamw(name):
    model, optimizer = LAYOUTS[name]
    assert isinstance(optimizer, DPOptimizer)
    reference = build_model(CFG, seed=0)
    ref_opt = torch.optim.AdamW(reference.parameters(), **OPT)
    for step in range(3):
        ours = _loop_step(model, optimizer, step)
        theirs = _loop_step(reference, ref_opt, step, protocol=False)
        assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-6), (name, step)
    held, host = optimizer.memory_bytes(), optimizer.host_memory_bytes()
    assert set(MODEL_STATES) <= set(held) and set(host) == set(MODEL_STATES)
    assert held["params"] > 0 and held["grads"] > 0
    offloaded = "offload" in name
    assert (held["optimizer"] == 0) == offloaded and (host["optimizer"] > 0) == offloaded
    state = copy.deepcopy(optimizer.state_dict())
    optimizer.load_state_dict(state)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_the_training_state_brings_back_the_weights_and_the_optimizer_state(name):
    """What checkpoints and spike rollback keep: weights too (ZeRO-3's model holds none between steps),
    named as in the model; taking it back repeats the same steps, bit for bit."""
    model, optimizer = _layouts()[name]
    for step in range(2):
        _loop_step(model, optimizer, step)
    kept = optimizer.training_state()
    after = [_loop_step(model, optimizer, step) for step in (2, 3)]
    optimizer.load_training_state(PieceSource(kept))
    assert [_loop_step(model, optimizer, step) for step in (2, 3)] == after, name
    names = {p.name for p in kept}
    expected = {n for n, _ in build_model(CFG, seed=0).named_parameters()}
    assert names == (set(map(str, range(len(expected)))) if name == "offload" else expected), name
    assert {"param", "exp_avg", "exp_avg_sq"} <= set().union(*(p.tensors for p in kept))


def test_a_layout_that_forgets_its_training_state_cannot_be_made():
    class Forgetful(DPOptimizer):  # everything the loop drives, but nothing to save
        param_groups = []

        def zero_grad(self, set_to_none=True): ...
        def step(self): ...
        def memory_bytes(self):
            return {}

        def state_dict(self):
            return {}

        def load_state_dict(self, state): ...

    with pytest.raises(TypeError, match="load_training_state, training_state"):
        Forgetful()


def test_a_torch_optimizer_alone_is_not_one():
    assert not isinstance(torch.optim.AdamW(build_model(CFG, seed=0).parameters()), DPOptimizer)


def test_the_loop_asks_no_capability_with_hasattr():
    for path in ("dtlab/train/loop.py", "dtlab/train/rank.py", "dtlab/parallel/pipeline/runtime.py"):
        calls = [
            node.func.id
            for node in ast.walk(ast.parse((ROOT / path).read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        ]
        assert "hasattr" not in calls, path
