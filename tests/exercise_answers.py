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
}

STUBS: dict[str, str] = {
    "01.ring_step": '''
def ring_step(chunks, step, rank, size):
    """One reduce-scatter step."""
    raise NotImplementedError  # your code here / 在这里写你的代码
''',
}


def grade_many(ctx, items: list[tuple[str, str, str]]) -> list[dict]:
    """On each rank: the check of every (exercise key, source, function name), in order."""
    from dtlab.course.exercises.registry import exercise

    return [exercise(key).check(ctx, source, name) for key, source, name in items]
