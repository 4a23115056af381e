"""Which torch releases dtlab runs on, and a clear refusal of the others before any rank starts.

The range is the one in ``pyproject.toml`` (and the Makefile, binder/postBuild
and the README, which a test keeps in step). Its lower end is the first
release with every torch name dtlab relies on: 2.6, where FSDP2's
``fully_shard`` became public (``torch.distributed.fsdp``), the baseline that
``dtlab bench zero`` and the ZeRO-3 tests compare against. Collectives that
newer releases renamed (``all_gather_single`` for ``all_gather_into_tensor``)
are looked up with a fallback in ``dtlab/comm/calls.py``, so both ends work.

pip enforces the range when it installs dtlab, but a torch installed before
(``make`` and Binder keep one that imports) is not checked by pip: hence
:func:`check_torch`, called where ranks are started.
"""

from __future__ import annotations

from dtlab.i18n import DtlabError

TORCH_MIN = (2, 6)
"""The oldest supported release (inclusive)."""
TORCH_BELOW = (2, 14)
"""The first release not yet supported (exclusive): newer ones are untested."""
TORCH_SPEC = f"torch>={TORCH_MIN[0]}.{TORCH_MIN[1]},<{TORCH_BELOW[0]}.{TORCH_BELOW[1]}"
"""The range as pip writes it."""


def release(version: str) -> tuple[int, int]:
    """``"2.13.0+cpu"`` -> ``(2, 13)``."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def check_torch() -> None:
    """Refuse, in both languages, a torch outside :data:`TORCH_SPEC`."""
    import torch

    if not TORCH_MIN <= release(torch.__version__) < TORCH_BELOW:
        raise DtlabError(
            f"dtlab needs {TORCH_SPEC}, but this Python has torch {torch.__version__}; "
            f'install a supported one: pip install "{TORCH_SPEC}"',
            f"dtlab 需要 {TORCH_SPEC}，但当前 Python 中的 torch 是 {torch.__version__}；"
            f'请安装受支持的版本：pip install "{TORCH_SPEC}"',
        )
