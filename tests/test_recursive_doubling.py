"""Recursive doubling against torch's all-reduce, at world sizes 1 to 4 (3: a rank folded in and out).

Integer-valued tensors are summed exactly by any order, so they must equal
torch's bit for bit; random ones agree within rounding, and every rank must end
with the *same* bits (each exchange adds the same two numbers on both sides).
The meter counts what each rank sent: log2(P) whole tensors on the P ranks
that double, one more on a rank that takes in an extra one, one on the extra.
Over a subgroup the partners are ranks of the group.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dtlab.comm.collectives import CommMeter
from dtlab.comm.recursive_doubling import recursive_doubling_all_reduce
from dtlab.comm.tracer import CommTracer, tracing
from tests.harness import run_ranks

OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def _reduce(ctx) -> dict:
    n, rank = ctx.world_size, ctx.rank
    g = torch.Generator().manual_seed(rank)
    results = {}
    for name, op in OPS.items():
        for integer in (True, False):
            x = torch.randint(-50, 50, (3, 37), generator=g).float() if integer else torch.randn(3, 37, generator=g)
            want = x.clone()
            dist.all_reduce(want, op=dist.ReduceOp.SUM if op == dist.ReduceOp.AVG else op)
            if op == dist.ReduceOp.AVG:
                want /= n
            got = recursive_doubling_all_reduce(x.clone(), op)
            everyone = [torch.empty_like(got) for _ in range(n)]
            dist.all_gather(everyone, got)
            results[(name, integer)] = {
                "equal": torch.equal(got, want),
                "worst": float((got - want).abs().max()),
                "same_bits": all(torch.equal(e, everyone[0]) for e in everyone),
            }
    meter, tracer = CommMeter(), CommTracer()
    column = (torch.arange(20.0).view(4, 5) * (rank + 1)).t()  # (5, 4), not contiguous
    with tracing(tracer):
        recursive_doubling_all_reduce(column, meter=meter)
    sub = _over_a_subgroup(n, rank)
    return {
        "results": results,
        "sent": meter.bytes_sent["all_reduce"],
        "column": column.tolist(),
        "calls": [(c.kind, c.bytes) for c in tracer.calls],
        "subgroup": sub,
    }


def _over_a_subgroup(n: int, rank: int) -> bool | None:
    """Every rank but 0 all-reduce over their own group (3 ranks of 4: a fold inside it), against torch's."""
    if n < 2:
        return None
    group = dist.new_group(list(range(1, n)))
    if rank == 0:
        return None
    x = torch.randint(-50, 50, (33,), generator=torch.Generator().manual_seed(rank)).float()
    want = x.clone()
    dist.all_reduce(want, group=group)
    return torch.equal(recursive_doubling_all_reduce(x, group=group), want)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_recursive_doubling_equals_torch_with_the_same_bits_on_every_rank(world_size):
    ranks = run_ranks(_reduce, world_size, timeout=120)
    p = 1 << (world_size.bit_length() - 1)
    for rank, got in enumerate(ranks):
        for (name, integer), r in got["results"].items():
            assert r["same_bits"], (rank, name, integer)
            if integer:
                assert r["equal"], (rank, name, r)
            assert r["worst"] < 1e-5, (rank, name, integer, r)
        ranks_sum = sum(range(1, world_size + 1))  # column was arange(20) x (rank + 1)
        assert got["column"] == (torch.arange(20.0).view(4, 5) * ranks_sum).t().tolist()
        assert got["subgroup"] is (None if world_size == 1 or rank == 0 else True)
        messages = (p.bit_length() - 1) + (rank + p < world_size) if rank < p else 1
        assert got["sent"] == messages * 20 * 4, (rank, got["sent"])
        assert got["calls"] == ([] if world_size == 1 else [("all_reduce", 80)])
