"""``--attention eager|sdpa`` gives the same training on every layout; ``--compile`` trains; both refused
where they cannot apply, in both languages, before any rank starts.

One launch of 2 ranks trains the tiny GPT 20 steps with each kernel at dp 2, tp 2 (with and without
sp), pp 2, ep 2, under recompute and ZeRO-2, and resumes a checkpoint saved under one kernel with
the other: process start-up dominates on two cores, so everything shares it. The kernels themselves
are compared in this process, values and gradients.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from dtlab.cli import build_parser
from dtlab.config import TrainConfig
from dtlab.config.train_config import attention_for
from dtlab.model import ATTENTION_KERNELS, build_model, causal_attention, fused_attention
from dtlab.reference import adamw, make_optimizer
from dtlab.state.checkpoint import step_folder
from dtlab.train.loop import train_rank
from tests.harness import run_ranks
from tests.test_bad_inputs import CJK, assert_refused_in_both_languages, nothing_may_start, refused  # noqa: F401

LAYOUTS = [
    dict(dp=2),
    dict(tp=2),
    dict(tp=2, sp=True),
    dict(pp=2, micro_batches=2),
    dict(ep=2, experts=2),
    dict(dp=2, recompute=True),
    dict(dp=2, zero=2),
]
"""Every layout the acceptance names (dp, tp, tp + sp, pp, ep at 2), plus recompute and ZeRO-2."""


def _kernels_on_every_layout(ctx, layouts: list[dict], folder: str) -> dict:
    """Each layout trained 20 steps with each kernel; a save under sdpa at step 10 resumed under eager."""
    losses = {}
    for i, layout in enumerate(layouts):
        for kernel in ("eager", "sdpa"):
            summary = train_rank(ctx, TrainConfig(model="tiny", steps=20, attention=kernel, **layout))
            losses[i, kernel] = summary.get("losses")
    base = dict(model="tiny", dp=2, steps=20)  # the same 20 steps (the learning rate's decay spans them)
    train_rank(ctx, TrainConfig(**base, attention="sdpa", save=folder, save_every=10))
    at_10 = str(step_folder(folder, 10))
    losses["resumed"] = train_rank(ctx, TrainConfig(**base, attention="eager", resume=at_10)).get("losses")
    return losses


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("attention_checkpoint")
    return run_ranks(_kernels_on_every_layout, 2, LAYOUTS, str(folder), timeout=600)[0]


@pytest.mark.parametrize(
    "index", range(len(LAYOUTS)), ids=[",".join(f"{k}={v}" for k, v in d.items()) for d in LAYOUTS]
)
def test_sdpa_and_eager_train_to_the_same_losses(trained, index):
    eager, sdpa = trained[index, "eager"], trained[index, "sdpa"]
    assert len(eager) == len(sdpa) == 20
    assert max(abs(a - b) for a, b in zip(eager, sdpa)) <= 1e-5, (eager, sdpa)


def test_a_checkpoint_saved_under_one_kernel_resumes_under_the_other(trained):
    whole = trained[0, "eager"]  # dp=2, eager, 20 steps without a stop
    assert max(abs(a - b) for a, b in zip(trained["resumed"], whole[10:])) <= 1e-5
    assert len(trained["resumed"]) == 10


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_fused_kernel_equals_the_eager_one_values_and_gradients(dtype):
    generator = torch.Generator().manual_seed(0)
    for shape in [(2, 4, 16, 8), (1, 3, 33, 5), (3, 2, 1, 4)]:
        q, k, v = (torch.randn(shape, generator=generator, dtype=dtype).requires_grad_() for _ in range(3))
        weights = torch.randn(shape, generator=generator, dtype=dtype)
        eager, fused = causal_attention(q, k, v), fused_attention(q, k, v)
        assert_close(fused, eager, atol=1e-6, rtol=0)
        expected = torch.autograd.grad((eager * weights).sum(), (q, k, v))
        got = torch.autograd.grad((fused * weights).sum(), (q, k, v))
        for a, b in zip(got, expected):
            assert_close(a, b, atol=1e-6, rtol=0)


def test_the_kernel_is_the_configs_or_the_devices():
    assert set(ATTENTION_KERNELS) == set(TrainConfig.choices("attention")) == {"eager", "sdpa"}
    assert attention_for(TrainConfig(), "cpu") == "eager"
    assert attention_for(TrainConfig(), "cuda:1") == attention_for(TrainConfig(), torch.device("cuda", 0)) == "sdpa"
    assert attention_for(TrainConfig(attention="eager"), "cuda:0") == "eager"
    assert attention_for(TrainConfig(attention="sdpa"), "cpu") == "sdpa"
    model = build_model(TrainConfig(model="tiny", attention="sdpa").model_config(), seed=0)
    assert {block.attn.attention for block in model.blocks} == {"sdpa"}
    assert TrainConfig(model="tiny").model_config("cuda:0").attention == "sdpa"
    # Not a shape: the same parameters either way (so a checkpoint of one loads into the other).
    eager = build_model(TrainConfig(model="tiny", attention="eager").model_config(), seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), eager.parameters()))


def test_adamw_is_fused_only_on_cuda_tensors():
    on_cpu = adamw([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    assert not on_cpu.defaults.get("fused")
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))]}, {"params": [torch.nn.Parameter(torch.zeros(3))]}]
    assert len(make_optimizer(groups, TrainConfig()).param_groups) == 2
    if torch.cuda.is_available():
        on_gpu = make_optimizer([torch.nn.Parameter(torch.zeros(2, device="cuda"))], TrainConfig())
        assert on_gpu.defaults["fused"] is True


REFUSED = [
    ("train --attention sdpa --cp 2", "attention='sdpa'"),
    ("train --attention flash", "attention='flash'"),
    ("train --compile --pp 2 --micro-batches 2", "pp=2"),
    ("train --compile --cp 2", "cp=2"),
    ("train --compile --experts 2 --ep 2", "ep=2"),
    ("train --compile --dp 2 --zero 3", "zero=3"),
    ("train --compile --recompute", "recompute=True"),
]


@pytest.mark.parametrize("command,needle", REFUSED, ids=[c for c, _ in REFUSED])
def test_what_cannot_apply_is_refused_in_both_languages(command, needle, nothing_may_start, capsys):  # noqa: F811
    code, err = refused(command.split(), capsys)
    assert_refused_in_both_languages(code, err, needle)


def test_what_can_apply_is_not_refused():
    for config in (
        TrainConfig(cp=2, attention="eager"),
        TrainConfig(cp=2),  # unset: ring attention, as documented
        TrainConfig(dp=2, tp=2, sp=True, attention="sdpa", compile=True),
        TrainConfig(dp=2, recompute=True, attention="sdpa"),
        TrainConfig(dp=2, zero=2, compile=True, precision="bf16"),
    ):
        config.validate()


def test_train_help_shows_both_flags_in_both_languages():
    train = next(a for a in build_parser()._actions if a.choices and "train" in a.choices).choices["train"]
    actions = {a.dest: a for a in train._actions}
    assert actions["attention"].metavar == "eager|sdpa" and actions["attention"].default is None
    assert actions["compile"].default is False and not actions["compile"].metavar
    for name in ("attention", "compile"):
        help_text = actions[name].help
        assert " / " in help_text and CJK.search(help_text.split(" / ")[-1]), help_text
    text = " ".join(train.format_help().split())
    assert "--attention eager|sdpa" in text and "--compile" in text


def _compiled_steps(ctx) -> tuple[list, list] | str:
    """Eager and compiled losses on this rank, or why torch.compile cannot build a kernel here (probed in the
    rank, which compiles anyway, rather than in the test process as well)."""
    reason = _compiler_works()
    if reason:
        return reason
    eager = train_rank(ctx, TrainConfig(model="tiny", steps=2)).get("losses")
    compiled = train_rank(ctx, TrainConfig(model="tiny", steps=2, compile=True)).get("losses")
    return eager, compiled


def _compiler_works() -> str | None:
    """None where torch.compile builds a kernel on this machine; else why not."""
    try:
        torch.compile(lambda x: x * 2)(torch.ones(2))
    except Exception as error:  # no C++ compiler, an unsupported Python, ...
        return f"torch.compile does not work on this machine: {type(error).__name__}: {error}"[:300]
    return None


def test_compile_trains_the_tiny_model_to_the_same_losses():
    """--compile at dp 1, 2 steps (compiling on the CPU takes tens of seconds, more the first time)."""
    got = run_ranks(_compiled_steps, 1, timeout=600)[0]
    if isinstance(got, str):
        pytest.skip(got)
    eager, compiled = got
    assert len(compiled) == 2
    assert max(abs(a - b) for a, b in zip(eager, compiled)) <= 1e-5, (eager, compiled)
