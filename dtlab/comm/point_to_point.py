"""Point-to-point messages under dtlab's collectives: ranks within a group, and a send with its receive.

:func:`group_size_and_rank` and :func:`global_rank` translate between a
process group's ranks and the world's (point-to-point calls address world
ranks); :class:`_Transfer` posts one send and one receive together and waits
for both, counting the bytes sent on a :class:`~dtlab.comm.meter.CommMeter`
and, given a :class:`dtlab.planner.hardware.Link`, stretching the exchange to
the time the alpha-beta model gives that link (the simulation
:mod:`dtlab.comm.collectives` describes). The ring's lockstep steps, the naive
all-reduce and :mod:`dtlab.comm.all_to_all` are made of these.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from dtlab.comm import calls as comm
from dtlab.comm.meter import CommMeter
from dtlab.planner.hardware import Link


def group_size_and_rank(group=None) -> tuple[int, int]:
    """(world size, my rank) within ``group``; (1, 0) when no process group exists."""
    if not dist.is_available() or not dist.is_initialized():
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def global_rank(group, group_rank: int) -> int:
    """The world rank of ``group_rank`` in ``group``: point-to-point calls address world ranks."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


class _Transfer:
    """One send and one receive, posted together now and waited for later.

    Both are posted before either is waited on: if every rank of a ring first
    sent and then received, each could sit in its send waiting for a
    neighbour that is itself still sending. The receive is posted first: on
    gloo, when two ranks exchange with each other (a ring of two), a send
    posted before the matching receive made the exchange take turns instead
    of using both directions of the link at once (measured: twice the time on
    a shaped link, dtlab/cluster/bench.py). Empty tensors (a tensor smaller
    than the ring) are skipped; both ends know every chunk's size, so they agree.
    """

    def __init__(
        self, send: torch.Tensor | None, dst: int | None, recv: torch.Tensor | None, src: int | None, *, group
    ):
        self.send = send if send is not None and send.numel() else None
        self.recv = recv if recv is not None and recv.numel() else None
        self.started = time.perf_counter()
        self.works = []
        if self.recv is not None:
            self.works.append(comm.irecv(self.recv, src, group=group))
        if self.send is not None:
            self.works.append(comm.isend(self.send, dst, group=group))

    def wait(self, *, kind: str, meter: CommMeter | None, link: Link | None) -> None:
        for work in self.works:
            work.wait()
        sent = 0 if self.send is None else self.send.numel() * self.send.element_size()
        if meter is not None:
            meter.record_sent(kind, sent)
        if link is not None and self.works:
            # Simulation: send and receive share one full-duplex link step, so
            # the larger of the two messages sets the wire time alpha + n / beta.
            received = 0 if self.recv is None else self.recv.numel() * self.recv.element_size()
            wire_s = link.time(max(sent, received))
            time.sleep(max(0.0, self.started + wire_s - time.perf_counter()))
