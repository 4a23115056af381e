"""The lab: what runs in the notebook kernel (dashboard, controls, checks, languages).

Nothing in the engine imports this package; data flows one way, from the
controls through a validated TrainConfig to the ranks and back as records.
"""

from dtlab.lab import progress_bar  # noqa: F401  (long calls such as calibrate() draw a progress bar)
from dtlab.lab.checks import check, human_bytes
from dtlab.lab.controls import ControlPanel
from dtlab.lab.dashboard import Dashboard
from dtlab.lab.prediction_box import prediction_box

__all__ = ["ControlPanel", "Dashboard", "check", "human_bytes", "prediction_box"]
