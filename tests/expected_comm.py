"""What each layout's algorithm must send per rank and step, written from the papers, not from dtlab.

tests/test_layouts.py compares it with what the tracer counted. Bytes are
the tensor's bytes (nccl-tests' "size": the output of an all-gather, the
input of a reduce-scatter, the message of a send); ``wire`` is what this rank
sends with a ring, bytes times nccl-tests' bus factor (2(N-1)/N for an
all-reduce, (N-1)/N for reduce-scatter and all-gather). Parameters are fp32.

* Tensor parallelism (Megatron, Shoeybi et al. 2019, Sec. 3): per block and
  micro-batch, two all-reduces forward (g) and two backward (f), each of the
  activations (B_micro, T, h).
* Pipeline (GPipe / 1F1B): per micro-batch, a stage sends its output forward
  and receives a gradient back (the last stage does neither forward), each
  (B_micro, T, h); the loss is broadcast from the last stage once. Interleaved
  1F1B: the same once per chunk, v times (not at the model's two ends).
* Data parallelism: one all-reduce per bucket of the stage's gradients (Li et
  al. 2020, Sec. 3.2.2: tensors packed in backward order, last first, a bucket
  closed when the next would pass ``bucket_mb``), 2(N-1)/N of each on the wire.
* ZeRO-1/2 (Rajbhandari et al. 2019, Sec. 7.2.1): one reduce-scatter of the
  gradients and one all-gather of the parameters, each of the flat buffer
  padded to a multiple of N: the same 2(N-1)/N on the wire. ZeRO-2 with
  DeepSpeed's ``overlap_comm`` cuts both into buckets of ``bucket_mb`` (here
  a multiple of N elements, the last bucket the rest): one reduce-scatter and
  one all-gather per bucket, the same bytes in all.
* ZeRO-3 (Sec. 7.2.2): per unit and micro-batch, an all-gather forward and one
  backward, and one reduce-scatter of its gradient.
* Hybrid sharding (``dp_shard`` = K; FSDP2's HSDP): ZeRO-2/3's calls as above
  with N = K, on the shard group, and one all-reduce of each reduce-scattered
  shard (ZeRO-2: the whole (S,) shard once; ZeRO-3: each unit's) on the
  replicate group of R = dp/K ranks, 2(R-1)/R of it on the wire.
"""

from __future__ import annotations

from dtlab.config import TrainConfig
from dtlab.model import build_model
from dtlab.parallel.zero.units import assign_units

FP32 = 4
BOOKKEEPING = {"all_reduce.loss", "all_gather_object.records", "broadcast.loss"}
"""Kinds every layout has besides its algorithm's: the loss for the record, the records themselves."""


def block_params(d: int, tp: int) -> int:
    """One block's parameters on a TP rank: LayerNorms and row-parallel biases whole, the rest / tp."""
    return 6 * d + (12 * d * d + 7 * d) // tp


def stage_params(config: TrainConfig, stage: int) -> int:
    """Parameters of pipeline stage ``stage`` on one TP rank (blocks split evenly over the stages)."""
    cfg = config.model_config()
    d, blocks = cfg.d_model, cfg.n_layer // config.pp
    n = blocks * block_params(d, config.tp)
    if stage == 0:
        n += cfg.vocab_size * d + cfg.seq_len * d  # token and position embeddings
    if stage == config.pp - 1:
        n += 2 * d + d * cfg.vocab_size  # final LayerNorm, untied head
    return n


def stage_tensors(config: TrainConfig, stage: int) -> list[int]:
    """Elements of each parameter tensor of a stage on one TP rank, in the model's order."""
    cfg = config.model_config()
    d, tp, blocks = cfg.d_model, config.tp, cfg.n_layer // config.pp
    block = [
        d,
        d,
        3 * d * d // tp,
        3 * d // tp,
        d * d // tp,
        d,
        d,
        d,
        4 * d * d // tp,
        4 * d // tp,
        4 * d * d // tp,
        d,
    ]  # ln1, qkv (column), attention proj (row), ln2, fc (column), proj (row)
    tensors = [cfg.vocab_size * d, cfg.seq_len * d] if stage == 0 else []
    tensors += block * blocks
    return tensors + ([d, d, cfg.vocab_size * d] if stage == config.pp - 1 else [])


def buckets(tensors: list[int], cap_bytes: float) -> list[int]:
    """Bytes of each gradient bucket: the tensors last first, a bucket closed once it holds the cap."""
    out: list[int] = []
    for numel in reversed(tensors):
        if not out or out[-1] >= cap_bytes:
            out.append(0)
        out[-1] += numel * FP32
    return out


def padded(numel: int, n: int) -> int:
    return -(-numel // n) * n


def expected_comm(config: TrainConfig, rank: dict) -> dict[str, dict]:
    """``{kind: {"count", "bytes"[, "wire"]}}`` this rank's algorithm sends in one step."""
    cfg = config.model_config()
    m = config.micro_batches * config.grad_accum  # micro-batches per step
    activation = config.batch_size // config.dp // m * cfg.seq_len * cfg.d_model * FP32
    out: dict[str, dict] = {}
    if config.tp > 1:
        calls = 2 * (cfg.n_layer // config.pp) * m
        forward = calls * (2 if config.recompute else 1)  # recomputation repeats the forward's g
        out["all_reduce.forward"] = {"count": forward, "bytes": forward * activation}
        out["all_reduce.backward"] = {"count": calls, "bytes": calls * activation}
    if config.pp > 1:
        # Interleaved (Narayanan et al. 2021, Sec. 2.2.2): each of the rank's v chunks sends and
        # receives once per micro-batch, but for the ends of the whole model (virtual stages 0, pv - 1).
        stage, last, v = rank["pp"], config.pp - 1, config.virtual_stages
        for kind, ends in (
            ("send.forward", stage == last),
            ("recv.backward", stage == last),
            ("recv.forward", stage == 0),
            ("send.backward", stage == 0),
        ):
            if v - ends:
                out[kind] = {"count": m * (v - ends), "bytes": m * (v - ends) * activation}
    if config.dp > 1:
        out.update(_data_parallel(config, rank, m))
    return out


def _data_parallel(config: TrainConfig, rank: dict, m: int) -> dict[str, dict]:
    if config.dp_shard is not None:
        return _hybrid(config, rank, m)
    n, psi = config.dp, stage_params(config, rank["pp"])
    if config.zero == 0:
        sizes = buckets(stage_tensors(config, rank["pp"]), config.bucket_mb * 2**20)
        assert sum(sizes) == psi * FP32
        return {
            "all_reduce": {
                "count": len(sizes),
                "bytes": sum(sizes),
                "wire": sum(round(2 * (n - 1) / n * b) for b in sizes),
            }
        }
    if config.zero == 2:
        length, size = padded(psi, n), padded(-(-int(config.bucket_mb * 2**20) // FP32), n)
        sizes = [min(size, length - start) * FP32 for start in range(0, length, size)]
        each = {"count": len(sizes), "bytes": length * FP32, "wire": sum(round((n - 1) / n * b) for b in sizes)}
        return {"reduce_scatter": each, "all_gather": dict(each)}
    if config.zero < 3:
        flat = padded(psi, n) * FP32
        return {
            "reduce_scatter": {"count": 1, "bytes": flat, "wire": round((n - 1) / n * flat)},
            "all_gather": {"count": 1, "bytes": flat, "wire": round((n - 1) / n * flat)},
        }
    units = unit_sizes(config)
    flat = sum(padded(u, n) for u in units) * FP32
    return {
        "all_gather": {"count": 2 * len(units) * m, "bytes": 2 * m * flat},
        "reduce_scatter": {"count": len(units) * m, "bytes": m * flat},
    }


def unit_sizes(config: TrainConfig) -> list[int]:
    """Elements of each of ZeRO-3's units of the whole model (pp = tp = 1)."""
    model = build_model(config.model_config(), seed=0)
    return [sum(p.numel() for p, _ in params) for _, _, params in assign_units(model)]


def _ring(kind: str, n: int, sizes: list[int]) -> dict:
    """count, bytes and ring wire bytes of one call of ``kind`` per size in ``sizes`` (bytes) over n ranks."""
    factor = 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n
    return {"count": len(sizes), "bytes": sum(sizes), "wire": sum(round(factor * b) for b in sizes)}


def _hybrid(config: TrainConfig, rank: dict, m: int) -> dict[str, dict]:
    """Hybrid sharding: ZeRO-2/3 over K ranks, then an all-reduce of each shard over R = dp / K."""
    k, r, psi = config.dp_shard, config.dp // config.dp_shard, stage_params(config, rank["pp"])
    if config.zero == 2:
        length, size = padded(psi, k), padded(-(-int(config.bucket_mb * 2**20) // FP32), k)
        windows = [min(size, length - start) * FP32 for start in range(0, length, size)]
        shards = [length // k * FP32]  # the (S,) shard, all-reduced once after the last bucket
        gathered, scattered = windows, windows
    else:
        units = unit_sizes(config)
        gathered = [padded(u, k) * FP32 for u in units] * 2 * m  # forward and backward
        scattered = [padded(u, k) * FP32 for u in units] * m
        shards = [padded(u, k) // k * FP32 for u in units] * m
    out = {}
    if k > 1:
        out["all_gather"], out["reduce_scatter"] = (
            _ring("all_gather", k, gathered),
            _ring("reduce_scatter", k, scattered),
        )
    if r > 1:
        out["all_reduce.replicas"] = _ring("all_reduce", r, shards)
    return out


GROUP_OF = {"all_gather": "dp_shard", "reduce_scatter": "dp_shard", "all_reduce.replicas": "dp_replicate"}
"""Hybrid sharding: the group each of its kinds runs on (the tracer's ``comm_groups``)."""


def expected_groups(config: TrainConfig, rank: dict) -> dict[str, dict]:
    """``{group: {"count", "bytes", "wire"}}`` hybrid sharding sends on its shard and replicate groups."""
    out: dict[str, dict] = {}
    for kind, want in _hybrid(config, rank, config.micro_batches * config.grad_accum).items():
        total = out.setdefault(GROUP_OF[kind], {"count": 0, "bytes": 0, "wire": 0})
        for key in total:
            total[key] += want[key]
    return out


def check_traced_groups(config: TrainConfig, records: list[dict]) -> None:
    """Every rank of every step: the tracer's bytes on the shard and on the replicate group are the formula's."""
    for record in records:
        for rank in record["ranks"]:
            traced = rank["comm_groups"]
            for group, want in expected_groups(config, rank).items():
                got = traced.get(group, {})
                assert (got.get("count"), got.get("bytes"), got.get("wire_bytes")) == (
                    want["count"],
                    want["bytes"],
                    want["wire"],
                ), (group, rank["rank"], got, want)


def check_traced_comm(config: TrainConfig, records: list[dict]) -> None:
    """Every rank of every step after the first sent what its algorithm must, and nothing else
    but bookkeeping; ranks that communicate were blocked in it some of the time."""
    for record in records[1:]:
        for rank in record["ranks"]:
            expected, traced = expected_comm(config, rank), rank["comm"]
            for kind, want in expected.items():
                got = traced.get(kind, {})
                assert got.get("count") == want["count"], (kind, rank["rank"], got, want)
                assert got.get("bytes") == want["bytes"], (kind, rank["rank"], got, want)
                if "wire" in want:
                    assert got["wire_bytes"] == want["wire"], (kind, rank["rank"], got, want)
            assert set(traced) <= set(expected) | BOOKKEEPING, (rank["rank"], set(traced) - set(expected))
            if config.world_size > 1:
                assert rank["comm_s"] > 0 and all(v["seconds"] >= 0 for v in traced.values())
