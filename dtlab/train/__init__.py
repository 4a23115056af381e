"""Training the small GPT: one loop on every rank, one call from the caller.

Three ways in, one loop:

* ``dtlab.train(config)`` from a notebook: validates, then runs the loop on the
  warm local pool and returns a :class:`~dtlab.train.run.TrainingRun` whose
  records stream as each step finishes (``dtlab.train.start(config, pool=...)``
  is the same call with a pool of your choosing);
* ``dtlab train --dp 4 ...`` on the command line (``dtlab/cli.py``);
* ``torchrun --nproc-per-node 4 -m dtlab.train --dp 4 ...`` on a cluster: each
  process torchrun starts joins torchrun's group and runs the same loop.

The package, by plane:

* ``rank.py`` and ``loop.py``, the rank side: :func:`build_rank` composes the
  parallelisms, :func:`train_rank` runs the steps;
* ``records.py``: the step records and the run summary (DESIGN.md's
  contract), made on rank 0;
* ``run.py``, the caller side: :func:`start`, :class:`TrainingRun`, and the
  planner's prediction set beside the summary when it arrives;
* ``command.py``: running ``dtlab train`` and ``python -m dtlab.train``
  (``__main__.py``), as one rank of a torchrun job or on local ranks; the
  flags come from ``dtlab/config/flags.py``, so no import of ``dtlab.cli``.

``dtlab.train`` is both this package and the call ``dtlab.train(config)``:
``import dtlab.train`` binds the package to ``dtlab.train``, so the package
itself is made callable. Nothing is imported until it is used, so the
command line's flags load without torch.
"""

import sys
import types


class _CallableModule(types.ModuleType):
    """Lets ``dtlab.train(config)`` be a call while ``python -m dtlab.train`` stays a module."""

    def __call__(self, config, *, pool=None):
        from dtlab.train.run import start

        return start(config, pool=pool)


sys.modules[__name__].__class__ = _CallableModule


def __getattr__(name: str):
    if name in ("start", "TrainingRun"):
        from dtlab.train import run

        return getattr(run, name)
    if name in ("build_rank", "RankState"):
        from dtlab.train import rank

        return getattr(rank, name)
    if name == "train_rank":
        from dtlab.train import loop

        return loop.train_rank
    raise AttributeError(f"module 'dtlab.train' has no attribute {name!r}")
