"""Before any rank starts: is there a checkpoint to resume, undamaged, of this model and this data?

A resume that cannot work should fail in the caller with a message that says
why, not inside the ranks after they have started. :func:`check_resume` reads
the newest save's manifest and verifies every rank file (size, sha256,
``weights_only``), then compares what the checkpoint says about its run with
the run about to start:

* the model: the same parameter names and shapes (a layout may differ: the
  checkpoint is resharded on load; the model may not);
* the data order: the same seed and global batch size. Every layout reads the
  same global batch at a step (``dtlab.data.global_batch``), split among its
  data-parallel ranks, so the layout may change; a different seed or batch
  size would silently continue on other data, so it is refused;
* the step: a checkpoint at or past ``steps`` leaves nothing to train.

Options the user changes on purpose (learning rate, precision, steps) are
taken as asked.
"""

from __future__ import annotations

from pathlib import Path

from dtlab.i18n import DtlabError
from dtlab.state.checkpoint.files import verify


def check_resume(directory, *, tensors: dict, run: dict, steps: int) -> tuple[Path, dict]:
    """Refuse, with a bilingual :class:`~dtlab.i18n.DtlabError`, a resume from ``directory`` that cannot work.

    ``tensors``: ``{name: shape}`` of the whole model about to train; ``run``:
    its ``model`` (the model's settings), ``seed`` and ``batch_size``;
    ``steps``: where it stops. Returns the folder and manifest to resume from.
    """
    folder, manifest = verify(directory)
    saved_run = manifest.get("run", {})
    saved_tensors = {name: tuple(shape) for name, shape in manifest.get("tensors", {}).items()}
    if saved_tensors != {name: tuple(shape) for name, shape in tensors.items()}:
        raise _another_model(folder, saved_run.get("model", {}), run["model"], saved_tensors, tensors)
    for key, flag in (("seed", "--seed"), ("batch_size", "--batch-size")):
        if saved_run.get(key) != run[key]:
            raise DtlabError(
                f"the checkpoint in {folder} was trained with {key}={saved_run.get(key)}, this run has "
                f"{key}={run[key]}: the data from its step {manifest['step']} on would not be the batches "
                f"that run would have read, silently; resume with {flag} {saved_run.get(key)}",
                f"{folder} 中的检查点训练时 {key}={saved_run.get(key)}，本次运行是 {key}={run[key]}："
                f"从第 {manifest['step']} 步起读到的数据将不再是原来那次运行会读到的批次，而且不会有任何提示；"
                f"请用 {flag} {saved_run.get(key)} 恢复",
            )
    if manifest["step"] >= steps:
        raise DtlabError(
            f"the checkpoint in {folder} is at step {manifest['step']}, and this run stops at --steps "
            f"{steps}: nothing is left to train (ask for more than {manifest['step']} steps)",
            f"{folder} 中的检查点已到第 {manifest['step']} 步，而本次运行在 --steps {steps} 处结束："
            f"没有剩下要训练的步（请指定大于 {manifest['step']} 的步数）",
        )
    return folder, manifest


def _another_model(folder: Path, saved: dict, ours: dict, saved_tensors: dict, tensors: dict) -> DtlabError:
    differences = [
        f"{key} {saved.get(key)} / {ours.get(key)}"
        for key in sorted(set(saved) | set(ours))
        if saved.get(key) != ours.get(key)
    ]
    if not differences:  # same settings, other parameters
        names = sorted(set(saved_tensors) ^ set(tensors)) or sorted(
            n for n in tensors if saved_tensors.get(n) != tuple(tensors[n])
        )
        differences = [f"parameter {names[0]}"] if names else []
    listed = ", ".join(differences) or "?"
    return DtlabError(
        f"the checkpoint in {folder} is of another model (checkpoint / this run: {listed}); resume with "
        "the model it was saved with (--model, --seq-len, --experts ...)",
        f"{folder} 中的检查点属于另一个模型（检查点 / 本次运行：{listed}）；请用保存时的模型设置恢复"
        "（--model、--seq-len、--experts 等）",
    )
