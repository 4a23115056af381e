"""--deepspeed-config: DeepSpeed's ds_config.json read faithfully, or refused naming the key.

The files under tests/data/ are written here from DeepSpeed's documented
format (deepspeed.ai/docs/config-json), the way its tutorials lay them out.
The schedule tests compare with values worked out by hand from the formulas
in deepspeed/runtime/lr_schedules.py (cited in dtlab/numerics/lr_schedule.py).
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dtlab.config import TrainConfig
from dtlab.config.deepspeed import config_from_deepspeed
from dtlab.i18n import ConfigError
from dtlab.numerics.lr_schedule import DeepSpeedSchedule, lr_at
from dtlab.reference import make_optimizer

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parent.parent
DS = {
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}, "overlap_comm": True},
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
    "wall_clock_breakdown": False,
}


def _write(tmp_path, tree) -> Path:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(tree))
    return path


def _chinese(text: str) -> bool:
    return any("\u4e00" <= c <= "\u9fff" for c in text)


def test_common_keys_map_to_train_config_and_the_rest_is_listed(tmp_path):
    config, ignored = config_from_deepspeed(_write(tmp_path, DS), TrainConfig(dp=4, steps=5))
    assert (config.batch_size, config.grad_accum, config.zero, config.offload) == (16, 2, 2, True)
    assert (config.precision, config.lr, config.dp, config.steps) == ("bf16", 3e-4, 4, 5)
    assert config.weight_decay == 0.1 and config.clip_grad is None
    assert ignored == [
        "wall_clock_breakdown",
        "zero_optimization.offload_optimizer.pin_memory",
        "zero_optimization.overlap_comm",
    ]
    config.validate()


def test_dp_is_inferred_from_the_batch_keys_when_not_given(tmp_path):
    """train_batch_size / (micro x accumulation) ranks, as DeepSpeed's launcher would start; --dp wins."""
    path = _write(tmp_path, DS)
    assert config_from_deepspeed(path, TrainConfig(), dp_given=False)[0].dp == 4  # 16 / (2 x 2)
    assert config_from_deepspeed(path, TrainConfig(tp=2), dp_given=False)[0].world_size == 8
    two = {k: v for k, v in DS.items() if k != "gradient_accumulation_steps"}
    config = config_from_deepspeed(_write(tmp_path, two), TrainConfig(dp=2), dp_given=True)[0]
    assert (config.dp, config.grad_accum, config.batch_size) == (2, 4, 16)  # DeepSpeed derives 16 / 2 / 2
    config = config_from_deepspeed(_write(tmp_path, {"train_batch_size": 12}), TrainConfig(dp=3))[0]
    assert (config.dp, config.grad_accum, config.batch_size) == (3, 1, 12)
    for tree, needle in (
        ({**DS, "train_batch_size": 128}, "= 32 data-parallel ranks"),
        ({**DS, "train_batch_size": 18}, "train_batch_size=18"),
    ):
        with pytest.raises(ConfigError) as info:
            config_from_deepspeed(_write(tmp_path, tree), TrainConfig(), dp_given=False)
        assert needle in info.value.en and _chinese(info.value.zh)


def test_optimizer_params_reach_adamw(tmp_path):
    config, ignored = config_from_deepspeed(DATA / "ds_fp16_zero1_warmup_cosine.json", TrainConfig(), dp_given=False)
    group = make_optimizer([torch.nn.Parameter(torch.zeros(2))], config).param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (5e-4, (0.8, 0.999), 1e-8, 0.1)
    assert (config.dp, config.zero, config.precision, config.loss_scale) == (4, 1, "fp16", "dynamic")
    assert "optimizer.params.torch_adam" in ignored and "fp16.hysteresis" in ignored
    with pytest.raises(ConfigError) as info:
        config_from_deepspeed(
            _write(tmp_path, {"optimizer": {"type": "Adam", "params": {"weight_decay": 0.1, "adam_w_mode": False}}}),
            TrainConfig(),
        )
    assert "adam_w_mode" in info.value.en


def test_deepspeed_schedules_equal_their_formulas():
    """Step s trains at DeepSpeed's last_batch_iteration s - 1 (its engine steps the scheduler after the
    optimizer); before the first scheduler step WarmupLR holds warmup_min_lr, WarmupCosineLR 0."""
    ln = math.log
    warm = DeepSpeedSchedule("WarmupLR", warmup_min_lr=0.001, warmup_max_lr=0.01, warmup_num_steps=4)
    expected = [0.001, 0.001, 0.001 + 0.009 * ln(2) / ln(4), 0.001 + 0.009 * ln(3) / ln(4), 0.01, 0.01]
    decay = DeepSpeedSchedule(
        "WarmupDecayLR", warmup_max_lr=0.01, warmup_num_steps=4, total_num_steps=10, warmup_type="linear"
    )
    expected_decay = [
        0.0,
        0.0,
        0.0025,
        0.005,
        0.0075,
        0.01 * 6 / 6,
        0.01 * 5 / 6,
        0.01 * 4 / 6,
        0.01 * 3 / 6,
        0.01 * 2 / 6,
        0.01 * 1 / 6,
        0.0,
        0.0,
    ]
    cosine = DeepSpeedSchedule(
        "WarmupCosineLR",
        warmup_num_steps=4,
        total_num_steps=12,
        warmup_min_ratio=0.2,
        cos_min_ratio=0.1,
        warmup_type="linear",
    )
    expected_cosine = [0.0, 0.2 * 0.5, (0.2 + 0.8 * 0.25) * 0.5, (0.2 + 0.8 * 0.5) * 0.5, (0.2 + 0.8 * 0.75) * 0.5]
    expected_cosine += [0.5 * (0.1 + 0.9 * (1 + math.cos(math.pi * k / 8)) / 2) for k in range(1, 9)]
    expected_cosine += [0.5 * 0.1] * 4  # past total_num_steps: the floor, not the cosine rising again
    for schedule, values, base in ((warm, expected, 1.0), (decay, expected_decay, 1.0), (cosine, expected_cosine, 0.5)):
        got = [lr_at(s, lr=base, warmup=0, total_steps=len(values), schedule=schedule) for s in range(len(values))]
        assert got == pytest.approx(values, abs=1e-12), schedule.kind
    assert DeepSpeedSchedule("constant").lr(7, 0.3) == 0.3
    short = DeepSpeedSchedule("WarmupCosineLR", warmup_num_steps=4, total_num_steps=4, cos_min_ratio=0.1)
    assert [short.lr(s, 1.0) for s in (5, 6, 50)] == pytest.approx([0.1] * 3)  # T = W: straight to the floor


def test_a_file_schedule_and_clipping_become_the_config(tmp_path):
    config, ignored = config_from_deepspeed(DATA / "ds_zero2_bf16_warmup_decay.json", TrainConfig(), dp_given=False)
    assert (config.dp, config.grad_accum, config.batch_size, config.clip_grad) == (2, 2, 16, 1.0)
    assert config.lr_schedule == DeepSpeedSchedule(
        "WarmupDecayLR",
        warmup_min_lr=0.0,
        warmup_max_lr=0.001,
        warmup_num_steps=5,
        warmup_type="linear",
        total_num_steps=20,
    )
    assert "zero_optimization.allgather_bucket_size" in ignored and "scheduler.params.total_num_steps" not in ignored
    # stage 2: reduce_bucket_size (fp32 elements) is ZeRO-2's bucket, bucket_mb in MiB
    assert config.bucket_mb == 200000000 * 4 / 2**20 and "zero_optimization.reduce_bucket_size" not in ignored
    config, ignored = config_from_deepspeed(DATA / "ds_warmuplr_offload.json", TrainConfig(dp=2))
    assert (config.zero, config.offload, config.batch_size, config.lr_schedule.kind) == (3, True, 8, "WarmupLR")
    assert "zero_optimization.offload_param.device" in ignored
    assert (
        config_from_deepspeed(_write(tmp_path, {"train_batch_size": 4}), TrainConfig())[0].lr_schedule.kind
        == "constant"
    )  # no scheduler: DeepSpeed keeps the optimizer's rate


@pytest.mark.parametrize(
    "tree,needle",
    [
        ({"fp16": {"enabled": "false"}}, "fp16.enabled='false'"),
        ({"train_micro_batch_size_per_gpu": 2.5}, "train_micro_batch_size_per_gpu=2.5"),
        ({"train_micro_batch_size_per_gpu": 2.0}, "train_micro_batch_size_per_gpu=2.0"),
        ({"zero_optimization": {"stage": "2"}}, "zero_optimization.stage='2'"),
        ({"train_batch_size": "auto"}, "Hugging Face"),
        ({"gradient_clipping": "auto"}, "gradient_clipping='auto'"),
        ({"gradient_clipping": -1}, "gradient_clipping=-1"),
        ({"optimizer": "AdamW"}, "optimizer='AdamW'"),
        ({"optimizer": {"type": "Lamb"}}, "optimizer.type='Lamb'"),
        ({"optimizer": {"params": {"betas": 0.9}}}, "optimizer.params.betas=0.9"),
        ({"optimizer": {"params": {"lr": True}}}, "optimizer.params.lr=True"),
        ({"scheduler": {"type": "OneCycle"}}, "scheduler.type='OneCycle'"),
        ({"scheduler": {"type": "WarmupLR", "params": {"warmup_steps": 10}}}, "scheduler.params.warmup_steps"),
        ({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10.5}}}, "warmup_num_steps=10.5"),
        ({"scheduler": {"type": "WarmupDecayLR"}}, "total_num_steps"),
        ({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}}, "warmup_type='cosine'"),
        ({"train_batch_size": 12}, "train_batch_size=12"),
        ({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme"}}}, "nvme"),
        ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "fp16.enabled"),
        ({"train_batch_size": 0}, "train_batch_size=0"),
    ],
)
def test_bad_values_are_refused_naming_the_key_in_both_languages(tmp_path, tree, needle):
    with pytest.raises(ConfigError) as info:
        config_from_deepspeed(_write(tmp_path, {**DS, **tree}), TrainConfig(dp=4))
    assert needle in info.value.en and _chinese(info.value.zh)


@pytest.mark.parametrize(
    "content,needle",
    [(b"[1, 2]", "JSON object"), (b"\xff\xfe{}", "utf-8"), (b'{"train_batch_size": 4,}', "cannot read")],
)
def test_a_file_that_is_not_a_json_object_is_refused(tmp_path, content, needle):
    path = tmp_path / "ds.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        config_from_deepspeed(path, TrainConfig())
    assert needle in info.value.en and _chinese(info.value.zh)


def test_fp16_loss_scale_zero_means_dynamic(tmp_path):
    path = _write(tmp_path, {"fp16": {"enabled": True, "loss_scale": 0}, "train_micro_batch_size_per_gpu": 4})
    config, _ = config_from_deepspeed(path, TrainConfig(dp=2))
    assert (config.precision, config.loss_scale, config.batch_size) == ("fp16", "dynamic", 8)


def _dtlab_train(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "dtlab.cli", "train", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )


def test_a_realistic_file_runs_end_to_end_with_no_other_flag(tmp_path):
    """dp 2 inferred, ZeRO-2, bf16, accumulation 2, the WarmupDecayLR rates, clipping at 1.0, keys listed."""
    proc = _dtlab_train("--deepspeed-config", str(DATA / "ds_zero2_bf16_warmup_decay.json"), "--json")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    steps, summary = lines[:-1], lines[-1]
    assert summary["summary"] and summary["dp"] == 2 and len(steps) == 20
    schedule = DeepSpeedSchedule(
        "WarmupDecayLR", warmup_max_lr=0.001, warmup_num_steps=5, warmup_type="linear", total_num_steps=20
    )
    assert [r["lr"] for r in steps] == pytest.approx([schedule.lr(s, 0.001) for s in range(20)], abs=1e-15)
    assert all(r["grad_norm"] > 0 and isinstance(r["clipped"], bool) for r in steps)
    assert "zero_optimization.allgather_bucket_size" in proc.stderr and "steps_per_print" in proc.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"fp16": {"enabled": "false"}}))
    proc = _dtlab_train("--deepspeed-config", str(bad))
    assert proc.returncode != 0 and "fp16.enabled" in proc.stderr and "Traceback" not in proc.stderr


def test_under_torchrun_its_processes_are_the_limit(tmp_path):
    path = _write(tmp_path, {**DS, "train_batch_size": 64})  # 64 / (2 x 2) = 16 ranks
    assert config_from_deepspeed(path, TrainConfig(), dp_given=False, max_ranks=16)[0].dp == 16
    with pytest.raises(ConfigError) as info:
        config_from_deepspeed(path, TrainConfig(), dp_given=False, max_ranks=8)
    assert "at most 8" in info.value.en


def test_keys_the_file_lacks_leave_the_typed_flags(tmp_path):
    """--clip-grad, --warmup (dtlab's warmup and cosine), --offload and --lr stay when the file is silent."""
    path = _write(tmp_path, {"train_batch_size": 8, "zero_optimization": {"stage": 2}})
    typed = TrainConfig(clip_grad=0.5, warmup=3, offload=True, lr=3e-4)
    config, _ = config_from_deepspeed(path, typed, given=frozenset({"clip_grad", "warmup", "offload", "lr"}))
    assert (config.clip_grad, config.warmup, config.lr_schedule, config.offload, config.lr, config.zero) == (
        0.5,
        3,
        None,
        True,
        3e-4,
        2,
    )
    untyped, _ = config_from_deepspeed(path, TrainConfig())
    assert untyped.lr_schedule == DeepSpeedSchedule("constant")  # no scheduler, no --warmup: DeepSpeed's rate
    warm = _write(tmp_path, {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4}}})
    config, _ = config_from_deepspeed(warm, TrainConfig(lr=3e-4), given=frozenset({"lr"}))
    assert (config.lr, config.lr_schedule.warmup_max_lr) == (3e-4, 3e-4)  # no warmup_max_lr: the typed --lr
    config, _ = config_from_deepspeed(warm, TrainConfig(lr=3e-4))
    assert (config.lr, config.lr_schedule.warmup_max_lr) == (0.001, 0.001)  # untyped: DeepSpeed's default
    same = _write(tmp_path, {"gradient_clipping": 1, "optimizer": {"params": {"lr": 3e-4}}})
    config, _ = config_from_deepspeed(same, TrainConfig(clip_grad=1.0, lr=3e-4), given=frozenset({"clip_grad", "lr"}))
    assert (config.clip_grad, config.lr) == (1.0, 3e-4)  # agreeing values are fine


@pytest.mark.parametrize(
    "tree,typed,needle",
    [
        (
            {"gradient_clipping": 1.0},
            dict(clip_grad=0.5),
            "--clip-grad 0.5 disagrees with the DeepSpeed config's gradient_clipping, which gives clip_grad=1.0",
        ),
        ({"gradient_clipping": 0}, dict(clip_grad=0.5), "gradient_clipping, which gives clip_grad=None"),
        (
            {"scheduler": {"type": "WarmupLR"}},
            dict(warmup=3),
            "--warmup 3 and the DeepSpeed config's scheduler.type='WarmupLR'",
        ),
        (
            {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}}},
            dict(offload=True, zero=2),
            "--offload True disagrees",
        ),
        (
            {"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01}}},
            dict(lr=3e-4),
            "--lr 0.0003 disagrees with the DeepSpeed config's optimizer.params.lr/scheduler.params.warmup_max_lr",
        ),
        ({"optimizer": {"params": {"lr": 5e-4}}}, dict(lr=3e-4), "which gives lr=0.0005"),
        ({"train_batch_size": 16}, dict(batch_size=8), "--batch-size 8 disagrees"),
    ],
)
def test_a_typed_flag_the_file_contradicts_is_refused_naming_both(tmp_path, tree, typed, needle):
    with pytest.raises(ConfigError) as info:
        config_from_deepspeed(_write(tmp_path, tree), TrainConfig(**typed), given=frozenset(typed))
    assert needle in info.value.en and _chinese(info.value.zh), info.value.en


def test_the_command_line_passes_what_was_typed(tmp_path):
    proc = _dtlab_train("--deepspeed-config", str(_write(tmp_path, {"gradient_clipping": 1.0})), "--clip-grad", "0.5")
    assert proc.returncode != 0 and "--clip-grad 0.5 disagrees" in proc.stderr and "不一致" in proc.stderr
    assert "Traceback" not in proc.stderr
