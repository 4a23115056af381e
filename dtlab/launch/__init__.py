"""Start real ranks: a warm local pool for notebooks, or attach under torchrun.

A *rank* is one process of a distributed job; the *world size* is how many
there are; a *process group* is the set of ranks a collective spans; the
*backend* (gloo on CPU, NCCL on GPUs) moves the bytes; the *rendezvous* is how
ranks find each other before the first collective.

Two planes, one module each, and a small public interface between them:

* ``worker.py``, the rank side: the loop a pooled worker runs, the
  :class:`RankContext` a rank's function receives, the backend and device
  choice, and attaching to a torchrun job;
* ``pool.py`` and ``runs.py``, the caller side (the notebook kernel, the
  CLI): :class:`RankPool` keeps workers warm and owns the rendezvous store;
  :class:`Run` follows one job and turns what goes wrong into the errors of
  ``errors.py`` (:class:`RankError`, :class:`CollectiveTimeout`,
  :class:`GroupNotFormed`, :class:`RunTimeout`, :class:`RankDied`).

What crosses between them is data defined in ``worker.py``: an
``Assignment`` in (a ``Job`` plus the rank and the store's port), ``Message``
tuples out, and ``STOP_KEY`` in the run's store to ask for an early stop.
"""

from dtlab.launch.errors import CollectiveTimeout, GroupNotFormed, RankDied, RankError, RunTimeout
from dtlab.launch.pool import RankPool, default_pool, run
from dtlab.launch.runs import STARTUP_TIMEOUT_S, Run
from dtlab.launch.worker import DEFAULT_TIMEOUT_S, STOP_KEY, RankContext, pick_backend, torchrun_context

__all__ = [
    "CollectiveTimeout",
    "DEFAULT_TIMEOUT_S",
    "GroupNotFormed",
    "RankContext",
    "RankDied",
    "RankError",
    "RankPool",
    "Run",
    "RunTimeout",
    "STARTUP_TIMEOUT_S",
    "STOP_KEY",
    "default_pool",
    "pick_backend",
    "run",
    "torchrun_context",
]
