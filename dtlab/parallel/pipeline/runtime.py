"""Run one rank's pipeline schedule: compute its stage, send and receive what crosses stages.

The schedule (:mod:`dtlab.parallel.pipeline.schedule`) says *what* each rank does, in
order; this runtime *does* it, with point-to-point messages over the pipeline
group::

    F of micro-batch i:  receive h_i (B/m, T, C) from stage s-1 (stage 0: embed the tokens)
                         out_i = stage(h_i)              -> send out_i to stage s+1
                         (last stage: loss_i = CE / m)   keep h_i, out_i for backward
    B of micro-batch i:  receive dL/d out_i from stage s+1 (last stage: start from loss_i)
                         backward through the stage      -> send dL/d h_i to stage s-1

Each micro-batch's loss is divided by m, and gradients add up over the m
backwards, so every parameter's ``.grad`` ends as the gradient of the mean
loss over the rank's whole batch: what one process computes on that batch.

Sends are posted with ``isend`` and waited for only at the end of the step:
a rank never blocks on delivering a message, only on receiving one it needs.
With blocking sends, 1F1B's steady state would deadlock: stage s sending
forward to s+1 while s+1 sends its gradient back to s, each waiting for the
other to receive.

Interleaved 1F1B (``virtual_stages`` v > 1): the rank holds v chunks
(:class:`~dtlab.parallel.pipeline.partition.GPTStage`), and an action names its
*virtual* stage s = chunk x p + rank (``2F0`` on rank 0 of p = 2: chunk 1).
Virtual stage s sends its output to s + 1 on rank (rank + 1) mod p (the last
rank's chunk c to rank 0's chunk c + 1) and its input's gradient to s - 1 on
rank (rank - 1) mod p. Virtual stage 0 embeds the tokens, the last computes
the loss.

Every message is tagged by where it goes: (virtual stage, micro-batch,
direction) (:func:`message_tag`), so a receive takes exactly its message
(gloo matches tags). The order matches too, which backends that ignore tags
(NCCL) rely on: between two ranks each direction carries one kind of message
(with p = 2 both kinds share a pair), and sender and receiver take
them in the same order: every rank runs its forwards in the same order of
(chunk, micro-batch), its backwards too, and moving to the next chunk keeps
that order. ``tests/test_pipeline_interleaved.py`` checks it, send by send,
for p up to 8, v up to 4 and m up to 8p.

Per step it measures what the dashboard draws: each action's start and end
(after its input arrived) and how long it waited for it, the bubble fraction
measured as idle / total time on this rank, and the peak activation bytes
held for backward (:class:`dtlab.measure.memory.ActivationMeter`), which grows with m
under GPipe and stays bounded by p - stage micro-batches under 1F1B.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn

from dtlab.comm import calls as comm
from dtlab.comm.collectives import global_rank, group_size_and_rank
from dtlab.data import micro_batches as split_micro_batches
from dtlab.i18n import ConfigError
from dtlab.measure.memory import ActivationMeter, note_level
from dtlab.parallel.pipeline.schedule import BACKWARD, FORWARD
from dtlab.parallel.pipeline.schedule import schedule as make_schedule


@dataclass
class PipelineStepResult:
    """What one step of the pipeline did on this rank."""

    loss: float
    """Mean loss over the micro-batches (computed by the last stage, sent to every stage)."""
    timeline: list[dict]
    """Per action ``{"action": "1F0", "start": s, "end": e, "wait": w, "cpu": c}``: seconds
    since the step began; ``start`` is when its input had arrived, ``wait`` the time spent
    waiting for it, ``cpu`` the CPU time this rank's thread spent on the action (on a CPU
    with fewer cores than ranks, ``end - start`` also counts waiting for a core; ``cpu`` does
    not. On a GPU it is only the time to launch the kernels)."""
    bubble_fraction: float
    """Measured: idle / total, where idle is the step's time outside any action's compute."""
    total_s: float
    compute_s: float
    wait_s: float
    """Time blocked on receives, plus waiting for the sends at the end of the step."""
    activation_peak: int
    """Peak bytes saved for backward during the step."""
    in_flight_peak: int
    """Most micro-batches held for backward at once."""

    def as_record(self) -> dict:
        return asdict(self)


class PipelineRuntime:
    """Executes this rank's actions of a GPipe, 1F1B or interleaved 1F1B schedule.

    ``module`` is this rank's stage (a :class:`~dtlab.parallel.pipeline.partition.GPTStage`,
    possibly TP-split or wrapped for data parallelism): ``module(x)`` for the
    stage's forward, ``module(x, targets)`` on the last stage for the loss.
    ``group`` is the pipeline group: this rank's index in it is its stage,
    and the previous / next stage are its neighbours there (addressed by
    global rank). ``d_model`` is the width C of the activations that cross
    stages (B/m, T, C). ``no_sync``, if given, makes the context every
    backward but the step's last runs in (a DP wrapper's, through
    :meth:`dtlab.parallel.dp_optimizer.DPOptimizer.no_sync`), so DP communicates once.
    ``activation_dtype`` is the dtype of what crosses stages: the compute
    precision's (fp16 or bf16 under mixed precision, where the parameters stay
    fp32); by default the parameters'. Sender and receiver must agree on it.
    ``virtual_stages`` > 1 with ``schedule="interleaved"``: ``module`` holds that many
    chunks and takes ``module(x, chunk=c)`` (a :class:`~dtlab.parallel.pipeline.partition.GPTStage`
    cut with the same ``virtual_stages``).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        d_model: int,
        group=None,
        schedule: str = "1f1b",
        micro_batches: int = 1,
        meter: ActivationMeter | None = None,
        no_sync=None,
        activation_dtype: torch.dtype | None = None,
        virtual_stages: int = 1,
    ):
        self.module, self.d_model, self.group = module, d_model, group
        self.no_sync = no_sync or nullcontext
        self.micro_batches, self.virtual_stages = micro_batches, virtual_stages
        self.stages, self.stage = group_size_and_rank(group)
        self.chained = self.stages * virtual_stages  # virtual stages in the whole pipeline
        self.is_first, self.is_last = self.stage == 0, self.stage == self.stages - 1
        # The ranks of virtual stages s - 1 and s + 1 (interleaved: around the ring of ranks).
        self.prev = global_rank(group, (self.stage - 1) % self.stages)
        self.next = global_rank(group, (self.stage + 1) % self.stages)
        self.actions = make_schedule(schedule, self.stages, micro_batches, virtual_stages)[self.stage]
        self.meter = meter if meter is not None else ActivationMeter(module)
        self.dtype = activation_dtype or next(module.parameters()).dtype
        self.buffer_peak = self._received = 0

    def step(self, x: torch.Tensor, y: torch.Tensor, *, loss_scale: float = 1.0) -> PipelineStepResult:
        """Forward and backward of the batch ``x``, ``y`` (B, T) on this stage; gradients
        accumulate into ``.grad``. Every stage passes the same batch (only the first
        uses ``x``, only the last ``y``). ``loss_scale`` multiplies the loss before
        backward (fp16 loss scaling); the reported loss is unscaled."""
        self.loss_scale = loss_scale
        m = self.micro_batches
        if x.shape[0] % m:
            raise ConfigError(
                f"a batch of {x.shape[0]} sequences cannot be cut into {m} equal "
                f"micro-batches (allowed: a batch that is a multiple of {m})",
                f"{x.shape[0]} 个序列的批次无法平均分成 {m} 个微批次（允许：{m} 的倍数）",
            )
        # Own copies: a slice shares the whole batch's storage, which the activation
        # meter would count as held by every micro-batch that saves its ids.
        self._batches = [
            (mx.clone(), my.clone()) for mx, my in split_micro_batches(x, y, m)
        ]  # m x ((B/m, T), (B/m, T))
        self._held = {}  # (chunk, micro-batch) -> (its input, its output): kept for B
        self._sends = []  # (work, buffer) posted and not yet delivered
        self._loss_sum = torch.zeros((), dtype=torch.float32, device=x.device)
        last_backward = max(n for n, a in enumerate(self.actions) if a.kind != FORWARD)
        timeline, in_flight_peak = [], 0
        self.meter.reset_peak()
        self.buffer_peak = self._received = 0  # bytes of send and receive buffers (memory's ``buffers``)
        now = _clock(x.device)
        t0 = now()
        with self.meter.track():
            for n, action in enumerate(self.actions):
                asked, cpu = now(), time.thread_time()
                if action.kind == FORWARD:
                    start = self._forward(action)
                else:
                    start = self._backward(action, sync=n == last_backward)
                end = now()
                timeline.append(
                    {
                        "action": str(action),
                        "start": start - t0,
                        "end": end - t0,
                        "wait": start - asked,
                        "cpu": time.thread_time() - cpu,
                    }
                )
                in_flight_peak = max(in_flight_peak, len(self._held))
                buffers = self._buffer_bytes()
                self.buffer_peak = max(self.buffer_peak, buffers)
                note_level("pipeline", buffers)  # memory's peak at one moment
                self._sends = self._undelivered()
        drained = now()
        for work, _ in self._sends:
            work.wait()  # the buffers live until here
        note_level("pipeline", 0)
        total = now() - t0
        compute = sum(a["end"] - a["start"] for a in timeline)
        wait = sum(a["wait"] for a in timeline) + (t0 + total - drained)
        self._batches = self._sends = None
        return PipelineStepResult(
            loss=self._loss_from_last_stage(self._loss_sum),
            timeline=timeline,
            bubble_fraction=max(0.0, 1 - compute / total) if total > 0 else 0.0,
            total_s=total,
            compute_s=compute,
            wait_s=wait,
            activation_peak=self.meter.peak,
            in_flight_peak=in_flight_peak,
        )

    def _chunk(self, action) -> dict:
        """The module's keyword for the action's chunk: none unless interleaved (any stage module then works)."""
        return {"chunk": action.stage // self.stages} if self.virtual_stages > 1 else {}

    def _tag(self, stage: int, i: int, kind: str) -> int:
        return message_tag(stage, i, kind, micro_batches=self.micro_batches)

    def _forward(self, action) -> float:
        """F of virtual stage ``action.stage``, micro-batch ``i``; returns the time its input had arrived."""
        s, i = action.stage, action.micro_batch
        mx, my = self._batches[i]
        if s == 0:
            h = mx  # (B/m, T) token ids
        else:
            h = self._recv(
                (*mx.shape, self.d_model), self.prev, mx.device, kind="recv.forward", tag=self._tag(s, i, FORWARD)
            )
            h.requires_grad_()  # (B/m, T, C)
        start = _clock(mx.device)()
        if s == self.chained - 1:
            out = self.module(h, my, **self._chunk(action)) / self.micro_batches  # () loss_i / m
            self._loss_sum += out.detach()
        else:
            out = self.module(h, **self._chunk(action))  # (B/m, T, C)
            self._sends.append(
                self._send(out.detach(), self.next, kind="send.forward", tag=self._tag(s + 1, i, FORWARD))
            )
        self._held[s, i] = (h, out)
        return start

    def _backward(self, action, *, sync: bool) -> float:
        """B of virtual stage ``action.stage``, micro-batch ``i``; returns the time its output gradient had arrived."""
        s, i = action.stage, action.micro_batch
        h, out = self._held.pop((s, i))  # after this backward, autograd frees its activations
        if s == self.chained - 1:
            out, grad = out * self.loss_scale, None  # scaled loss: small gradients survive fp16
        else:
            grad = self._recv(out.shape, self.next, out.device, kind="recv.backward", tag=self._tag(s, i, BACKWARD))
        start = _clock(out.device)()
        # A DP wrapper communicates in the step's last backward only; before it, gradients
        # of the micro-batches just add up locally (as in gradient accumulation). Interleaved,
        # that backward is chunk 0's: the other chunks' gradients are complete by then, and the
        # wrapper's finish_gradient_sync() sends what the last backward did not touch.
        with nullcontext() if sync else self.no_sync():
            torch.autograd.backward(out, grad)
        if s > 0:
            self._sends.append(
                self._send(h.grad, self.prev, kind="send.backward", tag=self._tag(s - 1, i, BACKWARD))
            )  # (B/m, T, C)
        return start

    def _recv(self, shape, src: int, device, *, kind: str, tag: int) -> torch.Tensor:
        buffer = torch.empty(shape, dtype=self.dtype, device=device)
        comm.recv(buffer, src, group=self.group, kind=kind, tag=tag)
        if kind == "recv.backward":  # a forward's input is held for backward: an activation
            self._received = buffer.numel() * buffer.element_size()
        return buffer

    def _buffer_bytes(self) -> int:
        """Send buffers still in flight and the gradient received for this action, in bytes."""
        sent = sum(b.numel() * b.element_size() for _, b in self._sends)
        received, self._received = self._received, 0
        return sent + received

    def _send(self, tensor: torch.Tensor, dst: int, *, kind: str, tag: int):
        tensor = tensor.contiguous()
        return comm.isend(tensor, dst, group=self.group, kind=kind, tag=tag), tensor

    def _undelivered(self) -> list:
        """The sends still in flight; a delivered one is waited for (at once) and its buffer let go."""
        for work, _ in self._sends:
            if work.is_completed():
                work.wait()
        return [s for s in self._sends if not s[0].is_completed()]

    def _loss_from_last_stage(self, loss_sum: torch.Tensor) -> float:
        """Only the last stage computed the loss; the others receive it, for the step record."""
        if self.stages > 1:
            comm.broadcast(loss_sum, global_rank(self.group, self.stages - 1), group=self.group, kind="broadcast.loss")
        return loss_sum.item()


def message_tag(stage: int, micro_batch: int, kind: str, *, micro_batches: int) -> int:
    """The point-to-point tag of the message that virtual stage ``stage`` receives for ``micro_batch``:
    its input (``kind`` F, from stage - 1) or its output's gradient (B, from stage + 1). Unique within a step."""
    return 2 * (stage * micro_batches + micro_batch) + (kind == BACKWARD)


def _clock(device: torch.device):
    """``time.perf_counter``, after the device has finished its queued work on CUDA: the time of
    an action is then its kernels' time, not the time it took to launch them."""
    if device.type != "cuda":
        return time.perf_counter

    def now() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return now
