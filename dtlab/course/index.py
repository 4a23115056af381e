"""The course index as data: which lesson teaches which glossary words.

``LESSONS`` is the curriculum: the notebooks in ``notebooks/``, in
the order of the README's lesson table, each executed from its jupytext source
``notebooks/NN_name.py`` and each a prediction, a real run on local ranks and
a measured check. Every glossary entry links to the lessons that run it and
to the modules that implement it; ``tests/test_glossary.py`` holds the two
sides to each other.

``PLANNED_MODULES`` and ``PLANNED_LESSONS`` are the files the glossary already
links to but that are not written yet. They keep the links honest both ways:
a link to a missing file must be listed here, and a listed file must really
be missing. So when you build one of these files, remove its entry here in
the same change (the test names the entry to remove).
"""

from __future__ import annotations

from typing import NamedTuple


class Lesson(NamedTuple):
    """One notebook of the course."""

    number: int
    """Position in the course (0, 1, 2, ...; a number may be missing while its lesson is being written)."""
    stem: str
    """File name without ``.ipynb``, e.g. ``"04_zero"``."""
    title_en: str
    title_zh: str
    terms: tuple[str, ...]
    """Glossary slugs (file names in ``glossary/``) the lesson teaches."""
    builds_on: tuple[str, ...] = ()
    """The lessons (by :attr:`name`) whose concepts this one uses without teaching them: each must come
    earlier in the course (``tests/test_glossary.py`` checks the order against these lists)."""

    @property
    def name(self) -> str:
        """The stem without its number, e.g. ``"zero"``: what :attr:`builds_on` lists."""
        return self.stem[3:]

    @property
    def path(self) -> str:
        """Path from the repository root, as glossary entries write it."""
        return f"notebooks/{self.stem}.ipynb"

    def title(self, lang: str = "en") -> str:
        return self.title_zh if lang == "zh" else self.title_en


_EVERY_LESSON_BEFORE = (
    "first_distributed_run",
    "all_reduce",
    "data_parallelism",
    "mixed_precision",
    "zero",
    "offloading",
    "tensor_parallelism",
    "long_sequences",
    "pipeline_parallelism",
    "3d_parallelism",
    "warmup_and_loss_spikes",
    "checkpointing",
    "mixture_of_experts",
    "one_gpu_fast",
    "fp8",
    "planning_at_scale",
    "from_laptop_to_cluster",
)
"""The glossary's flash cards come last: they ask about every other lesson's terms."""

LESSONS: tuple[Lesson, ...] = (
    Lesson(
        0,
        "00_first_distributed_run",
        "Your first distributed run",
        "第一次分布式运行",
        ("rank", "world-size", "process-group", "backend", "rendezvous", "torchrun"),
        (),
    ),
    Lesson(
        1,
        "01_all_reduce",
        "All-reduce",
        "全归约（all-reduce）",
        ("all-reduce", "reduce-scatter", "all-gather", "nccl", "gloo", "interconnect"),
        ("first_distributed_run",),
    ),
    Lesson(
        2,
        "02_data_parallelism",
        "Data parallelism",
        "数据并行",
        ("data-parallelism", "gradient-accumulation", "straggler"),
        ("first_distributed_run", "all_reduce"),
    ),
    Lesson(
        3,
        "03_mixed_precision",
        "Mixed precision",
        "混合精度",
        ("mixed-precision", "fp16", "bf16", "loss-scaling", "master-weights"),
        ("all_reduce", "data_parallelism"),
    ),
    Lesson(
        4,
        "04_zero",
        "ZeRO",
        "ZeRO 零冗余优化器",
        ("zero", "fsdp", "model-states"),
        ("all_reduce", "data_parallelism", "mixed_precision"),
    ),
    Lesson(
        5,
        "05_offloading",
        "Offloading",
        "卸载到 CPU",
        ("offloading", "pcie"),
        ("all_reduce", "data_parallelism", "mixed_precision", "zero"),
    ),
    Lesson(
        6,
        "06_tensor_parallelism",
        "Tensor parallelism",
        "张量并行",
        ("tensor-parallelism", "model-parallelism"),
        ("all_reduce", "data_parallelism"),
    ),
    Lesson(
        7,
        "07_long_sequences",
        "Long sequences: sequence and context parallelism",
        "长序列：序列并行与上下文并行",
        ("sequence-parallelism", "context-parallelism", "ring-attention"),
        ("all_reduce", "data_parallelism", "tensor_parallelism"),
    ),
    Lesson(
        8,
        "08_pipeline_parallelism",
        "Pipeline parallelism",
        "流水线并行",
        ("pipeline-parallelism", "micro-batch", "pipeline-bubble", "gpipe", "1f1b"),
        ("data_parallelism", "mixed_precision", "zero"),
    ),
    Lesson(
        9,
        "09_3d_parallelism",
        "3D parallelism",
        "3D 并行",
        ("3d-parallelism", "device-mesh"),
        ("data_parallelism", "tensor_parallelism", "pipeline_parallelism"),
    ),
    Lesson(
        10,
        "10_warmup_and_loss_spikes",
        "Warmup and loss spikes",
        "学习率预热与损失尖峰",
        ("warmup", "loss-spike", "gradient-clipping"),
        ("data_parallelism", "zero", "tensor_parallelism", "pipeline_parallelism", "3d_parallelism"),
    ),
    Lesson(
        11,
        "11_checkpointing",
        "Checkpointing",
        "检查点：重计算与断点续训",
        ("gradient-checkpointing", "training-checkpoint"),
        (
            "first_distributed_run",
            "data_parallelism",
            "mixed_precision",
            "zero",
            "tensor_parallelism",
            "warmup_and_loss_spikes",
        ),
    ),
    Lesson(
        12,
        "12_mixture_of_experts",
        "Mixture of experts and expert parallelism",
        "混合专家与专家并行",
        ("mixture-of-experts", "expert-parallelism", "all-to-all", "router", "capacity-factor"),
        ("all_reduce", "data_parallelism", "tensor_parallelism", "pipeline_parallelism", "3d_parallelism"),
    ),
    Lesson(
        13,
        "13_one_gpu_fast",
        "One GPU, fast",
        "单卡，快起来",
        ("mfu", "flashattention", "kernel-fusion", "torch-compile"),
        ("mixed_precision",),
    ),
    Lesson(14, "14_fp8", "FP8", "FP8 训练", ("fp8", "amax"), ("mixed_precision", "warmup_and_loss_spikes")),
    Lesson(
        15,
        "15_planning_at_scale",
        "Planning at scale",
        "大规模训练规划",
        ("mfu", "flops", "memory-budget"),
        (
            "all_reduce",
            "data_parallelism",
            "mixed_precision",
            "zero",
            "tensor_parallelism",
            "pipeline_parallelism",
            "3d_parallelism",
            "checkpointing",
        ),
    ),
    Lesson(
        16,
        "16_from_laptop_to_cluster",
        "From laptop to cluster",
        "从笔记本到集群",
        ("node", "hierarchical-all-reduce", "torchrun", "interconnect", "nccl", "hsdp"),
        (
            "first_distributed_run",
            "all_reduce",
            "data_parallelism",
            "zero",
            "tensor_parallelism",
            "pipeline_parallelism",
            "3d_parallelism",
        ),
    ),
    # The flash-card lesson teaches every term; it builds its cards from
    # dtlab.course.glossary.all_terms() rather than from a list kept here, and comes last.
    Lesson(17, "17_glossary", "Glossary", "术语表", (), _EVERY_LESSON_BEFORE),
)


def lesson(key: int | str) -> Lesson:
    """A lesson by number (``3``), stem (``"04_zero"``) or path (``"notebooks/04_zero.ipynb"``)."""
    for item in LESSONS:
        if key in (item.number, item.stem, item.path):
            return item
    raise KeyError(key)


# Linked from the glossary (or listed in LESSONS) but not on disk yet.
# Remove an entry in the same change that adds its file.
PLANNED_MODULES: tuple[str, ...] = ()

PLANNED_LESSONS: tuple[str, ...] = ()
