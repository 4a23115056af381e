"""The probe of issue 41 in the suite: hostile paths, files and environment variables, each refused cleanly.

Every case runs ``dtlab ARGV`` in this process (``cli.main``, with
``nothing_may_start`` from tests/test_bad_inputs.py) and asserts a refusal in
both languages (exit 2, the value named, no traceback), no process left
behind, and no file changed: not in the folder of hostile files, not a
device. Only the launcher-killed case runs real processes.

The hostile files: devices (``/dev/null``, ``/dev/full``, ``/dev/zero``), a
FIFO, a socket, symbolic links to them, names longer than the filesystem
allows, tampered checkpoint manifests and rank files, DeepSpeed configs nested
200,000 deep or with duplicate keys.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shlex
import socket
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from dtlab.launch.resources import descendants
from tests.test_bad_inputs import assert_refused_in_both_languages, nothing_may_start, refused  # noqa: F401

LONG = "n" * 300
DEVICES = ["/dev/null", "/dev/full", "/dev/zero"]
SPECIAL = ["{h}/fifo", "{h}/sock", "{h}/to_null", "{h}/to_fifo", "{h}/to_zero"]
BAD_PLACES = [f"{{h}}/{LONG}", f"{{h}}/{LONG}/x.json", "{h}/a_file/below.json", "/proc/nope/x.json", "{h}/gone/x"]
OUTPUTS = DEVICES + SPECIAL + BAD_PLACES  # never a place to write a file
INPUTS = DEVICES + SPECIAL + [f"{{h}}/{LONG}", "{h}/a_dir", "{h}/big.json"]  # never a file to read

GOOD_MANIFEST = {}  # filled by the fixture: the manifest of a real one-rank checkpoint
TAMPERED = {  # name: (key path, new value) or a function of the manifest's text
    "step_text": ("step", "abc"),
    "step_float": ("step", 2.5),
    "step_null": ("step", None),
    "step_bool": ("step", True),
    "step_negative": ("step", -1),
    "step_earlier": ("step", 1),
    "step_later": ("step", 3),
    "step_list": ("step", [2]),
    "world_zero": ("world_size", 0),
    "world_text": ("world_size", "1"),
    "world_two": ("world_size", 2),
    "files_object": ("files", {"rank00000.pt": {}}),
    "files_empty": ("files", []),
    "files_null_entry": ("files", [None]),
    "files_text": ("files", "rank00000.pt"),
    "file_null": ("files.0.file", None),
    "file_outside": ("files.0.file", "../../etc/passwd"),
    "file_absolute": ("files.0.file", "/etc/passwd"),
    "file_other_rank": ("files.0.file", "rank00001.pt"),
    "file_number": ("files.0.file", 7),
    "bytes_text": ("files.0.bytes", "x"),
    "bytes_negative": ("files.0.bytes", -1),
    "bytes_float": ("files.0.bytes", 1.5),
    "sha_short": ("files.0.sha256", "abc"),
    "sha_null": ("files.0.sha256", None),
    "layout_list": ("layout", [1]),
    "layout_text_value": ("layout", {"dp": "x"}),
    "no_step": ("step", KeyError),
    "no_files": ("files", KeyError),
    "no_layout": ("layout", KeyError),
}
RAW_MANIFESTS = {
    "nan": lambda text: text.replace('"step": 2', '"step": NaN'),
    "infinity": lambda text: text.replace('"step": 2', '"step": Infinity'),
    "trailing_comma": lambda text: text.rstrip().rstrip("}") + ",}",
    "duplicate_step": lambda text: text.replace('"step": 2', '"step": 2, "step": 4'),
    "deep": lambda text: text.replace('"step": 2', '"step": 2, "x": ' + "[" * 200_000 + "]" * 200_000),
    "top_list": lambda text: "[" + text + "]",
    "empty": lambda text: "",
    "not_utf8": lambda text: "\udcff",
    "cut_short": lambda text: text[: len(text) // 2],
}
DEEPSPEED = {
    "ds_deep.json": "[" * 200_000 + "]" * 200_000,
    "ds_deep_object.json": '{"a": ' * 100_000 + "1" + "}" * 100_000,
    "ds_dup_top.json": '{"train_batch_size": 8, "train_batch_size": 16}',
    "ds_dup_nested.json": '{"zero_optimization": {"stage": 1, "stage": 2}}',
    "ds_dup_optimizer.json": '{"optimizer": {"type": "AdamW", "params": {"lr": 0.1, "lr": 0.2}}}',
    "ds_empty.json": "",
    "ds_nan_top.json": "NaN",
    "ds_string.json": '"train_batch_size"',
    "ds_bom.json": "\ufeff{}",
}


def _set(tree: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        tree = tree[int(key)] if isinstance(tree, list) else tree[key]
    if value is KeyError:
        del tree[last]
    else:
        tree[last] = value


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A folder of hostile files: a FIFO, a socket, links to devices, tampered checkpoints and configs."""
    import torch

    from dtlab.state.checkpoint.files import save_checkpoint

    h = tmp_path_factory.mktemp("hostile")
    (h / "a_file").write_text("a file")
    (h / "a_dir").mkdir()
    (h / "big.json").write_bytes(b" " * (17 << 20))
    os.mkfifo(h / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(h / "sock"))
    sock.close()
    for name, target in (("to_null", "/dev/null"), ("to_zero", "/dev/zero"), ("to_fifo", h / "fifo")):
        os.symlink(target, h / name)
    for name, text in DEEPSPEED.items():
        (h / name).write_text(text, encoding="utf-8")
    layout = {"dp": 1, "tp": 1, "pp": 1, "zero": 0}
    for step in (2, 4):
        save_checkpoint(h / "CK", step=step, layout=layout, state={"x": torch.zeros(2)})
    text = (h / "CK" / "step00000002" / "manifest.json").read_text()
    GOOD_MANIFEST.update(json.loads(text))
    for name, (key, value) in TAMPERED.items():
        manifest = json.loads(text)
        _set(manifest, key, value)
        _tampered(h, name, json.dumps(manifest))
    for name, change in RAW_MANIFESTS.items():
        _tampered(h, name, change(text))
    for name, how in (("manifest_fifo", "fifo"), ("manifest_zero", "zero"), ("manifest_dir", "dir")):
        folder = _tampered(h, name, None)
        if how == "fifo":
            os.mkfifo(folder / "manifest.json")
        elif how == "zero":
            os.symlink("/dev/zero", folder / "manifest.json")
        else:
            (folder / "manifest.json").mkdir()
    for name, how in (("rank_fifo", "fifo"), ("rank_zero", "zero"), ("rank_missing", "gone"), ("rank_cut", "cut")):
        folder = _tampered(h, name, text)
        rank = folder / "rank00000.pt"
        data = (h / "CK" / "step00000002" / "rank00000.pt").read_bytes()
        {"fifo": lambda: os.mkfifo(rank), "zero": lambda: os.symlink("/dev/zero", rank), "gone": lambda: None}.get(
            how, lambda: rank.write_bytes(data[:-1])
        )()
    os.chmod(h, 0o755)
    return h


def _tampered(h, name: str, text: str | None):
    folder = h / f"tamper_{name}" / "step00000002"
    folder.mkdir(parents=True)
    if text is not None:
        (folder / "manifest.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    return folder


def _cases() -> list[tuple[str, str, dict]]:
    """(argv with {h} for the hostile folder, a piece of the message naming the value, environment)."""
    cases = []
    out_options = [
        ("train --save", OUTPUTS),
        ("train --trace", OUTPUTS + ["{h}/a_dir"]),
        ("calibrate --out", OUTPUTS + ["{h}/a_dir"]),
        ("bench pool --out", OUTPUTS + ["{h}/a_dir"]),
        ("lab --workspace", DEVICES + SPECIAL + BAD_PLACES[:3] + ["/proc/nope/lessons"]),
    ]
    for option, values in out_options:
        cases += [(f"{option} {shlex.quote(v)}", _needle(v), {}) for v in values]
    for option in ("train --deepspeed-config", "plan --gpu"):
        cases += [(f"{option} {shlex.quote(v)}", _needle(v), {}) for v in INPUTS + ["{h}/missing.json"]]
    cases += [(f"train --deepspeed-config {{h}}/{name}", name, {}) for name in DEEPSPEED]
    cases += [("train --resume " + shlex.quote(v), _needle(v), {}) for v in [*DEVICES, *SPECIAL, BAD_PLACES[0]]]
    for name in [*TAMPERED, *RAW_MANIFESTS, "manifest_fifo", "manifest_zero", "manifest_dir"]:
        for target in (f"{{h}}/tamper_{name}", f"{{h}}/tamper_{name}/step00000002"):
            cases.append((f"train --resume {target} --steps 10", f"tamper_{name}", {}))
    for name in ("rank_fifo", "rank_zero", "rank_missing", "rank_cut"):
        cases.append((f"train --resume {{h}}/tamper_{name} --steps 10", f"tamper_{name}", {}))
    cases.append(("train --resume {h}/CK/step00000002 --save {h}/CK --steps 4", "CK", {}))
    cases.append(("train --resume {h}/CK/step00000002 --save {h}/CK --steps 9", "CK", {}))
    cases += [(f"lab --notebooks {shlex.quote(v)}", _needle(v), {}) for v in DEVICES + SPECIAL + BAD_PLACES[:1]]
    for port in ("²", "８０", "٨٠٨٠", "1e3", "0x50", "", "-1", " 80", "80.0", "65536", "0", "00000", "1,000", "+80"):
        cases.append((f"lab --port {shlex.quote(port)}", repr(port), {}))
    for value in (
        "99999999999999999999",
        "1e3",
        "0x10",
        "-1",
        "nan",
        "inf",
        "²",
        "٣",
        "10**9",
        "1_000",
        "4097",
        "abc",
        "0",
        "+99999",
    ):
        for command in ("train", "cluster run -- train", "train --dp 2"):
            cases.append((command, f"DTLAB_MAX_RANKS={value!r}", {"DTLAB_MAX_RANKS": value}))
    for value in OUTPUTS[:-1]:  # not {h}/gone/x: the default profile's folders are created
        cases.append(("calibrate", _needle(value), {"DTLAB_PROFILE": value}))
        cases.append(("calibrate", _needle(value), {"DTLAB_HOME": value, "DTLAB_PROFILE": ""}))
    for value in INPUTS:
        cases.append(("plan --gpu local", _needle(value), {"DTLAB_PROFILE": value}))
    for value in DEVICES + SPECIAL + BAD_PLACES[:3]:
        cases.append(("lab", _needle(value), {"DTLAB_WORKSPACE": value}))
    # an unusable DTLAB_HOME (where progress goes) is refused before JupyterLab starts, by its name
    for value in DEVICES + ["{h}/fifo", "{h}/a_file", "{h}/a_file/below", "/proc/nope", f"{{h}}/{LONG}"]:
        named = "DTLAB_HOME='" + ("" if value.startswith("{h}") else value)
        cases.append(("lab --reference", named[:40], {"DTLAB_HOME": value}))
    cases.append(("lab", "DTLAB_WORKSPACE '", {"DTLAB_WORKSPACE": "{h}/a_file"}))
    cases.append(("lab --workspace ''", "--workspace ''", {}))
    cases.append(("plan --gpu local", "DTLAB_PROFILE='", {"DTLAB_PROFILE": "{h}/a_dir"}))
    return cases


def _needle(value: str) -> str:
    name = value.replace("{h}/", "").split("/")[0] if value.startswith("{h}/") else value
    return name[:40] or "''"


CASES = _cases()


def test_there_are_at_least_three_hundred_hostile_cases():
    assert len(CASES) >= 300


def _snapshot(h) -> dict:
    """What a case could damage: every entry below ``h`` (kind, size, time, content) and the devices."""
    seen = {}
    for root, dirs, files in os.walk(h):
        for name in dirs + files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            digest = None
            if stat.S_ISREG(info.st_mode) and info.st_size < (1 << 20):
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            seen[path] = (info.st_mode, info.st_size, info.st_mtime_ns, digest)
    for device in DEVICES:
        info = os.lstat(device)
        seen[device] = (info.st_mode, info.st_rdev)
    return seen


@pytest.mark.parametrize("command,needle,env", CASES, ids=[f"{c} {sorted(e.items())}"[:120] for c, _, e in CASES])
def test_a_hostile_input_is_refused_and_changes_nothing(
    command, needle, env, hostile, nothing_may_start, monkeypatch, capsys
):
    for key in ("DTLAB_MAX_RANKS", "DTLAB_PROFILE", "DTLAB_HOME", "DTLAB_WORKSPACE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        if value:
            monkeypatch.setenv(key, value.replace("{h}", str(hostile)))
    argv = shlex.split(command.replace("{h}", str(hostile)))
    before, children = _snapshot(hostile), descendants(os.getpid())
    code, err = refused(argv, capsys)
    assert_refused_in_both_languages(code, err, needle)
    assert _snapshot(hostile) == before
    assert descendants(os.getpid()) == children


def test_a_resume_from_an_earlier_step_names_the_later_steps(hostile, nothing_may_start, capsys):
    code, err = refused(shlex.split(f"train --resume {hostile}/CK/step00000002 --save {hostile}/CK --steps 4"), capsys)
    assert_refused_in_both_languages(code, err, "CK")
    assert "later steps 4" in err and "第 4 步" in err and "--save a new directory" in err


def test_a_damaged_progress_file_is_kept_aside_and_reported(tmp_path, monkeypatch, capsys):
    from dtlab.course.exercises import progress

    monkeypatch.setenv("DTLAB_HOME", str(tmp_path))
    progress.record_exercise("01.ring_step", 1, passed=True)
    damaged = (tmp_path / "progress.json").read_text().rstrip().rstrip("}") + ",}"  # one trailing comma
    (tmp_path / "progress.json").write_text(damaged)
    progress.record_prediction("01.ring_steps", 1, right=True)
    err = capsys.readouterr().err
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("progress.json.damaged-")]
    assert len(aside) == 1 and aside[0].read_text() == damaged
    assert str(aside[0]) in err and "无法读取进度记录" in err
    assert set(progress.load()["predictions"]) == {"01.ring_steps"}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("argv", [[], ["{h}/a_file"], ["{h}/a_dir"], ["/proc/nope"], ["a", "b"]])
def test_the_binder_workspace_helper_refuses_a_place_without_lessons(argv, hostile, capsys):
    """``python -m dtlab.course.workspace DIRECTORY`` (binder/postBuild), run in this process."""
    from dtlab.course import workspace

    assert workspace.main([a.replace("{h}", str(hostile)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "expected" in err and "应" in err, err
    assert ("DIRECTORY" in err) if argv else ("got 0" in err)


def test_an_unwritable_progress_home_is_refused_in_both_languages(monkeypatch):
    from dtlab.course.exercises import progress
    from dtlab.i18n import DtlabError

    monkeypatch.setenv("DTLAB_HOME", "/proc/nope")
    with pytest.raises(DtlabError) as error:
        progress.record_prediction("01.ring_steps", 1, right=True)
    assert "/proc/nope" in error.value.en and "/proc/nope" in error.value.zh


def test_an_interrupted_save_is_swept_at_the_next_save(tmp_path):
    import torch

    from dtlab.state.checkpoint.files import committed_steps, save_checkpoint

    layout = {"dp": 1, "tp": 1, "pp": 1, "zero": 0}
    save_checkpoint(tmp_path, step=2, layout=layout, state={"x": torch.zeros(1)})
    unfinished = tmp_path / "step00000003"
    unfinished.mkdir()
    (unfinished / ".rank00000.pt.0123.tmp").write_bytes(b"half")
    (tmp_path / "step00000002" / ".manifest.json.4567.tmp").write_bytes(b"half")
    save_checkpoint(tmp_path, step=4, layout=layout, state={"x": torch.zeros(1)})
    assert not unfinished.exists() and committed_steps(tmp_path) == [2, 4]
    assert not list(tmp_path.glob("step*/*.tmp"))


def test_ranks_end_when_their_launcher_is_killed_under_a_caller_reading_its_output():
    """SIGKILL the launcher of a two-rank run while its caller still holds its pipes (as
    ``subprocess.run(..., capture_output=True)`` does): the ranks see the launcher exit through a pidfd
    (not ``kill(pid, 0)``, which a zombie answers), so the output ends and no process is left."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dtlab.cli", "train", "--dp", "2", "--model", "tiny", "--steps", "100000", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    below = []
    try:
        json.loads(proc.stdout.readline())
        below = descendants(proc.pid)
        assert below, "the run started no process"
        os.kill(proc.pid, 9)
        proc.communicate(timeout=60)  # returns once every holder of the pipes has exited
        deadline = time.monotonic() + 10
        while _alive(below) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _alive(below) == []
        from dtlab.launch.resources import sweep_rendezvous

        left = glob.glob(os.path.join(tempfile.gettempdir(), f"dtlab-rendezvous-{proc.pid}-*"))
        assert set(left) <= set(sweep_rendezvous())  # the next pool's start sweeps it
        assert not glob.glob(os.path.join(tempfile.gettempdir(), f"dtlab-rendezvous-{proc.pid}-*"))
    finally:
        for pid in below + [proc.pid]:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        proc.wait(timeout=10)


def _alive(pids: list[int]) -> list[int]:
    from dtlab.launch.resources import process_exists

    return [pid for pid in pids if process_exists(pid)]


def test_a_full_disk_stops_the_trace_not_the_training(capsys):
    """/dev/full stands for a disk that fills up during the run: the trace stops with a bilingual line."""
    from dtlab.measure.chrome_trace import TraceWriter

    writer = TraceWriter("/dev/full")
    writer.add({"step": 0, "ranks": []})
    writer.add({"step": 1, "ranks": []})
    assert writer.close() == "/dev/full" and writer.error is not None
    err = capsys.readouterr().err
    assert err.count("/dev/full") == 2 and "No space left" in err and "训练继续" in err


def test_a_full_disk_during_a_save_leaves_the_last_commit_intact(tmp_path, monkeypatch):
    import errno

    import torch

    from dtlab.i18n import DtlabError
    from dtlab.state.checkpoint import files

    layout = {"dp": 1, "tp": 1, "pp": 1, "zero": 0}
    files.save_checkpoint(tmp_path, step=2, layout=layout, state={"x": torch.zeros(1)})

    def full(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files, "_write_atomically", full)
    with pytest.raises(DtlabError) as error:
        files.save_checkpoint(tmp_path, step=4, layout=layout, state={"x": torch.zeros(1)})
    assert "No space left" in error.value.en and "step 2" in error.value.en and "第 2 步" in error.value.zh
    monkeypatch.undo()
    assert files.committed_steps(tmp_path) == [2] and files.verify(tmp_path)[1]["step"] == 2


def test_semaphores_no_process_maps_are_swept_and_mapped_ones_kept(tmp_path):
    import mmap

    from dtlab.launch.resources import sweep_semaphores

    stale, used = tmp_path / "sem.mp-stale", tmp_path / "sem.mp-used"
    for path in (stale, used):
        path.write_bytes(b"\0" * 32)
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    with open(used, "r+b") as f, mmap.mmap(f.fileno(), 32):
        assert sweep_semaphores(shm=str(tmp_path)) == [str(stale)]
    assert used.exists() and not stale.exists()


@pytest.mark.parametrize(
    "text",
    ['{"version": 1, "predictions": [], "exercises": {}}', '{"version": 1, "predictions": {"a": 3}}', '{"version": 2}'],
)
def test_a_progress_file_of_another_shape_is_kept_aside_too(text, tmp_path, monkeypatch, capsys):
    from dtlab.course.exercises import progress

    monkeypatch.setenv("DTLAB_HOME", str(tmp_path))
    (tmp_path / "progress.json").write_text(text)
    progress.record_prediction("01.ring_steps", 1, right=True)
    assert [p.read_text() for p in tmp_path.glob("progress.json.damaged-*")] == [text]
    assert "progress.json.damaged-" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["abc", "nan", "inf", "0", "-5", "1e9", "²", "86401"])
def test_a_bad_dtlab_timeout_is_refused_in_both_languages(value, monkeypatch):
    from dtlab.i18n import ConfigError
    from dtlab.launch.worker import env_timeout

    monkeypatch.setenv("DTLAB_TIMEOUT", value)
    with pytest.raises(ConfigError) as error:
        env_timeout()
    assert f"DTLAB_TIMEOUT={value!r}" in error.value.en and f"DTLAB_TIMEOUT={value!r}" in error.value.zh


@pytest.mark.parametrize("target", ["/dev/full", "/dev/null", "{h}/fifo", "{h}/to_fifo", "{h}/a_dir"])
def test_a_check_log_that_is_no_file_is_refused(target, hostile, monkeypatch):
    from dtlab.course.exercises.progress import LOG_ENV, log_verdict
    from dtlab.i18n import DtlabError

    target = target.replace("{h}", str(hostile))
    monkeypatch.setenv(LOG_ENV, target)
    before = _snapshot(hostile)
    with pytest.raises(DtlabError) as error:
        log_verdict("check", "01.x", 1, "right", by_key=False)
    assert target in error.value.en and target in error.value.zh
    assert _snapshot(hostile) == before
