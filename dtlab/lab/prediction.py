"""The planner's prediction beside a local run, and the same layout at cluster scale.

Everything here is a *prediction* (dtlab.planner: formulas with their
sources), shown next to what the ranks measure, never instead of it.
"""
from __future__ import annotations

from dtlab.config import TrainConfig
from dtlab.i18n import t
from dtlab.lab import labels as _labels  # noqa: F401
from dtlab.lab.checks import human_bytes
from dtlab.planner import plan


def plan_for(config: TrainConfig, *, gpus: int | None = None, gpu: str = "H100"):
    """The planner's view of ``config``; with ``gpus`` the DP degree grows to fill that many GPUs.

    Scaling out keeps the per-rank batch, so the global batch grows with DP,
    as it does when a real job is moved to a larger cluster.
    """
    dp = config.dp
    if gpus is not None:
        dp = max(1, gpus // (config.tp * config.pp))
    per_dp_rank = config.batch_size // config.dp
    recompute = "full" if config.recompute else "none"
    return plan(model=config.model_config(), dp=dp, tp=config.tp, pp=config.pp,
                micro_batches=max(config.micro_batches, 1), schedule=config.schedule,
                zero=config.zero, precision=config.precision, recompute=recompute,
                gpu=gpu, batch_size=per_dp_rank * dp)


def prediction_html(config: TrainConfig, *, big: int = 1024, gpu: str = "H100") -> str:
    """A small bilingual-labelled HTML summary for the control panel."""
    local = plan_for(config).to_dict()
    scaled = plan_for(config, gpus=big, gpu=gpu).to_dict()
    mem = local["memory"]
    rows = [
        t("plan.local", params=human_bytes(mem["params"]), grads=human_bytes(mem["grads"]),
          optimizer=human_bytes(mem["optimizer"])) + f", {t('mem.activations')} ≈ {human_bytes(mem['activations'])}",
        t("plan.scaled", gpus=scaled["gpus"], gpu=gpu, dp=scaled["dp"],
          total=human_bytes(scaled["memory"]["total"]), step=scaled["step_time_s"] * 1e3,
          mfu=100 * scaled["mfu"]),
    ]
    return f"<b>{t('plan.title')}</b><br>" + "<br>".join(rows)
