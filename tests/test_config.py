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


@pytest.mark.parametrize("kwargs", [{"tp": 2}, {"pp": 2}, {"zero": 1}, {"precision": "bf16"},
                                    {"recompute": True}, {"offload": True}, {"spike": 3},
                                    {"save": "/tmp/x"}, {"micro_batches": 4}])
def test_options_of_later_components_are_refused_not_ignored(kwargs):
    with pytest.raises(ConfigError, match="not available in this version"):
        TrainConfig(**kwargs).validate()


def test_config_is_frozen_and_valid_by_default():
    config = TrainConfig().validate()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.dp = 2  # type: ignore[misc]
    assert config.world_size == 1 and config.model_config() == MODEL_PRESETS["small"]


def test_the_pool_limit_is_part_of_validation():
    with pytest.raises(ConfigError, match="at most 2"):
        TrainConfig(dp=4).validate(max_world_size=2)
