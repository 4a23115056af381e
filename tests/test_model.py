import torch

from dtlab.config import MODEL_PRESETS, ModelConfig
from dtlab.data import corpus_tokens, global_batch, micro_batches, shard
from dtlab.model import build_model, count_params


def test_presets_span_thousands_to_millions_and_match_the_formula():
    counts = {name: count_params(build_model(cfg, seed=0)) for name, cfg in MODEL_PRESETS.items()}
    assert counts == {name: cfg.param_count() for name, cfg in MODEL_PRESETS.items()}
    assert 1_000 < counts["tiny"] < 10_000 and counts["medium"] > 1_000_000


def test_same_seed_same_weights_and_no_dropout():
    cfg = MODEL_PRESETS["tiny"]
    a, b = build_model(cfg, seed=3), build_model(cfg, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert cfg.dropout == 0.0
    x = torch.randint(0, 256, (2, cfg.seq_len))
    a.train()
    assert torch.equal(a(x), a(x))  # training mode, yet deterministic: nothing is dropped


def test_attention_is_causal():
    cfg = ModelConfig(vocab_size=256, seq_len=8, n_layer=2, n_head=2, d_model=16)
    model = build_model(cfg, seed=0)
    x = torch.randint(0, 256, (1, 8))
    y = x.clone()
    y[0, 5:] = (y[0, 5:] + 1) % 256  # change only the future
    assert torch.allclose(model(x)[0, :5], model(y)[0, :5])
    assert not torch.allclose(model(x)[0, 5:], model(y)[0, 5:])


def test_batches_are_deterministic_and_shards_tile_the_global_batch():
    assert len(corpus_tokens()) > 1000
    x, y = global_batch(3, batch_size=8, seq_len=16, seed=0)
    x2, _ = global_batch(3, batch_size=8, seq_len=16, seed=0)
    assert torch.equal(x, x2) and x.shape == (8, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next tokens
    assert torch.equal(torch.cat([shard(x, index=i, count=4) for i in range(4)]), x)
    assert torch.equal(torch.cat([m for m, _ in micro_batches(x, y, 2)]), x)
