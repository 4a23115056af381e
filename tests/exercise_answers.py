"""Planted wrong answers to the course's exercises, and the rank function that grades many at once.

Each exercise (``dtlab.course.exercises``) gets at least two wrong solutions a
learner might write, each with the words its verdict must contain (what the
grader names as differing). ``tests/test_exercises.py`` grades all of them,
the reference solutions and the stubs, batched into one launch per world size.
"""
from __future__ import annotations

WRONG: dict[str, list[tuple[str, str]]] = {
    "01.ring_step": [
        # sends its own chunk every step: the partial sums never travel on
        ('''
def ring_step(chunks, step, rank, size):
    incoming = torch.empty_like(chunks[rank])
    works = [dist.irecv(incoming, (rank - 1) % size), dist.isend(chunks[rank], (rank + 1) % size)]
    for w in works:
        w.wait()
    chunks[(rank - 1) % size].add_(incoming)
''', "after step 0, chunks["),
        # copies instead of adding: the neighbour's partial sum replaces this rank's contribution
        ('''
def ring_step(chunks, step, rank, size):
    mine = chunks[(rank - step - 2) % size]
    incoming = torch.empty_like(mine)
    works = [dist.irecv(incoming, (rank - 1) % size), dist.isend(chunks[(rank - step - 1) % size], (rank + 1) % size)]
    for w in works:
        w.wait()
    mine.copy_(incoming)
''', "expected"),
        # the ring turned the other way round: the right chunks arrive at the wrong ranks
        ('''
def ring_step(chunks, step, rank, size):
    mine = chunks[(rank - step - 2) % size]
    incoming = torch.empty_like(mine)
    works = [dist.irecv(incoming, (rank + 1) % size), dist.isend(chunks[(rank - step - 1) % size], (rank - 1) % size)]
    for w in works:
        w.wait()
    mine.add_(incoming)
''', "after step 0"),
    ],
    "14.top_k_dispatch": [
        # sends every choice, dropped ones too
        ('''
def top_k_dispatch(expert, gate, keep):
    S, k = expert.shape
    order = torch.argsort(expert.flatten(), stable=True)
    return torch.arange(S).repeat_interleave(k)[order], expert.flatten()[order], gate.flatten()[order]
''', "choices were kept"),
        # rows in token order, not grouped by expert
        ('''
def top_k_dispatch(expert, gate, keep):
    S, k = expert.shape
    token = torch.arange(S)[:, None].expand(S, k)[keep]
    return token, expert[keep], gate[keep]
''', "not grouped by expert"),
        # sorted by expert, but the gates left in token order: each row carries another choice's gate
        ('''
def top_k_dispatch(expert, gate, keep):
    S, k = expert.shape
    token = torch.arange(S)[:, None].expand(S, k)[keep]
    order = torch.argsort(expert[keep], stable=True)
    return token[order], expert[keep][order], gate[keep]
''', "with your dispatch"),
    ],
}

WRONG["13.merge"] = [
    # forgets the weights: averages the two blocks as if they had the same normaliser
    ('''
def my_merge(o_a, lse_a, o_b, lse_b):
    return (o_a + o_b) / 2, torch.maximum(lse_a, lse_b)
''', "zigzag layout: output["),
    # the right output of two blocks, but the log-sum-exp of the larger one only: the next merge
    # (a later chunk sees three blocks) and backward both go wrong
    ('''
def my_merge(o_a, lse_a, o_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    o = torch.exp(lse_a - lse)[..., None] * o_a + torch.exp(lse_b - lse)[..., None] * o_b
    return o, torch.maximum(lse_a, lse_b)
''', "zigzag layout:"),
    # weights exp(lse) without normalising by the merged sum
    ('''
def my_merge(o_a, lse_a, o_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    return torch.exp(lse_a)[..., None] * o_a + torch.exp(lse_b)[..., None] * o_b, lse
''', "expected"),
]

STUBS: dict[str, str] = {
    "13.merge": '''
def my_merge(o_a, lse_a, o_b, lse_b):
    raise NotImplementedError  # your code here / 在这里写你的代码
''',
    "01.ring_step": '''
def ring_step(chunks, step, rank, size):
    """One reduce-scatter step."""
    raise NotImplementedError  # your code here / 在这里写你的代码
''',
    "14.top_k_dispatch": '''
def top_k_dispatch(expert, gate, keep):
    raise NotImplementedError  # your code here / 在这里写你的代码
''',
}


def grade_many(ctx, items: list[tuple[str, str, str]]) -> list[dict]:
    """On each rank: the check of every (exercise key, source, function name), in order."""
    from dtlab.course.exercises.registry import exercise

    return [exercise(key).check(ctx, source, name) for key, source, name in items]
