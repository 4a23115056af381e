"""``--bucket-mb``: data parallelism's bucket cap as an option, with a default that overlaps.

The small GPT's 0.9 MiB of gradients: four buckets at the default 0.25 MiB
(three of them all-reduced during backward), one at DDP's 25; either way the
losses are the single process's. The flag, DeepSpeed's ``reduce_bucket_size``
(elements of fp32 gradient) and bad values (refused in both languages) too.
And the benchmarks' overlap figures for PyTorch's own wrappers (dtlab/bench/_overlap.py).
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

import dtlab.train
from dtlab.bench._overlap import ddp_overlap_s, torch_calls_traced
from dtlab.cli import build_parser, config_from_args
from dtlab.comm.tracer import CommTracer
from dtlab.config import TrainConfig
from dtlab.config.deepspeed import config_from_deepspeed
from dtlab.i18n import ConfigError
from dtlab.reference import reference_train
from tests.expected_comm import buckets, stage_tensors
from tests.harness import run_ranks, session_pool


def test_bucket_mb_sets_the_buckets_and_training_equals_the_reference():
    reference = reference_train(TrainConfig(steps=3, seed=0))[0]
    for bucket_mb, expected in ((TrainConfig().bucket_mb, 4), (25.0, 1), (0.0, 53)):
        config = TrainConfig(dp=2, steps=3, seed=0, bucket_mb=bucket_mb)
        assert len(buckets(stage_tensors(config, 0), bucket_mb * 2**20)) == expected
        run = dtlab.train.start(config, pool=session_pool()).wait()
        calls = {r["comm"]["all_reduce"]["count"] for rec in run.records for r in rec["ranks"]}
        assert calls == {expected}, bucket_mb
        assert max(abs(a - b) / b for a, b in zip(run.losses(), reference)) < 1e-4, bucket_mb
        if expected > 1:  # buckets were in flight while backward computed, on every rank and step
            overlapped = [r["overlap_s"] for rec in run.records for r in rec["ranks"]]
            assert all(s > 0 for s in overlapped), (bucket_mb, overlapped)


def test_bucket_mb_from_the_flag_and_from_deepspeed_and_bad_values_refused(tmp_path):
    args = build_parser().parse_args(["train", "--dp", "2", "--bucket-mb", "1.5"])
    assert config_from_args(args).bucket_mb == 1.5
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 0, "reduce_bucket_size": 262144}}))
    config, ignored = config_from_deepspeed(ds, TrainConfig(dp=2))
    assert config.bucket_mb == 1.0 and "zero_optimization.reduce_bucket_size" not in ignored
    for bad in (-1.0, float("nan"), 5000.0):
        with pytest.raises(ConfigError, match="bucket_mb=") as error:
            TrainConfig(bucket_mb=bad).validate()
        assert "不合法" in str(error.value)


def test_ddp_overlap_is_in_flight_time_until_the_last_bucket_was_issued():
    assert ddp_overlap_s([[0.0, 2.0], [1.0, 5.0], [3.0, None]]) == 3.0  # DDP waits from 3.0 on
    assert ddp_overlap_s([[4.0, 4.5], [1.0, 1.5], [6.0, 6.2]]) == 1.0
    assert ddp_overlap_s([]) == 0.0


def _torch_calls(ctx) -> dict:
    """torch.distributed's own calls, as FSDP2 makes them, timed into a tracer by the bench's rule."""
    tracer = CommTracer()
    originals = [dist.all_reduce, dist.all_gather_single, dist.reduce_scatter_single]
    x = torch.ones(1000)
    with torch_calls_traced(tracer):
        tracer.start()
        with tracer.compute():
            work = dist.all_reduce(x, async_op=True)
            torch.randn(200, 200) @ torch.randn(200, 200)  # computed while it is in flight
            work.wait()
            out = torch.empty(500 * ctx.world_size)
            dist.all_gather_single(out, torch.ones(500))
            dist.reduce_scatter_single(output=torch.empty(250), input=torch.ones(250 * ctx.world_size))
        figures = tracer.end_step()
    restored = [dist.all_reduce, dist.all_gather_single, dist.reduce_scatter_single] == originals
    return {
        "comm": {k: (v["count"], v["bytes"]) for k, v in figures["comm"].items()},
        "overlap_s": figures["overlap_s"],
        "restored": restored,
        "sum": x[0].item(),
    }


def test_bench_times_torch_calls_by_the_tracer_rule():
    for got in run_ranks(_torch_calls, 2):
        assert got["comm"] == {"all_reduce": (1, 4000), "all_gather": (1, 4000), "reduce_scatter": (1, 2000)}
        assert got["overlap_s"] > 0 and got["restored"] and got["sum"] == 2.0
