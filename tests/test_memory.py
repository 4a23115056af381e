import torch
import torch.nn as nn

from dtlab.config import MODEL_PRESETS
from dtlab.measure.memory import ActivationMeter, StepTimer, model_state_bytes
from dtlab.model import build_model


def test_saved_activations_are_counted_without_parameters_and_released_after_backward():
    layer = nn.Linear(10, 20)
    meter = ActivationMeter(layer)
    x = torch.randn(4, 10, requires_grad=True)
    with meter.track():
        y = layer(x)  # saves x (4 x 10 floats) and the weight (excluded: a parameter)
        z = torch.relu(y)  # saves its output (4 x 20 floats)
        assert meter.current == (4 * 10 + 4 * 20) * 4
        z.sum().backward()
    assert meter.current == 0
    assert meter.peak == (4 * 10 + 4 * 20) * 4


def test_storage_saved_twice_counts_once():
    meter = ActivationMeter()
    x = torch.randn(100, requires_grad=True)
    with meter.track():
        a = x.exp()  # saves its output a
        b = a * a  # saves a twice: same storage
        assert meter.current == 100 * 4
        b.sum().backward()
    assert meter.current == 0


def test_activation_memory_grows_with_the_batch():
    cfg = MODEL_PRESETS["tiny"]
    model = build_model(cfg, seed=0)
    peaks = []
    for batch in (2, 4, 6):
        meter = ActivationMeter(model)
        x = torch.randint(0, 256, (batch, cfg.seq_len))
        with meter.track():
            model(x, x).backward()
        peaks.append(meter.peak)
    # exactly linear in the batch (plus a small batch-independent part: positions, mask)
    assert peaks[2] - peaks[1] == peaks[1] - peaks[0] > 0
    assert peaks[1] - peaks[0] > 0.9 * peaks[0]


def test_model_states_bytes_count_each_tied_parameter_once():
    a = nn.Linear(4, 4, bias=False)
    b = nn.Linear(4, 4, bias=False)
    b.weight = a.weight  # tied
    params = list(a.parameters()) + list(b.parameters())
    optimizer = torch.optim.AdamW(a.parameters())
    assert model_state_bytes(params, optimizer) == {"params": 64, "grads": 0, "optimizer": 0}
    a(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    assert model_state_bytes(params, optimizer) == {"params": 64, "grads": 64, "optimizer": 128}


def test_step_timer_splits_wall_time():
    timer = StepTimer()
    with timer.compute():
        sum(range(10000))
    with timer.comm():
        pass
    times = timer.finish()
    assert times["wall_s"] >= times["compute_s"] + times["comm_s"]
    assert times["idle_s"] >= 0


def test_16_bit_weight_copies_are_copies_not_activations():
    """Under bf16 the cast weights autograd saves count as ``copies``; fp32 has none."""
    from dtlab.numerics.precision import apply_mixed_precision

    counts = {}
    for precision in ("fp32", "bf16"):
        model = apply_mixed_precision(nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8)), precision)
        meter = ActivationMeter(model)
        with meter.track():
            model(torch.randn(4, 8, requires_grad=True)).sum().backward()
        counts[precision] = (meter.copies_peak, meter.copies, meter.current)
    assert counts["fp32"] == (0, 0, 0)
    assert counts["bf16"][0] == (8 * 16 + 16 * 8) * 2  # both weights, 2 bytes each
    assert counts["bf16"][1:] == (0, 0)


def test_peak_is_the_highest_total_at_one_moment_worked_by_hand():
    """Linear(8, 16) -> ReLU -> Linear(16, 4), no biases, a batch of 16 fp32 rows.

    Forward saves x (16 x 8 x 4 = 512 B) for the first weight's gradient and
    the ReLU's output r (16 x 16 x 4 = 1024 B; the second Linear saves the
    same storage). Backward first produces the second weight's gradient
    (4 x 16 x 4 = 256 B) while the ReLU still holds r: 512 + 1024 + 256 =
    1792 B, more than the end of forward (1536) or the end of backward
    (all gradients: 256 + 512 = 768), and less than the categories' peaks
    summed (1536 + 768 = 2304).
    """
    from dtlab.measure.memory import LiveBytes, counting

    model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.ReLU(), nn.Linear(16, 4, bias=False))
    ledger, meter = LiveBytes(), ActivationMeter(model)
    ledger.watch_gradients(model.parameters())
    for _ in range(2):  # the second step starts from the ledger's start(), as the trainer's do
        model.zero_grad(set_to_none=True)
        ledger.start({})
        with counting(ledger), meter.track():
            model(torch.randn(16, 8)).sum().backward()
        assert (ledger.high, meter.peak, ledger.levels) == (1792, 1536, {"activations": 0, "grads": 768})


def test_each_category_agrees_with_the_storages_alive_after_a_warm_up_step():
    """The CPU's side of `make gpu-check`'s accountant check (dtlab/measure/allocator.py): a census of every
    storage alive stands in for torch.cuda.memory_allocated. Each category within 5% of what the census
    saw it add; beyond them (``workspace``) only AdamW's step counters; no first-use extra on the CPU."""
    from dtlab.data import global_batch
    from dtlab.measure.allocator import SLACK_BYTES, check_accountant
    from dtlab.measure.memory import workspace_bytes

    cfg = MODEL_PRESETS["small"]
    x, y = global_batch(0, batch_size=4, seq_len=cfg.seq_len, seed=0)
    found = check_accountant(build_model(cfg, seed=0), x, y, "cpu")
    assert found["ok"], found["categories"]
    for name, category in found["categories"].items():
        gap = abs(category["allocator"] - category["counted"])
        assert gap <= max(0.05 * category["counted"], SLACK_BYTES), (name, category)
    assert found["categories"]["params"]["allocator"] == found["categories"]["params"]["counted"] > 0
    params = len(list(build_model(cfg, seed=0).parameters()))
    assert found["workspace"]["after_first_step"] == found["workspace"]["after_second_step"] == 4 * params
    assert (found["first_step_extra"]["forward"], found["first_step_extra"]["backward"]) == (0, 0)
    assert workspace_bytes("cpu", 123) == 0  # a record's workspace on the CPU: no allocator to ask


def test_the_check_finds_what_the_accountant_does_not_count():
    """A model that keeps a copy of its hidden state every step (no saved tensor, no category) fails the check."""
    from dtlab.measure.allocator import check_accountant

    class Hoarder(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.gpt, self.kept = build_model(cfg, seed=0), []

        def forward(self, x, y):
            self.kept.append(torch.zeros(2**18))  # 1 MiB a step, uncounted
            return self.gpt(x, y)

    cfg = MODEL_PRESETS["tiny"]
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))  # (B, T)
    found = check_accountant(Hoarder(cfg), x, x, "cpu")
    activations = found["categories"]["activations"]
    assert not found["ok"] and not activations["ok"]
    # 1 MiB, less the batch autograd saves (counted, but alive before the step), plus the loss
    assert 2**20 - 1024 < activations["allocator"] - activations["counted"] <= 2**20
