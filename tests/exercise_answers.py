"""Planted wrong answers to the course's exercises, and the rank function that grades many at once.

Each exercise (``dtlab.course.exercises``) gets at least two wrong solutions a
learner might write, each with the words its verdict must contain (what the
grader names as differing). ``tests/test_exercises.py`` grades all of them,
the reference solutions and the stubs, batched into one launch per world size.
"""

from __future__ import annotations

import inspect

from dtlab.course.exercises import registry
from dtlab.course.exercises.grader import source_of
from dtlab.course.exercises.lesson01 import ring_step
from dtlab.course.exercises.lesson02 import assign_buckets
from dtlab.course.exercises.lesson03 import update_scale
from dtlab.course.exercises.lesson04 import zero_shard
from dtlab.course.exercises.lesson09 import rank_groups
from dtlab.course.exercises.lesson10 import is_spike, warmup_lr
from dtlab.course.exercises.lesson13 import scores_bytes
from dtlab.course.exercises.lesson14 import quantize_e4m3
from dtlab.course.exercises.lesson16 import hierarchical_all_reduce

WRONG: dict[str, list[tuple[str, str]]] = {}
"""Exercise key -> [(wrong source, words its verdict must contain), ...]."""
RIGHT: dict[str, list[str]] = {}
"""Exercise key -> [right source other than the reference, ...]: other ways a learner may get it right."""


def stub(exercise) -> str:
    """The stub a stored lesson holds: the exercise's function, its body not written yet."""
    parameters = ", ".join(inspect.signature(exercise.reference).parameters)
    return (
        f"def {exercise.function}({parameters}):\n    raise NotImplementedError  # your code here / 在这里写你的代码\n"
    )


def planted(reference, *edits: tuple[str, str]) -> str:
    """The reference solution's source with each ``(old, new)`` edit made: a learner's mistake, written as
    its difference from the right answer (each ``old`` must stand exactly once in the source)."""
    source = source_of(reference)
    for old, new in edits:
        assert source.count(old) == 1, f"{reference.__name__}: {old!r} stands {source.count(old)} times"
        source = source.replace(old, new)
    return source


def grade_many(ctx, items: list[tuple[str, str, str]]) -> list[dict]:
    """On each rank: the check of every (exercise key, source, function name), in order."""
    from dtlab.course.exercises.registry import exercise

    return [exercise(key).check(ctx, source, name) for key, source, name in items]


# --------------------------------------------------------------------------- lesson 01

WRONG["01.ring_step"] = [
    # sends its own chunk every step: the partial sums never travel on
    (
        planted(
            ring_step,
            ("chunks[(rank - step - 1) % size]", "chunks[rank]"),
            ("chunks[(rank - step - 2) % size]", "chunks[(rank - 1) % size]"),
        ),
        "after step 0, chunks[",
    ),
    # copies instead of adding: the neighbour's partial sum replaces this rank's contribution
    (planted(ring_step, ("mine.add_(incoming)", "mine.copy_(incoming)")), "expected"),
    # the ring turned the other way round: the right chunks arrive at the wrong ranks
    (
        planted(
            ring_step,
            (
                "right, left = (rank + 1) % size, (rank - 1) % size",
                "right, left = (rank - 1) % size, (rank + 1) % size",
            ),
        ),
        "after step 0",
    ),
]


# --------------------------------------------------------------------------- lesson 02

WRONG["02.buckets"] = [
    # the model's order: the first layers' gradients, made last by backward, would hold up bucket 0
    (planted(assign_buckets, ("reversed(range(len(sizes)))", "range(len(sizes))")), "buckets[0]"),
    # keeps every bucket under the cap: one bucket more than DDP's rule, one collective more per step
    (
        """
def assign_buckets(sizes, cap_bytes):
    buckets, used = [], 0
    for i in reversed(range(len(sizes))):
        if not buckets or used + sizes[i] > cap_bytes:
            buckets.append([])
            used = 0
        buckets[-1].append(i)
        used += sizes[i]
    return buckets
""",
        "cap 262,144 bytes",
    ),
    # forgets the embeddings (parameter 0): its gradient would never be averaged
    (
        """
def assign_buckets(sizes, cap_bytes):
    return [[i] for i in reversed(range(1, len(sizes)))]
""",
        "parameter 0 is in no bucket",
    ),
]


# --------------------------------------------------------------------------- lesson 04

WRONG["04.shard"] = [
    # bounds without padding: Ψ // N elements each, the last few values belong to no rank
    (
        """
def zero_shard(flat_grad, rank, size):
    shard = flat_grad.numel() // size
    padded = torch.zeros(-(-flat_grad.numel() // size) * size)
    padded[:flat_grad.numel()] = flat_grad
    mine = torch.empty(-(-flat_grad.numel() // size))
    dist.reduce_scatter_single(mine, padded)
    return rank * shard, (rank + 1) * shard, mine / size
""",
        "(start, stop)",
    ),
    # the sum, not the mean: every rank's optimizer would step N times too far
    (
        planted(zero_shard, ("mine / size", "mine")),
        ("shard[0]: expected", "4× too big: did you forget to divide by the world size N = 4?", "大了 4 倍"),
    ),
    # the mean taken twice
    (planted(zero_shard, ("mine / size", "mine / size / size")), "4× too small"),
    # right numbers through an all-reduce: 2Ψ on the wire where ZeRO moves Ψ
    (
        planted(
            zero_shard,
            ("dist.reduce_scatter_single(mine, padded)", "dist.all_reduce(padded)"),
            ("mine / size", "padded[rank * shard:(rank + 1) * shard] / size"),
        ),
        "all-reduced the whole gradient",
    ),
]


# --------------------------------------------------------------------------- lesson 05

WRONG["05.offload_step"] = [
    # the update stays on the host: the device trains on stale parameters
    (
        """
def offloaded_step(params, masters, host_grads, optimizer):
    moved = {"d2h": 0, "h2d": 0}
    with torch.no_grad():
        for p, m, g in zip(params, masters, host_grads):
            g.copy_(p.grad)
            m.grad = g
            moved["d2h"] += p.grad.numel() * p.grad.element_size()
        optimizer.step()
        for p in params:
            moved["h2d"] += p.numel() * p.element_size()
    return moved
""",
        "after step 0, params[",
    ),
    # the gradients are copied but never given to the masters: the host optimizer has nothing to do
    (
        """
def offloaded_step(params, masters, host_grads, optimizer):
    moved = {"d2h": 0, "h2d": 0}
    with torch.no_grad():
        for p, g in zip(params, host_grads):
            g.copy_(p.grad)
            moved["d2h"] += p.grad.numel() * p.grad.element_size()
        optimizer.step()
        for p, m in zip(params, masters):
            p.copy_(m)
            moved["h2d"] += p.numel() * p.element_size()
    return moved
""",
        "after step 0, masters[",
    ),
    # right update, but counts the optimizer state as moved too
    (
        """
def offloaded_step(params, masters, host_grads, optimizer):
    with torch.no_grad():
        for p, m, g in zip(params, masters, host_grads):
            g.copy_(p.grad)
            m.grad = g
        optimizer.step()
        for p, m in zip(params, masters):
            p.copy_(m)
    total = sum(p.numel() * 4 for p in params)
    return {"d2h": 4 * total, "h2d": total}
""",
        "bytes['d2h']",
    ),
]


# --------------------------------------------------------------------------- lesson 06

WRONG["06.parallel_mlp"] = [
    # no f: forward is right, but each rank's input gradient is only its own slice's share
    (
        """
def parallel_mlp(x, fc, proj, rank, size):
    n = fc.out_features // size
    mine = slice(rank * n, (rank + 1) * n)
    h = F.linear(x, fc.weight[mine], fc.bias[mine])
    return g(F.linear(F.gelu(h), proj.weight[:, mine])) + proj.bias
""",
        "x.grad[",
    ),
    # the row-parallel bias added on every rank before the sum: counted TP times
    (
        """
def parallel_mlp(x, fc, proj, rank, size):
    n = fc.out_features // size
    mine = slice(rank * n, (rank + 1) * n)
    h = F.linear(f(x), fc.weight[mine], fc.bias[mine])
    return g(F.linear(F.gelu(h), proj.weight[:, mine], proj.bias))
""",
        "output[",
    ),
    # no g: each rank returns only its partial sum
    (
        """
def parallel_mlp(x, fc, proj, rank, size):
    n = fc.out_features // size
    mine = slice(rank * n, (rank + 1) * n)
    h = F.linear(f(x), fc.weight[mine], fc.bias[mine])
    return F.linear(F.gelu(h), proj.weight[:, mine]) + proj.bias
""",
        "output[",
    ),
]


# --------------------------------------------------------------------------- lesson 08

WRONG["08.one_f_one_b"] = [
    # GPipe's order: correct, but holds all m micro-batches' activations
    (
        """
def one_f_one_b(stage, stages, micro_batches):
    return [f"F{i}" for i in range(micro_batches)] + [f"B{i}" for i in range(micro_batches)]
""",
        "stage 1 holds 4 micro-batches",
    ),
    # no warm-up: each stage waits for its own backward before the next forward, the pipeline never fills
    (
        """
def one_f_one_b(stage, stages, micro_batches):
    return [a for i in range(micro_batches) for a in (f"F{i}", f"B{i}")]
""",
        "more than GPipe",
    ),
    # one forward too many before the first backward
    (
        """
def one_f_one_b(stage, stages, micro_batches):
    warmup = min(stages - stage, micro_batches)
    order = [f"F{i}" for i in range(warmup)]
    for i in range(micro_batches - warmup):
        order += [f"F{warmup + i}", f"B{i}"]
    return order + [f"B{i}" for i in range(micro_batches - warmup, micro_batches)]
""",
        "1F1B holds at most",
    ),
]


# --------------------------------------------------------------------------- lesson 07 (longctx)

WRONG["07.merge"] = [
    # forgets the weights: averages the two blocks as if they had the same normaliser
    (
        """
def my_merge(o_a, lse_a, o_b, lse_b):
    return (o_a + o_b) / 2, torch.maximum(lse_a, lse_b)
""",
        ("zigzag layout: output[", "your lse is the running max only", "你的 lse 只是运行最大值"),
    ),
    # the right output of two blocks, but the log-sum-exp of the larger one only: the next merge
    # (a later chunk sees three blocks) and backward both go wrong
    (
        """
def my_merge(o_a, lse_a, o_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    o = torch.exp(lse_a - lse)[..., None] * o_a + torch.exp(lse_b - lse)[..., None] * o_b
    return o, torch.maximum(lse_a, lse_b)
""",
        "your lse is the running max only",
    ),
    # weights exp(lse) without normalising by the merged sum
    (
        """
def my_merge(o_a, lse_a, o_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    return torch.exp(lse_a)[..., None] * o_a + torch.exp(lse_b)[..., None] * o_b, lse
""",
        "the output overflows",
    ),
]


# --------------------------------------------------------------------------- lesson 09

WRONG["09.rank_groups"] = [
    # PP innermost: stages would sit on neighbouring GPUs and TP would cross machines
    (planted(rank_groups, ("(p * dp + d) * tp + t", "(t * dp + d) * pp + p")), "tp groups (sorted)"),
    # DP and TP swapped: DP replicas adjacent, TP ranks tp apart
    (planted(rank_groups, ("(p * dp + d) * tp + t", "(p * tp + t) * dp + d")), "groups (sorted)"),
    # forgets the pipeline groups
    (
        planted(
            rank_groups,
            ('"pp": [[rank(d, t, p) for p in range(pp)] for d in range(dp) for t in range(tp)]', '"pp": []'),
        ),
        "pp groups (sorted)",
    ),
]


# --------------------------------------------------------------------------- lesson 03

WRONG["03.update_scale"] = [
    # no vote: rank 0 never sees rank 1's overflow, and the ranks' scales drift apart
    (
        """
def update_scale(scale, clean_steps, overflow_here, growth_interval):
    if overflow_here:
        return scale * 0.5, 0, True
    clean_steps += 1
    if clean_steps == growth_interval:
        return scale * 2.0, 0, False
    return scale, clean_steps, False
""",
        "rank 1 overflowed alone",
    ),
    # keeps counting through an overflow: the scale grows back too soon
    (
        planted(
            update_scale,
            ("return scale * 0.5, 0, True", "return scale * 0.5, clean_steps, True"),
            ("if clean_steps == growth_interval", "if clean_steps >= growth_interval"),
        ),
        "(scale, clean_steps, skip)",
    ),
    # grows after every clean step
    (
        planted(
            update_scale,
            (
                "    clean_steps += 1\n    if clean_steps == growth_interval:\n        return scale * 2.0, 0, False\n"
                "    return scale, clean_steps, False",
                "    return scale * 2.0, 0, False",
            ),
        ),
        "step 0",
    ),
]


# --------------------------------------------------------------------------- lesson 12 (moe)

WRONG["12.top_k_dispatch"] = [
    # sends every choice, dropped ones too
    (
        """
def top_k_dispatch(expert, gate, keep):
    S, k = expert.shape
    order = torch.argsort(expert.flatten(), stable=True)
    return torch.arange(S).repeat_interleave(k)[order], expert.flatten()[order], gate.flatten()[order]
""",
        "choices were kept",
    ),
    # rows in token order, not grouped by expert
    (
        """
def top_k_dispatch(expert, gate, keep):
    S, k = expert.shape
    token = torch.arange(S)[:, None].expand(S, k)[keep]
    return token, expert[keep], gate[keep]
""",
        "not grouped by expert",
    ),
    # sorted by expert, but the gates left in token order: each row carries another choice's gate
    (
        """
def top_k_dispatch(expert, gate, keep):
    S, k = expert.shape
    token = torch.arange(S)[:, None].expand(S, k)[keep]
    order = torch.argsort(expert[keep], stable=True)
    return token[order], expert[keep][order], gate[keep]
""",
        "with your dispatch",
    ),
]


# --------------------------------------------------------------------------- lesson 10

WRONG["10.warmup_lr"] = [
    # warmup from zero: the first step does not move the weights at all
    (
        planted(warmup_lr, ("peak * (step + 1) / warmup", "peak * step / warmup")),
        ("warmup_lr(step=0, peak=0.3, warmup=10, total=40)", "one step off", "差了一步"),
    ),
    # no decay: the peak forever after warmup
    (
        """
def warmup_lr(step, peak, warmup, total):
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    return peak
""",
        "warmup_lr(step=11",
    ),
    # decays to zero instead of a tenth of the peak
    (
        planted(
            warmup_lr,
            (
                "peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))",
                "peak * 0.5 * (1.0 + math.cos(math.pi * progress))",
            ),
        ),
        "expected",
    ),
]

WRONG["10.is_spike"] = [
    # judges its own loss: rank 0 never sees rank 1's corrupted batch
    (
        planted(
            is_spike,
            ("total = torch.tensor([float(local_loss)])", "loss = float(local_loss)"),
            ("dist.all_reduce(total)", "pass"),
            ("loss = total.item() / dist.get_world_size()", "pass"),
        ),
        "step 8",
    ),
    # a spike is 1.5x the mean of the window: too blunt to see this one
    (
        """
def is_spike(local_loss, recent):
    total = torch.tensor([float(local_loss)])
    dist.all_reduce(total)
    loss = total.item() / dist.get_world_size()
    return len(recent) >= 5 and loss > 1.5 * sum(recent) / len(recent), loss
""",
        "step 8",
    ),
    # forgets NaN: NaN > threshold is False, and a NaN update would poison the weights
    (planted(is_spike, ("    if not math.isfinite(loss):\n        return True, loss\n", "")), "step 11"),
]


# --------------------------------------------------------------------------- lesson 11

WRONG["11.atomic_save"] = [
    # writes the target in place: a failing disk leaves half a file where the old one was
    (
        """
def atomic_save(data, path):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
""",
        "without os.replace",
    ),
    # temporary file and rename, but never fsynced: the rename can reach the disk before the bytes
    (
        """
def atomic_save(data, path):
    temporary = path + ".tmp"
    try:
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
""",
        "before os.fsync",
    ),
    # atomic, but a failed write leaves its temporary file behind
    (
        """
def atomic_save(data, path):
    temporary = path + ".tmp"
    with open(temporary, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
""",
        "left behind",
    ),
]


# --------------------------------------------------------------------------- lesson 16

WRONG["16.hierarchical"] = [
    # the right sum the flat way: one all-reduce over the whole world crosses the link with everything
    (
        """
def hierarchical_all_reduce(tensor, node_group, cross_group):
    dist.all_reduce(tensor)
    return tensor
""",
        "over the whole world",
    ),
    # a node all-reduce, then the whole tensor across nodes: the right sum, K times the cross-node bytes
    (
        """
def hierarchical_all_reduce(tensor, node_group, cross_group):
    dist.all_reduce(tensor, group=node_group)
    dist.all_reduce(tensor, group=cross_group)
    return tensor
""",
        "sent 12 elements across",
    ),
    # the piece summed inside the node again instead of across nodes: each node keeps only its own sum
    (
        planted(
            hierarchical_all_reduce,
            ("dist.all_reduce(piece, group=cross_group)", "dist.all_reduce(piece, group=node_group)"),
        ),
        "tensor[",
    ),
    # no all-gather: the other K - 1 pieces of the result never arrive
    (
        planted(
            hierarchical_all_reduce,
            ("dist.all_gather_single(tensor, piece, group=node_group)", "tensor[:piece.numel()] = piece"),
        ),
        "expected",
    ),
]

WRONG["16.hierarchical"] += [
    # the whole tensor across nodes in pieces: no single call carries more than 1/K, the total does
    (
        """
def hierarchical_all_reduce(tensor, node_group, cross_group):
    dist.all_reduce(tensor, group=node_group)
    for piece in tensor.split(6):
        dist.all_reduce(piece, group=cross_group)
    return tensor
""",
        "sent 12 elements across",
    ),
    # the flat ring on a group of its own that holds every rank
    (
        """
def hierarchical_all_reduce(tensor, node_group, cross_group):
    everyone = dist.new_group(list(range(dist.get_world_size())))
    dist.all_reduce(tensor, group=everyone)
    return tensor
""",
        "over the whole world",
    ),
]

RIGHT["16.hierarchical"] = [
    # torch 2.13's names, the group passed by position, an asynchronous all-reduce, and a barrier
    """
def hierarchical_all_reduce(tensor, node_group, cross_group):
    scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    piece = torch.empty(tensor.numel() // dist.get_world_size(node_group))
    scatter(piece, tensor, dist.ReduceOp.SUM, node_group)
    dist.all_reduce(piece, dist.ReduceOp.SUM, cross_group, async_op=True).wait()
    dist.barrier()
    gather(tensor, piece, node_group)
""",
    # across the nodes a reduce-scatter and an all-gather: the same bytes as an all-reduce
    """
def hierarchical_all_reduce(tensor, node_group, cross_group):
    piece = torch.empty(tensor.numel() // dist.get_world_size(node_group))
    dist.reduce_scatter_tensor(piece, tensor, group=node_group)
    half = torch.empty(piece.numel() // dist.get_world_size(cross_group))
    dist.reduce_scatter_tensor(half, piece, group=cross_group)
    dist.all_gather_into_tensor(piece, half, group=cross_group)
    dist.all_gather_into_tensor(tensor, piece, group=node_group)
    return tensor
""",
]


# --------------------------------------------------------------------------- lesson 13

WRONG["13.scores_bytes"] = [
    # one head's scores: the heads forgotten
    (planted(scores_bytes, ("batch * heads * seq_len", "batch * seq_len")), "multiply by the heads"),
    # T scores per head, not T x T
    (planted(scores_bytes, ("seq_len * seq_len", "seq_len")), "each of the T queries"),
    # only the lower triangle the causal mask keeps
    (
        planted(
            scores_bytes, ("seq_len * seq_len * bytes_per_element", "seq_len * (seq_len + 1) // 2 * bytes_per_element")
        ),
        "the whole T x T square",
    ),
    # float32's 4 bytes whatever the dtype: right for float32, twice too many for bfloat16
    (
        planted(scores_bytes, ("torch.empty((), dtype=dtype).element_size()", "4")),
        "off by 2",
    ),
    # elements, not bytes
    (planted(scores_bytes, (" * bytes_per_element", "")), "the bytes of an element"),
]

RIGHT["13.scores_bytes"] = [
    # the element size from the format's bits
    """
def scores_bytes(batch, heads, seq_len, dtype):
    return batch * heads * seq_len ** 2 * torch.finfo(dtype).bits // 8
""",
]


# --------------------------------------------------------------------------- lesson 14

WRONG["14.quantize_e4m3"] = [
    # amax / 448: the factor that dequantizes, not the scale
    (planted(quantize_e4m3, ("448.0 / amax", "amax / 448.0")), "the factor that dequantizes"),
    # the largest value, not the largest magnitude: a negative amax is missed
    (planted(quantize_e4m3, ("x.abs().max()", "x.max()")), "largest magnitude"),
    # the scaled values returned in fp32, never cast
    (planted(quantize_e4m3, (".to(torch.float8_e4m3fn)", "")), "float8_e4m3fn"),
]

RIGHT["14.quantize_e4m3"] = [
    # the scale as a tensor, amax from aminmax
    """
def quantize_e4m3(x):
    low, high = torch.aminmax(x) if x.numel() else (torch.tensor(0.0), torch.tensor(0.0))
    amax = torch.maximum(low.abs(), high.abs()).item()
    scale = 448.0 / amax if amax else 1.0
    return scale, torch.clamp(x * scale, min=-448.0, max=448.0).to(torch.float8_e4m3fn)
""",
]


STUBS: dict[str, str] = {key: stub(exercise) for key, exercise in registry.exercises().items()}
"""Exercise key -> the stub the stored lesson holds."""
