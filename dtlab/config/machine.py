"""What machine this is: the CPU's model, its cores, its memory, the OS, Python.

``dtlab calibrate`` keeps it in the profile it writes
(:mod:`dtlab.planner.calibrate`), and ``dtlab bench all`` at the head of its
result (:mod:`dtlab.bench._all`), so that two machines' figures are read
side by side with what ran them.
"""

from __future__ import annotations

import os
import platform
import sys


def describe_machine() -> dict:
    """What this machine is: the CPU's name, its cores, its memory, the OS."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 0
    return {
        "description": f"{cpu}, {cores} cores, {platform.system()} {platform.release()}",
        "cpu": cpu,
        "cores": cores,
        "memory_bytes": memory,
        "python": sys.version.split()[0],
    }
