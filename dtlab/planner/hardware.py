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

from dataclasses import dataclass

from dtlab.planner.presets import preset


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


# Nominal peak figures per GPU (or per NIC), one direction. The latencies are
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
    use TF32 for matmuls unless asked), bf16/fp16 are the tensor-core figures."""
    intra_node_link: str = "nvlink"
    """Link between GPUs of one node (a name in :data:`LINKS`)."""
    inter_node_link: str = "infiniband"
    """Link between nodes, one NIC per GPU."""
    gpus_per_node: int = 8

    def link_for(self, group_span: int) -> str:
        """The link a group of ``group_span`` neighbouring GPUs talks over: the
        node's own (NVLink) if the group fits in one node, else the network."""
        return self.intra_node_link if group_span <= self.gpus_per_node else self.inter_node_link


GPUS: dict[str, GPU] = {
    # NVIDIA A100 SXM 80GB datasheet: 312 TFLOP/s BF16/FP16 dense, 19.5 FP32.
    "A100": GPU(name="A100", memory_bytes=80 * 10**9, peak_flops={"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
    # NVIDIA H100 SXM datasheet: 989 TFLOP/s BF16/FP16 dense, 67 FP32.
    "H100": GPU(name="H100", memory_bytes=80 * 10**9, peak_flops={"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    # H200: the H100's compute with 141 GB of HBM3e.
    "H200": GPU(name="H200", memory_bytes=141 * 10**9, peak_flops={"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
}


def get_gpu(name: str) -> GPU:
    """The preset GPU called ``name``; a bilingual ConfigError if there is none."""
    return preset(GPUS, name, what="GPU", what_zh="GPU")
