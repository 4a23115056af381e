"""What the planner plans on: accelerators and the links between them, by their datasheet numbers.

A :class:`GPU` is memory, peak FLOP/s per precision, and which link joins it
to its neighbours (NVLink inside a node, InfiniBand between nodes). A
:class:`Link` is one direction of a connection in the alpha-beta model::

    time(n) = alpha + n / beta        (alpha: latency, beta: bandwidth in bytes/s)

:mod:`dtlab.planner.communication` prices collectives on these links, and
:mod:`dtlab.comm.collectives` can slow a real run down to one of them. Every
figure is a nominal peak, not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dtlab.planner.presets import preset

ACHIEVABLE_FRACTION = 0.5
"""Share of the GPU's peak FLOP/s a GPU preset without a calibration is assumed to reach. Published
MFUs of large runs are 38-46% (Llama 3 405B 38-43%, Grattafiori et al. 2024; PaLM 540B 46.2%, Chowdhery
et al. 2022), so 0.5 for the compute alone is an optimistic but not absurd guess. The A100 has its own,
calibrated against Megatron-LM's published A100 runs (:data:`A100_MATMUL_FRACTION`)."""


@dataclass(frozen=True, kw_only=True)
class Link:
    """One direction of a point-to-point connection, in the alpha-beta model."""

    name: str
    """Short name used on the command line (``"nvlink"``, ``"infiniband"``, ...)."""
    latency_s: float
    """alpha: seconds before the first byte arrives, whatever the message size."""
    bandwidth_Bps: float
    """beta: bytes per second in one direction once data is flowing."""

    def time(self, nbytes: float) -> float:
        """Seconds to send ``nbytes`` in one message: alpha + n / beta."""
        return self.latency_s + nbytes / self.bandwidth_Bps


# Nominal peak figures per GPU (or per NIC), one direction: a GPU's share of the node's
# fabric (NVLink) or its own network card (one NIC per GPU, as DGX nodes have). The latencies are
# the order of magnitude of one step of a collective library on that fabric:
# small messages are latency-bound, large ones bandwidth-bound, and these
# numbers put the crossover where real systems put it (tens of kB to a few MB).
LINKS: dict[str, Link] = {
    # H100 SXM, NVLink 4: 18 links x 25 GB/s = 450 GB/s per direction per GPU
    # (NVIDIA quotes 900 GB/s, which counts both directions).
    "nvlink": Link(name="nvlink", latency_s=1e-6, bandwidth_Bps=450e9),
    # PCIe Gen5 x16: 32 GT/s x 16 lanes = 64 GB/s per direction, nominal
    # (Gen4 x16 is half that, 32 GB/s).
    "pcie": Link(name="pcie", latency_s=2e-6, bandwidth_Bps=64e9),
    # InfiniBand NDR: 400 Gb/s = 50 GB/s per NIC, one NIC per GPU.
    "infiniband": Link(name="infiniband", latency_s=5e-6, bandwidth_Bps=50e9),
    # 100 Gb/s Ethernet (12.5 GB/s) through the kernel's TCP stack, as gloo uses it.
    "ethernet": Link(name="ethernet", latency_s=25e-6, bandwidth_Bps=12.5e9),
}


A100_LINKS: dict[str, Link] = {
    # NVLink 3 on an A100 SXM: 12 links x 25 GB/s = 300 GB/s per direction per GPU (NVIDIA quotes
    # 600 GB/s, both directions).
    "nvlink": Link(name="nvlink", latency_s=1e-6, bandwidth_Bps=300e9),
    # InfiniBand HDR: 200 Gb/s = 25 GB/s per NIC and direction; a DGX A100 has 8 of them for its
    # 8 GPUs (Narayanan et al. 2021, Sec. 5: Selene's nodes), so one per GPU.
    "infiniband": Link(name="infiniband", latency_s=5e-6, bandwidth_Bps=25e9),
}
"""The A100's generation of the two links: the same kinds (names) as :data:`LINKS`, their own speeds."""

A100_MATMUL_FRACTION = 0.61
"""Share of an A100's peak that the weights' matmuls (and everything else but the attention core)
reach in a step, and :data:`A100_ATTENTION_FRACTION` the attention core's (QK^T, the fused softmax,
attention over V: per-head batched GEMMs of head-dim width and memory-bound kernels). Calibrated once,
together, so that the planner reproduces two rows of Narayanan et al. 2021's Table 1 that the tests do
not check: 3.6B on 64 A100s (138 TFLOP/s per GPU) and 529.6B on 2,520 (163), planned as Megatron-LM ran
them (``memory_model="megatron"``: fp16, full recomputation, the interleaved schedule with its
scatter/gather, micro-batches of one sequence). Two rates, because the attention core's share of the
FLOPs, s/(6h), is what falls as the models grow (15% at 1.7B, 1% at 1T), which is the "larger
matrix multiplications" Narayanan et al. credit for the rising utilization."""
A100_ATTENTION_FRACTION = 0.18


def get_link(name: str) -> Link:
    """The preset link called ``name``; a bilingual ConfigError if there is none."""
    return preset(LINKS, name, what="link", what_zh="互连")


@dataclass(frozen=True, kw_only=True)
class GPU:
    """An accelerator, by its datasheet numbers (dense, no sparsity)."""

    name: str
    memory_bytes: int
    """HBM capacity."""
    peak_flops: dict[str, float]
    """Peak FLOP/s per training precision. fp32 is plain FP32 (PyTorch does not
    use TF32 for matmuls unless asked), bf16/fp16/fp8 are the tensor-core figures. fp8 prices the whole
    step at the FP8 rate, an upper bound: attention's core and the rest stay bf16 (dtlab/numerics/fp8.py)."""
    intra_node_link: str = "nvlink"
    """Link between GPUs of one node (a name in :data:`LINKS`)."""
    inter_node_link: str = "infiniband"
    """Link between nodes, one NIC per GPU."""
    gpus_per_node: int = 8
    own_links: dict[str, Link] = field(default_factory=dict)
    """This GPU's generation of a link kind, where its speed differs from :data:`LINKS`' (the A100's
    NVLink 3 and HDR InfiniBand); the other kinds are :data:`LINKS`'."""
    matmul_fraction: float = ACHIEVABLE_FRACTION
    """Share of peak FLOP/s the compute reaches, all but the attention core (:data:`ACHIEVABLE_FRACTION`
    unless calibrated: :data:`A100_MATMUL_FRACTION`)."""
    attention_fraction: float = ACHIEVABLE_FRACTION
    """Share of peak FLOP/s the attention core reaches (QK^T, softmax, attention over V)."""

    def link(self, name: str) -> Link:
        """The link of kind ``name`` as this GPU has it: its own generation, else :func:`get_link`'s."""
        return self.own_links[name] if name in self.own_links else get_link(name)

    def link_for(self, group_span: int) -> str:
        """The link a group of ``group_span`` neighbouring GPUs talks over: the
        node's own (NVLink) if the group fits in one node, else the network."""
        return self.intra_node_link if group_span <= self.gpus_per_node else self.inter_node_link


GPUS: dict[str, GPU] = {
    # NVIDIA A100 SXM 80GB datasheet: 312 TFLOP/s BF16/FP16 dense, 19.5 FP32.
    # NVLink 3 and HDR InfiniBand (A100_LINKS); its compute fractions calibrated (A100_MATMUL_FRACTION).
    "A100": GPU(
        name="A100",
        memory_bytes=80 * 10**9,
        peak_flops={"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12, "fp8": 312e12},  # no FP8 units: BF16's
        own_links=A100_LINKS,
        matmul_fraction=A100_MATMUL_FRACTION,
        attention_fraction=A100_ATTENTION_FRACTION,
    ),
    # NVIDIA H100 SXM datasheet: 989 TFLOP/s BF16/FP16 dense, 1979 FP8 dense, 67 FP32.
    "H100": GPU(
        name="H100",
        memory_bytes=80 * 10**9,
        peak_flops={"bf16": 989e12, "fp16": 989e12, "fp32": 67e12, "fp8": 1979e12},
    ),
    # H200: the H100's compute with 141 GB of HBM3e.
    "H200": GPU(
        name="H200",
        memory_bytes=141 * 10**9,
        peak_flops={"bf16": 989e12, "fp16": 989e12, "fp32": 67e12, "fp8": 1979e12},
    ),
}


def get_gpu(name: str) -> GPU:
    """The preset GPU called ``name``; a bilingual ConfigError if there is none."""
    return preset(GPUS, name, what="GPU", what_zh="GPU")
