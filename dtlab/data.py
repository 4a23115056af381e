"""The corpus shipped with dtlab, and deterministic batches and shards of it.

Tokens are bytes (vocabulary 256), so no tokenizer and no download is needed.
A batch depends only on ``(seed, step)``: the global batch of a step is the
same whatever the layout, and each data-parallel rank and each accumulation
micro-step takes its own contiguous slice of it. That is what makes a run on
4 ranks comparable, step by step, with the run on one.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import torch


@lru_cache(maxsize=None)
def corpus_tokens() -> torch.Tensor:
    """The whole corpus as a 1-D uint8 tensor of byte tokens."""
    text = resources.files("dtlab.corpus").joinpath("lab_notes.txt").read_bytes()
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).clone()


def global_batch(step: int, *, batch_size: int, seq_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets for one optimizer step, shape (B, T) each."""
    tokens = corpus_tokens()
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch_size,), generator=generator)
    rows = torch.stack([tokens[s : s + seq_len + 1] for s in starts.tolist()]).long()  # (B, T+1)
    return rows[:, :-1], rows[:, 1:]


def shard(batch: torch.Tensor, *, index: int, count: int) -> torch.Tensor:
    """Slice ``index`` of ``count`` equal, contiguous slices along the batch dimension."""
    per = batch.shape[0] // count
    return batch[index * per : (index + 1) * per]


def micro_batches(x: torch.Tensor, y: torch.Tensor, count: int):
    """Split a (B, T) batch into ``count`` micro-batches of (B / count, T)."""
    return [(shard(x, index=i, count=count), shard(y, index=i, count=count)) for i in range(count)]


def rank_batch(step: int, *, per_rank: int, seq_len: int, seed: int, rank: int, world_size: int):
    """This rank's ``per_rank`` sequences of step ``step``'s global batch of ``per_rank * world_size``."""
    x, y = global_batch(step, batch_size=per_rank * world_size, seq_len=seq_len, seed=seed)
    return shard(x, index=rank, count=world_size), shard(y, index=rank, count=world_size)  # (B / N, T)
