"""ZeRO-3's sharding policy: which modules' parameters are sharded, and the rest kept whole on every rank.

FSDP applies ``fully_shard`` to the modules a wrapping policy picks and
leaves the others to plain data parallelism; a course (or a library user) may
want the same: shard the matrices, where nearly all the bytes are, and keep
the norms whole, so that a LayerNorm's ``.grad`` is its whole shape, the same
on every rank, instead of a 1-D piece that differs from rank to rank.
``ZeroStage3(model, shard_modules=...)`` takes

* ``None`` (the default): every trainable parameter is sharded (ZeRO-3 as the paper);
* a module type or a tuple of them, e.g. ``(nn.Linear, nn.Embedding)``;
* a predicate ``module -> bool``; :func:`matrices` is ``--zero3-shard linear``'s:
  the Linear and Embedding weights, tensor-parallel layers included (every
  module whose ``weight`` is a matrix), with their biases.

A parameter is sharded when every module that uses it matches (a tied one,
used by two, must match in both); otherwise it is *replicated*:
:class:`Replicated` keeps it whole, computes with it in the wrapper's compute
dtype, and averages its gradient over the shard group (and, with hybrid
sharding, over the copies) by the end of backward, with the same bucketed
all-reduce plain data parallelism uses. Its ``.grad`` is then bit-identical on
every rank, shaped like the parameter, in its own (master) dtype.
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn

from dtlab.i18n import ConfigError
from dtlab.parallel.data_parallel import BucketedDP

POLICIES = ("all", "linear")
"""``--zero3-shard``: ``all`` shards every parameter; ``linear`` the matrices only (:func:`matrices`)."""


def matrices(module: nn.Module) -> bool:
    """``--zero3-shard linear``: a Linear or an Embedding, dense or tensor-parallel (its ``weight`` is 2-D)."""
    weight = getattr(module, "weight", None)
    return isinstance(module, (nn.Linear, nn.Embedding)) or (isinstance(weight, torch.Tensor) and weight.dim() == 2)


def shard_predicate(shard_modules):
    """``shard_modules`` as a predicate ``module -> bool`` (see the module docstring); refused if it is none."""
    if shard_modules is None or shard_modules == "all":
        return lambda module: True
    if shard_modules == "linear":
        return matrices
    if isinstance(shard_modules, type):
        shard_modules = (shard_modules,)
    if isinstance(shard_modules, tuple) and shard_modules and all(isinstance(t, type) for t in shard_modules):
        return lambda module: isinstance(module, shard_modules)
    if callable(shard_modules):
        return shard_modules
    raise ConfigError(
        f"shard_modules={shard_modules!r} is not allowed; expected None (shard everything), "
        "a module type, a tuple of module types, a predicate module -> bool, or one of "
        f"{list(POLICIES)}",
        f"shard_modules={shard_modules!r} 不合法；应为 None（全部分片）、一个模块类型、模块类型的元组、"
        f"判定函数 module -> bool，或 {list(POLICIES)} 之一",
    )


class Replicated:
    """The parameters a policy keeps whole: cast for compute, and averaged by the end of each backward.

    ``syncs``: a :class:`dtlab.parallel.data_parallel.BucketedDP` over the shard group (and one over the
    copies, with hybrid sharding), used only for its gradient hooks; never called, and held outside the
    wrapper's submodules so the model's parameters are not listed twice.
    """

    def __init__(self, module: nn.Module, params: list, *, group, replicate_group, meter, compute_dtype):
        self.params = params
        self.syncs = []
        if params:
            self.syncs.append(BucketedDP(module, group=group, meter=meter, params=params))
            if replicate_group is not None:
                self.syncs.append(BucketedDP(module, group=replicate_group, meter=meter, params=params))
        self.buffer_bytes = sum(b.nbytes for sync in self.syncs for b in sync.buckets)
        if compute_dtype is not None and params:
            ids = {id(p) for p in params}
            for m in module.modules():
                if any(id(p) in ids for p in m.parameters(recurse=False)):
                    m.register_forward_pre_hook(functools.partial(_cast_params, compute_dtype, ids))
                    m.register_forward_hook(_restore_params)


def _cast_params(dtype: torch.dtype, ids: set, module: nn.Module, args: tuple) -> None:
    """Before the module runs: its replicated parameters swapped for differentiable casts to ``dtype``."""
    module._dtlab_masters = {n: p for n, p in module._parameters.items() if p is not None and id(p) in ids}
    for name, p in module._dtlab_masters.items():
        module._parameters[name] = p.to(dtype)  # its gradient flows back, fp32, into the whole parameter


def _restore_params(module: nn.Module, args: tuple, output) -> None:
    module._parameters.update(module.__dict__.pop("_dtlab_masters", {}))
