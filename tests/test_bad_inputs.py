"""Every bad input is refused cleanly: exit code 2, English and Chinese naming the value, no traceback,
before any rank (or JupyterLab, or a cluster) starts.

Most cases run in this process through the command line's ``main()`` (fast);
a few run as real subprocesses, for what only a process shows (a closed pipe,
the ``python -m`` entry points).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from dtlab import cli
from dtlab.launch.pool import RankPool

CJK = re.compile(r"[\u4e00-\u9fff]")

DS_FILES = {
    "ds_list.json": "[1, 2]",
    "ds_not_json.json": "{train_batch_size: 8",
    "ds_auto.json": json.dumps({"train_micro_batch_size_per_gpu": "auto"}),
    "ds_bool_batch.json": json.dumps({"train_batch_size": True}),
    "ds_float_accum.json": json.dumps({"gradient_accumulation_steps": 2.5}),
    "ds_stage5.json": json.dumps({"zero_optimization": {"stage": 5}}),
    "ds_stage_text.json": json.dumps({"zero_optimization": {"stage": "two"}}),
    "ds_nvme.json": json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}}),
    "ds_both.json": json.dumps({"fp16": {"enabled": True}, "bf16": {"enabled": True}}),
    "ds_enabled_text.json": json.dumps({"fp16": {"enabled": "yes"}}),
    "ds_lr_text.json": json.dumps({"optimizer": {"type": "AdamW", "params": {"lr": "fast"}}}),
    "ds_lr_nan.json": '{"optimizer": {"params": {"lr": NaN}}}',
    "ds_lr_huge.json": json.dumps({"optimizer": {"params": {"lr": 1e300}}}),
    "ds_sgd.json": json.dumps({"optimizer": {"type": "SGD"}}),
    "ds_mismatch.json": json.dumps(
        {"train_batch_size": 12, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}
    ),
    "ds_accum_zero.json": json.dumps({"gradient_accumulation_steps": 0}),
    "ds_micro_negative.json": json.dumps({"train_micro_batch_size_per_gpu": -2}),
    "ds_loss_scale_text.json": json.dumps({"fp16": {"enabled": True, "loss_scale": "big"}}),
    "ds_loss_scale_negative.json": json.dumps({"fp16": {"enabled": True, "loss_scale": -4}}),
    "ds_offload_zero0.json": json.dumps({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}}),
    "ds_latin1.json": b'{"optimizer": {"type": "Adam\xe9"}}',
}

# (argv, a piece of the message that names the bad value; it must appear in English and in Chinese)
CASES: list[tuple[str, str]] = [
    # -- the command itself
    ("", "command"),
    ("trian", "'trian'"),
    ("train --foo 1", "--foo"),
    ("train --spi 3", "--spi"),  # no abbreviations: not --spike
    ("train --mod tiny", "--mod"),  # nor --model
    ("train --steps 5 extra", "extra"),
    ("train --dp", "--dp"),
    ("train --recompute=yes", "--recompute"),
    ("train --json=1", "--json"),
    # -- layout
    ("train --dp 0", "dp=0"),
    ("train --dp -1", "dp=-1"),
    ("train --dp x", "'x'"),
    ("train --dp 1.5", "'1.5'"),
    ("train --dp 1e9", "'1e9'"),
    ("train --dp nan", "'nan'"),
    ("train --dp 99", "99"),
    ("train --dp 123456789012345678901234567890", "123456789012345678901234567890"),
    ("train --dp 2000000", "dp=2000000"),  # the range is the rank limit's (test_config.py)
    ("train --tp 99999999999", "tp=99999999999"),
    ("train --tp 3", "tp=3"),
    ("train --tp 0", "tp=0"),
    ("train --cp 0", "cp=0"),
    ("train --cp 3", "cp=3"),
    ("train --pp 5", "pp=5"),
    ("train --pp 0", "pp=0"),
    ("train --sp", "sp=True"),
    ("train --ep 2", "ep=2"),
    ("train --micro-batches 0", "micro_batches=0"),
    ("train --pp 2 --micro-batches 3", "micro_batches=3"),
    ("train --micro-batches 100000", "micro_batches=100000"),
    ("train --schedule foo", "'foo'"),
    ("train --dp-mode fastest", "'fastest'"),
    ("train --zero 4", "zero=4"),
    ("train --zero -1", "zero=-1"),
    ("train --zero x", "'x'"),
    ("train --offload", "offload=True"),
    ("train --zero 3 --pp 2", "zero=3"),
    ("train --dp 2 --zero 1 --dp-mode bucketed", "dp_mode='bucketed'"),  # ZeRO averages gradients itself
    ("train --dp 2 --zero 3 --dp-mode per_parameter", "dp_mode='per_parameter'"),
    # -- precision
    ("train --precision fp4", "'fp4'"),
    ("train --precision fp16 --loss-scale abc", "'abc'"),
    ("train --precision fp16 --loss-scale -1", "'-1'"),
    ("train --precision fp16 --loss-scale 0", "'0'"),
    ("train --precision fp16 --loss-scale inf", "'inf'"),
    ("train --precision fp16 --loss-scale nan", "'nan'"),
    ("train --precision fp16 --loss-scale 1e400", "'1e400'"),
    ("train --loss-scale 128", "'128'"),
    ("train --zero 3 --precision fp16 --master-weights model", "zero=3"),
    ("train --precision fp32 --master-weights optimizer", "master_weights"),
    ("train --zero 1 --offload --precision bf16 --master-weights optimizer", "offload"),
    # -- optimisation
    ("train --grad-accum 0", "grad_accum=0"),
    ("train --grad-accum 3", "grad_accum = 1 x 1 x 3"),
    ("train --grad-accum 100000", "grad_accum=100000"),
    ("train --lr nan", "lr=nan"),
    ("train --lr inf", "lr=inf"),
    ("train --lr=-inf", "lr=-inf"),
    ("train --lr -inf", "--lr"),  # argparse reads -inf as an option
    ("train --lr 0", "lr=0"),
    ("train --lr -1", "lr=-1"),
    ("train --lr 1e9", "lr=1000000000.0"),
    ("train --lr 1e999", "lr=inf"),
    ("train --lr fast", "'fast'"),
    ("train --warmup -1", "warmup=-1"),
    ("train --warmup 2000000", "warmup=2000000"),
    ("train --warmup x", "'x'"),
    ("train --steps 0", "steps=0"),
    ("train --steps -5", "steps=-5"),
    ("train --steps 2000000", "steps=2000000"),
    ("train --steps 1e3", "'1e3'"),
    ("train --seed -1", "seed=-1"),
    ("train --seed 1099511627776", "seed=1099511627776"),
    ("train --seed x", "'x'"),
    ("train --seq-len 1", "seq_len=1"),
    ("train --seq-len 2000", "seq_len=2000"),
    ("train --seq-len x", "'x'"),
    ("train --model huge", "'huge'"),
    ("train --batch-size 0", "batch_size=0"),
    ("train --dp 2 --batch-size 3", "batch_size 3"),
    ("train --batch-size 100000", "batch_size=100000"),
    ("train --batch-size nan", "'nan'"),
    # -- fault injection
    ("train --straggler x", "'x'"),
    ("train --straggler 1", "'1'"),
    ("train --straggler 9:0.1", "9:0.1"),
    ("train --straggler 0:nan", "nan"),
    ("train --straggler 0:inf", "inf"),
    ("train --straggler 0:-1", "0:-1.0"),
    ("train --straggler 0:100", "0:100.0"),
    ("train --straggler 0:5 --timeout 5", "straggler=0:5.0"),  # its peers would time out waiting
    ("train --spike 50", "spike=50"),
    ("train --spike -1", "spike=-1"),
    ("train --spike x", "'x'"),
    ("train --spike-policy retry", "'retry'"),
    ("train --timeout 0", "timeout_s=0.0"),
    ("train --timeout -1", "timeout_s=-1.0"),
    ("train --timeout inf", "timeout_s=inf"),
    ("train --timeout nan", "timeout_s=nan"),
    ("train --timeout 1e999", "timeout_s=inf"),
    ("train --timeout soon", "'soon'"),
    ("train --timeout 0.5", "timeout_s=0.5"),
    # -- checkpoints: the save target is checked before step 0
    ("train --save {tmp}/a_file", "a_file"),
    ("train --save {tmp}/missing/parent/dir", "missing"),
    ("train --save ''", "save=''"),
    ("train --save {tmp}/a_file/below", "a_file"),
    ("train --trace {tmp}", "trace="),
    ("train --trace {tmp}/missing/trace.json", "missing"),
    ("train --trace {tmp}/a_file/trace.json", "a_file"),
    ("train --trace ''", "trace=''"),
    ("train --save-every 0", "save_every=0"),
    ("train --save-every x", "'x'"),
    ("train --save-every 5", "save_every=5"),  # without --save: nothing to save
    # -- mixture of experts
    ("train --experts -1", "experts=-1"),
    ("train --experts 100000", "experts=100000"),
    ("train --experts 3 --ep 2", "ep=2"),
    ("train --experts 2 --top-k 3", "top_k=3"),
    ("train --top-k 2", "top_k=2"),
    ("train --capacity-factor 2", "capacity_factor=2.0"),  # without --experts: no router
    ("train --capacity-factor none", "capacity_factor=None"),
    ("train --aux-loss-coef 0", "aux_loss_coef=0.0"),
    ("train --experts 2 --capacity-factor x", "'x'"),
    ("train --experts 2 --capacity-factor nan", "capacity_factor=nan"),
    ("train --experts 2 --capacity-factor -1", "capacity_factor=-1.0"),
    ("train --experts 2 --aux-loss-coef inf", "aux_loss_coef=inf"),
    ("train --experts 2 --aux-loss-coef -1", "aux_loss_coef=-1.0"),
    # -- DeepSpeed config keys
    ("train --deepspeed-config {tmp}/no_such.json", "no_such.json"),
    ("train --deepspeed-config {tmp}/ds_list.json", "ds_list.json"),
    ("train --deepspeed-config {tmp}/ds_not_json.json", "ds_not_json.json"),
    ("train --deepspeed-config {tmp}/ds_latin1.json", "ds_latin1.json"),
    ("train --deepspeed-config {tmp}/ds_auto.json", "'auto'"),
    ("train --deepspeed-config {tmp}/ds_bool_batch.json", "train_batch_size=True"),
    ("train --deepspeed-config {tmp}/ds_float_accum.json", "gradient_accumulation_steps=2.5"),
    ("train --deepspeed-config {tmp}/ds_stage5.json", "zero=5"),
    ("train --deepspeed-config {tmp}/ds_stage_text.json", "'two'"),
    ("train --deepspeed-config {tmp}/ds_nvme.json", "'nvme'"),
    ("train --deepspeed-config {tmp}/ds_both.json", "bf16.enabled"),
    ("train --deepspeed-config {tmp}/ds_enabled_text.json", "'yes'"),
    ("train --deepspeed-config {tmp}/ds_lr_text.json", "'fast'"),
    ("train --deepspeed-config {tmp}/ds_lr_nan.json", "nan"),
    ("train --deepspeed-config {tmp}/ds_lr_huge.json", "lr=1e+300"),
    ("train --deepspeed-config {tmp}/ds_sgd.json", "'SGD'"),
    ("train --dp 2 --deepspeed-config {tmp}/ds_mismatch.json", "train_batch_size=12"),
    ("train --deepspeed-config {tmp}/ds_accum_zero.json", "gradient_accumulation_steps=0"),
    ("train --deepspeed-config {tmp}/ds_micro_negative.json", "train_micro_batch_size_per_gpu=-2"),
    ("train --deepspeed-config {tmp}/ds_loss_scale_text.json", "'big'"),
    ("train --deepspeed-config {tmp}/ds_loss_scale_negative.json", "'-4.0'"),
    ("train --deepspeed-config {tmp}/ds_offload_zero0.json", "offload=True"),
    # -- the planner
    ("plan --params nan", "'nan'"),
    ("plan --params inf", "'inf'"),
    ("plan --params 1e999", "'1e999'"),
    ("plan --params -5", "'-5'"),
    ("plan --params lots", "'lots'"),
    ("plan --gpus 0", "'0'"),
    ("plan --gpus 3 --dp 2", "gpus = 3"),
    ("plan --dp x", "'x'"),
    ("plan --tp 0", "'0'"),
    ("plan --pp 99999999999999999999", "'99999999999999999999'"),
    ("plan --layers 100000000000000000000", "'100000000000000000000'"),
    ("plan --hidden 64", "--layers"),
    ("plan --layers 2 --hidden 65 --heads 2 --vocab 100", "--seq-len"),
    ("plan --layers 2 --hidden 65 --heads 2 --vocab 100 --seq-len 8", "hidden = 65"),
    ("plan --seq-len -3", "'-3'"),
    ("plan --micro-batches 0", "'0'"),
    ("plan --batch-size 99999999999999999999", "'99999999999999999999'"),
    ("plan --zero 5", "5"),
    ("plan --precision fp4", "'fp4'"),
    ("plan --schedule x", "'x'"),
    ("plan --recompute some", "'some'"),
    ("plan --gpu TPU", "'TPU'"),
    ("plan --gpu B200", "FILE.json"),
    ("plan --model gpt5", "'gpt5'"),
    ("plan --model tiny --params 7B", "--params"),
    ("plan --params 7B --tied-embeddings", "tied_embeddings"),
    ("plan --model small --zero 3 --pp 2", "pp=2"),
    ("plan --mod tiny", "--mod"),
    # -- glossary, lab, bench, cluster, progress
    ("progress --lang fr", "'fr'"),
    ("glossary --lang fr", "'fr'"),
    ("glossary --lang", "--lang"),
    ("glossary no-such-term-at-all", "no-such-term-at-all"),
    ("lab --port abc", "'abc'"),
    ("lab --port 70000", "'70000'"),
    ("lab --port 0", "'0'"),
    ("lab --ip 'not an address'", "'not an address'"),
    ("lab --notebooks {tmp}/missing", "missing"),
    ("lab --notebooks {tmp}/a_file", "a_file"),
    ("lab --browser", "--browser"),
    ("lab --workspace {tmp}/a_file", "a_file"),
    ("lab --workspace {tmp}/lessons --reset 99", "'99'"),
    ("lab --reference --reset 03", "--reference"),
    ("lab --notebooks {tmp} --workspace {tmp}/w", "--notebooks"),
    ("bench", "name"),
    ("bench nope", "'nope'"),
    ("bench pool --repeats 0", "--repeats 0"),
    ("bench pool --repeats 100000", "--repeats 100000"),
    ("bench pool --repeats x", "'x'"),
    ("bench pool --rep 2", "--rep"),
    ("bench zero --cluster", "'zero'"),
    ("bench allreduce --nodes 3", "--nodes 3"),  # without --cluster: no cluster to shape
    ("bench allreduce --nproc-per-node 1", "--nproc-per-node 1"),
    ("bench allreduce --bandwidth 1gbit", "--bandwidth 1gbit"),
    ("bench dp --nodes 2 --cluster", "'dp'"),
    ("cluster run --nodes 0 -- train", "nodes=0"),
    ("cluster run --nodes 99 -- train", "nodes=99"),
    ("cluster run --nproc-per-node 0 -- train", "nproc_per_node=0"),
    ("cluster run --bandwidth fast -- train", "'fast'"),
    ("cluster run --nodes x -- train", "'x'"),
    ("calibrate --out {tmp}", "--out="),  # before measuring, not after
    ("calibrate --out {tmp}/a_file/p.json", "a_file"),
    ("calibrate --out {tmp}/missing/dir/p.json", "missing"),
]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    """A folder with the files the cases name: a plain file, DeepSpeed configs good and bad."""
    folder = tmp_path_factory.mktemp("bad_inputs")
    (folder / "a_file").write_text("not a directory")
    for name, text in DS_FILES.items():
        (folder / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return folder


@pytest.fixture
def nothing_may_start(monkeypatch):
    """Fail the test if a bad input gets as far as starting ranks, JupyterLab or a cluster."""

    def started(*args, **kwargs):
        raise AssertionError("a bad input got as far as starting processes")

    monkeypatch.setattr(RankPool, "start", started)
    monkeypatch.setattr(subprocess, "call", started)
    import dtlab.cluster.launcher

    monkeypatch.setattr(dtlab.cluster.launcher, "start", started)


def refused(argv: list[str], capsys) -> tuple[int, str]:
    """Run ``dtlab ARGV`` in this process: (exit code, what it wrote to stderr)."""
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse's errors exit from inside parse_args
        code = exit_.code
    return code, capsys.readouterr().err


def assert_refused_in_both_languages(code: int, err: str, needle: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(("dtlab", "python -m dtlab"))]
    english = [line for line in lines if not CJK.search(line)]
    chinese = [line for line in lines if CJK.search(line)]
    assert any(needle in line for line in english), (needle, err)
    assert any(needle in line for line in chinese), (needle, err)


def test_there_are_at_least_a_hundred_cases():
    assert len(CASES) >= 100


@pytest.mark.parametrize("command,needle", CASES, ids=[c or "(nothing)" for c, _ in CASES])
def test_a_bad_input_is_refused_cleanly_before_anything_starts(command, needle, tmp, nothing_may_start, capsys):
    import shlex

    argv = shlex.split(command.replace("{tmp}", str(tmp)))
    code, err = refused(argv, capsys)
    assert_refused_in_both_languages(code, err, needle)


def _mount_tmpfs(path, options: str) -> bool:
    os.makedirs(path, exist_ok=True)
    return (
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode == 0
    )


@pytest.fixture
def unwritable_and_full(tmp_path):
    """A read-only folder and a full disk: tmpfs mounts where we may (CI runs as root), chmod otherwise."""
    readonly, full = tmp_path / "readonly", tmp_path / "full"
    mounted = []
    if os.geteuid() == 0:
        if not (_mount_tmpfs(readonly, "ro,size=64k") and _mount_tmpfs(full, "size=64k")):
            pytest.skip("root without the right to mount a tmpfs")
        mounted = [readonly, full]
        with open(full / "filler", "wb") as f:
            try:
                f.write(b"\0" * (1 << 20))
            except OSError:
                pass
    else:
        readonly.mkdir()
        readonly.chmod(0o555)
        full = None
    yield readonly, full
    for path in mounted:
        subprocess.run(["umount", str(path)], capture_output=True)


def test_a_read_only_or_full_save_target_is_refused_before_step_0(unwritable_and_full, nothing_may_start, capsys):
    readonly, full = unwritable_and_full
    code, err = refused(["train", "--save", str(readonly / "ckpt")], capsys)
    assert_refused_in_both_languages(code, err, "readonly")
    code, err = refused(["train", "--trace", str(readonly / "trace.json")], capsys)
    assert_refused_in_both_languages(code, err, "readonly")
    code, err = refused(["calibrate", "--out", str(readonly / "machine.json")], capsys)
    assert_refused_in_both_languages(code, err, "readonly")
    if full is not None:
        code, err = refused(["train", "--save", str(full / "ckpt")], capsys)
        assert_refused_in_both_languages(code, err, "full")
        assert "bytes free" in err


def test_calibrate_creates_no_directory_for_out(tmp_path, nothing_may_start, capsys):
    code, err = refused(["calibrate", "--out", str(tmp_path / "missing" / "dir" / "p.json")], capsys)
    assert_refused_in_both_languages(code, err, "missing")
    assert "does not exist" in err and not (tmp_path / "missing").exists()


@pytest.mark.parametrize("value", ["abc", "0", "-3", "2.5"])
def test_a_bad_rank_limit_is_refused_where_it_is_used(value, monkeypatch, nothing_may_start, capsys):
    """DTLAB_MAX_RANKS is read when a command needs it: a bilingual refusal naming it, its value and
    what is allowed; commands that start no rank do not read it (test_the_rank_limit_is_not_read_at_import)."""
    monkeypatch.setenv("DTLAB_MAX_RANKS", value)
    for argv in (["train"], ["cluster", "run", "--", "train"]):
        code, err = refused(argv, capsys)
        assert_refused_in_both_languages(code, err, f"DTLAB_MAX_RANKS={value!r}")
        assert "positive integer" in err and "正整数" in err
    from dtlab.i18n import ConfigError

    with pytest.raises(ConfigError, match="DTLAB_MAX_RANKS"):
        RankPool()


def test_the_rank_limit_is_not_read_at_import():
    env = {**os.environ, "DTLAB_MAX_RANKS": "abc"}
    for argv in (["--help"], ["train", "--help"], ["glossary", "zero"]):
        proc = _dtlab("-m", "dtlab.cli", *argv, env=env)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (argv, proc.stderr)


def test_the_rank_limit_names_where_it_comes_from(monkeypatch, nothing_may_start, capsys):
    monkeypatch.setenv("DTLAB_MAX_RANKS", "2")
    code, err = refused(["train", "--dp", "2", "--tp", "2"], capsys)
    assert_refused_in_both_languages(code, err, "DTLAB_MAX_RANKS=2")
    assert "at most 2" in err


def test_a_train_job_larger_than_its_cluster_names_nodes_times_ranks(capsys):
    from dtlab.cluster.launcher import start
    from dtlab.cluster.spec import ClusterSpec
    from dtlab.i18n import ConfigError

    with pytest.raises(ConfigError) as error:
        start(ClusterSpec(nodes=2, nproc_per_node=1), ["train", "--dp", "3"])
    for text in (error.value.en, error.value.zh):
        assert "dp=3" in text and "nodes x nproc_per_node = 2 x 1 = 2" in text
    with pytest.raises(SystemExit) as exit_:  # the job's own flags: the bilingual usage error
        start(ClusterSpec(nodes=2, nproc_per_node=1), ["train", "--foo"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert_refused_in_both_languages(2, err, "--foo")


def test_plan_names_every_kind_of_gpu_it_takes(nothing_may_start, capsys):
    code, err = refused(["plan", "--gpu", "B200"], capsys)
    for line in err.splitlines():
        assert all(word in line for word in ("'B200'", "A100", "H200", "local", "FILE.json")), line


def test_a_flag_left_at_its_default_is_never_refused_as_unused():
    """The refusals of flags that would do nothing trigger on a value other than the default only."""
    import argparse

    from dtlab.bench import _check_cluster_flags
    from dtlab.config.flags import add_train_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    for flags in (
        ["--save-every", "10"],
        ["--capacity-factor", "1.25", "--aux-loss-coef", "0.01"],
        ["--dp", "2", "--zero", "1", "--dp-mode", "overlapped"],
        ["--top-k", "1", "--ep", "1"],
        ["--straggler", "1:0.5", "--dp", "2", "--timeout", "5"],
        ["--timeout", "1"],
    ):
        config_from_args(parser.parse_args(flags)).validate()
    bench = cli.build_parser()
    for argv in (
        ["bench", "allreduce"],
        ["bench", "allreduce", "--cluster", "--nodes", "2", "--bandwidth", "1gbit"],
        ["bench", "zero"],
    ):
        _check_cluster_flags(bench.parse_args(argv))


# -- a few through real processes


def _dtlab(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, **kwargs)


def test_the_entry_points_refuse_bad_input_in_both_languages_without_a_traceback():
    for argv, needle in (
        (["-m", "dtlab.cli", "train", "--dp", "x"], "'x'"),
        (["-m", "dtlab.train", "--lr", "nan"], "lr=nan"),
        (["-m", "dtlab.train", "--spi", "2"], "--spi"),
    ):
        proc = _dtlab(*argv)
        assert_refused_in_both_languages(proc.returncode, proc.stderr, needle)


def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly():
    """``dtlab train --json | head -1``: no BrokenPipeError traceback, the SIGPIPE exit code, no rank left.

    The steps print far more than a pipe holds (64 KiB), so the command is
    still writing when the reader goes away.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "dtlab.cli", "train", "--model", "tiny", "--steps", "2000", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    json.loads(proc.stdout.readline())
    proc.stdout.close()  # the reader goes away after one line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout
    assert children.strip() == ""


def test_every_benchmark_dtlab_bench_lists_can_run():
    """`dtlab bench NAME` for each name it offers (in its help and its unknown-name error) has a run()."""
    import importlib

    from dtlab.bench import available

    names = available()
    assert {"allreduce", "dp", "zero", "pipeline"} <= set(names)
    assert [n for n in names if not callable(getattr(importlib.import_module(f"dtlab.bench.{n}"), "run", None))] == []
