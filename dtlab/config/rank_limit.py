"""How many ranks a local run may start at once: ``DTLAB_MAX_RANKS``, 8 unless set.

Every process a local run starts shares this machine's cores and memory, so
the local pool, ``dtlab train`` and a local cluster (``dtlab cluster run``)
all stop at one number, read here and nowhere else. It is read when it is
used, not when a module is imported: a bad value then stops the command that
needs it, with a message in both languages, and leaves ``dtlab --help`` or
``dtlab glossary`` alone.
"""

from __future__ import annotations

import os

from dtlab.i18n import ConfigError

LIMIT_ENV = "DTLAB_MAX_RANKS"
DEFAULT_LIMIT = 8
"""The limit when ``DTLAB_MAX_RANKS`` is unset (or empty)."""
CORES_FACTOR = 4
"""``DTLAB_MAX_RANKS`` may not exceed this many ranks per core of the machine (nor go below the default 8):
past that, the ranks only wait on each other and fill the memory."""


def local_rank_limit() -> int:
    """``DTLAB_MAX_RANKS`` as a positive integer (8 unless set); a bilingual ConfigError naming it otherwise."""
    text = os.environ.get(LIMIT_ENV, "")
    if not text.strip():
        return DEFAULT_LIMIT
    try:
        value = int(text) if text.strip().isascii() and len(text) <= 12 else 0
    except ValueError:
        value = 0
    ceiling, cores = machine_ceiling(), os.cpu_count() or 1
    if not 1 <= value <= ceiling:
        raise ConfigError(
            f"{LIMIT_ENV}={text!r} is not allowed; expected a positive integer (1, 2, 3, ...) of at most {ceiling} "
            f"({CORES_FACTOR} x the {cores} cores of this machine, and never less than {DEFAULT_LIMIT}): the most "
            f"ranks a local run may start, each a process on this machine (unset: {DEFAULT_LIMIT})",
            f"环境变量 {LIMIT_ENV}={text!r} 不合法；应为不超过 {ceiling} 的正整数（1、2、3……；本机 {cores} 个核心的 "
            f"{CORES_FACTOR} 倍，且不少于 {DEFAULT_LIMIT}）：本地运行最多可启动的 rank 数，每个都是本机上的一个进程"
            f"（未设置时为 {DEFAULT_LIMIT}）",
        )
    return value


def machine_ceiling() -> int:
    """The most ranks ``DTLAB_MAX_RANKS`` may allow: :data:`CORES_FACTOR` per core, never below the default."""
    return max(DEFAULT_LIMIT, CORES_FACTOR * (os.cpu_count() or 1))


def local_limit_reason(limit: int) -> tuple[str, str]:
    """Where a limit of ``limit`` ranks comes from, in English and Chinese, to follow "but ..."."""
    given = os.environ.get(LIMIT_ENV, "").strip()
    source = (
        (f"{LIMIT_ENV}={given}", f"环境变量 {LIMIT_ENV}={given}")
        if given
        else (f"{LIMIT_ENV}, {DEFAULT_LIMIT} unless set", f"环境变量 {LIMIT_ENV}，未设置时为 {DEFAULT_LIMIT}")
    )
    return (
        f"the local pool allows at most {limit} ranks ({source[0]})",
        f"本地进程池最多允许 {limit} 个 rank（{source[1]}）",
    )


def pool_limit_reason(limit: int) -> tuple[str, str]:
    """The same for a given pool's size (``RankPool(max_size=...)``, which is DTLAB_MAX_RANKS by default)."""
    return (
        f"the rank pool allows at most {limit} ranks (its max_size; {LIMIT_ENV} by default)",
        f"该进程池最多允许 {limit} 个 rank（其 max_size；默认取环境变量 {LIMIT_ENV}）",
    )
