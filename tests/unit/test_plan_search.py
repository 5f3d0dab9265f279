"""The replica search of `plan` (replay/plan/search.py) against oracles whose answer is known."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import UserError
from replay.plan.plan import frontier
from replay.plan.search import search_replicas
from replay.plan.space import build_space, parse_quantizations, parse_slo, parse_tps


def _drive(start, need, max_replicas):
    """Run the search where pool p meets the SLO from need[p] replicas on; every fleet it asked for."""
    search = search_replicas(start, 0.99, max_replicas)
    asked, summary = [], None
    try:
        while True:
            fleet = search.send(summary)
            asked.append(fleet)
            summary = {"pools": {p: {"slo_attainment": 1.0 if n >= need[p] else 0.5} for p, n in fleet.items()}}
    except StopIteration as done:
        return done.value, asked


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["chat", "batch", "code"]), st.tuples(st.integers(1, 80), st.integers(1, 80)),
                       min_size=1), st.integers(1, 64))
def test_finds_the_fewest_replicas_that_meet(pools, max_replicas):
    start = {p: s for p, (s, _) in pools.items()}
    need = {p: n for p, (_, n) in pools.items()}
    answer, asked = _drive(start, need, max_replicas)
    for pool, n in need.items():
        tried = {fleet[pool] for fleet in asked}
        if n > max_replicas:
            assert answer[pool] is None and max_replicas in tried
        else:
            assert answer[pool] == n
            assert n in tried and (n == 1 or n - 1 in tried)  # one fewer was replayed, and failed
    # bisection: about 2 log2 of the range per pool, shared by every pool in the same replays
    assert len(asked) <= 2 * math.ceil(math.log2(max_replicas + 1)) + 3
    assert all(1 <= n <= max_replicas for fleet in asked for n in fleet.values())


def test_a_fleet_that_cannot_run_ends_the_search():
    search = search_replicas({"default": 2}, 0.99, 8)
    next(search)
    with pytest.raises(StopIteration) as done:
        search.send(None)
    assert done.value.value is None


def test_a_pool_the_trace_sends_nothing_meets_with_one_replica():
    answer, _ = _drive({"idle": 4}, {"idle": 0}, 8)
    assert answer == {"idle": 1}


class _T:
    def __init__(self, cost, att, ttft=100.0):
        self.summary = {"cost_usd": cost, "slo_attainment": att, "ttft_p99_ms": ttft}


def test_frontier_keeps_what_no_cheaper_fleet_beats():
    trials = [_T(3, 0.9), _T(1, 0.5), _T(2, 0.95), _T(4, 0.99), _T(5, 0.99), _T(2.5, 0.7)]
    assert [(t.summary["cost_usd"], t.summary["slo_attainment"]) for t in frontier(trials)] == [
        (1, 0.5), (2, 0.95), (4, 0.99)]


@pytest.mark.parametrize("text, words", [
    ("ttft=2000", "expected KEY=MS"), ("ttft_ms=abc", "expected a number"), ("ttft_ms=-5", "in [0.01"),
    ("ttft_ms=1,ttft_ms=2", "given twice"), ("tpot_ms=nan", "in [0.01"),
])
def test_bad_slo_is_one_line_naming_it(text, words):
    with pytest.raises(UserError, match="--slo") as err:
        parse_slo(text)
    assert words in str(err.value)


def test_slo_suggests_the_key():
    with pytest.raises(UserError, match="did you mean 'ttft_ms'"):
        parse_slo("ttft_mss=100")


@pytest.mark.parametrize("attainment", [0.0, 1.5, -1, float("nan")])
def test_attainment_out_of_range(attainment):
    with pytest.raises(UserError, match="--attainment"):
        build_space(None, attainment, ["h100-sxm-80gb"], [1], [None], 8)


def test_lists_are_checked():
    with pytest.raises(UserError, match="--tp: got '3'"):
        parse_tps("1,3")
    with pytest.raises(UserError, match="listed twice"):
        parse_tps("2,2")
    with pytest.raises(UserError, match="did you mean 'fp8'"):
        parse_quantizations("none,fp88")
    with pytest.raises(UserError, match="--max-replicas"):
        build_space(None, 0.99, ["h100-sxm-80gb"], [1], [None], 0)
    assert parse_quantizations("none,FP8") == [None, "fp8"]
