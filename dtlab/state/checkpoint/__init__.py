"""Training checkpoints: everything a run needs to continue, written atomically, verified, and reshardable.

Not to be confused with activation checkpointing (:mod:`dtlab.numerics.gradient_checkpointing`).
A resumed run continues the *same* loss curve only if it restores all of it:
the weights, the optimizer state (Adam's moments and step count), the loss
scaler, the position in the data, the spike detector's recent losses (and its
rollback snapshot), and the random-number generators. The learning rate needs
no saving: it is a function of the step.

The package, by role:

    files.py     one file per rank plus a manifest; atomic writes, sha256, weights_only (the format)
    rng.py       the random-number generators as tensors and plain values
    reshard.py   each saved piece's place in the whole tensor, and reading any layout's pieces back
    resume.py    the checks a resume must pass before any rank starts

What the trainer (``dtlab/train/checkpoints.py``) puts in a rank file::

    pieces         its training state, each piece a range of a whole tensor of the model:
                   {name, shape, offsets, sizes, start, stop, tensors: {param, exp_avg, exp_avg_sq},
                    scalars: {step}} (a piece several ranks hold alike is written by the first)
    scaler         the fp16 loss scaler (None otherwise)
    data_position  the step to continue from
    spike_guard    the detector's recent losses, and the rollback snapshot as pieces of its own
    rng            this rank's generators

and in the manifest, beside the files' sizes and hashes: the layout that wrote
it, ``run`` (the model's settings, seed and batch size) and ``tensors``
(every whole tensor's name and shape). Because each piece says where it
belongs, a checkpoint written at one layout resumes at another (ZeRO-3 on two
ranks into tensor parallelism, 2 x 2 x 2 into ZeRO-1 on four, four pipeline
stages into one process): each rank gathers the whole tensors its parameters
overlap and slices out its own.
"""

from dtlab.state.checkpoint.files import (
    FORMAT,
    MANIFEST,
    latest_step,
    load_all,
    load_checkpoint,
    rank_file,
    read_manifest,
    save_checkpoint,
    step_folder,
    verify,
)
from dtlab.state.checkpoint.reshard import GlobalSource, Place, keep_first_copies, to_global
from dtlab.state.checkpoint.resume import check_resume
from dtlab.state.checkpoint.rng import capture_rng_state, restore_rng_state

__all__ = [
    "FORMAT",
    "MANIFEST",
    "GlobalSource",
    "Place",
    "capture_rng_state",
    "check_resume",
    "keep_first_copies",
    "latest_step",
    "load_all",
    "load_checkpoint",
    "rank_file",
    "read_manifest",
    "restore_rng_state",
    "save_checkpoint",
    "step_folder",
    "to_global",
    "verify",
]
