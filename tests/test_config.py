import dataclasses

import pytest

from dtlab.config import MODEL_PRESETS, ModelConfig, TrainConfig
from dtlab.i18n import ConfigError


def has_chinese(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"dp": 0}, "dp=0"),
        ({"steps": -1}, "steps=-1"),
        ({"batch_size": 0}, "batch_size=0"),
        ({"model": "gpt5"}, "gpt5"),
        ({"dp": 9}, "9"),
        ({"dp": 3}, "batch_size 8"),
        ({"schedule": "zigzag"}, "zigzag"),
        ({"precision": "fp4"}, "fp4"),
        ({"zero": 4}, "zero=4"),
        ({"lr": -1.0}, "lr=-1.0"),
        ({"straggler": (7, 0.1), "dp": 4}, "7:0.1"),
    ],
)
def test_bad_values_are_named_with_what_is_allowed_in_both_languages(kwargs, needle):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**kwargs).validate()
    assert needle in info.value.en and has_chinese(info.value.zh)
    assert needle.split("=")[0] in info.value.zh


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"tp": 3}, "tp=3"),
        ({"pp": 5}, "pp=5"),
        ({"pp": 2, "micro_batches": 3}, "micro_batches=3"),
        ({"dp": 2, "tp": 2, "pp": 4}, "16"),
        ({"loss_scale": "1024"}, "loss_scale='1024'"),
        ({"offload": True}, "offload=True"),
        ({"zero": 3, "pp": 2}, "zero=3"),
        ({"spike": 99, "steps": 10}, "spike=99"),
        ({"spike_policy": "pray"}, "pray"),
        ({"dp": 2, "zero": 2, "zero3_prefetch": 1}, "zero3_prefetch=1"),
        ({"dp": 2, "zero": 3, "zero3_prefetch": -1}, "zero3_prefetch=-1"),
    ],
)
def test_layouts_the_components_cannot_split_are_refused_before_start(kwargs, needle):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**kwargs).validate()
    assert needle in info.value.en and has_chinese(info.value.zh)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"dp": 2, "tp": 2, "pp": 2, "micro_batches": 2},
        {"tp": 4},
        {"pp": 4, "micro_batches": 8, "schedule": "gpipe"},
        {"dp": 2, "zero": 3, "precision": "bf16"},
        {"dp": 2, "zero": 3, "zero3_prefetch": 2},
        {"precision": "fp16", "loss_scale": "128"},
        {"dp": 2, "zero": 2, "precision": "fp16"},
        {"dp": 2, "zero": 2, "offload": True},
        {"recompute": True},
    ],
)
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


# One list of training options: the CLI, its help and the control panel come from TrainConfig.

CONTRACT_FLAGS = {
    "--dp",
    "--tp",
    "--pp",
    "--micro-batches",
    "--schedule",
    "--zero",
    "--offload",
    "--precision",
    "--loss-scale",
    "--grad-accum",
    "--recompute",
    "--lr",
    "--warmup",
    "--steps",
    "--seed",
    "--seq-len",
    "--model",
    "--batch-size",
    "--straggler",
    "--spike",
    "--save",
    "--resume",
    "--json",
}  # DESIGN.md's public contract


def _train_parser():
    from dtlab.cli import build_parser

    subparsers = next(a for a in build_parser()._actions if a.choices and "train" in a.choices)
    return subparsers.choices["train"]


def test_every_train_config_field_has_a_docstring():
    from dtlab.config.field_docs import field_docs

    docs = field_docs(TrainConfig)
    missing = [f.name for f in dataclasses.fields(TrainConfig) if len(docs.get(f.name, "")) < 10]
    assert not missing, f"TrainConfig fields without a docstring: {missing}"
    assert field_docs(ModelConfig)["d_model"].startswith("Hidden size")


def test_every_train_flag_has_help_and_the_contract_flags_exist():
    actions = [a for a in _train_parser()._actions if a.option_strings and a.dest != "help"]
    assert all(a.help and len(a.help) > 10 for a in actions), [a.dest for a in actions if not a.help]
    flags = {s for a in actions for s in a.option_strings}
    assert CONTRACT_FLAGS <= flags, CONTRACT_FLAGS - flags
    from dtlab.config.flags import flag_name

    hidden = {f.name for f in dataclasses.fields(TrainConfig) if flag_name(f) is None}
    assert hidden == {"weight_decay", "lr_schedule"}  # every other option is a flag (a schedule comes
    # from --deepspeed-config)


def test_help_is_read_from_the_source_from_any_directory(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    out = subprocess.run(
        [sys.executable, "-m", "dtlab.cli", "train", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    for needle in (
        "--tp TP Tensor-parallel degree. 1 means disabled. (default: 1)",
        "--schedule gpipe|1f1b",
        "--zero 0|1|2|3",
        "--straggler RANK:SECONDS Slow one rank",
        "--timeout SECONDS How long any collective may wait",
        "--model tiny|small|medium",
    ):
        assert needle in text, needle


def test_flags_parse_to_the_config_and_default_to_its_defaults():
    from dtlab.config.flags import config_from_args

    parser = _train_parser()
    assert config_from_args(parser.parse_args([])) == TrainConfig()
    args = parser.parse_args(
        [
            "--dp",
            "2",
            "--zero",
            "2",
            "--offload",
            "--timeout",
            "5",
            "--straggler",
            "1:0.25",
            "--schedule",
            "gpipe",
            "--seq-len",
            "32",
            "--json",
        ]
    )
    assert args.json and args.deepspeed_config is None
    assert config_from_args(args) == TrainConfig(
        dp=2, zero=2, offload=True, timeout_s=5.0, straggler=(1, 0.25), schedule="gpipe", seq_len=32
    )


def test_a_malformed_straggler_is_a_bilingual_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        _train_parser().parse_args(["--straggler", "fast"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "RANK:SECONDS" in err and has_chinese(err)


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(TrainConfig) if TrainConfig.choices(f.name)])
def test_choices_are_the_literal_types_and_validation_names_them(name):
    from dtlab.config import DP_MODES, PRECISIONS, SCHEDULES, ZERO_STAGES

    allowed = TrainConfig.choices(name)
    assert {"dp_mode": DP_MODES, "schedule": SCHEDULES, "precision": PRECISIONS, "zero": ZERO_STAGES}.get(
        name, allowed
    ) == allowed
    with pytest.raises(ConfigError) as info:
        TrainConfig(**{name: "nonsense"}).validate()
    for value in allowed:
        assert repr(value) in info.value.en and repr(value) in info.value.zh
    assert TrainConfig.choices("dp") is None


def test_adamw_hyperparameters_live_in_one_place():
    import torch

    from dtlab.reference import ADAMW_BETAS, ADAMW_EPS, adamw_options, make_optimizer

    config = TrainConfig(lr=2e-3, weight_decay=0.1)
    group = make_optimizer([torch.nn.Parameter(torch.zeros(2))], config).param_groups[0]
    assert (group["betas"], group["eps"], group["lr"], group["weight_decay"]) == (ADAMW_BETAS, ADAMW_EPS, 2e-3, 0.1)
    assert adamw_options(config) == {"lr": 2e-3, "betas": ADAMW_BETAS, "eps": ADAMW_EPS, "weight_decay": 0.1}


def test_the_control_panel_sets_the_fields_it_shows():
    from dtlab.lab.controls import field_widget

    for f in dataclasses.fields(TrainConfig):
        allowed = TrainConfig.choices(f.name)
        if allowed and isinstance(allowed[0], str):
            assert list(field_widget(f.name, f.default).options) == list(allowed)
    assert field_widget("zero", 0).max == 3 and field_widget("recompute", False).value is False
    with pytest.raises(TypeError, match="straggler"):
        field_widget("straggler", None)
    from dtlab.lab.controls import ControlPanel
    from tests.harness import session_pool

    panel = ControlPanel(
        TrainConfig(dp=2, model="tiny"),
        pool=session_pool(),
        auto_run=False,
        show=("dp", "accum", "precision", "recompute", "schedule"),
    )
    panel.accum.value, panel.precision.value, panel.recompute.value = 2, "bf16", True
    assert panel.fields["grad_accum"] is panel.accum
    assert panel.config() == TrainConfig(dp=2, model="tiny", grad_accum=2, precision="bf16", recompute=True)


@pytest.mark.parametrize("axis", ["dp", "tp", "cp", "pp", "ep"])
def test_a_huge_parallel_degree_is_given_the_rank_limit_as_its_range(axis, monkeypatch):
    monkeypatch.delenv("DTLAB_MAX_RANKS", raising=False)
    with pytest.raises(ConfigError) as info:
        TrainConfig(**{axis: 99_999_999_999}).validate()
    assert f"{axis}=99999999999" in info.value.en and "from 1 to 8" in info.value.en
    assert "DTLAB_MAX_RANKS" in info.value.en and "DTLAB_MAX_RANKS" in info.value.zh
    assert "-1000000" not in info.value.en
    with pytest.raises(ConfigError, match="from 1 to 2: torchrun started 2 processes"):
        TrainConfig(**{axis: 4}).validate(max_world_size=2, limit_reason=("torchrun started 2 processes", "2 个"))


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"top_k": 10**9}, "from 1 to 256"),
        ({"spike": 10**9}, "from 0 to 999999"),
        ({"virtual_stages": 10**9}, "from 1 to 1000000"),
        ({"timeout_s": 0.001}, "from 1 to 86400"),
    ],
)
def test_every_range_a_refusal_names_is_the_fields_own(kwargs, needle):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**kwargs).validate()
    assert needle in info.value.en and "-1000000" not in info.value.en


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"save_every": 5}, "--save"),
        ({"capacity_factor": None}, "--experts"),
        ({"aux_loss_coef": 0.0}, "--experts"),
        ({"dp": 2, "zero": 2, "dp_mode": "bucketed"}, "zero=2"),
        ({"straggler": (0, 2.0), "timeout_s": 2.0}, "timeout_s=2.0"),
    ],
)
def test_an_option_that_would_do_nothing_or_fail_later_is_refused(kwargs, needle):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**kwargs).validate()
    assert needle in info.value.en and needle in info.value.zh


def test_the_options_that_apply_are_accepted(tmp_path):
    TrainConfig(save=str(tmp_path), save_every=5).validate()
    TrainConfig(experts=2, capacity_factor=None, aux_loss_coef=0.0).validate()
    TrainConfig(dp=2, dp_mode="bucketed").validate()
    TrainConfig(dp=2, straggler=(1, 1.5), timeout_s=2.0).validate()


def test_saving_into_another_runs_checkpoints_is_refused_unless_this_run_continues_them(tmp_path):
    """A resume picks the newest committed step: a fresh run's step 10 beside an earlier run's step 20
    would be passed over for it, silently. A folder whose save was never committed does not count."""
    (tmp_path / "step00000030").mkdir()  # a save cut short: no manifest
    TrainConfig(save=str(tmp_path), save_every=5).validate()
    for step in (10, 20):
        (tmp_path / f"step{step:08d}").mkdir()
        (tmp_path / f"step{step:08d}" / "manifest.json").write_text("{}")
    with pytest.raises(ConfigError) as info:
        TrainConfig(save=str(tmp_path), save_every=5).validate()
    assert "steps 10, 20" in info.value.en and f"--resume {tmp_path}" in info.value.en
    assert "第 10、20 步" in info.value.zh and f"--resume {tmp_path}" in info.value.zh
    TrainConfig(save=str(tmp_path), resume=str(tmp_path), steps=40).validate()
    with pytest.raises(ConfigError) as info:  # its saves would overwrite the committed step 20 (issue 41)
        TrainConfig(save=str(tmp_path), resume=str(tmp_path / "step00000010"), steps=40).validate()
    assert "later steps 20" in info.value.en and "第 20 步" in info.value.zh
    TrainConfig(save=str(tmp_path), resume=str(tmp_path / "step00000020"), steps=40).validate()
    with pytest.raises(ConfigError):
        TrainConfig(save=str(tmp_path), resume=str(tmp_path.parent), steps=40).validate()
