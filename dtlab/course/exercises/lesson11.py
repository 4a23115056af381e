"""Lesson 11 (checkpointing): the answer key, and the exercise "an atomic save".

The learner writes ``atomic_save(data, path)``: after it, ``path`` holds
``data``, and whatever happens during it (a full disk, a crash), ``path``
holds either its old content or ``data``, never a part of it, and nothing is
left behind: write to a temporary file beside the target, flush and fsync it,
then ``os.replace``. The reference solution is dtlab's own
:func:`dtlab.state.checkpoint.files.atomic_save`, which the trainer's checkpoints use. The check runs on 2 real ranks, each saving its own
rank file, through a disk that records what happens and can fail half-way
through a write: a normal save, then a save whose write fails, compared with
what dtlab's own writer leaves on the same disk.
"""

from __future__ import annotations

import builtins
import os
import shutil
import tempfile
from pathlib import Path

from dtlab.comm.collectives import group_size_and_rank
from dtlab.course.exercises.model import Exercise, Mistake, Prediction
from dtlab.course.exercises.ranks import NotDone, call, does_not_compile, learner_function, not_done, verdict
from dtlab.state.checkpoint.files import _write_atomically, atomic_save

BLOCK = 8 * 64 * 64 * 4  # one block's input, B x T x C fp32
_OPEN = builtins.open  # the real one (the grader swaps builtins.open while dtlab's writer runs)

PREDICTIONS = (
    Prediction(
        "11.recompute",
        11,
        "recompute on the small GPT",
        "小 GPT 上的重计算",
        answer={"fewer activation bytes": True, "same losses": True},
        hint_en='{"fewer activation bytes": bool, "same losses": bool}',
        hint_zh='{"fewer activation bytes": bool, "same losses": bool}',
        mistakes=(
            Mistake(
                {"fewer activation bytes": True, "same losses": False},
                "the recomputed forward is the same arithmetic on the same inputs: the same losses, bit for bit",
                "重计算的前向是在相同输入上做相同的运算：损失逐位相同",
            ),
        ),
    ),
    Prediction(
        "11.per_block",
        11,
        "bytes each block adds with recompute",
        "重计算时每个 block 增加的字节数",
        answer=[BLOCK] * 3,
        hint_en="a list of 3 byte counts (F0->F1, F1->F2, F2->F3)",
        hint_zh="3 个字节数的列表（F0->F1、F1->F2、F2->F3）",
        mistakes=(
            Mistake(
                [BLOCK // 8] * 3,
                "the input of a block is B x T x C = 8 x 64 x 64 values, 4 bytes each",
                "一个 block 的输入是 B x T x C = 8 x 64 x 64 个值，每个 4 字节",
            ),
        ),
    ),
    Prediction(
        "11.depth",
        11,
        "activation saving and depth",
        "激活值节省量与深度",
        answer={"saving grows with depth": True, "recompute peak, 4 -> 8 blocks": 4 * BLOCK},
        hint_en='{"saving grows with depth": bool, "recompute peak, 4 -> 8 blocks": bytes}',
        hint_zh='{"saving grows with depth": bool, "recompute peak, 4 -> 8 blocks": 字节}',
    ),
    Prediction(
        "11.forward_passes",
        11,
        "block forwards per step, 4 and 8 blocks, without and with recompute",
        "每步的 block 前向次数，4 与 8 个 block，不重计算与重计算",
        answer={4: {"keep all": 4, "recompute": 8}, 8: {"keep all": 8, "recompute": 16}},
        hint_en='{4: {"keep all": n, "recompute": n}, 8: {...}}',
        hint_zh='{4: {"keep all": n, "recompute": n}, 8: {...}}',
        mistakes=(
            Mistake(
                {4: {"keep all": 4, "recompute": 5}, 8: {"keep all": 8, "recompute": 9}},
                "every block's forward runs again, not one forward of the whole model",
                "每个 block 的前向都重跑一遍，而不是整个模型多一次前向",
            ),
        ),
    ),
    Prediction(
        "11.flops_ratio",
        11,
        "compute with recompute over without (forward 1, backward 2)",
        "重计算与不重计算的计算量之比（前向 1，反向 2）",
        answer=round(4 / 3, 2),
        rel_tol=0.01,
        hint_en="a ratio, 2 decimals",
        hint_zh="一个比值，保留 2 位小数",
        mistakes=(
            Mistake(
                2.0,
                "the extra forward is one of 1 + 2 = 3 units: 4/3, not twice",
                "多出来的前向只是 1 + 2 = 3 份中的一份：是 4/3，不是两倍",
            ),
        ),
    ),
    Prediction(
        "11.resume",
        11,
        "save at step 10, interrupt, resume",
        "第 10 步保存、中断、恢复",
        answer={"folders on disk": ["step00000010"], "resumed losses equal exactly": True},
        hint_en='{"folders on disk": [names], "resumed losses equal exactly": bool}',
        hint_zh='{"folders on disk": [文件夹名], "resumed losses equal exactly": bool}',
    ),
    Prediction(
        "11.other_layout",
        11,
        "resumed under TP 2 against ZeRO-3",
        "以 TP 2 恢复与 ZeRO-3 相比",
        answer="within rounding",
        hint_en='"exactly" or "within rounding"',
        hint_zh='"完全相等"（exactly）或 "舍入误差之内"（within rounding）',
        words_zh=(
            ("完全相等", "exactly"),
            ("完全相同", "exactly"),
            ("舍入误差之内", "within rounding"),
            ("舍入误差以内", "within rounding"),
        ),
        mistakes=(
            Mistake(
                "exactly",
                "the two layouts add the same numbers in another order: fp32 rounds them differently",
                "两种布局以不同的顺序把相同的数加起来：fp32 的舍入结果不同",
            ),
        ),
    ),
    Prediction(
        "11.other_seed",
        11,
        "a resume with another seed is refused",
        "换一个种子恢复会被拒绝",
        answer=True,
        hint_en="True or False",
        hint_zh="True 或 False",
        mistakes=(
            Mistake(
                False,
                "the seed decides the data order: resuming another seed's run would silently train on other batches",
                "种子决定数据顺序：用另一个种子恢复会悄悄地用别的批次训练",
            ),
        ),
    ),
    Prediction(
        "11.refused",
        11,
        "the damaged checkpoint is refused",
        "损坏的检查点被拒绝",
        answer=True,
        hint_en="True or False",
        hint_zh="True 或 False",
    ),
    Prediction(
        "11.try_resume_14",
        11,
        "first step of a run resumed after an interruption at step 14 (save_every = 5)",
        "第 14 步中断（save_every = 5）后恢复的运行从哪一步开始",
        answer=15,
        hint_en="a step",
        hint_zh="步数",
        mistakes=(
            Mistake(
                10,
                "the checkpoint named step 15 (what runs next) is committed as step 14 ends, "
                "before the ranks see the stop",
                "名为第 15 步（接下来要运行的步）的检查点在第 14 步结束时提交，早于各 rank 看到停止请求",
            ),
            Mistake(
                14,
                "a checkpoint is named by the step that runs next: step 14 is done, 15 is next",
                "检查点以接下来要运行的步命名：第 14 步已经完成，接下来是第 15 步",
            ),
        ),
    ),
)


# --------------------------------------------------------------------------- the exercise


class Disk:
    """``open`` and ``os`` as the learner's cell sees them: real files, with a log, and a disk that can fail.

    ``fail_after``: the number of bytes a file may receive before a write raises
    ``OSError`` (a full disk, a pulled cable), or None.
    """

    class File:
        def __init__(self, disk, f, path):
            self.disk, self.f, self.path, self.written = disk, f, path, 0

        def write(self, data):
            limit = self.disk.fail_after
            if limit is not None and self.written + len(data) > limit:
                self.f.write(data[: max(0, limit - self.written)])
                self.f.flush()
                raise OSError(28, "No space left on device (the grader's simulated disk)")
            self.written += len(data)
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def __init__(self, fail_after=None):
        self.fail_after, self.log, self.fds = fail_after, [], {}
        self.os = _LoggingOS(self)

    def open(self, path, mode="r", *args, **kwargs):
        f = _OPEN(path, mode, *args, **kwargs)
        if "w" in mode or "a" in mode or "+" in mode:
            self.fds[f.fileno()] = str(path)
            self.log.append(("open", str(path)))
            return Disk.File(self, f, str(path))
        return f


class _LoggingOS:
    """``os`` with ``fsync`` and ``replace`` logged; everything else is the real module."""

    def __init__(self, disk: Disk):
        self._disk = disk

    def fsync(self, fd):
        self._disk.log.append(("fsync", self._disk.fds.get(fd, fd)))
        return os.fsync(fd)

    def replace(self, src, dst):
        self._disk.log.append(("replace", str(src), str(dst)))
        return os.replace(src, dst)

    def __getattr__(self, name):
        return getattr(os, name)


def _run(save, folder: Path, fail_after) -> tuple[dict, list]:
    """Save new bytes over old ones with ``save(data, path, disk)``; what the folder holds after, and the log."""
    target = folder / "rank.pt"
    target.write_bytes(b"OLD" * 100)
    disk = Disk(fail_after)
    try:
        save(b"NEW" * 100, str(target), disk)
    except NotDone:
        raise
    except Exception:  # a failed save may raise: what counts is what is left on disk
        pass
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}, disk.log


def _judge(got: dict, expected: dict, log: list, target: str, failing: bool) -> tuple[str, str] | None:
    case_en, case_zh = (
        ("a write that fails half-way", "写到一半失败的情况") if failing else ("a normal save", "正常保存")
    )
    left = sorted(set(got) - set(expected))
    if left:
        return f"{case_en}: {left} is left behind in the folder", f"{case_zh}：文件夹里留下了 {left}"
    if got.get("rank.pt") != expected.get("rank.pt"):
        what = got.get("rank.pt", b"")
        kind = "a part of the new data" if what.startswith(b"NEW") else "something else"
        kind_zh = "新数据的一部分" if what.startswith(b"NEW") else "别的内容"
        want = "its old content" if failing else "the new data"
        want_zh = "原来的内容" if failing else "新数据"
        return (
            f"{case_en}: the target holds {len(what)} bytes, {kind}; it should hold {want}",
            f"{case_zh}：目标文件有 {len(what)} 字节，是{kind_zh}；它应当保存{want_zh}",
        )
    if not failing:
        replaces = [entry for entry in log if entry[0] == "replace" and entry[2] == target]
        if not replaces:
            return (
                "the new bytes reached the target without os.replace: a crash in between would leave a "
                "half-written file",
                "新字节没有经过 os.replace 就写进了目标：中途崩溃会留下写了一半的文件",
            )
        src = replaces[0][1]
        if Path(src).parent != Path(target).parent:
            return (
                f"the temporary file {src} is not beside the target: os.replace is atomic only within one filesystem",
                f"临时文件 {src} 不在目标旁边：os.replace 只在同一个文件系统内是原子的",
            )
        synced = [entry for entry in log[: log.index(replaces[0])] if entry == ("fsync", src)]
        if not synced:
            return (
                "os.replace came before os.fsync of the temporary file: after a power cut the name could "
                "point at bytes that never reached the disk",
                "os.replace 在临时文件的 os.fsync 之前：断电后，文件名可能指向从未写到磁盘上的字节",
            )
    return None


def _dtlab_writer(data, path, disk) -> None:
    """dtlab's own atomic write, on the same (possibly failing) disk."""
    builtins.open = disk.open
    try:
        _write_atomically(Path(path), data)
    finally:
        builtins.open = _OPEN


def check_atomic_save(ctx, source: str, name: str) -> dict:
    """On each rank: a normal save and a failing one, the learner's against dtlab's writer."""
    _, rank = group_size_and_rank(None)
    root = Path(tempfile.mkdtemp(prefix=f"dtlab-atomic-{rank}-"))
    problem = None
    raised: list = []

    def learners(data, path, disk):
        fn = learner_function(source, name, open=disk.open, os=disk.os)
        _, found = call(fn, data, path)
        if found:
            raised.append(found)
            raise OSError(found[0])

    try:
        learner_function(source, name)  # does the cell compile?
        for failing in (False, True):
            mine, theirs = root / f"dtlab-{failing}", root / f"yours-{failing}"
            mine.mkdir(), theirs.mkdir()
            expected, _ = _run(_dtlab_writer, mine, 150 if failing else None)
            raised.clear()
            got, log = _run(learners, theirs, 150 if failing else None)
            if raised and not failing:
                problem = raised[0]
            problem = problem or _judge(got, expected, log, str(theirs / "rank.pt"), failing)
            if problem:
                break
    except NotDone:
        return not_done(rank, name)
    except Exception as error:
        problem = does_not_compile(error)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return verdict(rank, problem)


EXERCISES = (
    Exercise(
        "11.atomic_save",
        11,
        "an atomic save",
        "原子保存",
        function="atomic_save",
        check=check_atomic_save,
        reference=atomic_save,
        world_size=2,
    ),
)
