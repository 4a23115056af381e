"""The random-number generators a step may draw from, saved as tensors and plain values.

``torch.load(weights_only=True)`` rebuilds only tensors and plain Python
values, so each generator's state is stored in that form: torch's as its byte
tensor, Python's ``random`` as its tuple of ints, NumPy's as its key array.
"""

from __future__ import annotations

import random

import torch


def capture_rng_state() -> dict:
    """Every generator a step may draw from, as tensors and plain values (``weights_only``-safe)."""
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }
    try:
        import numpy as np

        _, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = {
            "keys": torch.from_numpy(keys.astype("int64")),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    except ImportError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    """Put back what :func:`capture_rng_state` captured."""
    torch.set_rng_state(state["torch"])
    python = state["python"]
    random.setstate((python["version"], tuple(python["internal"]), python["gauss_next"]))
    if "numpy" in state:
        import numpy as np

        n = state["numpy"]
        np.random.set_state(
            ("MT19937", n["keys"].numpy().astype("uint32"), n["pos"], n["has_gauss"], n["cached_gaussian"])
        )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
