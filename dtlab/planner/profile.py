"""A machine profile: this machine's measured FLOP/s and link costs, what ``dtlab plan --gpu local`` plans on.

``dtlab calibrate`` (:mod:`dtlab.planner.calibrate`) measures them and writes one
small JSON file; the planner reads it back here. Nothing in this module runs
a process or imports torch: it is the file's format, the straight-line fit
both measurements share, and where the file lives.

Both measurements are fitted to the same straight line, least squares over a
few sizes ``x`` (Hockney's alpha-beta model for a message, and its twin for
compute)::

    link:     time(n bytes) = alpha + beta * n        alpha: latency (s), beta: s per byte
    compute:  time(F flops)  = overhead + F / flop_s   overhead: s per block, forward + backward

A link's ``alpha`` and ``beta`` are the whole collective's at the group size
it was measured on, with ``n`` the tensor's bytes (nccl-tests' "size": an
all-gather's output, a reduce-scatter's input, a message of send/recv).
:meth:`MachineProfile.link` turns them into a :class:`~dtlab.planner.hardware.Link`
(per ring step), so the ring formulas of :mod:`dtlab.planner.communication`
give back the measured line at that size and extrapolate to others.

Compute is per rank *and per world size*: on a machine with fewer cores than
ranks (4 ranks on 2 cores), each rank gets a share of the cores, so the
profile keeps what one rank achieved while 1, 2 and 4 ranks ran at once.

The file (``version`` 1)::

    {"version": 1, "kind": "dtlab machine profile", "created": "2026-12-01T22:00:00Z",
     "machine": {"description": "...", "cores": 2, "memory_bytes": ...}, "torch": "2.x",
     "precision": "fp32", "model": "small",
     "compute": {"1": {"flop_s": ..., "overhead_s": ..., "matmul_flop_s": ...,
                       "optimizer_s_per_param": ..., "step_s": ...}, "2": {...}, "4": {...}},
     "links": {"2": {"all_reduce": {"alpha_s": ..., "beta_s_per_byte": ...}, "all_gather": {...},
                     "reduce_scatter": {...}, "send_recv": {...}}, "4": {...}}}

It lives in the user's dtlab directory beside their progress:
``$DTLAB_PROFILE`` if set, else ``$DTLAB_HOME/machine.json``, else
``$XDG_DATA_HOME/dtlab/machine.json`` (``~/.local/share/dtlab/``), and is
written whole through a temporary file and ``os.replace``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dtlab.i18n import ConfigError
from dtlab.planner.hardware import Link

VERSION = 1
KIND = "dtlab machine profile"
PROFILE_ENV = "DTLAB_PROFILE"
LINK_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
"""What ``dtlab calibrate`` measures; ``send_recv`` is one message between two ranks."""
BURST_KINDS = {
    "all_reduce_buckets": "all_reduce",
    "reduce_scatter_buckets": "reduce_scatter",
    "all_gather_buckets": "all_gather",
}
"""Measured too, as the runtime issues them in bursts, per call: a few buckets' all-reduces (data
parallelism) or reduce-scatters (ZeRO-2) in flight together and waited for at the end, and ZeRO-2's
all-gathers one after another with nothing computed between. A profile without one prices it as its
plain kind (the value)."""

# Ring steps and the share of the tensor each rank sends, per collective on n
# ranks (dtlab/planner/communication.py; nccl-tests' PERFORMANCE.md).
_STEPS = {
    "all_reduce": lambda n: 2 * (n - 1),
    "all_gather": lambda n: n - 1,
    "reduce_scatter": lambda n: n - 1,
    "send_recv": lambda n: 1,
}
_SHARE = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "send_recv": lambda n: 1.0,
}
for _burst, _plain in BURST_KINDS.items():
    _STEPS[_burst], _SHARE[_burst] = _STEPS[_plain], _SHARE[_plain]


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``(intercept, slope)`` of ``y = intercept + slope * x``.

    With the times of a few message sizes: (alpha, beta). Exact on points
    that lie on a line; needs at least two distinct ``x``.
    """
    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ConfigError(
            f"a line needs two or more distinct sizes, got x = {list(xs)}",
            f"拟合直线至少需要两个不同的大小，收到的是 x = {list(xs)}",
        )
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def fit_nonnegative(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """:func:`fit_line` with both coefficients kept at 0 or above (least squares under that constraint):
    on a busy machine the noise can tilt a few points into a negative latency or slope."""
    intercept, slope = fit_line(xs, ys)
    if slope <= 0:
        return max(0.0, sum(ys) / len(ys)), 0.0
    if intercept < 0:
        return 0.0, max(0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs))
    return intercept, slope


@dataclass(frozen=True, kw_only=True)
class LinkCost:
    """One collective at one group size: ``time(n) = alpha_s + beta_s_per_byte * n``."""

    alpha_s: float
    """Seconds whatever the size: latency (the fit's intercept, at least 0)."""
    beta_s_per_byte: float
    """Seconds per byte of the tensor (the fit's slope, above 0)."""

    def time(self, nbytes: float) -> float:
        return self.alpha_s + self.beta_s_per_byte * nbytes

    @classmethod
    def fit(cls, sizes: list[float], seconds: list[float]) -> "LinkCost":
        """The line through measured ``seconds`` at ``sizes`` bytes, neither coefficient below 0
        (:func:`fit_nonnegative`; a slope of 0 is kept at 1e-15 s/byte so that a bandwidth exists)."""
        alpha, beta = fit_nonnegative(sizes, seconds)
        return cls(alpha_s=alpha, beta_s_per_byte=max(beta, 1e-15))


@dataclass(frozen=True, kw_only=True)
class ComputeCost:
    """What one rank computes at, while ``world`` ranks share the machine (fp32)."""

    flop_s: float
    """FLOP/s of the small GPT's forward and backward beyond a fixed cost per block (the fit's 1/slope)."""
    overhead_s: float
    """Seconds per block per micro-batch, forward and backward, whatever its size (the fit's intercept
    over the blocks): the kernels' launches and Python, which small models are made of."""
    matmul_flop_s: float
    """FLOP/s of one matmul at the model's shapes: this machine's peak for MFU."""
    optimizer_s_per_param: float
    """Seconds of AdamW's step per parameter it updates."""
    step_s: float = 0.0
    """Seconds every training step costs at this world size beyond its forward, backward, optimizer and
    gradient collectives: the trainer's own bookkeeping (the loss for the record, every rank's record
    gathered on rank 0, the memory ledger, the tracer). Measured by ``dtlab calibrate`` on real training
    steps at one sequence per rank; 0 in a profile written before it was measured."""


@dataclass(frozen=True, kw_only=True)
class MachineProfile:
    """This machine, measured by ``dtlab calibrate``: compute per world size, links per group size."""

    machine: dict
    torch: str
    created: str
    model: str
    compute: dict[int, ComputeCost]
    links: dict[int, dict[str, LinkCost]]
    precision: str = "fp32"
    path: str | None = field(default=None, compare=False)

    def compute_at(self, world: int) -> ComputeCost:
        """Per-rank compute with ``world`` ranks running. Measured sizes as measured; between or beyond
        them, the nearest measured size below, its FLOP/s shared further when ranks outnumber cores."""
        if world in self.compute:
            return self.compute[world]
        below = max((w for w in self.compute if w <= world), default=min(self.compute))
        cost = self.compute[below]
        cores = max(1, int(self.machine.get("cores", 1)))
        share = max(1.0, world / max(below, cores)) if world > cores else 1.0
        return ComputeCost(
            flop_s=cost.flop_s / share,
            overhead_s=cost.overhead_s * share,
            matmul_flop_s=cost.matmul_flop_s / share,
            optimizer_s_per_param=cost.optimizer_s_per_param * share,
            step_s=cost.step_s * share,
        )

    def link(self, kind: str, group: int) -> Link:
        """``kind`` over ``group`` ranks as a per-step :class:`Link`: the ring formulas then give the
        measured ``alpha + beta * n`` at the measured size (the nearest one; the largest if beyond)."""
        measured = sorted(self.links)
        size = min(measured, key=lambda w: (abs(w - group), -w)) if measured else 2
        kinds = self.links[size]
        cost = kinds[kind] if kind in kinds else kinds[BURST_KINDS[kind]]  # an older profile: the plain kind
        n = max(2, size)
        return Link(
            name=f"local/{kind}",
            latency_s=cost.alpha_s / _STEPS[kind](n),
            bandwidth_Bps=_SHARE[kind](n) / cost.beta_s_per_byte,
        )

    def to_dict(self) -> dict:
        return {
            "version": VERSION,
            "kind": KIND,
            "created": self.created,
            "machine": self.machine,
            "torch": self.torch,
            "precision": self.precision,
            "model": self.model,
            "compute": {str(w): asdict(c) for w, c in sorted(self.compute.items())},
            "links": {str(w): {k: asdict(c) for k, c in kinds.items()} for w, kinds in sorted(self.links.items())},
        }

    @classmethod
    def from_dict(cls, data: dict, *, path: str | None = None) -> "MachineProfile":
        """Read the file's object; a KeyError, TypeError or ValueError if it is not version 1's shape."""
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise ValueError("not a dtlab machine profile")
        if data.get("version") != VERSION:
            raise ValueError(f"version {data.get('version')!r}, this dtlab reads {VERSION}")
        compute = {int(w): ComputeCost(**{k: float(v) for k, v in c.items()}) for w, c in data["compute"].items()}
        links = {
            int(w): {k: LinkCost(**{f: float(v) for f, v in c.items()}) for k, c in kinds.items()}
            for w, kinds in data["links"].items()
        }
        if not compute or 1 not in compute:
            raise ValueError("no compute measured with one rank")
        if not links:
            raise ValueError("no links measured")
        for cost in compute.values():
            if not all(math.isfinite(x) and x > 0 for x in (cost.flop_s, cost.matmul_flop_s)):
                raise ValueError("FLOP/s must be positive numbers")
        for kinds in links.values():
            if set(kinds) - set(BURST_KINDS) != set(LINK_KINDS):
                raise ValueError(f"links must be {', '.join(LINK_KINDS)} (and may be {', '.join(BURST_KINDS)})")
        return cls(
            machine=dict(data["machine"]),
            torch=str(data["torch"]),
            created=str(data["created"]),
            model=str(data["model"]),
            precision=str(data.get("precision", "fp32")),
            compute=compute,
            links=links,
            path=path,
        )


def default_path() -> Path:
    """``$DTLAB_PROFILE``, else ``machine.json`` in the user's dtlab directory (see the module docstring)."""
    given = os.environ.get(PROFILE_ENV)
    if given:
        return Path(given)
    home = os.environ.get("DTLAB_HOME")
    if home:
        return Path(home) / "machine.json"
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "dtlab" / "machine.json"


def save_profile(profile: MachineProfile, path: str | os.PathLike | None = None) -> Path:
    """Write ``profile`` to ``path`` (default :func:`default_path`) atomically; returns where."""
    path = Path(path) if path is not None else default_path()
    from dtlab.config.safe_paths import check_output_target

    check_output_target("--out", str(path))  # never renamed onto a device, a FIFO or a socket
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".machine-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(profile.to_dict(), f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def load_profile(path: str | os.PathLike | None = None) -> MachineProfile:
    """The profile at ``path`` (default :func:`default_path`); a bilingual ConfigError, naming the file and
    telling the user to run ``dtlab calibrate``, if it is missing or is not a profile this dtlab reads."""
    name = PROFILE_ENV if path is None and os.environ.get(PROFILE_ENV) else "--gpu"  # the name the user gave
    path = Path(path) if path is not None else default_path()
    from dtlab.config.safe_paths import check_existing_input

    check_existing_input(name, path, 1 << 20)  # a pipe or /dev/zero is refused before it is read
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"no machine profile at {path}: run `dtlab calibrate` first (it measures this "
            f"machine in under a minute), or give a profile file with --gpu FILE.json",
            f"{path} 处没有机器配置文件：请先运行 `dtlab calibrate`（一分钟内测出本机性能），"
            f"或用 --gpu FILE.json 指定配置文件",
        ) from None
    except OSError as error:
        raise ConfigError(
            f"cannot read the machine profile {path}: {error.strerror}",
            f"无法读取机器配置文件 {path}：{error.strerror}",
        ) from None
    try:
        return MachineProfile.from_dict(json.loads(text), path=str(path))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ConfigError(
            f"{path} is not a machine profile this dtlab can read ({error}); run `dtlab calibrate` again to rewrite it",
            f"{path} 不是本版 dtlab 能读取的机器配置文件（{error}）；请重新运行 `dtlab calibrate` 生成",
        ) from None


def is_local(gpu: str) -> bool:
    """True for ``--gpu local`` or a profile file (``*.json``), False for a preset GPU's name."""
    return gpu == "local" or str(gpu).endswith(".json")


def profile_for(gpu: str) -> MachineProfile:
    """The profile ``--gpu`` names: ``local`` is the default file, else the file itself."""
    return load_profile(None if gpu == "local" else gpu)


def check_profile_target(out: str | None) -> Path | None:
    """Where the profile will be written (None: the default path), refused in both languages if it cannot be.

    ``--out`` must name a file (not a directory) in a directory that exists (none is created: a typo
    would become one) and that this user can write in. The default path (``$DTLAB_PROFILE``, else under
    ``$DTLAB_HOME`` or the user's data folder) gets its folders created when missing (by ``save_profile``),
    so the nearest one that exists must be a directory this user can write in.
    """
    from dtlab.config.output_paths import check_output_file

    if out is not None:
        check_output_file("--out", out)
        return Path(out).expanduser()
    name = next((env for env in (PROFILE_ENV, "DTLAB_HOME") if os.environ.get(env)), "the profile")
    check_output_file(name, str(default_path()), create_folders=True)  # a device, /proc/nope: refused now
    return None
