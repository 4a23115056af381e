"""Loss spikes: inject a bad batch, detect the spike it causes, and recover from it.

A *loss spike* is a sudden jump of the training loss. Large runs meet them
(PaLM: "roughly 20 times" in training, Chowdhery et al., 2022, Sec. 5.1),
from a learning rate too high for the moment, a numerical overflow, or a bad
batch from the data pipeline. A bad batch shows up as a high loss at its
own step, and its *update* is a step in a direction the real data does not
want, which the run then has to climb back from. The remedy is to notice the
spike before the optimizer step, and not let that update through.

``--spike STEP`` feeds one corrupted batch (:func:`corrupt_batch`) at STEP.
:class:`SpikeDetector` watches the loss the ranks agree on
(:func:`global_loss`), and on a spike the :class:`SpikePolicy` decides:

* ``skip``: drop this step's update (no ``optimizer.step()``); the bad batch
  is gone and the weights are as they were before it.
* ``rollback``: also go back to the last in-memory :class:`Snapshot` of the
  weights, optimizer and loss scaler (taken every ``snapshot_every`` healthy
  steps), and carry on with the batch after the bad one: the batches since
  the snapshot are dropped too. PaLM did this at scale: restart from a
  checkpoint about 100 steps before the spike and skip 200-500 batches.

In a training step (:class:`SpikeGuard` puts the pieces together)::

    guard = SpikeGuard("skip")
    ...
    if step == config.spike:
        x, y = corrupt_batch(x, y, seed=config.seed + step)   # the global batch, before sharding
    ... forward, backward ...
    events = guard.check(step, global_loss(loss, group=dp_group),
                         model=model, optimizer=optimizer, scaler=mp.scaler)
    if not events:                 # healthy: take the step
        mp.step(optimizer)
    # else: skipped; `events` go into the step's record

Every rank must take the same decision, so the detector sees the mean loss
over the data-parallel ranks, which is the same number everywhere.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections import deque
from enum import Enum

import torch

from dtlab.comm import calls as comm
from dtlab.comm.collectives import group_size_and_rank
from dtlab.i18n import ConfigError


def corrupt_batch(x: torch.Tensor, y: torch.Tensor, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of the same shape made of random bytes 128-255, which the corpus never contains.

    Deterministic in ``seed``. Like a real batch, the targets are the inputs
    shifted by one token. A model that has learned anything about the corpus
    finds these bytes very unlikely, so the loss jumps.
    """
    generator = torch.Generator().manual_seed(seed)
    B, T = x.shape
    rows = torch.randint(128, 256, (B, T + 1), generator=generator)  # (B, T+1)
    return rows[:, :-1].to(x), rows[:, 1:].to(y)


def global_loss(loss: float | torch.Tensor, *, group=None) -> float:
    """The mean of each rank's loss over ``group``: the loss of the whole global batch, on every rank."""
    value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
    world, _ = group_size_and_rank(group)
    if world == 1:
        return value
    total = torch.tensor([value], dtype=torch.float64)
    comm.all_reduce(total, group=group, kind="all_reduce.loss")  # a gloo or NCCL group on CPU tensors
    return total.item() / world


class SpikeDetector:
    """Flags a loss far above the recent ones: more than ``k`` robust deviations above their median.

    Over the last ``window`` accepted losses, with median m and median
    absolute deviation MAD::

        spike  if  loss > m + k * max(1.4826 * MAD, min_spread * m)

    The median and MAD are the robust versions of the mean and standard
    deviation (1.4826 x MAD estimates the standard deviation of normal
    noise): an earlier spike in the window barely moves them. The floor
    ``min_spread * m`` keeps a flat loss from making every wiggle a spike.
    The window is short because a falling loss leaves its median behind by
    about window/2 steps. Nothing is flagged in the first ``warmup`` steps,
    except a loss that is inf or NaN, which always is. Flagged losses are
    not added to the window.

    A spike is brief by definition. After ``patience`` flagged losses in a
    row the loss has moved to a new level (too high a learning rate, say),
    and refusing every update from then on would silently stop training:
    the detector then accepts the new level (``accepted_new_level`` is set,
    the window restarts from this loss) and the caller reports it.
    """

    def __init__(
        self, window: int = 10, *, k: float = 3.0, min_spread: float = 0.05, warmup: int = 5, patience: int = 3
    ):
        if not (window >= 3 and k > 0 and min_spread >= 0 and 1 <= warmup <= window):
            raise ConfigError(
                f"SpikeDetector(window={window}, k={k}, min_spread={min_spread}, warmup={warmup}) "
                "is not allowed; expected window >= 3, k > 0, min_spread >= 0, 1 <= warmup <= window",
                f"SpikeDetector(window={window}, k={k}, min_spread={min_spread}, warmup={warmup}) "
                "不合法；应满足 window >= 3、k > 0、min_spread >= 0、1 <= warmup <= window",
            )
        self.window, self.k, self.min_spread, self.warmup = window, k, min_spread, warmup
        self.recent: deque[float] = deque(maxlen=window)
        self.threshold = math.inf
        self.patience, self.in_a_row, self.accepted_new_level = patience, 0, False

    def observe(self, loss: float) -> bool:
        """True if ``loss`` is a spike; otherwise it joins the window."""
        self.accepted_new_level = False
        loss = float(loss)
        if not math.isfinite(loss):
            return True
        if len(self.recent) >= self.warmup:
            median = statistics.median(self.recent)
            mad = statistics.median(abs(v - median) for v in self.recent)
            self.threshold = median + self.k * max(1.4826 * mad, self.min_spread * abs(median))
            if loss > self.threshold:
                self.in_a_row += 1
                if self.in_a_row < self.patience:
                    return True
                self.recent.clear()  # not a spike any more: the loss lives here now
                self.accepted_new_level = True
        self.in_a_row = 0
        self.recent.append(loss)
        return False

    def state_dict(self) -> dict:
        return {"recent": list(self.recent), "in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.recent = deque(state["recent"], maxlen=self.window)
        self.in_a_row = int(state.get("in_a_row", 0))


class SpikePolicy(str, Enum):
    """What to do about a spike (see the module docstring)."""

    SKIP = "skip"
    ROLLBACK = "rollback"


class Snapshot:
    """An in-memory copy of the weights, optimizer state and loss scaler at the start of ``step``.

    Each of ``model``, ``optimizer``, ``scaler`` is anything with
    ``state_dict()`` / ``load_state_dict()``, or None. The trainer passes no
    model: its optimizer's training state holds the weights too, wherever the
    layout keeps them (:meth:`dtlab.parallel.dp_optimizer.DPOptimizer.training_state`;
    under ZeRO-3 the model itself holds none).
    """

    def __init__(self, step: int, model, optimizer, scaler=None):
        self.step = step
        self.model = None if model is None else copy.deepcopy(model.state_dict())
        self.optimizer = copy.deepcopy(optimizer.state_dict())
        self.scaler = None if scaler is None else copy.deepcopy(scaler.state_dict())

    def restore(self, model, optimizer, scaler=None) -> None:
        if model is not None and self.model is not None:
            model.load_state_dict(self.model)
        optimizer.load_state_dict(copy.deepcopy(self.optimizer))  # keep ours intact for a second rollback
        if scaler is not None and self.scaler is not None:
            scaler.load_state_dict(self.scaler)


class SpikeGuard:
    """Detector, policy and snapshots in one object, for the training loop.

    Call :meth:`check` once per step, after backward and before the optimizer
    step, with the loss every rank agrees on. It returns the step's events: an
    empty list means healthy (take the step); otherwise skip the optimizer step
    and put the events in the step's record.
    """

    def __init__(
        self,
        policy: SpikePolicy | str = SpikePolicy.SKIP,
        *,
        detector: SpikeDetector | None = None,
        snapshot_every: int = 10,
    ):
        try:
            self.policy = SpikePolicy(policy)
        except ValueError:
            raise ConfigError(
                f"spike policy {policy!r} is not allowed; expected 'skip' or 'rollback'",
                f"尖峰处理策略 {policy!r} 不合法；应为 'skip' 或 'rollback'",
            ) from None
        self.detector = detector or SpikeDetector()
        self.snapshot_every = snapshot_every
        self.snapshot: Snapshot | None = None

    def check(self, step: int, loss: float, *, model, optimizer, scaler=None) -> list[dict]:
        """Detect, and on a spike recover; returns the events (``[]`` when the step is healthy)."""
        if not self.detector.observe(loss):
            if self.detector.accepted_new_level:
                return [
                    {
                        "kind": "spike_accepted",
                        "step": step,
                        "rank": None,
                        "loss": float(loss),
                        "after": self.detector.patience,
                    }
                ]
            # Healthy, and the optimizer has not stepped yet: the model is the
            # state at the start of this step, a good one to come back to.
            if self.policy is SpikePolicy.ROLLBACK and (
                self.snapshot is None or step - self.snapshot.step >= self.snapshot_every
            ):
                self.snapshot = Snapshot(step, model, optimizer, scaler)
            return []
        events = [
            {
                "kind": "spike",
                "step": step,
                "rank": None,
                "loss": float(loss),
                "threshold": self.detector.threshold,
                "action": self.policy.value,
            }
        ]
        if self.policy is SpikePolicy.ROLLBACK and self.snapshot is not None:
            self.snapshot.restore(model, optimizer, scaler)
            events.append({"kind": "rollback", "step": step, "rank": None, "to_step": self.snapshot.step})
        return events
