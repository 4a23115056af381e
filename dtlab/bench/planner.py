"""The planner on this machine beside real runs: step time, memory by category, and the layouts' ranking.

For eleven layouts of the small GPT on up to 8 local ranks (DP, TP, both
pipeline schedules, ZeRO 1-3, DP x TP, and DP x TP x PP on 8 ranks), each run
on the warm pool three times (the layouts in turn, then again, and again), for
two warm-up steps and eight measured ones each time: the median of the 24
measured step times, and the largest
memory per rank of each category in the last step, beside ``dtlab plan --gpu
local`` for the same layout (the profile ``dtlab calibrate`` wrote; without
one, the bilingual error says to run it). Then Kendall's tau between the
layouts ranked by predicted and by measured step time (1: the same order).

With ``--calibrate`` the bench first runs ``dtlab calibrate`` itself, on the
same warm ranks, and saves the profile where ``dtlab calibrate`` would: the
layouts then run seconds after the machine was measured instead of minutes or
hours. A shared or virtual machine's speed drifts (this 2-core VM has run
15-30% faster or slower from one minute to the next), and a profile is a
snapshot of the speed it had when it was taken.

So the bench checks the profile against the machine before the layouts and
again after them (:func:`dtlab.planner.whole_steps.speed_against`: calibrate's own
DP runs on 1 and 4 ranks, measured over predicted, 1.0 while the machine is
as fast as when it was calibrated). When the check before is off by more
than ``STALE`` either way (the two runs' geometric mean), the profile no longer describes this machine: the
bench says so, in EN and 中文, and calibrates again first, as
``--calibrate`` would. The check after shows whether the machine moved while
the layouts ran.

There is no PyTorch built-in to put beside the planner, so ``ratio`` is the
geometric mean over the layouts of predicted over measured step time (1.0 is
ideal). On a machine shared with other work, the measurement moves with the
load (printed); the profile was measured under whatever load there was then.
"""

from __future__ import annotations

import math
import os
import statistics

from dtlab.config import TrainConfig
from dtlab.config.command_progress import Progress, current
from dtlab.planner.whole_steps import CHECK_SIZES, speed_against
from dtlab.train.compare import kendall_tau, run_in_passes

LAYOUTS = {
    "1 rank": {},
    "DP 2": {"dp": 2},
    "DP 4": {"dp": 4},
    "TP 2": {"tp": 2},
    "PP 2 gpipe m4": {"pp": 2, "micro_batches": 4, "schedule": "gpipe"},
    "PP 2 1f1b m4": {"pp": 2, "micro_batches": 4, "schedule": "1f1b"},
    "ZeRO-1 DP 2": {"dp": 2, "zero": 1},
    "ZeRO-2 DP 2": {"dp": 2, "zero": 2},
    "ZeRO-3 DP 2": {"dp": 2, "zero": 3},
    "DP 2 x TP 2": {"dp": 2, "tp": 2},
    "3D 2x2x2 m2": {"dp": 2, "tp": 2, "pp": 2, "micro_batches": 2},
}
CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers", "logits", "peak")
WARMUP = 2
PASSES = 3
TIMED = 8  # timed steps per run (at least; --repeats above 8 gives more)
STALE = 0.15  # the check before the layouts: a profile off by more than this is measured again


def run(args) -> dict:
    from dtlab.launch import RankPool
    from dtlab.planner import plan_for_config
    from dtlab.planner.profile import check_profile_target, load_profile

    fresh = getattr(args, "calibrate", False)
    profile = None if fresh else load_profile()  # refused here, before any rank starts, if there is none
    if fresh:
        check_profile_target(None)  # where it will be saved: refused now, not after measuring
    steps = WARMUP + max(TIMED, getattr(args, "repeats", 3))
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    configs = {
        name: TrainConfig(model="small", batch_size=8, steps=steps, **layout) for name, layout in LAYOUTS.items()
    }
    pool = RankPool(max_size=max(c.world_size for c in configs.values()))
    speed, recalibrated = {}, False
    progress = current()
    progress.more(1 + len(configs) * PASSES + 1)  # the check or calibrating, the runs, the check after
    try:
        if not fresh:
            progress.stage(*_CHECK_STAGE)
            speed["before"] = speed_against(profile, pool)
            recalibrated = stale(speed["before"])
            if recalibrated:  # that check was against the profile now replaced
                speed["replaced"] = speed.pop("before")
                _print_stale(profile, speed["replaced"])
                progress.more(1 + len(configs) * PASSES + 1)
        if fresh or recalibrated:
            profile = _calibrate_now(pool)
        # every layout once per pass, so that a change in the machine's load falls on all of them
        measured = run_in_passes(configs, pool, warmup=WARMUP, passes=PASSES, on_run=_say_run)
        progress.stage(*_CHECK_STAGE)
        speed["after"] = speed_against(profile, pool)
    finally:
        pool.close()
    for got in measured.values():  # per category, the largest per-rank memory of the last step
        ranks = got["runs"][-1][-1]["ranks"]
        got["memory"] = {k: max(r["mem"][k] for r in ranks) for k in CATEGORIES}
    rows = []
    for name, config in configs.items():
        predicted, step = plan_for_config(config, gpu=profile.path), statistics.median(measured[name]["step_times"])
        rows.append(
            {
                "layout": name,
                "predicted_s": predicted.step_time_s,
                "measured_s": step,
                "ratio": predicted.step_time_s / step,
                "memory": {
                    k: {"predicted": predicted.memory[k], "measured": measured[name]["memory"][k]} for k in CATEGORIES
                },
            }
        )
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    tau = kendall_tau([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows])
    result = {
        "bench": "planner",
        "rows": rows,
        "kendall_tau": tau,
        "ratio": math.exp(statistics.mean(math.log(r["ratio"]) for r in rows)),
        "within_20_percent": sum(abs(r["ratio"] - 1) <= 0.2 for r in rows),
        "layouts": len(rows),
        "machine_drift": machine_drift(rows),
        "load_average": [load_before, load_after],
        "speed_check": speed,
        "recalibrated": recalibrated,
        "profile": profile.path,
    }
    _print(result, profile, fresh or recalibrated)
    return result


def machine_drift(rows: list[dict]) -> str | None:
    """ "faster" or "slower" when at least three layouts miss ±20% and every miss is on the same side (the
    machine's speed, not the model, moved since calibrating: predicted over measured above 1 means the
    runs were faster than the profile); None otherwise."""
    misses = [r["ratio"] for r in rows if abs(r["ratio"] - 1) > 0.2]
    if len(misses) < 3 or len({m > 1 for m in misses}) > 1:
        return None
    return "faster" if misses[0] > 1 else "slower"


def stale(speed: dict[int, float]) -> bool:
    """True when the geometric mean of :func:`speed_against`'s ratios says the machine runs more than
    STALE faster or slower than the profile it was checked against. The mean, because one small run
    alone swings: the 1-rank run took 12 ms, then 17 ms, in four rounds within a minute here."""
    return abs(math.exp(statistics.mean(math.log(r) for r in speed.values())) - 1) > STALE


RANKS_EN = " and ".join(map(str, CHECK_SIZES))
RANKS_ZH = " 个和 ".join(map(str, CHECK_SIZES)) + " 个"


def _speeds(speed: dict) -> str:
    return " / ".join(f"{speed[n]:.2f}" for n in CHECK_SIZES)


def _print_stale(profile, speed: dict[int, float]) -> None:
    print(
        f"the profile of {profile.created} no longer describes this machine: calibrate's own runs on "
        f"{RANKS_EN} ranks take {_speeds(speed)} x the time it predicts (their geometric mean more than "
        f"±{STALE:.0%} off); calibrating again first",
        flush=True,
    )
    print(
        f"{profile.created} 的机器配置文件已不再符合本机：与校准相同的 {RANKS_ZH} rank 运行，实测时间是其预测的 "
        f"{_speeds(speed)} 倍（两者的几何平均偏差超过 ±{STALE:.0%}）；先重新校准",
        flush=True,
    )


_CHECK_STAGE = (
    f"this machine against the profile: calibrate's runs on {RANKS_EN} ranks",
    f"本机与机器配置文件对照：与校准相同的 {RANKS_ZH} rank 运行",
)


def _say_run(name: str, k: int) -> None:
    current().stage(
        f"{name}, pass {k + 1} of {PASSES} (every layout once a pass)",
        f"{name}，第 {k + 1} 轮，共 {PASSES} 轮（每轮每个布局运行一次）",
    )


def _calibrate_now(pool):
    """``dtlab calibrate`` on ``pool``'s warm ranks, saved where it saves; the profile as read back."""
    from dtlab.planner.calibrate import calibrate
    from dtlab.planner.profile import load_profile, save_profile

    current().stage("calibrating this machine first (about half a minute)", "先校准本机（约半分钟）")
    with Progress("calibrate"):
        return load_profile(save_profile(calibrate(model="small", pool=pool)))


def _print(result: dict, profile, fresh: bool = False) -> None:
    """The tables of :func:`run`'s ``result``, in English and Chinese."""
    rows, tau, drift = result["rows"], result["kendall_tau"], result["machine_drift"]
    inside, (load_before, load_after) = result["within_20_percent"], result["load_average"]
    when = ", measured in this run / 本次运行中测得" if fresh else ""
    print(f"dtlab bench planner: small GPT, batch 8, profile {profile.path} ({profile.created}{when})")
    print(f"dtlab bench planner：small GPT，批量 8，机器配置文件 {profile.path}（{profile.created}{when}）")
    print(
        f"load average / 平均负载: {load_before:.1f} before / 之前, {load_after:.1f} after / 之后 "
        f"({profile.machine.get('cores')} cores / 核)"
    )
    print()
    print(f"{'layout / 布局':<16} {'predicted / 预测':>16} {'measured / 实测':>15} {'ratio / 比值':>12}")
    for r in rows:
        flag = "" if abs(r["ratio"] - 1) <= 0.2 else "  (outside ±20% / 超出 ±20%)"
        print(
            f"{r['layout']:<16} {r['predicted_s'] * 1e3:>13.1f} ms {r['measured_s'] * 1e3:>12.1f} ms "
            f"{r['ratio']:>12.2f}{flag}"
        )
    print()
    print("memory, predicted / measured per category (largest rank) / 显存：各类别预测值与实测值之比（最大的 rank）")
    print(f"{'layout / 布局':<16} " + " ".join(f"{k:>11}" for k in CATEGORIES))
    for r in rows:
        cells = []
        for k in CATEGORIES:
            p, m = r["memory"][k]["predicted"], r["memory"][k]["measured"]
            cells.append(f"{p / m:>11.2f}" if m else f"{'-' if not p else 'inf':>11}")
        print(f"{r['layout']:<16} " + " ".join(cells))
    print()
    speed = result.get("speed_check", {})
    for when, en, zh in (("before", "before the layouts", "各布局运行前"), ("after", "after them", "各布局运行后")):
        if when in speed:
            print(
                f"this machine against the profile, {en}: {_speeds(speed[when])} "
                f"(calibrate's runs on {RANKS_EN} ranks, measured / predicted time)"
            )
            print(
                f"本机与机器配置文件之比，{zh}：{_speeds(speed[when])}"
                f"（与校准相同的 {RANKS_ZH} rank 运行，实测 / 预测时间）"
            )
    print(
        f"step time within ±20%: {inside} of {len(rows)} layouts / 单步时间在 ±20% 以内：{len(rows)} 个布局中 {inside} 个"
    )
    if drift and "after" in speed and not stale(speed["after"]):
        print(
            "every layout outside ±20% is off the same way, yet the check after the layouts found the machine "
            f"within ±{STALE:.0%} of the profile: these misses are the planner's, not the machine's speed"
        )
        print(
            f"所有超出 ±20% 的布局都偏向同一边，但各布局运行后的检查显示本机与配置文件相差不到 ±{STALE:.0%}："
            "这些偏差来自规划器，而不是本机速度"
        )
    elif drift:
        en, zh = ("faster", "快") if drift == "faster" else ("slower", "慢")
        print(
            f"every layout outside ±20% is off the same way: the machine ran {en} than when it was "
            "calibrated; its speed changed while the layouts ran (see the check after them): run it again"
        )
        print(
            f"所有超出 ±20% 的布局都偏向同一边：本机比校准时跑得更{zh}；速度是在各布局运行期间变的"
            "（见运行后的检查）：请再运行一次"
        )
    print(
        f"Kendall tau, predicted vs measured ranking: {tau:.2f} (1 = same order) / "
        f"预测排名与实测排名的 Kendall tau：{tau:.2f}（1 表示顺序相同）"
    )
