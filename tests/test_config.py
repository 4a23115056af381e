import dataclasses

import pytest

from dtlab.config import MODEL_PRESETS, TrainConfig
from dtlab.i18n import ConfigError


def has_chinese(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


@pytest.mark.parametrize("kwargs,needle", [
    ({"dp": 0}, "dp=0"), ({"steps": -1}, "steps=-1"), ({"batch_size": 0}, "batch_size=0"),
    ({"model": "gpt5"}, "gpt5"), ({"dp": 9}, "9"), ({"dp": 3}, "batch_size 8"),
    ({"schedule": "zigzag"}, "zigzag"), ({"precision": "fp8"}, "fp8"), ({"zero": 4}, "zero=4"),
    ({"lr": -1.0}, "lr=-1.0"), ({"straggler": (7, 0.1), "dp": 4}, "7:0.1"),
])
def test_bad_values_are_named_with_what_is_allowed_in_both_languages(kwargs, needle):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**kwargs).validate()
    assert needle in info.value.en and has_chinese(info.value.zh)
    assert needle.split("=")[0] in info.value.zh


@pytest.mark.parametrize("kwargs,needle", [
    ({"tp": 3}, "tp=3"), ({"pp": 5}, "pp=5"), ({"pp": 2, "micro_batches": 3}, "micro_batches=3"),
    ({"dp": 2, "tp": 2, "pp": 4}, "16"), ({"loss_scale": "1024"}, "loss_scale='1024'"),
    ({"offload": True}, "offload=True"), ({"zero": 3, "pp": 2}, "zero=3"),
    ({"spike": 99, "steps": 10}, "spike=99"), ({"spike_policy": "pray"}, "pray"),
])
def test_layouts_the_components_cannot_split_are_refused_before_start(kwargs, needle):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**kwargs).validate()
    assert needle in info.value.en and has_chinese(info.value.zh)


@pytest.mark.parametrize("kwargs", [{"dp": 2, "tp": 2, "pp": 2, "micro_batches": 2}, {"tp": 4},
                                    {"pp": 4, "micro_batches": 8, "schedule": "gpipe"},
                                    {"dp": 2, "zero": 3, "precision": "bf16"},
                                    {"precision": "fp16", "loss_scale": "128"},
                                    {"dp": 2, "zero": 2, "precision": "fp16"},
                                    {"dp": 2, "zero": 2, "offload": True}, {"recompute": True}])
def test_supported_layouts_validate(kwargs):
    assert TrainConfig(**kwargs).validate().world_size <= 8


def test_config_is_frozen_and_valid_by_default():
    config = TrainConfig().validate()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.dp = 2  # type: ignore[misc]
    assert config.world_size == 1 and config.model_config() == MODEL_PRESETS["small"]


def test_the_pool_limit_is_part_of_validation():
    with pytest.raises(ConfigError, match="at most 2"):
        TrainConfig(dp=4).validate(max_world_size=2)
