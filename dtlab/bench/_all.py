"""``dtlab bench all``: every benchmark in one run, with the machine it ran on, so two machines compare.

Each benchmark of :func:`dtlab.bench.available` runs in turn, ``planner``
with ``--calibrate`` (a profile of this machine measured in the same run).
One that fails is recorded with its error and the others still run. The
result names the machine (CPU model, cores, torch, Python, date) and gives,
per benchmark, its headline ``ratio`` and, where issue 38 sets one, its goal,
checked: OverlappedDP / DDP <= 1.00 at every world size; the shared-memory
ring / torch's busbw >= 1.0 at every size and world size; the measured
pipeline bubble within ±0.05 of the formula in every row; ZeRO-3 / FSDP2 <=
0.90 at every world size; the planner within ±20% on all but one layout, with
Kendall tau >= 0.8. A benchmark that failed misses its goal.

``ratio`` for ``all``: the goals met over the goals checked (higher is better;
1.0: every goal met). ``failed``: the benchmarks that raised.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
import traceback

from dtlab.config.command_progress import Progress
from dtlab.config.machine import describe_machine
from dtlab.i18n import DtlabError


def _dp(result: dict) -> tuple[bool, dict]:
    by = {n: r["ratio"] for n, r in result["results"].items()}
    return max(by.values()) <= 1.00, by


def _allreduce(result: dict) -> tuple[bool, dict]:
    by = {
        f"{n} ranks, {row['bytes']} B": row["shared_busbw_GBps"] / row["torch_busbw_GBps"]
        for n, rows in result["results"].items()
        for row in rows
        if "shared_busbw_GBps" in row
    }
    return bool(by) and min(by.values()) >= 1.0, by


def _pipeline(result: dict) -> tuple[bool, dict]:
    by = {f"{r['schedule']} m={r['m']}": r["measured"] - r["formula"] for r in result["rows"]}
    return max(abs(v) for v in by.values()) <= 0.05, by


def _zero(result: dict) -> tuple[bool, dict]:
    by = {n: r["ratio"] for n, r in result["results"].items()}
    return max(by.values()) <= 0.90, by


def _planner(result: dict) -> tuple[bool, dict]:
    by = {"within_20_percent": result["within_20_percent"], "kendall_tau": result["kendall_tau"]}
    return by["within_20_percent"] >= result["layouts"] - 1 and by["kendall_tau"] >= 0.8, by


GOALS = {
    "dp": ("OverlappedDP / DDP step time <= 1.00 at every world size", _dp),
    "allreduce": ("shared-memory ring / torch busbw >= 1.0 at every size and world size", _allreduce),
    "pipeline": ("measured bubble - formula within ±0.05 in every row", _pipeline),
    "zero": ("ZeRO-3 / FSDP2 step time <= 0.90 at every world size", _zero),
    "planner": ("step time within ±20% on all layouts but one (10 of 11), Kendall tau >= 0.8", _planner),
}
"""Issue 38's goals: name -> (the goal, a check of the benchmark's result -> (met, the figures by case))."""


def machine() -> dict:
    """What ran it: the CPU's model (/proc/cpuinfo), its cores (all, and this process's), memory, torch,
    Python, the date (UTC), whether CUDA was visible, the code's commit."""
    import torch

    described = describe_machine()
    return {
        "description": described["description"],
        "cpu": described["cpu"],
        "cpu_count": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_bytes": described["memory_bytes"],
        "os": f"{platform.system()} {platform.release()}",
        "hostname": platform.node(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "cuda_available": torch.cuda.is_available(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "date": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "commit": _commit(),
    }


def _commit() -> str | None:
    import subprocess

    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def _one(name: str, args: argparse.Namespace, run_one) -> dict:
    """One benchmark's entry: its ratio, headline, goal checked, seconds, the whole result, or its error."""
    sub = argparse.Namespace(**{**vars(args), "name": name, "calibrate": name == "planner"})
    start = time.monotonic()
    entry: dict = {"ratio": None, "headline": None}
    try:
        result = run_one(name, sub)
    except DtlabError as error:
        entry["error"] = error.en
    except Exception as error:  # a bug or a failed rank: recorded, and the next benchmark runs
        entry["error"] = f"{type(error).__name__}: {error}"
        traceback.print_exc(file=sys.stderr)
    else:
        entry.update(ratio=result.get("ratio"), headline=result.get("headline"), result=result)
    entry["seconds"] = time.monotonic() - start
    if name in GOALS:
        goal, check = GOALS[name]
        entry["goal"] = goal
        try:
            entry["pass"], entry["by_case"] = check(entry["result"]) if "result" in entry else (False, None)
        except (KeyError, TypeError, ValueError) as error:  # a result without the figures the goal reads
            entry["pass"], entry["by_case"] = False, None
            entry["error"] = entry.get("error") or f"goal not checkable: {type(error).__name__}: {error}"
    return entry


def run_all(args: argparse.Namespace, names: list[str], run_one) -> dict:
    """Every benchmark of ``names`` in turn, each by ``run_one(name, args)`` (dtlab.bench's: see the module
    docstring); the one result, printed as a table too."""
    start = time.monotonic()
    benches = {}
    with Progress("dtlab bench all", total=len(names) + 1) as progress:
        progress.stage("describing this machine", "记录本机信息")
        described = machine()
        for i, name in enumerate(names, 1):
            progress.stage(f"{name} ({i} of {len(names)})", f"{name}（第 {i} 个，共 {len(names)} 个）")
            benches[name] = _one(name, args, run_one)
    checked = [b for b in benches.values() if "goal" in b]
    met = sum(bool(b["pass"]) for b in checked)
    result = {
        "bench": "all",
        "machine": described,
        "quick": bool(getattr(args, "quick", False)),
        "repeats": args.repeats,
        "headline": "goals met / goals checked, over every benchmark (higher is better; 1.0: every goal met)",
        "ratio": met / len(checked) if checked else 1.0,
        "goals_met": met,
        "goals_checked": len(checked),
        "failed": [name for name, b in benches.items() if "error" in b and "result" not in b],
        "seconds": time.monotonic() - start,
        "benches": benches,
    }
    print_summary(result)
    return result


def print_summary(result: dict) -> None:
    """The table of every benchmark's ratio and goal, in English and Chinese."""
    m = result["machine"]
    how = f"repeats {result['repeats']}{', --quick' if result['quick'] else ''}"
    print(f"\ndtlab bench all: {m['cpu']}, {m['cpu_count']} cores ({m['cores_usable']} usable)")
    print(f"  torch {m['torch']}, Python {m['python']}, {m['date']}, {how}")
    print(f"dtlab bench all：{m['cpu']}，{m['cpu_count']} 核（可用 {m['cores_usable']} 核）")
    print(f"{'bench':<10}{'ratio':>8}{'seconds':>9}  {'goal / 目标':<12}")
    for name, b in result["benches"].items():
        ratio = f"{b['ratio']:.3f}" if isinstance(b.get("ratio"), (int, float)) else "-"
        verdict = "" if "goal" not in b else ("met / 达到" if b["pass"] else "MISSED / 未达到")
        print(f"{name:<10}{ratio:>8}{b['seconds']:>9.0f}  {verdict}{': ' + b['goal'] if 'goal' in b else ''}")
        if "error" in b:
            print(f"{'':<10}error / 错误: {b['error']}")
    print(
        f"goals met: {result['goals_met']} of {result['goals_checked']} (ratio {result['ratio']:.2f}) / "
        f"达到的目标：{result['goals_checked']} 个中 {result['goals_met']} 个；用时 {result['seconds']:.0f} 秒",
        flush=True,
    )
