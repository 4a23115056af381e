"""The learner's side of the course: predictions judged against the answer key, exercises graded on ranks.

Per exercise: dtlab's reference solution passes on real ranks, at least two
planted wrong solutions fail with a message naming what differs, and the
stub reports "not done yet" (all batched: one launch per world size). Then
the stored lessons: no prediction is pre-filled. Progress goes to a temporary
file (the session's DTLAB_HOME, see conftest.py).
"""

from __future__ import annotations

import ast
import datetime
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import nbformat
import pytest

from dtlab.course.exercises import grader, predictions, progress, registry, report
from dtlab.course.exercises.model import MEASURED, Mistake, Prediction
from dtlab.course.exercises.predictions import judge
from dtlab.lab.checks import SOURCES
from tests.exercise_answers import RIGHT, STUBS, WRONG, grade_many
from tests.harness import run_ranks, session_pool
from tests.rotation import BINDER, END_TO_END, NO_CLUSTER, ROTATION, _todays_share, skip_unless_today

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
ENTRY = Prediction(
    "t.bytes",
    3,
    "bytes per rank",
    "每个 rank 的字节数",
    answer=200,
    rel_tol=0.05,
    hint_en="bytes",
    hint_zh="字节数",
    mistakes=(
        Mistake(
            300,
            "you predicted 3Ψ: stage 1 reduce-scatters, so 2Ψ",
            "你预测的是 3Ψ：stage 1 用 reduce-scatter，所以是 2Ψ",
        ),
    ),
)


# --------------------------------------------------------------------------- predictions


def test_an_empty_prediction_says_so_in_both_languages_and_shows_the_measurement(monkeypatch):
    monkeypatch.delenv(predictions.FILL_ENV, raising=False)
    v = judge(ENTRY, None, 200)
    assert v.status == "none" and "no prediction yet: write yours and re-run" in v.en[0] and "200" in v.en[0]
    assert "还没有预测" in v.zh[0] and "200" in v.zh[0] and "bytes" in v.en[1]


def test_a_prediction_is_judged_within_its_stated_tolerance_and_a_miss_is_explained():
    right = judge(ENTRY, 205, 200)
    assert right.right and "within 5%" in right.en[0] and "误差 5% 以内" in right.zh[0]
    known = judge(ENTRY, 300, 200)
    assert known.status == "wrong" and "stage 1 reduce-scatters" in known.en[1] and "reduce-scatter" in known.zh[1]
    gap = judge(ENTRY, 400, 200)
    assert "2x the measurement" in gap.en[1] and "2 倍" in gap.zh[1]
    assert "exact" in judge(Prediction("k", 0, "n", "n", answer=[1]), [1], [1]).en[0]
    assert judge(Prediction("k", 0, "n", "n", answer="TP"), " tp", "tp").right


def test_a_one_word_answer_may_be_written_in_chinese_or_in_quotation_marks():
    """A Chinese-first learner writes 更低 for "lower" (the Chinese hint names the Chinese words); typed
    into a prediction box, a word may come in a Chinese keyboard's quotation marks, “更低”. A common
    mistake in Chinese gets its explanation too, and the verdict shows the word as written."""
    entry = registry.prediction("15.mfu_recompute")
    for typed in ("更低", "“更低”", " lower ", "'Lower'", "「更低」"):
        assert judge(entry, typed, "lower").right, typed
    assert "预测 更低（lower）" in judge(entry, "更低", "lower").zh[0]
    wrong = judge(entry, "更高", "lower")
    assert not wrong.right and "重计算增加的是硬件执行的 FLOPs" in wrong.zh[1]
    assert not judge(entry, "更快", "lower").right
    for key in ("01.try_term", "11.other_layout", "15.mfu_recompute", "12.drops_without_balance", "12.lower_loss"):
        entry = registry.prediction(key)
        first, option = entry.words_zh[0]
        assert f'"{first}"' in entry.hint_zh, key  # the hint names the first Chinese word
        assert judge(entry, first, option).right, key
        assert all(f'"{option}"' in entry.hint_en for _, option in entry.words_zh), key  # one of the options


def test_an_exact_answer_is_right_against_the_rounded_value_the_lesson_prints():
    """01.nvlink_half_peak: the 1 KiB share, 100 x 1024 / (1024 + N·α·β) = 0.05686 %, worked out exactly or
    rounded as the lesson prints it (4 places), is right; rounded to 2 places (0.06) it was 5.5% off."""
    from dtlab.planner.communication import bus_bandwidth, ring_allreduce_time
    from dtlab.planner.hardware import LINKS

    entry, link = registry.prediction("01.nvlink_half_peak"), LINKS["nvlink"]
    crossover = round(4 * link.latency_s * link.bandwidth_Bps)
    share = 100 * bus_bandwidth(1024 / ring_allreduce_time(1024, 4, link), 4, "all_reduce") / link.bandwidth_Bps
    printed = {"half-peak size (bytes)": crossover, "1 KiB share of peak (%)": round(share, 4)}
    assert printed == entry.answer
    exact = {"half-peak size (bytes)": 4 * 1e-6 * 450e9, "1 KiB share of peak (%)": 100 * 1024 / (1024 + 1.8e6)}
    assert judge(entry, exact, printed).right and judge(entry, entry.answer, printed).right


def test_fill_mode_takes_the_answer_key_and_is_not_the_learners(monkeypatch):
    monkeypatch.setenv(predictions.FILL_ENV, "1")
    v = judge(ENTRY, None, 200)
    assert v.right and v.filled and v.predicted == 200
    assert judge(Prediction("k", 0, "n", "n", answer=MEASURED), None, 7.5).right


def test_check_records_progress_for_a_key_of_the_answer_key(tmp_path, monkeypatch, capsys):
    from dtlab.lab import check

    monkeypatch.setenv("DTLAB_HOME", str(tmp_path))
    monkeypatch.delenv(predictions.FILL_ENV, raising=False)
    assert not check("01.ring_steps", None, 6)
    assert not (tmp_path / "progress.json").exists()  # nothing made yet
    assert not check("01.ring_steps", 3, 6)
    out = capsys.readouterr().out
    assert "no prediction yet" in out and "one phase" in out and "只是一个阶段" in out
    assert check("01.ring_steps", 6, 6)
    data = progress.load()
    assert data["predictions"]["01.ring_steps"] == {"lesson": 1, "made": True, "right": True, "tries": 2}
    predictions.TYPED["01.ring_steps"] = 6  # typed into a prediction box
    try:
        assert check("01.ring_steps", None, 6)
    finally:
        predictions.TYPED.clear()
    assert check("an unlisted check", 1.0, 1.04, rel_tol=0.05)  # the old behaviour, nothing recorded
    assert set(progress.load()["predictions"]) == {"01.ring_steps"}


def test_every_verdict_goes_to_the_check_log_when_one_is_named(tmp_path, monkeypatch, capsys):
    from dtlab.lab import check

    monkeypatch.setenv("DTLAB_HOME", str(tmp_path))
    monkeypatch.delenv(progress.LOG_ENV, raising=False)
    check("01.ring_steps", 6, 6)
    assert not (tmp_path / "checks.jsonl").exists()  # no log unless one is named
    log = tmp_path / "checks.jsonl"
    monkeypatch.setenv(progress.LOG_ENV, str(log))
    monkeypatch.setenv(predictions.FILL_ENV, "1")
    check("01.ring_steps", None, 6)  # filled from the answer key
    check("01.ring_steps", 3, 6)  # the learner's, wrong
    check("an unlisted check", 1.0, 2.0, rel_tol=0.05)
    monkeypatch.delenv(predictions.FILL_ENV)
    check("01.ring_steps", None, 6)
    rows = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert [(r["kind"], r["status"], r["by_key"]) for r in rows] == [
        ("prediction", "right", True),
        ("prediction", "wrong", False),
        ("check", "wrong", False),
        ("prediction", "none", False),
    ]
    assert rows[0]["key"] == "01.ring_steps" and rows[0]["lesson"] == 1


def test_prediction_box_parses_what_is_typed():
    from dtlab.lab.prediction_box import parse, prediction_box

    assert parse("1,024") == 1024 and parse("3e6") == 3e6 and parse(" ") is None and parse("tp") == "tp"
    box = prediction_box("01.ring_steps")
    box.value = "6"
    assert predictions.TYPED.pop("01.ring_steps") == 6


def test_lesson_16s_gradient_bytes_are_the_small_gpts():
    """16.link_ms is worked out from GRADIENT_BYTES: it must stay the small GPT's parameters in float32."""
    from dtlab.config import MODEL_PRESETS
    from dtlab.course.exercises.lesson16 import GRADIENT_BYTES
    from dtlab.model import build_model

    model = build_model(MODEL_PRESETS["small"], seed=0)
    assert GRADIENT_BYTES == 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_the_answer_key_is_whole():
    entries = registry.predictions()
    assert entries and all(e.name_en and e.name_zh and e.key == k for k, e in entries.items())
    for e in entries.values():
        assert (e.hint_en == "") == (e.hint_zh == ""), e.key
        assert all(m.en and m.zh for m in e.mistakes), e.key
        assert not any(
            predictions.agrees(m.value, e.answer, e.rel_tol) for m in e.mistakes if e.answer is not MEASURED
        ), f"{e.key}: a listed mistake is the right answer"


# --------------------------------------------------------------------------- progress


def test_progress_file_and_the_dtlab_progress_command(tmp_path, monkeypatch, capsys):
    from dtlab.cli import main

    monkeypatch.setenv("DTLAB_HOME", str(tmp_path))
    progress.record_prediction("01.ring_steps", 1, right=False)
    progress.record_prediction("01.ring_steps", 1, right=True)
    progress.record_exercise("01.ring_step", 1, passed=True)
    rows = {r["lesson"]: r for r in report.summary()}
    assert rows[1]["made"] == 1 and rows[1]["right"] == 1 and rows[1]["passed"] == 1
    assert rows[1]["predictions"] == len([p for p in registry.predictions().values() if p.lesson == 1])
    assert main(["progress"]) == 0
    out = capsys.readouterr().out
    assert "01 All-reduce" in out and "预测正确" in out and str(tmp_path) in out
    assert main(["progress", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert any(line["lesson"] == 1 and line["passed"] == 1 for line in lines)
    assert "<table>" in report.format_html(report.summary())
    shell = subprocess.run(
        [sys.executable, "-m", "dtlab.cli", "progress", "--lang", "zh"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DTLAB_HOME": str(tmp_path)},
    )
    assert shell.returncode == 0 and "全部课程" in shell.stdout, shell.stderr  # the command a learner types
    assert main(["progress", "--reset"]) == 0 and not (tmp_path / "progress.json").exists()
    (tmp_path / "progress.json").write_text("not json")
    assert progress.load()["predictions"] == {}  # a damaged file is a fresh start


# --------------------------------------------------------------------------- exercises


def test_dtlab_lab_has_an_instructor_switch():
    from dtlab.cli import build_parser

    assert build_parser().parse_args(["lab", "--solutions"]).solutions
    assert not build_parser().parse_args(["lab"]).solutions


def test_a_stub_is_not_done_without_starting_ranks(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DTLAB_HOME", str(tmp_path))
    monkeypatch.delenv(grader.SOLUTIONS_ENV, raising=False)
    assert all(grader.is_stub(stub) for stub in STUBS.values())
    assert grader.is_stub("def f(x):\n    ...\n") and not grader.is_stub("def f(x):\n    return x\n")
    verdict = grader.grade_source(registry.exercise("01.ring_step"), STUBS["01.ring_step"], "ring_step")
    assert verdict["not_done"] and "not done yet" in verdict["en"][0] and "尚未完成" in verdict["zh"][0]
    assert not (tmp_path / "progress.json").exists()


def test_every_exercise_has_planted_mistakes_and_a_stub():
    for key in registry.exercises():
        assert len(WRONG.get(key, ())) >= 2, f"{key}: plant at least two wrong solutions"
        assert key in STUBS, key


def _batches():
    """Per world size: (exercise key, source, name, what the verdict must say) for every case."""
    batches = defaultdict(list)
    for key, ex in registry.exercises().items():
        reference = grader.source_of(ex.reference)
        batches[ex.world_size].append((key, reference, ex.reference.__name__, None))
        for source in RIGHT.get(key, ()):
            batches[ex.world_size].append((key, source, ex.function, None))
        for source, says in WRONG.get(key, ()):
            batches[ex.world_size].append((key, source, ex.function, says))
        if key in STUBS:
            batches[ex.world_size].append((key, STUBS[key], ex.function, "not done yet"))
    return batches


def test_exercises_graded_on_real_ranks():
    """Reference (and other right answers) pass, planted mistakes fail naming what differs, stubs are not done:
    one launch per size."""
    for size, cases in sorted(_batches().items()):
        results = run_ranks(grade_many, size, [(k, s, n) for k, s, n, _ in cases], timeout=60)
        for i, (key, _, name, says) in enumerate(cases):
            per_rank = [r[i] for r in results]
            verdict = grader._report(registry.exercise(key), name, per_rank)
            text = "\n".join(verdict["en"] + verdict["zh"])
            if says is None:
                assert verdict["ok"], f"{key}: the reference fails:\n{text}"
            else:
                wanted = (says,) if isinstance(says, str) else says  # several: each must be said
                assert not verdict["ok"] and all(w in text for w in wanted), f"{key}: expected {says!r} in:\n{text}"
                assert any("rank" in line for line in verdict["en"][1:]) or verdict["not_done"], text


SEND_FIRST = """
def ring_step(chunks, step, rank, size):
    right, left = (rank + 1) % size, (rank - 1) % size
    incoming = torch.empty_like(chunks[0])
    dist.send(chunks[(rank - step - 1) % size], right)
    dist.recv(incoming, left)
    chunks[(rank - step - 2) % size].add_(incoming)
"""


def test_a_hang_names_the_rank_the_call_and_its_line_with_the_traceback():
    """A blocking send before the receive on every rank: the verdict names the rank that timed out, the
    learner's line and call, shows that rank's traceback through the learner's code, in both languages."""
    import dataclasses

    from dtlab.launch import RankPool

    exercise = dataclasses.replace(registry.exercise("01.ring_step"), world_size=2, timeout_s=2.0)
    pool = RankPool(max_size=2)
    try:
        verdict = grader.grade_source(exercise, SEND_FIRST, "ring_step", pool=pool)
    finally:
        pool.close()
    en, zh = "\n".join(verdict["en"]), "\n".join(verdict["zh"])
    rank = verdict["results"][0]["rank"]
    assert not verdict["ok"] and rank in (0, 1), en
    assert f"rank {rank} timed out waiting at line 5 of ring_step, `dist.send(" in en, en
    assert "a blocking send returns only once the peer has posted its receive" in en
    assert f"traceback of rank {rank} (your lines):" in en and 'File "<your ring_step>", line 5' in en
    assert f"rank {rank} 在 ring_step 的第 5 行 `dist.send(" in zh and "先挂上接收" in zh, zh


def test_a_wrong_number_is_named_by_its_shape(monkeypatch):
    """N or 2 times off, one off, or a neighbouring step's value: said in both languages (no ranks needed)."""
    import torch

    from dtlab.course.exercises import hints
    from dtlab.course.exercises.hints import factor_hint
    from dtlab.course.exercises.ranks import difference

    monkeypatch.setattr(hints, "world_size", lambda: 4)  # as on rank r of 4
    en, zh = difference("shard", "分片", torch.tensor([2.25, -1.0, 0.0]), torch.tensor([9.0, -4.0, 0.0]))
    assert en == "shard[0]: expected 2.25, got 9 — 4× too big: did you forget to divide by the world size N = 4?"
    assert "大了 4 倍：是不是忘了除以 world size N = 4？" in zh and "应为 2.25" in zh
    assert "4× too small" in factor_hint(2.0, 0.5, n=4)[0] and "小了 4 倍" in factor_hint(2.0, 0.5, n=4)[1]
    assert "2× too big" in factor_hint(3.0, 6.0, n=4)[0] and "half of it" in factor_hint(3.0, 1.5, n=4)[0]
    assert factor_hint(2.0, 4.0, n=2)[0].startswith("2× too big: did you forget to divide by the world size N = 2")
    assert "one more than expected: an off-by-one" in factor_hint(6, 7, n=4)[0] and "多 1" in factor_hint(6, 7)[1]
    assert "one less" in factor_hint(6, 5, n=4)[0]
    step = factor_hint(0.03, 0.0, n=1, neighbours=[("one step earlier (step -1)", "早一步（第 -1 步）", 0.0)])
    assert step == (
        "one step off: that is the value one step earlier (step -1)",
        "差了一步：这是早一步（第 -1 步）的值",
    )
    assert factor_hint(2.0, 2.5, n=4) is None and factor_hint("a", "b") is None


def test_grade_prints_and_records_and_instructor_mode_grades_the_reference(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DTLAB_HOME", str(tmp_path))
    monkeypatch.setenv(progress.LOG_ENV, str(tmp_path / "checks.jsonl"))
    namespace: dict = {}
    exec(STUBS["01.ring_step"], namespace)
    stub = namespace["ring_step"]
    monkeypatch.setattr(
        grader,
        "source_of",
        lambda fn: STUBS["01.ring_step"] if fn is stub else grader.textwrap.dedent(grader.inspect.getsource(fn)),
    )
    monkeypatch.setenv(grader.SOLUTIONS_ENV, "1")
    assert grader.grade("01.ring_step", stub, pool=session_pool())
    out = capsys.readouterr().out
    assert "instructor mode" in out and "def ring_step" in out and "✓" in out
    assert not (tmp_path / "progress.json").exists()  # the reference's pass is not the learner's
    from dtlab.course.exercises.lesson01 import ring_step

    assert grader.grade("01.ring_step", ring_step, pool=session_pool())
    assert progress.load()["exercises"]["01.ring_step"]["passed"]
    rows = [json.loads(line) for line in (tmp_path / "checks.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [(r["kind"], r["key"], r["status"], r["by_key"]) for r in rows] == [
        ("exercise", "01.ring_step", "right", True),
        ("exercise", "01.ring_step", "right", False),
    ]


# --------------------------------------------------------------------------- the stored lessons


def _prediction_assignments(source: str):
    """(name, value node) of every assignment to a prediction variable in a cell."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.startswith(("my_prediction", "my_answer")):
                    yield target.id, node.value


NOT_CONVERTED_YET: set[str] = set()
"""Lessons whose prediction cells still hold the answer (issue 13 converts them in order)."""


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason="not converted yet (issue 13)"))
        if p.stem[:2] in NOT_CONVERTED_YET
        else p
        for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    ],
    ids=lambda p: p.stem,
)
def test_no_stored_lesson_fills_in_a_prediction(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join(line for line in cell.source.splitlines() if not line.startswith(("%", "!")))
        for line in source.splitlines():
            if "your prediction" in line and "=" in line and "==" not in line:
                name, _, value = line.partition("=")
                assert value.split("#")[0].strip() == "None", f"{path.name}: pre-filled: {line.strip()}"
        for name, value in _prediction_assignments(source):
            assert isinstance(value, ast.Constant) and value.value is None, (
                f"{path.name}: {name} is pre-filled with {ast.unparse(value)}"
            )


LESSON_SOURCES = Path(__file__).resolve().parent.parent / "notebooks"


@pytest.mark.parametrize("source", sorted(LESSON_SOURCES.glob("[0-9][0-9]_*.py")), ids=lambda p: p.stem[:2])
def test_every_keyed_check_of_a_lesson_is_in_the_answer_key(source):
    """A check named like a key ("02.overlap_versions") that the key lacks would print the bare key,
    never be filled in, and never count in the learner's progress."""
    keys = set(registry.predictions())
    named = re.findall(r'check\(\s*"(\d\d\.[a-z0-9_]+)"', source.read_text(encoding="utf-8"))
    assert named or source.stem.startswith("17"), f"{source.name}: no keyed check"
    assert [k for k in named if k not in keys] == []


NONE_LINE = re.compile(
    r"^· (?P<name>.+?): no prediction yet: write yours and re-run; "
    rf"(?:{'|'.join(en for en, _ in SOURCES.values())}) (?P<measured>.*)$"
)


def _stored_lines(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    return [
        line
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        for line in out.get("text", "").splitlines()
    ]


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


@pytest.mark.parametrize("number", sorted(registry.by_lesson()), ids=lambda n: f"{n:02d}")
def test_the_answer_key_agrees_with_every_stored_measurement(number):
    """The answer key, filled in, is right against what each stored lesson measured (nbval holds the stored
    outputs to a fresh run), and every prediction and exercise of the key is asked in the lesson.

    The sound and cheap form of running every lesson with its answers filled in: the lessons already run
    under nbval, so the measurements are known; the slow test below also runs every lesson filled in."""
    paths = sorted(NOTEBOOKS.glob(f"{number:02d}_*.ipynb"))
    if not paths or f"{number:02d}" in NOT_CONVERTED_YET:
        pytest.skip(f"lesson {number:02d} is not stored yet, or not converted")
    lines = _stored_lines(paths[0])
    entries, exercises = registry.by_lesson()[number]
    by_name = {e.name_en: e for e in entries}
    measured = {}
    for line in lines:
        m = NONE_LINE.match(line)
        if m and m["name"] in by_name:
            measured[by_name[m["name"]].key] = _value(m["measured"])
    missing = sorted(e.key for e in entries if e.key not in measured)
    assert not missing, f"predictions never checked (empty) in the stored lesson: {missing}"
    for e in entries:
        if e.answer is not MEASURED:
            assert predictions.agrees(e.answer, measured[e.key], e.rel_tol), (
                f"{e.key}: the answer key says {e.answer!r}, the lesson measured {measured[e.key]!r}"
            )
    for ex in exercises:
        assert any(line.startswith(f"· {ex.title_en}: not done yet") for line in lines), (
            f"{ex.key}: the stored lesson does not grade a stub of {ex.function}"
        )


LESSONS = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def _end_to_end(stems: list[str]) -> list[str]:
    every = os.environ.get("DTLAB_EVERY_LESSON") == "1"
    return [stem for stem in stems if every or stem[:2] in END_TO_END]


def test_the_rotation_covers_every_end_to_end_run_in_five_days():
    days = [datetime.date(2026, 12, 4) + datetime.timedelta(days=k) for k in range(len(ROTATION))]
    assert sorted(key for day in days for key in _todays_share(day)) == sorted([*END_TO_END, NO_CLUSTER, BINDER])


@pytest.mark.slow
@pytest.mark.parametrize("stem", _end_to_end(LESSONS))
def test_a_lesson_run_with_its_answers_and_solutions_reports_every_check_right(stem, tmp_path, monkeypatch):
    """A lesson, end to end, with DTLAB_FILL_PREDICTIONS filling every empty prediction from the answer
    key and DTLAB_SOLUTIONS grading dtlab's reference for every stub: every verdict check() and grade()
    record (DTLAB_CHECK_LOG) must be right, every entry of the lesson's key must be among them, and the
    final check cell must print no ✗. Slow: about as long as the lesson's nbval run (END_TO_END says which
    lessons CI runs)."""
    from nbclient import NotebookClient

    skip_unless_today(stem[:2])
    log = tmp_path / "checks.jsonl"
    monkeypatch.setenv(predictions.FILL_ENV, "1")
    monkeypatch.setenv(grader.SOLUTIONS_ENV, "1")
    monkeypatch.setenv(progress.LOG_ENV, str(log))
    monkeypatch.setenv("DTLAB_HOME", str(tmp_path))
    nb = nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    verdicts = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []
    not_right = [v for v in verdicts if v["status"] != "right"]
    assert not not_right, f"{stem}: checks not reported right: {not_right}"
    entries, exercises = registry.by_lesson().get(int(stem[:2]), ((), ()))
    seen = {(v["kind"], v["key"]) for v in verdicts}
    missing = [e.key for e in entries if ("prediction", e.key) not in seen]
    missing += [ex.key for ex in exercises if ("exercise", ex.key) not in seen]
    assert not missing, f"{stem}: never checked: {missing}"
    lines = [
        line
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        for line in out.get("text", "").splitlines()
    ]
    wrong = [line for line in lines if line.startswith(("✗", "·"))]
    assert not wrong, "\n".join(wrong)
    assert not (tmp_path / "progress.json").exists()  # filled answers and references are not the learner's


@pytest.mark.slow
def test_lesson_16_without_namespaces_checks_its_predictions_against_formulas(tmp_path, monkeypatch):
    """A learner without root (DTLAB_NO_CLUSTER=1 shows it as root) gets the local runs, and the
    predictions the cluster would have checked (the link's milliseconds, the layouts' order, the
    hierarchical all-reduce's win) are checked against formulas from the bytes the local ranks sent,
    labelled "formula"; the answer key's answers are right against them, and nothing prints ✗."""
    from nbclient import NotebookClient

    skip_unless_today(NO_CLUSTER)
    log = tmp_path / "checks.jsonl"
    monkeypatch.setenv("DTLAB_NO_CLUSTER", "1")
    monkeypatch.setenv(predictions.FILL_ENV, "1")
    monkeypatch.setenv(grader.SOLUTIONS_ENV, "1")
    monkeypatch.setenv(progress.LOG_ENV, str(log))
    monkeypatch.setenv("DTLAB_HOME", str(tmp_path))
    nb = nbformat.read(NOTEBOOKS / "16_from_laptop_to_cluster.ipynb", as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    verdicts = {v["key"]: v["status"] for v in map(json.loads, log.read_text(encoding="utf-8").splitlines())}
    assert {k: verdicts.get(k) for k in ("16.link_ms", "16.link_order", "16.hier_faster")} == dict.fromkeys(
        ("16.link_ms", "16.link_order", "16.hier_faster"), "right"
    )
    lines = [
        line
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        for line in out.get("text", "").splitlines()
    ]
    assert not [line for line in lines if line.startswith("✗")], lines
    for name in ("link_ms", "link_order", "hier_faster"):  # labelled as the formula they are
        line = next(line for line in lines if line.startswith(f"✓ {registry.prediction(f'15.{name}').name_en}:"))
        assert ", formula " in line, line
