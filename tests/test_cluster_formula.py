"""Lesson 16 without namespaces: the link's time as a formula from the bytes the local ranks sent."""

from __future__ import annotations

import pytest

from dtlab.cluster.spec import NO_CLUSTER_ENV, unavailable_reason
from dtlab.course.experiments.cluster import link_seconds


def _record(*sent_per_rank: dict[str, int]) -> dict:
    return {
        "ranks": [
            {"comm": {kind: {"count": 1, "bytes": b, "wire_bytes": b, "seconds": 0.0} for kind, b in sent.items()}}
            for sent in sent_per_rank
        ]
    }


def test_link_seconds_is_the_busiest_ranks_bytes_over_the_rate_after_the_first_step():
    records = [
        _record({"all_reduce": 10**9}, {"all_reduce": 0}),  # step 0: warm-up, left out
        _record({"all_reduce": 2_000_000, "all_gather_object.records": 500_000}, {"all_reduce": 1_000}),
        _record({"all_reduce": 1_000_000}, {"all_reduce": 3_000_000}),
        _record({"all_reduce": 2_000_000}, {"all_reduce": 2_500_000}),
    ]
    # busiest rank per step: 2.5 MB, 3 MB, 2.5 MB -> median 2.5 MB = 20 Mbit, over 20 Mbit/s
    assert link_seconds(records, "20mbit") == pytest.approx(1.0)
    assert link_seconds(records, "1gbit") == pytest.approx(0.02)
    assert link_seconds(records[:1], "20mbit") == pytest.approx(400.0)  # one step: that step


def test_no_cluster_can_be_asked_for_even_as_root(monkeypatch):
    monkeypatch.setenv(NO_CLUSTER_ENV, "1")
    english, chinese = unavailable_reason()
    assert f"{NO_CLUSTER_ENV}=1" in english and "本地进程池" in chinese
