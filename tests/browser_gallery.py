"""What the browser test draws: every lesson's lab views, built cheaply in one notebook, and the
third of the stored lessons it opens today.

A lesson's figures come from the views of ``dtlab.lab``; whether they fit their
output area depends on those views, not on the lesson's numbers. So the
browser test builds, in one kernel and without training, each view a lesson
shows (``CELLS``; the lessons that show each are read from their imports), measures every figure
against its output area, then moves them on (``AFTER``: steps, slider values,
Chinese) and measures again. The one real run is the ControlPanel's, started by
moving its slider in the page (the figures before it are the ones a learner
sees before the first run). ``test_every_view_a_lesson_imports_is_in_the_gallery``
keeps the list complete. Like the stored lessons it opens, the gallery shows
a third of the lessons' views each day (every one within three days), the
ControlPanel's every day: each plotly figure costs the page seconds to load.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
PANEL_STEPS = 10
PANEL_CELL = "ControlPanel Dashboard"

SETUP = """\
import time
T0 = time.monotonic()
import dtlab
from dtlab import TrainConfig
dtlab.set_language("en")
records = [{"step": s, "loss": 3.0 - 0.1 * s, "tokens_per_s": 900.0, "ranks": [
    {"rank": r, "dp": r, "tp": 0, "pp": 0, "compute_s": 0.02, "comm_s": 0.01, "idle_s": 0.002,
     "mem": {"params": 9e5, "grads": 9e5, "optimizer": 1.8e6, "activations": 4e5}} for r in range(4)]}
    for s in range(5)]


class Run:  # what a lesson's views read of a finished run
    records = records"""

STAGE3 = """\
from dtlab.lab.zero_view import Stage3Stepper
units = [{"name": name, "numel": 4000, "shard": 1000, "padded": 4000} for name in ("embed", "block.0", "block.1", "head")]
events, held = [], []
for phase, order in (("forward", units), ("backward", units[::-1])):
    for u in order:
        for action in ("gather", "free") + (("reduce_scatter",) if phase == "backward" else ()):
            held = held + [u["name"]] if action == "gather" else [h for h in held if h != u["name"]]
            events.append({"phase": phase, "action": action, "unit": u["name"], "held_bytes": 16000 * len(held),
                           "held_units": list(held)})
stepper = Stage3Stepper({"rank": 0, "world_size": 4, "units": units, "events": events, "peak": 16000,
                         "shard_bytes": 16000, "comm": {}})
stepper"""
RACE = """\
import tempfile
from pathlib import Path
from dtlab.lab.layout_race import LayoutRace
from dtlab.planner.profile import LINK_KINDS, ComputeCost, LinkCost, MachineProfile, save_profile
machine = MachineProfile(
    machine={"description": "gallery", "cores": 2, "memory_bytes": 8 * 2**30}, torch="-", created="2026-12-04T00:00:00Z",
    model="small",
    compute={w: ComputeCost(flop_s=2e10 / w, overhead_s=1e-4, matmul_flop_s=4e10 / w, optimizer_s_per_param=1e-9,
                            step_s=1e-3 * w) for w in (1, 2, 4)},
    links={w: {k: LinkCost(alpha_s=1e-4 * w, beta_s_per_byte=1e-9 * w) for k in LINK_KINDS} for w in (2, 4)})
race = LayoutRace(ranks=4, top=4, profile=str(save_profile(machine, Path(tempfile.mkdtemp()) / "machine.json")))
race"""

CELLS = {
    # a view's name (or names) -> a cell that builds and shows it (the last line is what the cell displays);
    # the lessons that show each are read from their imports (:func:`cell_lessons`)
    PANEL_CELL: f"""\
from dtlab.lab import ControlPanel, Dashboard
panel = ControlPanel(TrainConfig(dp=2, steps={PANEL_STEPS}, model="tiny"), auto_run=True,
                     dashboard=Dashboard(grad_norm=True))  # every lesson's dashboard, the fifth plot too
panel""",
    "RingView": "from dtlab.lab.ring_view import RingView, busbw_figure\nring = RingView(ranks=4)\nring",
    "busbw_figure": "busbw_figure({2**k: {'dtlab': 1e-4 * 2**(k-10), 'torch': 8e-5 * 2**(k-10)} "
    "for k in range(10, 21, 2)}, 4)",
    "time_figure": "from dtlab.lab.dp_view import AccumulationView, StragglerView, time_figure\n"
    "time_figure({'overlapped': records, 'plain': records})",
    "AccumulationView": "accum = AccumulationView(TrainConfig(dp=2, batch_size=8, steps=6, seed=0), choices=(1, 2, 4))\n"
    "accum",
    "StragglerView": "straggler = StragglerView(TrainConfig(dp=4, steps=4, seed=0))\nstraggler",
    "StepTimeline": "from dtlab.lab.timeline import StepTimeline\nStepTimeline()",
    "ZeroExplorer": "from dtlab.lab.zero_view import ZeroExplorer\nexplorer = ZeroExplorer(stage=3, dp=3)\nexplorer",
    "OffloadCost": "from dtlab.lab.offload_view import MemoryPools, OffloadCost\n"
    "cost = OffloadCost(params=7_500_000_000, tokens=4096)\ncost",
    "MemoryPools": "MemoryPools({'ZeRO-2': Run(), 'ZeRO-2 + offload': Run()})",
    "PipelineView": "from dtlab.lab.pipeline_view import PipelineView\n"
    "pipe = PipelineView(stages=4, micro_batches=4, schedule='gpipe')\npipe",
    "LossScaleFigure": "from dtlab.lab.loss_scaling_view import LossScaleFigure, LossScalerStepper\n"
    "scale_plot = LossScaleFigure()\nscale_plot",
    "LossScalerStepper": "scaler = LossScalerStepper([0.5, float('inf'), 0.5, 0.5, 0.5, 0.5], growth_interval=2)\n"
    "scaler",
    "WarmupView": "from dtlab.lab.warmup_view import WarmupView\n"
    "warm = WarmupView(TrainConfig(lr=0.3, warmup=10, steps=40, seed=0))\nwarm",
    "RecomputeView": "from dtlab.lab.recompute_view import RecomputeView\nrecompute = RecomputeView(layers=4)\n"
    "recompute",
    "PlannerExplorer": "from dtlab.lab.planner_widget import PlannerExplorer\n"
    "planner = PlannerExplorer(states='paper')\nplanner",
    "FlashCards": "from dtlab.lab.flashcards import FlashCards\nFlashCards(direction='en_to_zh', seed=0)",
    "RingAttentionView": "from dtlab.lab.ring_attention_view import RingAttentionView\nRingAttentionView(4)",
    "LongContextMemoryView": "from dtlab.lab.long_context_view import LongContextMemoryView\n"
    "long = LongContextMemoryView()\nlong",
    "AllToAllView": "from dtlab.lab.all_to_all_view import AllToAllView\na2a = AllToAllView(ranks=4)\na2a",
    "ExpertLoadView": "from dtlab.lab.expert_load_view import ExpertLoadView\nexperts = ExpertLoadView(4)\n"
    "for s in range(60):\n"
    "    experts.push({'step': s, 'experts': {'tokens': [3, 1, 0, 4], 'routed': [3, 2, 1, 4], 'dropped': 2, "
    "'balance': 1.2}})\nexperts",
    "StepGainsFigure": "from dtlab.lab.one_gpu_view import GAIN_STEPS, AttentionMemoryFigure, StepGainsFigure\n"
    "gains = {name: 1.0 + k / 4 for k, name in enumerate(GAIN_STEPS)}\n"
    "StepGainsFigure(gains, gains, gpu_name='NVIDIA H200', date='2026-12-04', here_name='this CPU')",
    "AttentionMemoryFigure": "AttentionMemoryFigure({'eager': {2**k: 2**(2 * k + 4) for k in range(7, 13)}, "
    "'sdpa': {2**k: 2**(k + 12) for k in range(7, 13)}}, batch=1)",
    "Stage3Stepper": STAGE3,
    "FigureOne": "from dtlab.lab.zero_view import FigureOne\n"
    "class StageRun(Run):\n"
    "    config = TrainConfig(dp=4, precision='bf16')\n"
    "FigureOne({stage: StageRun() for stage in range(4)})",
    "TimelineComparison": "from dtlab.lab.pipeline_view import TimelineComparison\n"
    "from dtlab.parallel.pipeline.schedule import schedule as make_schedule, simulate\n"
    "ideal = simulate(make_schedule('1f1b', 4, 4), f_time=1, b_time=2).timeline  # as the runtime records, in s\n"
    "TimelineComparison([[{'action': str(e.action), 'start': e.start / 1e3, 'end': e.end / 1e3} for e in rank]\n"
    "                    for rank in ideal], schedule='1f1b', micro_batches=4)",
    "LayoutRace": RACE,
}
NOT_IN_GALLERY = {
    "Deck": "the flash cards' data (FlashCards draws it)",
}
"""Names a lesson imports from dtlab.lab that draw no figure of their own."""

AFTER = """\
for name in ("ring", "a2a", "recompute", "pipe", "scaler"):
    for _ in range(3):
        if name in globals():
            globals()[name].step()
if "a2a" in globals():
    a2a.press_step()
if "long" in globals():
    long.cp.value, long.seq_len.value = 4, long.seq_len.options[-1]
if "planner" in globals():
    planner.dp.value = planner.dp.options[-1]
if "cost" in globals():
    cost.tokens.value = cost.tokens.options[-1]
dtlab.set_language("zh")
print("after: done")"""
"""What moves today's views on, then switches the language: the second measurement is after a first run,
in Chinese."""

READY = "gallery ready"


def cell_lessons(key: str) -> set[str]:
    """The lessons (``"04"``) that show a view of the gallery cell ``key``, from their imports."""
    imported = views_lessons_import()
    return set().union(*(imported.get(name, set()) for name in key.split()))


def gallery_cells(today: datetime.date | None = None) -> list[str]:
    """The cells of today's gallery: the views of today's third of the lessons, and the ControlPanel's."""
    numbers = {name[:2] for name in todays_third(today)}
    shown = [cell for key, cell in CELLS.items() if key == PANEL_CELL or numbers & cell_lessons(key)]
    return [SETUP, *shown, f"print({READY!r}, f'in {{time.monotonic() - T0:.0f}} s of the kernel')"]


def lessons() -> list[str]:
    return sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def todays_third(today: datetime.date | None = None) -> list[str]:
    """The stored lessons the browser opens today: every third, starting where the date says."""
    day = (today or datetime.date.today()).toordinal()
    return [name for k, name in enumerate(lessons()) if k % 3 == day % 3]


def views_lessons_import() -> dict[str, set[str]]:
    """View classes and figure functions each lesson imports from dtlab.lab (by name) -> lessons."""
    found: dict[str, set[str]] = {}
    for source in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py")):
        for names in re.findall(r"from dtlab\.lab[.\w]* import ([^\n]+)", source.read_text()):
            for name in (n.strip() for n in names.split(",")):
                if name[:1].isupper() or name.endswith("_figure"):
                    found.setdefault(name, set()).add(source.stem[:2])
    return found
