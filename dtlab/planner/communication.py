"""What a collective costs on a link: the ring algorithms in the alpha-beta model.

Sending ``n`` bytes over a :class:`~dtlab.planner.hardware.Link` costs a fixed
start-up latency ``alpha`` plus ``n / beta``. A ring collective over ``N``
ranks is a sequence of such steps in which every rank sends one chunk to its
right neighbour at the same time, so the time of the whole collective is
(number of steps) x (time of one step):

    operation        steps      bytes each rank sends in total
    all-reduce       2(N-1)     2(N-1)/N * nbytes   (reduce-scatter, then all-gather)
    reduce-scatter   N-1        (N-1)/N  * nbytes
    all-gather       N-1        (N-1)/N  * nbytes
    all-to-all       N-1        (N-1)/N  * nbytes   (pairwise exchange, even pieces)

``nbytes`` is always the size of the *whole* tensor (for reduce-scatter, the
input on each rank; for all-gather, the output), which is the convention of
nccl-tests' PERFORMANCE.md. A world of one rank communicates nothing: cost 0.

At the end, what data, tensor and pipeline parallelism send per training
iteration, priced with these collectives (the planner's communication terms).

Every figure here is a prediction from nominal numbers, not a measurement.
"""

from __future__ import annotations

from dtlab.i18n import ConfigError
from dtlab.planner.hardware import Link


def _check_world(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(
            f"number of ranks must be a positive integer, got {n!r}",
            f"参与通信的 rank 数必须是正整数，收到的是 {n!r}",
        )


def _ring_time(nbytes: float, n: int, link: Link, *, steps_per_rank: int) -> float:
    """``steps_per_rank * (N-1)`` ring steps, each moving one 1/N chunk."""
    _check_world(n)
    if n == 1:
        return 0.0
    steps = steps_per_rank * (n - 1)
    chunk = nbytes / n  # each step moves one of the N chunks of the tensor
    return steps * link.time(chunk)


def ring_allreduce_time(nbytes: float, n: int, link: Link) -> float:
    """Predicted seconds for a ring all-reduce of ``nbytes`` over ``n`` ranks.

    2(N-1) steps (N-1 of reduce-scatter, N-1 of all-gather), each sending
    nbytes/N: ``alpha * 2(N-1) + 2(N-1)/N * nbytes / beta``. The factor
    2(N-1)/N is the all-reduce bus-bandwidth factor of nccl-tests'
    PERFORMANCE.md.
    """
    return _ring_time(nbytes, n, link, steps_per_rank=2)


def ring_reduce_scatter_time(nbytes: float, n: int, link: Link) -> float:
    """Predicted seconds for a ring reduce-scatter of an ``nbytes`` tensor over ``n`` ranks.

    N-1 steps of nbytes/N each: ``alpha * (N-1) + (N-1)/N * nbytes / beta``
    (nccl-tests' PERFORMANCE.md, ReduceScatter). ``nbytes`` is the full input,
    each rank ends with nbytes/N of it.
    """
    return _ring_time(nbytes, n, link, steps_per_rank=1)


def ring_all_gather_time(nbytes: float, n: int, link: Link) -> float:
    """Predicted seconds for a ring all-gather whose *output* is ``nbytes``, over ``n`` ranks.

    N-1 steps of nbytes/N each: ``alpha * (N-1) + (N-1)/N * nbytes / beta``
    (nccl-tests' PERFORMANCE.md, AllGather). Each rank starts with nbytes/N.
    """
    return _ring_time(nbytes, n, link, steps_per_rank=1)


def all_to_all_time(nbytes: float, n: int, link: Link) -> float:
    """Predicted seconds for an all-to-all of ``nbytes`` per rank over ``n`` ranks (pairwise exchange).

    N-1 steps; in each, every rank sends one nbytes/N piece to a different
    peer (dtlab/comm/all_to_all.py): ``alpha * (N-1) + (N-1)/N * nbytes / beta``,
    the cost of a reduce-scatter without the additions (nccl-tests'
    PERFORMANCE.md, AlltoAll: busbw factor (N-1)/N). Uneven pieces cost the
    largest step's piece per step; this is the even case.
    """
    return _ring_time(nbytes, n, link, steps_per_rank=1)


# nccl-tests' PERFORMANCE.md: busbw = algbw * factor, where the factor is the
# share of the data that crosses the slowest link in an optimal algorithm, so
# busbw can be compared with the hardware's peak whatever the number of ranks.
BUS_BANDWIDTH_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def bus_bandwidth(algbw: float, n: int, op: str) -> float:
    """Bus bandwidth from algorithm bandwidth, as nccl-tests reports it.

    ``algbw`` = nbytes / time. nccl-tests' PERFORMANCE.md defines
    ``busbw = algbw * 2(n-1)/n`` for all-reduce and ``algbw * (n-1)/n`` for
    reduce-scatter, all-gather and all-to-all (1 for broadcast and reduce).
    ``op`` uses torch.distributed's names: ``"all_reduce"``, ``"reduce_scatter"``,
    ``"all_gather"``, ``"all_to_all"``, ``"broadcast"``, ``"reduce"``.
    """
    _check_world(n)
    if op not in BUS_BANDWIDTH_FACTORS:
        raise ConfigError(
            f"unknown collective {op!r}; known: {', '.join(BUS_BANDWIDTH_FACTORS)}",
            f"未知的集合通信操作 {op!r}；可选的有：{', '.join(BUS_BANDWIDTH_FACTORS)}",
        )
    return algbw * BUS_BANDWIDTH_FACTORS[op](n)


def ring_bytes_sent_per_rank(nbytes: float, n: int, op: str) -> float:
    """Bytes each rank sends in a ring ``op`` on an ``nbytes`` tensor over ``n`` ranks.

    The same factors as :func:`bus_bandwidth`: an all-reduce of 64 MB on 4
    ranks sends 2 * 3/4 * 64 = 96 MB from every rank (nccl-tests'
    PERFORMANCE.md explains why this, not nbytes, is what the links carry).
    """
    return bus_bandwidth(nbytes, n, op)


# --- what each kind of parallelism sends per iteration -----------------------


def data_parallel_comm_time(grad_bytes: float, *, dp: int, zero: int, link) -> float:
    """Seconds of DP communication per iteration (a prediction).

    ZeRO (Rajbhandari et al. 2019), Sec. 7: plain DP all-reduces the
    gradients (a reduce-scatter plus an all-gather, 2Ψ per rank); stages 1 and
    2 reduce-scatter gradients and all-gather updated parameters, the same 2Ψ;
    stage 3 all-gathers parameters in forward and again in backward, 3Ψ = 1.5x.
    """
    if zero < 3:
        return ring_allreduce_time(grad_bytes, dp, link)
    return ring_reduce_scatter_time(grad_bytes, dp, link) + 2 * ring_all_gather_time(grad_bytes, dp, link)


def hybrid_sharding_comm_time(
    grad_bytes: float, *, dp: int, dp_shard: int, zero: int, shard_link, replicate_link
) -> dict[str, float]:
    """Seconds per iteration on each of hybrid sharding's two groups (HSDP; a prediction).

    ``dp_shard``: ZeRO-``zero``'s collectives (:func:`data_parallel_comm_time`) over K ranks
    on ``shard_link``; ``dp_replicate``: one all-reduce of the reduce-scattered 1/K shard over
    R = dp/K ranks on ``replicate_link``, 2(R-1)/R x Ψ/K per rank
    (dtlab/parallel/zero/hybrid.py). K = dp: plain ZeRO, nothing on the replicate link.
    """
    return {
        "dp_shard": data_parallel_comm_time(grad_bytes, dp=dp_shard, zero=zero, link=shard_link),
        "dp_replicate": ring_allreduce_time(grad_bytes / dp_shard, dp // dp_shard, replicate_link),
    }


def tensor_parallel_comm_time(
    activation_bytes: float,
    *,
    tp: int,
    layers: int,
    micro_batches: int,
    recompute: str,
    link,
    sequence_parallel: bool = False,
) -> float:
    """Seconds of TP communication per iteration on one rank (a prediction).

    Megatron-LM (Shoeybi et al. 2019, Sec. 3, Fig. 4): each block all-reduces
    its b x s x h activations twice in forward (operator g after attention and
    after the MLP) and twice in backward (operator f). Full recomputation
    repeats the forward pair. With sequence parallelism (Korthikanti et al.
    2022, Sec. 4.2.2) each all-reduce becomes a reduce-scatter plus an
    all-gather, the same ring cost, and backward all-gathers the two
    column-parallel inputs again, which SP stores split: two more all-gathers.
    """
    per_layer = 4 + (2 if recompute == "full" else 0)
    regather = 2 * ring_all_gather_time(activation_bytes, tp, link) if sequence_parallel else 0.0
    return micro_batches * layers * (per_layer * ring_allreduce_time(activation_bytes, tp, link) + regather)


def vocab_parallel_comm_time(
    activation_bytes: float, tokens: int, *, tp: int, pp: int, micro_batches: int, link
) -> float:
    """Seconds of TP communication per iteration for a vocabulary-parallel embedding and head.

    Megatron-LM (Shoeybi et al. 2019, Sec. 3): the embedding's output is a
    partial sum (each rank looks up only the tokens of its vocabulary slice),
    all-reduced forward; the head is column-parallel, so its input's gradient
    is all-reduced backward (operator f); the parallel cross-entropy all-
    reduces three fp32 values per token (the max logit, the sum of
    exponentials, the target's logit) instead of gathering (b, s, V). The
    embedding is on the first stage, the head on the last: with pp > 1 a
    stage pays the dearer of the two.
    """
    embedding = ring_allreduce_time(activation_bytes, tp, link)
    head = ring_allreduce_time(activation_bytes, tp, link) + 3 * ring_allreduce_time(4 * tokens, tp, link)
    return micro_batches * (embedding + head if pp == 1 else max(embedding, head))


def context_parallel_comm_time(
    kv_bytes: float, *, cp: int, layers: int, micro_batches: int, recompute: str, link
) -> float:
    """Seconds one rank spends passing K/V round the ring per iteration (a prediction, no overlap).

    Ring attention (dtlab.parallel.ring_attention): per layer and micro-batch, forward
    passes this rank's K and V block (``kv_bytes``, both together) cp - 1
    times; backward passes K/V with their accumulating gradients (2 x
    kv_bytes) cp - 1 times, then the gradients (kv_bytes) home once. Full
    recomputation runs the forward ring again. Each pass is one point-to-point
    message on ``link``, in both directions at once.
    """
    if cp == 1:
        return 0.0
    forward = (cp - 1) * link.time(kv_bytes)
    backward = (cp - 1) * link.time(2 * kv_bytes) + link.time(kv_bytes)
    per_layer = forward * (2 if recompute == "full" else 1) + backward
    return micro_batches * layers * per_layer


def pipeline_comm_time(activation_bytes: float, *, pp: int, micro_batches: int, link, virtual_stages: int = 1) -> float:
    """Seconds a stage spends in point-to-point transfers per iteration (a prediction).

    Each micro-batch crosses a stage boundary twice: its b x s x h activation
    forward, its gradient backward (Narayanan et al. 2021, Sec. 2.2). The
    interleaved schedule sends v times as often, once per chunk (Sec. 2.2.2).
    """
    return 0.0 if pp == 1 else 2 * micro_batches * virtual_stages * link.time(activation_bytes)


def scatter_gather_pipeline_time(
    activation_bytes: float, *, pp: int, tp: int, micro_batches: int, link, tp_link, virtual_stages: int = 1
) -> float:
    """:func:`pipeline_comm_time` with Megatron-LM's scatter/gather (Narayanan et al. 2021, Sec. 4.1).

    The t TP ranks of a stage hold the same boundary tensor: each sends only its 1/t of it, on its own
    network card, and the t receivers all-gather the pieces over ``tp_link`` (NVLink), so a transfer
    costs the network bsh/t instead of bsh.
    """
    if pp == 1 or tp == 1:
        return pipeline_comm_time(
            activation_bytes, pp=pp, micro_batches=micro_batches, link=link, virtual_stages=virtual_stages
        )
    transfer = link.time(activation_bytes / tp) + ring_all_gather_time(activation_bytes, tp, tp_link)
    return 2 * micro_batches * virtual_stages * transfer
