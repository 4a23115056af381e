"""``--bucket-mb`` sizes the buckets of DP and of ZeRO-2 (DeepSpeed's ``overlap_comm``); ZeRO-1 and 3 have none.

dtlab's ZeRO-1 keeps the whole gradient and reduce-scatters it once after
backward, and ZeRO-3 reduce-scatters each unit's gradient as backward leaves
it; neither has a bucket for ``bucket_mb`` to size. A non-default value with
``zero`` 1 or 3 is therefore a bilingual ConfigError before any rank starts,
and so is 0 with ``zero=2`` (its buckets are windows of the flat gradient and
need a size). The DeepSpeed reader maps ``zero_optimization.reduce_bucket_size``
at stages 0 and 2, listing it as ignored at stages 1 and 3. No ranks are
launched here.
"""

from __future__ import annotations

import json

import pytest

from dtlab.config import TrainConfig
from dtlab.config.deepspeed import config_from_deepspeed
from dtlab.i18n import ConfigError
from tests.test_bad_inputs import assert_refused_in_both_languages, nothing_may_start, refused  # noqa: F401

KEY = "zero_optimization.reduce_bucket_size"
DEFAULT = TrainConfig().bucket_mb


@pytest.mark.parametrize("zero", [1, 3])
def test_a_bucket_size_with_zero_1_or_3_is_refused_in_both_languages(zero):
    with pytest.raises(ConfigError, match=f"bucket_mb=25.0 with zero={zero}") as error:
        TrainConfig(dp=2, zero=zero, bucket_mb=25.0).validate()
    assert f"bucket_mb={DEFAULT}" in str(error.value) and "> 0 with zero=2" in str(error.value)  # allowed
    assert "不能同时使用" in str(error.value) and f"zero={zero}" in str(error.value)
    TrainConfig(dp=2, zero=zero).validate()  # the default stays allowed
    TrainConfig(dp=2, zero=0, bucket_mb=25.0).validate()  # and any size for DP
    TrainConfig(dp=2, zero=2, bucket_mb=25.0).validate()  # and for ZeRO-2


def test_zero_2_needs_a_bucket_size():
    with pytest.raises(ConfigError, match="bucket_mb=0.0 with zero=2") as error:
        TrainConfig(dp=2, zero=2, bucket_mb=0.0).validate()
    assert "bucket_mb > 0 with zero=2" in str(error.value) and "不能同时使用" in str(error.value)
    TrainConfig(dp=2, zero=0, bucket_mb=0.0).validate()  # one bucket per parameter: DP's


def test_the_command_line_refuses_it_before_any_rank_starts(nothing_may_start, capsys):
    code, err = refused(["train", "--dp", "2", "--zero", "1", "--bucket-mb", "1.5"], capsys)
    assert_refused_in_both_languages(code, err, "bucket_mb=1.5")
    code, err = refused(["train", "--dp", "2", "--zero", "2", "--bucket-mb", "0"], capsys)
    assert_refused_in_both_languages(code, err, "bucket_mb=0")


def _ds(tmp_path, zero_section: dict):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {**zero_section, "reduce_bucket_size": 262144}}))
    return path


def test_deepspeed_reduce_bucket_size_maps_at_stages_0_and_2_and_is_ignored_at_1_and_3(tmp_path):
    for section, base in (
        ({"stage": 0}, TrainConfig(dp=2)),
        ({"stage": 2}, TrainConfig(dp=2)),
        ({}, TrainConfig(dp=2, zero=2)),
    ):
        config, ignored = config_from_deepspeed(_ds(tmp_path, section), base)
        assert config.bucket_mb == 1.0 and KEY not in ignored, section  # 262144 fp32 elements = 1 MiB
        config.validate()
    for section, base in (
        ({"stage": 1}, TrainConfig(dp=2)),
        ({"stage": 3}, TrainConfig(dp=2)),
        ({}, TrainConfig(dp=2, zero=3)),
    ):
        config, ignored = config_from_deepspeed(_ds(tmp_path, section), base)
        assert config.bucket_mb == DEFAULT and KEY in ignored, section
        config.validate()  # a common ZeRO file still runs
    with pytest.raises(ConfigError, match="bucket_mb=1.5 with zero=1"):  # the flag is not hidden by the file
        config_from_deepspeed(_ds(tmp_path, {"stage": 1}), TrainConfig(dp=2, bucket_mb=1.5))[0].validate()
