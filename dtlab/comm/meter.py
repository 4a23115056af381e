"""The communication meter: what one rank's collectives sent, counted per kind (:class:`CommMeter`).

Every collective of dtlab's takes ``meter=`` (:mod:`dtlab.comm.collectives`,
:mod:`~dtlab.comm.all_to_all`, :mod:`~dtlab.comm.recursive_doubling`), and so
does every parallel wrapper that calls them; the lessons and the tests read it
to compare the bytes sent with the ring's 2(N-1)/N x nbytes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch


@dataclass
class CommMeter:
    """What one rank communicated, per collective kind (``"all_reduce"``, ``"all_gather"``, ...).

    ``calls``: collective calls. ``nbytes``: bytes of the tensors they were
    called on (the whole tensor: nccl-tests' convention). ``bytes_sent``: bytes
    this rank put on point-to-point links itself, known only for dtlab's own
    collectives (PyTorch's built-ins do not report theirs).
    """

    calls: Counter = field(default_factory=Counter)
    nbytes: Counter = field(default_factory=Counter)
    bytes_sent: Counter = field(default_factory=Counter)

    def record_call(self, kind: str, tensor: torch.Tensor) -> None:
        self.calls[kind] += 1
        self.nbytes[kind] += tensor.numel() * tensor.element_size()

    def record_sent(self, kind: str, nbytes: int) -> None:
        self.bytes_sent[kind] += nbytes

    def reset(self) -> None:
        self.calls.clear()
        self.nbytes.clear()
        self.bytes_sent.clear()

    def as_dict(self) -> dict:
        return {"calls": dict(self.calls), "nbytes": dict(self.nbytes), "bytes_sent": dict(self.bytes_sent)}
