"""Running ``dtlab train``: as one rank of a torchrun job, or on local ranks.

Also the entry point of ``python -m dtlab.train`` and ``torchrun
--nproc-per-node N -m dtlab.train ...`` (:func:`main`, same flags, errors and
exit codes as ``dtlab train``). Under torchrun this process is one rank of
torchrun's job: it runs the training loop, and rank 0 prints one JSON line per
record, the summary completed with the planner's prediction as a local run's
is. Otherwise it starts ``dp x tp x pp`` local ranks on a fresh pool and
prints each record as it arrives.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from dtlab.config import TrainConfig
from dtlab.config.command_line import Parser, run_command
from dtlab.config.flags import add_train_arguments, config_from_args, given_options
from dtlab.i18n import DtlabError
from dtlab.launch.pool import RankPool
from dtlab.launch.worker import RankContext, torchrun_context
from dtlab.train.checkpoints import check_before_start
from dtlab.train.loop import train_rank
from dtlab.train.run import start, with_prediction


def run_train(args: argparse.Namespace) -> int:
    """Train as ``args`` (parsed by :func:`dtlab.config.flags.add_train_arguments`) say; returns the exit code."""
    config = config_from_args(args)
    if args.deepspeed_config:
        from dtlab.config.deepspeed import config_from_deepspeed

        torchrun_ranks = (
            int(os.environ["WORLD_SIZE"]) if "RANK" in os.environ and "WORLD_SIZE" in os.environ else None
        )  # started by torchrun (as torchrun_context tells): its processes are the limit
        config, ignored = config_from_deepspeed(
            args.deepspeed_config,
            config,
            max_ranks=torchrun_ranks,
            dp_given="dp" in given_options(args),
            given=given_options(args),
        )
        if ignored:
            print(f"dtlab: ignored DeepSpeed keys / 忽略的 DeepSpeed 配置项: {', '.join(ignored)}", file=sys.stderr)
    ctx = torchrun_context(emit=_json_printer(config))
    if ctx is not None:  # started by torchrun: this process is one rank of its job
        return _train_as_torchrun_rank(ctx, config)
    return _train_locally(config, as_json=args.json)


def _json_printer(config: TrainConfig):
    """Rank 0's printer under torchrun: one JSON line per record; the summary gets the prediction."""
    steps: list[dict] = []

    def emit(record: dict) -> None:
        if record.get("summary"):
            record = with_prediction(record, config, steps)
        else:
            steps.append(record)
        print(json.dumps(record, allow_nan=False), flush=True)

    return emit


def _train_as_torchrun_rank(ctx: RankContext, config: TrainConfig) -> int:
    import torch.distributed as dist

    from dtlab.comm import shared_memory_setup

    started = (f"torchrun started {ctx.world_size} processes", f"torchrun 启动了 {ctx.world_size} 个进程")
    config.validate(max_world_size=ctx.world_size, limit_reason=started)
    if config.world_size != ctx.world_size:
        product = (
            f"dp x cp x ep x tp x pp = {config.dp} x {config.cp} x {config.ep} x {config.tp} x {config.pp} "
            f"= {config.world_size}"
        )
        raise DtlabError(
            f"{product}, but torchrun started {ctx.world_size} processes (allowed: degrees whose product is "
            f"{ctx.world_size}, or torchrun --nproc-per-node x --nnodes = {config.world_size})",
            f"{product}，但 torchrun 启动了 {ctx.world_size} 个进程（允许：乘积为 {ctx.world_size} 的并行度，"
            f"或让 torchrun 的 --nproc-per-node x --nnodes = {config.world_size}）",
        )
    if config.resume:
        check_before_start(config)
    try:
        train_rank(ctx, config)
    finally:
        shared_memory_setup.close_all()  # --collectives dtlab's wires, if it made any
        dist.destroy_process_group()
    return 0


def _train_locally(config: TrainConfig, *, as_json: bool) -> int:
    config.validate()
    pool = RankPool(max_size=max(config.world_size, 1))
    run = None
    try:
        run = start(config, pool=pool)
        for record in run:
            if as_json:
                print(json.dumps(record, allow_nan=False), flush=True)
            else:
                flags = " ".join(f"[{e['kind']} rank {e.get('rank')}]" for e in record["events"])
                print(
                    f"step {record['step']:4d}  loss {_shown(record['loss'], '.4f')}  lr {record['lr']:.2e}  "
                    f"{record['tokens_per_s']:8.0f} tok/s  {flags}",
                    flush=True,
                )
        summary = run.summary
        if as_json:
            print(json.dumps(summary, allow_nan=False), flush=True)
        else:
            print(
                f"done: {summary['steps']} steps, final loss {_shown(summary['final_loss'], '.4f')}, "
                f"{summary['mean_tokens_per_s']:.0f} tokens/s, {summary['wall_s']:.1f} s"
            )
            local = (summary.get("predicted") or {}).get("local")
            if local:
                print(format_local(local))
    except BaseException:  # a closed pipe, a signal: end the ranks now, not after close()'s grace
        if run is not None:
            run.cancel()
        raise
    finally:
        pool.close()
    return 0


def format_local(local: dict) -> str:
    """The summary's prediction for this machine beside the measurement, in English and Chinese."""
    rows = [
        ("step time", "单步时间", "step_time_s", "measured_step_time_s"),
        ("compute per rank", "每 rank 计算", "compute_s", "measured_compute_s"),
        ("comm per rank", "每 rank 通信", "comm_s", "measured_comm_s"),
    ]
    lines = ["predicted on this machine (dtlab calibrate's profile) / 本机预测（dtlab calibrate 的配置文件）:"]
    for en, zh, predicted, measured in rows:
        lines.append(
            f"  {en} / {zh}: predicted / 预测 {local[predicted] * 1e3:.1f} ms, "
            f"measured / 实测 {local[measured] * 1e3:.1f} ms (median / 中位数)"
        )
    lines.append(f"  measured / predicted step time / 实测与预测之比: {local['step_time_ratio']:.2f}")
    return "\n".join(lines)


def _shown(value: float | None, spec: str) -> str:
    """A number as ``spec`` formats it; a missing one (an overflowed loss) as ``-``."""
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    """``python -m dtlab.train`` / ``torchrun ... -m dtlab.train``: the flags of ``dtlab train``."""
    parser = Parser(
        prog="python -m dtlab.train",
        description="Train the small GPT (the same flags as `dtlab train`). / "
        "训练小 GPT（参数与 `dtlab train` 相同）。",
    )
    add_train_arguments(parser)
    args = parser.parse_args(argv)
    return run_command(lambda: run_train(args))
