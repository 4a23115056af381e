"""A rank exits 0 after ``destroy_process_group()`` right after a DP, ZeRO or TP step (issue 36, item 5).

Each run is two fresh ranks forked from one process that imported torch once
(``tests/clean_exit.py``), so each child's interpreter really finalizes with
gloo's threads alive. ``python -m tests.clean_exit --mode all --runs 200`` is
the long version; here a few runs per layout fit in CI.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.clean_exit import MODES

RUNS = 2


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks its ranks")
def test_every_layout_exits_clean():
    # One child process imports torch once and forks every run's ranks (pytest itself holds threads).
    out = subprocess.run(
        [sys.executable, "-m", "tests.clean_exit", "--mode", ",".join(MODES), "--runs", str(RUNS), "--fork"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == len(MODES), out.stdout
    for line in lines:
        assert f": 0 of {RUNS} runs unclean" in line, out.stdout + out.stderr[-2000:]
