"""The single-process reference every distributed run is compared with.

Deliberately plain: one model, one AdamW, the whole global batch at once, no
process group. If a parallel layout gives a different loss from this, the
layout has a bug.
"""

from __future__ import annotations

import torch

from dtlab.config import TrainConfig
from dtlab.data import global_batch
from dtlab.model import build_model
from dtlab.numerics.lr_schedule import lr_at

ADAMW_BETAS = (0.9, 0.95)
"""AdamW's (beta1, beta2) in every dtlab run, as GPT-3 trained (Brown et al. 2020, appendix B)."""
ADAMW_EPS = 1e-8
"""AdamW's epsilon in every dtlab run (PyTorch's default)."""


def adamw_options(config: TrainConfig) -> dict:
    """AdamW's hyperparameters for ``config``: the reference, DP, ZeRO and offload all take these.

    ``config.betas`` and ``config.eps`` (a DeepSpeed file's ``optimizer.params``)
    replace the defaults above when set.
    """
    return {
        "lr": config.lr,
        "betas": ADAMW_BETAS if config.betas is None else tuple(config.betas),
        "eps": ADAMW_EPS if config.eps is None else config.eps,
        "weight_decay": config.weight_decay,
    }


def adamw(params, **options) -> torch.optim.AdamW:
    """``torch.optim.AdamW(params, **options)``, fused where every parameter is a CUDA tensor.

    ``fused=True`` runs the whole update as one kernel launch per step (a few for
    many tensors) instead of several per parameter; elsewhere torch picks its own
    default (``foreach`` where it can, a loop over parameters on the CPU). The
    same update either way, to rounding. ``params``: tensors or parameter groups.
    The reference, DP, ZeRO and offload build their AdamW with this (ZeRO and offload
    take it as ``optimizer_class``), so each decides by the tensors it steps: an
    offloaded optimizer's host copies are not fused.
    """
    params = list(params)
    listed = [item["params"] if isinstance(item, dict) else [item] for item in params]
    tensors = [p for group in listed for p in ([group] if isinstance(group, torch.Tensor) else group)]
    on_cuda = bool(tensors) and all(p.is_cuda for p in tensors)
    return torch.optim.AdamW(params, **options, **({"fused": True} if on_cuda else {}))


def make_optimizer(params, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW as every dtlab run uses it (see :func:`adamw_options` and :func:`adamw`)."""
    return adamw(params, **adamw_options(config))


def reference_train(config: TrainConfig, grad_norms: list | None = None) -> tuple[list[float], torch.nn.Module]:
    """Train on one process; return the loss of every step and the trained model.

    With ``config.clip_grad`` the gradients are clipped by torch's own
    ``clip_grad_norm_``; pass a list as ``grad_norms`` to receive each step's
    norm before clipping.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # same kernels, same summation order as a rank
    try:
        return _train(config, [] if grad_norms is None else grad_norms)
    finally:
        torch.set_num_threads(threads)


def _train(config: TrainConfig, grad_norms: list) -> tuple[list[float], torch.nn.Module]:
    cfg = config.model_config()
    model = build_model(cfg, seed=config.seed)
    if config.masters == "optimizer":
        return _train_master_weights(config, model)
    optimizer = make_optimizer(model.parameters(), config)
    losses = []
    for step in range(config.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(
                step, lr=config.lr, warmup=config.warmup, total_steps=config.steps, schedule=config.lr_schedule
            )
        x, y = global_batch(step, batch_size=config.batch_size, seq_len=cfg.seq_len, seed=config.seed)
        optimizer.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        if config.clip_grad is not None:
            grad_norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad).item())
        optimizer.step()
        losses.append(loss.item())
    return losses, model


def _train_master_weights(config: TrainConfig, model: torch.nn.Module) -> tuple[list[float], torch.nn.Module]:
    """``--master-weights optimizer`` on one process: 16-bit parameters, fp32 masters in the optimizer.

    The whole batch at once, as above; fp16 scales the loss and skips an overflowing step.
    """
    from dtlab.numerics.master_weights import MasterWeights, to_16_bit
    from dtlab.numerics.precision import MixedPrecision

    precision = MixedPrecision(config.precision, loss_scale=config.loss_scale)
    model = to_16_bit(precision.apply(model), precision.dtype)
    optimizer = MasterWeights(model.parameters(), adamw, **adamw_options(config))
    losses = []
    for step in range(config.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(
                step, lr=config.lr, warmup=config.warmup, total_steps=config.steps, schedule=config.lr_schedule
            )
        x, y = global_batch(step, batch_size=config.batch_size, seq_len=config.model_config().seq_len, seed=config.seed)
        optimizer.zero_grad(set_to_none=True)
        loss = model(x, y)
        precision.backward(loss)
        precision.step(optimizer)
        losses.append(loss.item())
    return losses, model
