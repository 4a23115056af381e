"""The planner's prediction beside a local run, and the same layout at cluster scale.

Everything here is a *prediction* (dtlab.planner: formulas with their
sources), shown next to what the ranks measure, never instead of it.
"""

from __future__ import annotations

from dtlab.config import TrainConfig
from dtlab.i18n import t
from dtlab.lab import labels as _labels  # noqa: F401
from dtlab.lab.checks import human_bytes
from dtlab.planner import plan_for_config


def prediction_html(config: TrainConfig, *, big: int = 1024, gpu: str = "H100") -> str:
    """A small bilingual-labelled HTML summary for the control panel."""
    local = plan_for_config(config).to_dict()
    scaled = plan_for_config(config, gpus=big, gpu=gpu).to_dict()
    mem = local["memory"]
    rows = [
        t(
            "plan.local",
            params=human_bytes(mem["params"]),
            grads=human_bytes(mem["grads"]),
            optimizer=human_bytes(mem["optimizer"]),
        )
        + f", {t('mem.activations')} ≈ {human_bytes(mem['activations'])}",
        t(
            "plan.scaled",
            gpus=scaled["gpus"],
            gpu=gpu,
            dp=scaled["dp"],
            total=human_bytes(scaled["memory"]["total"]),
            step=scaled["step_time_s"] * 1e3,
            mfu=100 * scaled["mfu"],
        ),
    ]
    return f"<b>{t('plan.title')}</b><br>" + "<br>".join(rows)
