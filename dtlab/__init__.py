"""dtlab: learn distributed training by running it.

``dtlab.TrainConfig(...)``, ``dtlab.train(config)`` (a run whose records
stream as they arrive), ``dtlab.plan(model, dtlab.Layout(...))`` (or
``dtlab.plan(...)`` with the defaults; ``config.layout`` is a TrainConfig's),
``dtlab.set_language("zh")``; the dashboard and control widgets live in
``dtlab.lab``.
"""

from dtlab.config import MODEL_PRESETS, ModelConfig, TrainConfig
from dtlab.config.layout import Layout
from dtlab.i18n import ConfigError, DtlabError, get_language, set_language

__version__ = "0.1.0"


def __getattr__(name):
    # Imported on first use, so ``import dtlab`` stays light (no torch import
    # for `dtlab plan` or `dtlab glossary`).
    if name == "train":
        import dtlab.train as module  # a callable package: dtlab.train(config)

        return module
    if name == "plan":
        from dtlab.planner import plan

        return plan
    if name in ("launch", "glossary", "lab", "reference", "planner"):
        import importlib

        return importlib.import_module(f"dtlab.{name}")
    raise AttributeError(f"module 'dtlab' has no attribute {name!r}")


__all__ = [
    "ConfigError",
    "DtlabError",
    "Layout",
    "MODEL_PRESETS",
    "ModelConfig",
    "TrainConfig",
    "get_language",
    "plan",
    "set_language",
    "train",
    "__version__",
]
