"""A plan's memory per GPU, by category, under its memory model (:mod:`dtlab.planner.memory_models`).

The model states (``params``, ``grads``, ``optimizer``, ``copies``) are the memory model's, for the
parameters the fullest rank holds, the experts sharded over dp and the rest over dp x cp x ep
(:func:`dtlab.planner.experts.model_states`). Then:

* ``runtime``: dtlab's accountant's categories, as :mod:`dtlab.planner.step_memory` completes them
  (16-bit copies per micro-batch in flight with the master weights in the model; gradient buckets in
  the gradients' dtype; the pipeline's send buffers; ZeRO-3's gathered units; the peak moment).
* ``deepspeed`` and ``megatron``: their model states, beside the activations (each micro-batch in
  flight's, Korthikanti et al.) and one micro-batch's logits; for Megatron-LM, ``buffers`` holds its
  pipeline's boundary tensors in flight: one received activation and one received gradient (a stage
  frees each output's data once it is sent, ``deallocate_output_tensor``, and keeps each received input
  as the first layer's saved input, counted in the activations). The 16-bit weights are the model's
  own, held once. ``peak`` is all of it at once (a bound).

``total`` is the papers' sum: model states, copies and activations.
"""

from __future__ import annotations

from dtlab.config.layout import Layout
from dtlab.planner.experts import model_states
from dtlab.planner.memory_models import (
    MemoryModel,
    assumed_largest_layer,
    deepspeed_largest_layer_bytes,
    largest_layer,
)
from dtlab.planner.step_memory import BUCKET_MB, boundary_bytes, logits_bytes, step_memory
from dtlab.planner.work import Work

STATES = ("params", "grads", "optimizer", "copies")


def plan_memory(
    work: Work, layout: Layout, memory_model: MemoryModel, *, micro_batch: int, bucket_mb: float = BUCKET_MB
) -> dict[str, int]:
    """Bytes per GPU by category and ``total``, the model states counted as ``memory_model`` says."""
    states = model_states(work, layout, count=memory_model.states)
    if memory_model.name == "deepspeed" and layout.zero == 3:
        for kind, size in deepspeed_largest_layer_bytes(largest_layer_params(work, layout)).items():
            states[kind] += size
    if memory_model.name == "runtime":
        memory = step_memory(
            states,
            work.arch,
            layout,
            held=work.held,
            micro_batch=micro_batch,
            activations=work.activations,
            exact_copies=memory_model.master_weights != "optimizer",
            bucket_mb=bucket_mb,
            grad_bytes=memory_model.grad_bytes,
        )
    else:
        memory = _framework_memory(states, work, layout, memory_model, micro_batch)
    memory["total"] = sum(memory[k] for k in (*STATES, "activations"))
    return memory


def largest_layer_params(work: Work, layout: Layout) -> int:
    """DeepSpeed's largest layer: the largest module of the shape (on one TP rank), or, for a bare
    parameter count, of a GPT-3-shaped model (:func:`assumed_largest_layer`)."""
    return largest_layer(work.arch, layout.tp) if work.arch is not None else assumed_largest_layer(work.params)


def _framework_memory(
    states: dict[str, int], work: Work, layout: Layout, memory_model: MemoryModel, micro_batch: int
) -> dict[str, int]:
    """DeepSpeed's or Megatron-LM's states beside the activations, the logits and Megatron's boundary
    tensors; the peak is all of them at once."""
    arch = work.arch
    buffers = 0
    if memory_model.name == "megatron" and arch is not None and layout.pp > 1:
        buffers = 2 * boundary_bytes(arch, layout, micro_batch, module_16bit=True)
    memory = {
        **states,
        "activations": work.activations,
        "buffers": buffers,
        "logits": logits_bytes(arch, layout, micro_batch) if arch is not None else 0,
    }
    memory["peak"] = sum(memory[k] for k in (*STATES, "activations", "buffers", "logits"))
    return memory


def memory_notes(memory_model: MemoryModel, work: Work, layout: Layout) -> tuple[str, ...]:
    """What the plan's memory model assumes, in both languages: DeepSpeed's formula and what it keeps
    beyond the paper (its fp32 gradient partition), Megatron-LM's bytes per parameter."""
    psi, n, zero = work.held, layout.zero_ranks, layout.zero
    gb = 1e9
    if memory_model.name == "deepspeed":
        if memory_model.offload:
            kept = "2Ψ" if zero == 2 else "4 x largest layer + 2Ψ/N"
            return (
                f"DeepSpeed's ZeRO-{zero} estimator with offload_optimizer: cpu: the GPU keeps {kept}; "
                f"the optimizer states and fp32 partitions live on the CPU / DeepSpeed 的 ZeRO-{zero} 估算公式"
                f"（offload_optimizer: cpu）：GPU 上保存 {kept}；优化器状态与 fp32 分片在 CPU 上",
            )
        partition = 4 * psi / n / gb
        if zero == 2:
            return (
                f"DeepSpeed's estimate_zero2_model_states_mem_needs: 2Ψ + 18Ψ/N (Ψ = {psi:,}, N = {n}); "
                f"beyond the paper's 2Ψ + 14Ψ/N it keeps an fp32 gradient partition, 4Ψ/N = {partition:.2f} GB "
                f"/ DeepSpeed 的 estimate_zero2_model_states_mem_needs：2Ψ + 18Ψ/N（Ψ = {psi:,}，N = {n}）；"
                f"比论文的 2Ψ + 14Ψ/N 多保存一份 fp32 梯度分片，4Ψ/N = {partition:.2f} GB",
            )
        largest = largest_layer_params(work, layout)
        which = (
            f"the largest module of the shape, {largest:,} parameters"
            if work.arch is not None
            else f"assumed: the token table of a GPT-3-shaped model, {largest:,} parameters"
        )
        which_zh = (
            f"模型中最大的模块，{largest:,} 个参数"
            if work.arch is not None
            else f"假设为 GPT-3 形状模型的词嵌入表，{largest:,} 个参数"
        )
        return (
            f"DeepSpeed's estimate_zero3_model_states_mem_needs: 18Ψ/N + 4 bytes x the largest layer "
            f"({which}); beyond the paper's 16Ψ/N it keeps an fp32 gradient partition (4Ψ/N = "
            f"{partition:.2f} GB, in place of a 16-bit one) and the largest layer gathered with its 16-bit "
            f"gradient / DeepSpeed 的 estimate_zero3_model_states_mem_needs：18Ψ/N + 4 字节 x 最大层（{which_zh}）；"
            f"比论文的 16Ψ/N 多保存一份 fp32 梯度分片（4Ψ/N = {partition:.2f} GB，取代 16 位的那份），"
            f"以及收集起来的最大层和它的 16 位梯度",
        )
    if memory_model.name == "megatron":
        per = sum(memory_model.states(10**6, dp=n, zero=zero, precision=layout.precision).values()) / 10**6
        optimizer = "its distributed optimizer" if zero == 1 else "its optimizer whole"
        optimizer_zh = "分布式优化器" if zero == 1 else "不切分的优化器"
        pipeline, pipeline_zh = (
            ("; the pipeline keeps 2 boundary tensors in flight", "；流水线同时保留 2 个边界张量")
            if layout.pp > 1
            else ("", "")
        )
        return (
            f"Megatron-LM's bytes per parameter: {layout.precision} params, {memory_model.grad_dtype} grads, "
            f"{optimizer} (d = {n}): {per:.4g}{pipeline} / Megatron-LM 每个参数的字节数：{layout.precision} 参数、"
            f"{memory_model.grad_dtype} 梯度、{optimizer_zh}（d = {n}）：{per:.4g}{pipeline_zh}",
        )
    return ()
