"""The glossary: complete bilingual entries, lookup by any name, the CLI, and
links to modules and lessons that are either built or honestly planned."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil

import pytest

from dtlab.course import glossary, glossary_cli
from dtlab.course import index as course
from dtlab.course.glossary import lookup
from dtlab.i18n import ConfigError

REQUIRED = {
    # the 16 terms of the reference glossary
    "data-parallelism",
    "model-parallelism",
    "tensor-parallelism",
    "pipeline-parallelism",
    "zero",
    "offloading",
    "gradient-accumulation",
    "gradient-checkpointing",
    "all-reduce",
    "nccl",
    "straggler",
    "mixed-precision",
    "bf16",
    "loss-scaling",
    "warmup",
    "loss-spike",
    # named in the overview and expected by users
    "3d-parallelism",
    "fsdp",
    "interconnect",
    "torchrun",
    "training-checkpoint",
    "gradient-clipping",
}
CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
YEAR = re.compile(r"\b(19|20)\d\d\b")


def cjk_share(text: str) -> float:
    chars = [c for c in text if not c.isspace()]
    return sum(bool(CJK.match(c)) for c in chars) / max(len(chars), 1)


TERMS = glossary.all_terms()
SLUGS = {term.slug for term in TERMS}


def test_every_required_term_is_present():
    assert REQUIRED <= SLUGS, sorted(REQUIRED - SLUGS)


@pytest.mark.parametrize("term", TERMS, ids=lambda term: term.slug)
def test_entry_is_complete_in_both_languages(term):
    assert term.term.strip() and term.zh.strip() and term.source.strip()
    for text in (term.definition, term.example):
        assert text.en.strip() and text.zh.strip()
        assert CJK.search(text.zh), f"{term.slug}: Chinese text has no Chinese: {text.zh!r}"
        assert cjk_share(text.en) < 0.2, f"{term.slug}: English text is mostly CJK: {text.en!r}"
    assert CJK.search(term.zh) or term.zh == term.abbr, term.zh
    assert YEAR.search(term.source), f"{term.slug}: source needs a year: {term.source!r}"
    assert term.modules and term.lessons
    for module in term.modules:
        assert re.fullmatch(r"dtlab/[a-z0-9_/]+\.py", module), module
    assert len(set(term.aliases)) == len(term.aliases)


def test_json_files_hold_exactly_the_documented_fields():
    for path in glossary.glossary_dir().glob("*.json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert list(data) == list(glossary.FIELDS), path.name
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", path.stem), path.name


@pytest.mark.parametrize(
    "name, slug",
    [
        ("zero", "zero"),
        ("ZeRO", "zero"),
        ("  Zero Redundancy Optimizer  ", "zero"),
        ("零冗余优化器", "zero"),
        ("zero-3", "zero"),
        ("dp", "data-parallelism"),
        ("DATA_PARALLELISM", "data-parallelism"),
        ("data parallelism", "data-parallelism"),
        ("数据并行", "data-parallelism"),
        ("all reduce", "all-reduce"),
        ("AllReduce", "all-reduce"),
        ("activation checkpointing", "gradient-checkpointing"),
        ("激活重计算", "gradient-checkpointing"),
        ("checkpoint", "training-checkpoint"),
        ("断点续训", "training-checkpoint"),
        ("慢节点", "straggler"),
        ("掉队者", "straggler"),
        ("BF16", "bf16"),
        ("nccl", "nccl"),
        ("NVIDIA 集合通信库", "nccl"),
        ("3D 并行", "3d-parallelism"),
        ("ｆｓｄｐ", "fsdp"),  # full-width, as typed with a Chinese input method
        ("1f1b", "1f1b"),
        ("bubble", "pipeline-bubble"),
        ("NVLink", "interconnect"),
    ],
)
def test_lookup_by_any_name(name, slug):
    assert lookup(name).slug == slug


def test_every_name_belongs_to_one_term():
    index = glossary.build_index(TERMS)  # raises if two terms share a name
    for term in TERMS:
        for name in term.names():
            if name:
                assert index[glossary.normalize(name)] is term


def test_unknown_term_gives_bilingual_error_with_suggestions():
    with pytest.raises(ConfigError) as caught:
        lookup("zerro")
    err = caught.value
    assert isinstance(err, ValueError)
    assert "zerro" in err.en and "ZeRO" in err.en and not CJK.search(err.en)
    assert "zerro" in err.zh and "零冗余优化器" in err.zh
    with pytest.raises(ConfigError) as caught:
        lookup("no such thing at all")
    assert "dtlab glossary" in caught.value.en and CJK.search(caught.value.zh)


def test_ambiguous_fragment_suggests_both_meanings():
    with pytest.raises(ConfigError) as caught:
        lookup("checkpoints")
    assert "gradient checkpointing" in caught.value.en
    assert "training checkpoint" in caught.value.en


def parse(*argv):
    parser = argparse.ArgumentParser(prog="dtlab glossary")
    glossary_cli.add_glossary_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_prints_the_chinese_entry(capsys):
    assert glossary_cli.run_glossary(parse("ZeRO", "--lang", "zh")) == 0
    out = capsys.readouterr().out
    zero = lookup("zero")
    assert out.startswith("零冗余优化器")
    assert zero.definition.zh in out and zero.example.zh in out
    assert zero.definition.en not in out
    assert "出处" in out and "dtlab/parallel/zero/__init__.py" in out and "notebooks/04_zero.ipynb" in out


def test_cli_english_entry_from_several_words(capsys):
    assert glossary_cli.run_glossary(parse("data", "parallelism", "--lang", "en")) == 0
    out = capsys.readouterr().out
    entry = lookup("dp")
    assert entry.definition.en in out and entry.definition.zh not in out
    assert "数据并行" in out  # the counterpart is always shown


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_cli_without_term_lists_every_term_with_its_counterpart(capsys, lang):
    assert glossary_cli.run_glossary(parse("--lang", lang)) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for term in TERMS:
        first, second = (term.zh, term.title("en")) if lang == "zh" else (term.title("en"), term.zh)
        assert any(line.startswith(first) and line.rstrip().endswith(second) for line in lines), term.slug


def test_cli_unknown_term_fails_in_both_languages(capsys):
    assert glossary_cli.run_glossary(parse("zerro")) == 2
    err = capsys.readouterr().err
    assert "no glossary entry" in err and "术语表中没有" in err


def test_render_and_markdown_carry_every_field():
    term = lookup("pipeline bubble")
    for lang in ("en", "zh"):
        text = glossary.render(term, lang)
        md = glossary.render_markdown(term, lang)
        for out in (text, md):
            assert term.zh in out and term.term in out and term.source in out
            assert term.definition.in_lang(lang) in out and term.example.in_lang(lang) in out
            assert all(module in out for module in term.modules)
        assert md.startswith("### ") and "(08_pipeline_parallelism.ipynb)" in md
    assert term._repr_markdown_() == glossary.render_markdown(term)


# ---------------------------------------------------------------- the course

LESSON_PATHS = {item.path for item in course.LESSONS}


def test_course_follows_the_curriculum():
    numbers = [item.number for item in course.LESSONS]
    assert numbers[:13] == list(range(13)) and numbers == sorted(set(numbers))
    for item in course.LESSONS:
        assert item.stem.startswith(f"{item.number:02d}_")
        assert item.title_en and CJK.search(item.title_zh)
        assert course.lesson(item.number) is course.lesson(item.path) is item


def test_every_lesson_comes_after_what_it_builds_on():
    """The course's order builds: each lesson's ``builds_on`` (concepts it uses without teaching them) are
    taught by lessons before it, the numbers are the files' order, and the glossary's flash cards come last."""
    position = {lesson.name: lesson.number for lesson in course.LESSONS}
    assert [lesson.number for lesson in course.LESSONS] == list(range(len(course.LESSONS)))
    assert all(lesson.stem.startswith(f"{lesson.number:02d}_") for lesson in course.LESSONS)
    late = [
        (lesson.stem, name)
        for lesson in course.LESSONS
        for name in lesson.builds_on
        if name not in position or position[name] >= lesson.number
    ]
    assert late == [], "a lesson leans on one that is not before it"
    assert course.LESSONS[-1].name == "glossary" and set(course.LESSONS[-1].builds_on) == set(position) - {"glossary"}
    # the order the issue asked for: mixed precision before ZeRO, SP and CP right after TP
    assert position["mixed_precision"] < position["zero"]
    assert position["long_sequences"] == position["tensor_parallelism"] + 1


def test_every_lesson_link_is_a_course_lesson():
    for term in TERMS:
        assert set(term.lessons) <= LESSON_PATHS, (term.slug, term.lessons)


def test_lessons_and_glossary_agree():
    taught = set()
    for item in course.LESSONS:
        for slug in item.terms:
            assert slug in SLUGS, f"lesson {item.stem} teaches unknown term {slug!r}"
            assert item.path in glossary.by_slug(slug).lessons, (item.stem, slug)
            taught.add(slug)
    assert taught == SLUGS, f"taught by no lesson: {sorted(SLUGS - taught)}"


def test_related_slugs_resolve():
    for term in TERMS:
        assert term.related, term.slug
        for slug in term.related:
            assert slug in SLUGS and slug != term.slug, (term.slug, slug)


# ----------------------------------------------------- links: built or planned

PLANNED = set(course.PLANNED_MODULES) | set(course.PLANNED_LESSONS)


def test_every_missing_link_is_planned():
    unplanned = {path: slugs for path, slugs in glossary.missing_links().items() if path not in PLANNED}
    assert not unplanned, (
        f"glossary links to files that neither exist nor are in dtlab.course.index.PLANNED_*: {unplanned}"
    )


def test_nothing_planned_exists_yet():
    built = sorted(path for path in PLANNED if (glossary.REPO_ROOT / path).exists())
    assert not built, f"{built} exist now: remove them from dtlab.course.index.PLANNED_MODULES / PLANNED_LESSONS"


def test_everything_planned_is_linked():
    linked = {path for term in TERMS for path in term.modules} | LESSON_PATHS
    assert PLANNED <= linked, sorted(PLANNED - linked)


def test_coverage_check_catches_a_broken_link(tmp_path):
    real = lookup("zero")
    broken = dataclasses.replace(
        real, modules=("dtlab/i18n.py", "dtlab/no_such_module.py"), lessons=("notebooks/99_nowhere.ipynb",)
    )
    missing = glossary.missing_links([broken])
    assert missing == {"dtlab/no_such_module.py": ("zero",), "notebooks/99_nowhere.ipynb": ("zero",)}
    assert not set(missing) <= PLANNED
    (tmp_path / "dtlab").mkdir()
    (tmp_path / "dtlab" / "no_such_module.py").write_text("")
    assert list(glossary.missing_links([broken], root=tmp_path)) == ["dtlab/i18n.py", "notebooks/99_nowhere.ipynb"]


# ------------------------------------------------------------- loading


def test_the_old_module_name_is_the_same_module():
    import dtlab
    import dtlab.course.glossary

    assert dtlab.course.glossary is glossary and dtlab.course.glossary.lookup("zero").slug == "zero"


def test_installed_copy_is_found_when_the_checkout_has_none(tmp_path, monkeypatch):
    installed = tmp_path / "_glossary"
    installed.mkdir()
    for slug in ("zero", "fsdp"):
        shutil.copy(glossary.glossary_dir() / f"{slug}.json", installed)
    monkeypatch.setattr(glossary, "SEARCH_PATH", (tmp_path / "glossary", installed))
    assert glossary.glossary_dir() == installed
    assert [term.slug for term in glossary.load(installed)] == ["fsdp", "zero"]


def test_no_glossary_anywhere_is_a_bilingual_error(tmp_path, monkeypatch):
    monkeypatch.setattr(glossary, "SEARCH_PATH", (tmp_path / "a", tmp_path / "b"))
    with pytest.raises(ConfigError) as caught:
        glossary.glossary_dir()
    assert CJK.search(caught.value.zh)


def test_malformed_entry_names_its_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text(json.dumps({"term": "broken"}), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        glossary.load_entry(path)
    assert "broken.json" in caught.value.en and "broken.json" in caught.value.zh
