"""How long a plan's step takes: compute at the GPU's achievable share of peak, plus communication per axis.

Compute is the iteration's FLOPs (:class:`~dtlab.planner.work.Work`) over the GPUs, each running its
matmuls at ``matmul_fraction`` of its peak and the attention core (QK^T, softmax, attention over V,
:func:`dtlab.planner.formulas.attention_core_flops`) at ``attention_fraction``
(:mod:`dtlab.planner.hardware`: calibrated for the A100, 0.5 for both elsewhere), stretched by the
pipeline's bubble. Communication is each axis's ring or point-to-point time on the link its group spans
(:mod:`dtlab.planner.communication`), assumed not to overlap with compute, so the step time is a
rough upper bound. On this machine as measured (``gpu="local"``) both come from ``dtlab calibrate``'s
profile instead, priced as dtlab's runtime runs the layout (:meth:`LocalMachine.step`).

Under ``memory_model="megatron"`` the plan is Megatron-LM's implementation: its gradients are
communicated in their own dtype and its pipeline sends boundary tensors with the scatter/gather
optimization (Narayanan et al. 2021, Sec. 4.1).
"""

from __future__ import annotations

from dtlab.config.layout import Layout
from dtlab.parallel.pipeline.schedule import bubble_over_ideal, ideal_bubble_fraction
from dtlab.planner.communication import (
    context_parallel_comm_time,
    data_parallel_comm_time,
    hybrid_sharding_comm_time,
    pipeline_comm_time,
    scatter_gather_pipeline_time,
    tensor_parallel_comm_time,
    vocab_parallel_comm_time,
)
from dtlab.planner.experts import expert_parallel_time
from dtlab.planner.formulas import BYTES_PER_VALUE
from dtlab.planner.hardware import GPU
from dtlab.planner.local import LocalMachine
from dtlab.planner.memory_models import MemoryModel
from dtlab.planner.work import Work


def achievable_fraction(device: GPU, work: Work) -> float:
    """The share of peak the iteration's compute reaches on ``device``: the attention core's FLOPs at its
    ``attention_fraction``, the rest at its ``matmul_fraction`` (their FLOP-weighted harmonic mean)."""
    matmul, attention = device.matmul_fraction, device.attention_fraction
    if matmul == attention or not work.flops:
        return matmul
    return work.flops / ((work.flops - work.attention_flops) / matmul + work.attention_flops / attention)


def timing(
    device: GPU,
    layout: Layout,
    work: Work,
    memory_model: MemoryModel,
    *,
    gpus: int,
    micro_batch_size: int,
    bucket_mb: float | None,
    flags: tuple[str, ...],
) -> tuple[dict, tuple[str, ...]]:
    """The plan's time fields (bubble, compute, communication, step time, MFU, the achievable fraction
    of peak), and ``flags`` with any a measured machine adds."""
    links, comm = communication(device, layout, work, memory_model, gpus=gpus, micro_batch_size=micro_batch_size)
    peak = device.peak_flops[layout.precision]
    pipeline = (layout.pp, layout.micro_batches, layout.virtual_stages)
    bubble = float(ideal_bubble_fraction(*pipeline))
    achieved = achievable_fraction(device, work)
    compute_s = work.flops / (gpus * peak * achieved) / (1 - bubble)
    step_s = compute_s + sum(comm.values())
    if isinstance(device, LocalMachine):
        compute_s, comm, links, step_s, peak, flags = device.step(
            work.arch, layout, micro_batch_size, bubble, bucket_mb, flags
        )
        achieved = 1.0
    fields = {
        "bubble_fraction": bubble,
        "bubble_over_ideal": float(bubble_over_ideal(*pipeline)),
        "compute_time_s": compute_s,
        "comm_time_s": comm,
        "links": links,
        "step_time_s": step_s,
        "mfu": work.model_flops / (step_s * gpus * peak),
        "achievable_fraction": achieved,
    }
    return fields, flags


def communication(
    device: GPU, layout: Layout, work: Work, memory_model: MemoryModel, *, gpus: int, micro_batch_size: int
) -> tuple[dict[str, str], dict[str, float]]:
    """Which link each axis uses, and its seconds of communication per iteration.

    Under CP every per-token tensor a rank sends holds s/cp tokens; the data-
    parallel gradient average spans dp x cp (x ep) ranks, the experts' dp.
    """
    dp, tp, pp, m, cp, ep = layout.dp, layout.tp, layout.pp, layout.micro_batches, layout.cp, layout.ep
    value_bytes = BYTES_PER_VALUE[layout.precision]
    grad_bytes = value_bytes if memory_model.master_weights == "model" else memory_model.grad_bytes
    megatron = memory_model.name == "megatron"
    links = {
        "dp": device.link_for(tp * cp * ep * dp),
        "tp": device.link_for(tp),
        "cp": device.link_for(tp * cp),
        "pp": device.link_for(gpus),
    }
    link = {axis: device.link(name) for axis, name in links.items()}
    tokens = micro_batch_size * work.seq_len // cp  # per rank
    boundary_bytes = tokens * work.hidden * value_bytes  # one (b, s/cp, h)
    kv_bytes = 2 * tokens * work.kv_dim // tp * value_bytes  # this rank's K and V
    dense = (work.held - work.experts_held) * grad_bytes
    comm = {
        "dp": data_parallel_comm_time(dense, dp=dp * cp * ep, zero=layout.zero, link=link["dp"])
        + data_parallel_comm_time(work.experts_held * grad_bytes, dp=dp, zero=layout.zero, link=link["dp"]),
        "tp": tensor_parallel_comm_time(
            boundary_bytes,
            tp=tp,
            layers=work.blocks,
            micro_batches=m,
            recompute=layout.recompute,
            link=link["tp"],
            sequence_parallel=layout.sp,
        ),
        "pp": _pipeline_time(boundary_bytes, layout, link, megatron=megatron) if work.hidden else 0.0,
    }
    if layout.dp_shard is not None:  # hybrid sharding: the shard group is K consecutive DP ranks (cp = ep = 1)
        links["dp_shard"], links["dp_replicate"] = device.link_for(tp * layout.dp_shard), links.pop("dp")
        del comm["dp"]
        comm.update(
            hybrid_sharding_comm_time(
                dense,
                dp=dp,
                dp_shard=layout.dp_shard,
                zero=layout.zero,
                shard_link=device.link(links["dp_shard"]),
                replicate_link=device.link(links["dp_replicate"]),
            )
        )
    if work.arch is not None and work.arch.vocab_parallel:
        comm["tp"] += vocab_parallel_comm_time(boundary_bytes, tokens, tp=tp, pp=pp, micro_batches=m, link=link["tp"])
    if cp > 1:  # only then: a plan without CP keeps the keys it always had
        comm["cp"] = context_parallel_comm_time(
            kv_bytes, cp=cp, layers=work.blocks, micro_batches=m, recompute=layout.recompute, link=link["cp"]
        )
    else:
        del links["cp"]
    if ep > 1:
        links["ep"] = device.link_for(tp * cp * ep)
        comm["ep"] = expert_parallel_time(work, layout, micro_batch_size, device.link(links["ep"]))
    return links, comm


def _pipeline_time(boundary_bytes: float, layout: Layout, link: dict, *, megatron: bool) -> float:
    """A stage's point-to-point seconds: Megatron-LM's scatter/gather over TP, or each tensor whole."""
    common = {"pp": layout.pp, "micro_batches": layout.micro_batches, "virtual_stages": layout.virtual_stages}
    if megatron:
        return scatter_gather_pipeline_time(boundary_bytes, tp=layout.tp, link=link["pp"], tp_link=link["tp"], **common)
    return pipeline_comm_time(boundary_bytes, link=link["pp"], **common)
