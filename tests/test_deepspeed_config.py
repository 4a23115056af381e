import json

import pytest

from dtlab.config import TrainConfig
from dtlab.deepspeed_config import config_from_deepspeed
from dtlab.i18n import ConfigError

DS = {
    "train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "overlap_comm": True},
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
    "wall_clock_breakdown": False,
}


def test_common_keys_map_to_train_config_and_the_rest_is_listed(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(DS))
    config, ignored = config_from_deepspeed(path, TrainConfig(dp=4, steps=5))
    assert (config.batch_size, config.grad_accum, config.zero, config.offload) == (16, 2, 2, True)
    assert (config.precision, config.lr, config.dp, config.steps) == ("bf16", 3e-4, 4, 5)
    assert ignored == ["optimizer.params.weight_decay", "wall_clock_breakdown",
                       "zero_optimization.offload_optimizer.pin_memory", "zero_optimization.overlap_comm"]
    config.validate()


@pytest.mark.parametrize("change,needle", [
    ({"train_batch_size": 12}, "train_batch_size=12"),
    ({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme"}}}, "nvme"),
    ({"fp16": {"enabled": True}}, "fp16.enabled"),
])
def test_inconsistent_or_unsupported_files_are_refused_in_both_languages(tmp_path, change, needle):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({**DS, **change}))
    with pytest.raises(ConfigError) as info:
        config_from_deepspeed(path, TrainConfig(dp=4))
    assert needle in info.value.en and any("\u4e00" <= c <= "\u9fff" for c in info.value.zh)


def test_fp16_loss_scale_zero_means_dynamic(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"fp16": {"enabled": True, "loss_scale": 0}, "train_micro_batch_size_per_gpu": 4}))
    config, _ = config_from_deepspeed(path, TrainConfig(dp=2))
    assert (config.precision, config.loss_scale, config.batch_size) == ("fp16", "dynamic", 8)
