"""Quiet runs (engine/quiet.py): the numba engine advancing an all-lazy replica's steps in a tight
loop against itself advancing every request at every step (`lazy=False`) and against the
reference engine: identical event logs, request rows, replica and pool counters, with every router
(live readers, scraped-view readers, prefix-aware), view refreshes, host ticks, replicas started
and drained mid-run, closed-loop sessions, KV so tight that runs are cut by the free blocks, and
arrivals, refreshes and ticks that land exactly on a quiet step's end."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.registry import ROUTERS, router_columns
from replay.engine.numba_engine import NumbaEngine
from tests.differential.test_closed_loop import session_trace
from tests.differential.test_engines import _run_with_lifecycle, assert_lifecycle_same, assert_same
from tests.strategies import engine_inputs, make_inputs, routers


def _outputs(engine):
    return engine.take_events(), engine.request_columns(), engine.replica_state(), engine.pool_counters()


def _run(inputs, lazy: bool, ticks):
    """The outputs, and what the host reads at each tick: every replica's snapshot, and every
    tenth tick the requests' progress (lazy requests' written as of then)."""
    engine = NumbaEngine(inputs, lazy=lazy)
    snapshots, progress = [], []
    for k, t in enumerate(ticks):
        engine.advance(int(t))
        snapshots.append(engine.snapshot(int(t)))
        if k % 10 == 0:
            columns = engine.request_columns()
            progress.append(np.stack([columns["computed"], columns["generated"]]))
        if engine.done:
            break
    assert engine.done
    reads = {"snapshots": np.stack(snapshots), "progress": np.stack(progress)}
    return engine, (*_outputs(engine), reads)


def assert_quiet_same(inputs, tick_us: int = 1_000_000, ticks=None, quiet_used: bool = True):
    """`ticks`: the host's advance times (default every tick_us); the quiet engine must take runs."""
    if ticks is None:
        ticks = range(tick_us, 10**11, tick_us)
    quiet, a = _run(inputs, True, ticks)
    eager, b = _run(inputs, False, ticks)
    for what, x, y in zip(("event", "request", "replica", "pool", "tick"), a, b):
        for name in y:
            np.testing.assert_array_equal(x[name], y[name], err_msg=f"{what} column {name}: quiet vs eager")
    if quiet_used:
        assert quiet.reps.qr_steps.sum() > 0, "the scenario must take quiet runs"
    assert eager.reps.qr_steps.sum() == 0
    return quiet


def sparse(n=120, seed=14, gap_us=400_000, **kwargs):
    """Sparse arrivals of long decodes: replicas spend most steps with an all-lazy batch."""
    rng = np.random.default_rng(seed)
    shape = dict(replicas=(4,), kv_blocks=(300,), max_num_seqs=(16,)) | kwargs
    return make_inputs(np.cumsum(rng.integers(0, gap_us, n)), rng.integers(1, 600, n), rng.integers(1, 400, n),
                       families=rng.integers(-1, 4, n), **shape)


@pytest.mark.parametrize("router", sorted(ROUTERS))
@pytest.mark.parametrize("refresh_us", [7_000, 50_000])
def test_quiet_runs_match_with_every_router(router, refresh_us):
    inputs = dataclasses.replace(sparse(router=(router,)), pool_refresh_us=np.array([refresh_us], np.int64))
    assert_quiet_same(inputs)
    assert_quiet_same(inputs, tick_us=37_000)  # the host reads between a run's steps
    assert_quiet_same(dataclasses.replace(inputs, detailed_events=False), tick_us=37_000)


@pytest.mark.parametrize("router", ["least-outstanding", "prefix-aware", "power-of-two"])
def test_quiet_runs_match_the_reference_engine(router):
    inputs = dataclasses.replace(sparse(n=60, replicas=(2,), router=(router,)),
                                 pool_refresh_us=np.array([20_000], np.int64))
    assert_quiet_same(inputs)
    assert_same(inputs)


def _step_ends(inputs, tick_us=3_001):
    """Times at which some step ends (steps in progress at fine ticks of the step-by-step engine)."""
    engine = NumbaEngine(inputs, lazy=False)
    ends = set()
    t = 0
    while not engine.done:
        t += tick_us
        engine.advance(t)
        ends.update(int(x) for x in engine.reps.busy_until if x >= 0)
    return np.array(sorted(ends), np.int64)


@pytest.mark.parametrize("async_scheduling", [0, 1])
def test_events_on_a_quiet_step_end(async_scheduling):
    """Arrivals, view refreshes and host ticks at exactly the end of a quiet step: the step end
    comes first, then the refresh and the arrival, then the replica schedules its next step."""
    base = sparse(n=60, replicas=(2,), async_scheduling=(async_scheduling,), router=("power-of-two",))
    ends = _step_ends(base)
    rng = np.random.default_rng(3)
    extra = np.sort(rng.choice(ends, 40, replace=False))
    n = len(extra)
    arrival = np.concatenate([base.arrival_us, extra])
    order = np.argsort(arrival, kind="stable")
    prompt = np.concatenate([base.prompt_tokens, rng.integers(1, 300, n)])[order]
    output = np.concatenate([base.output_tokens, rng.integers(1, 200, n)])[order]
    inputs = make_inputs(arrival[order], prompt, output, replicas=(2,), kv_blocks=(300,), max_num_seqs=(16,),
                         async_scheduling=(async_scheduling,), router=("power-of-two",))
    # Refresh every 1 ms: some refreshes fall on step ends too.
    inputs = dataclasses.replace(inputs, pool_refresh_us=np.array([1_000], np.int64))
    ticks = np.unique(np.concatenate([rng.choice(ends, 200, replace=False), np.arange(1, 400) * 1_000_000]))
    assert_quiet_same(inputs, ticks=ticks)
    assert_quiet_same(dataclasses.replace(inputs, detailed_events=False), ticks=ticks)


@pytest.mark.parametrize("kv_blocks", [60, 90, 150])
def test_quiet_runs_cut_by_the_free_blocks(kv_blocks):
    """KV so tight that a run stops where the free blocks may not cover its due blocks; replicas
    fall back to step by step and preempt."""
    rng = np.random.default_rng(5)
    n = 150
    inputs = make_inputs(np.cumsum(rng.integers(0, 40_000, n)), rng.integers(1, 40, n), rng.integers(50, 200, n),
                         families=rng.integers(-1, 4, n), replicas=(2,), kv_blocks=(kv_blocks,), block_size=(4,),
                         max_num_seqs=(16,), trace_block_tokens=4)
    quiet = assert_quiet_same(inputs)
    assert quiet.request_columns()["preemptions"].sum() > 0, "the scenario must preempt"
    assert_quiet_same(inputs, tick_us=23_000)


@pytest.mark.parametrize("router", ["prefix-aware", {"policy": "weighted", "scorers": {"prefix": 1}}],
                         ids=["prefix-aware", "prefix-only"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_prefix_hits_routed_on_after_quiet_evictions(router, seed):
    """Small replicas that churn through their blocks: a quiet run's allocations evict cached
    prefixes, and a router that reads each replica's hits must see them gone."""
    rng = np.random.default_rng(seed)
    n = 200
    inputs = make_inputs(np.cumsum(rng.integers(0, 150_000, n)), rng.integers(50, 200, n), rng.integers(100, 400, n),
                         families=rng.integers(0, 6, n), trace_block_tokens=16, replicas=(3,), kv_blocks=(48,),
                         max_num_seqs=(8,), router=(router,))
    # Views refreshed seldom, so that nothing but the routing itself catches the replicas up.
    inputs = dataclasses.replace(inputs, pool_refresh_us=np.array([10**9], np.int64))
    assert_quiet_same(inputs, tick_us=10**9)
    assert_quiet_same(inputs, tick_us=29_000)


def test_quiet_runs_match_on_closed_loop_sessions():
    rng = np.random.default_rng(21)
    sessions = [(int(rng.integers(0, 20_000_000)), [(int(rng.integers(1, 200)), int(rng.integers(20, 400)))
                                                   for _ in range(int(rng.integers(1, 5)))]) for _ in range(30)]
    _, inputs = session_trace(sessions, 300_000, kv_blocks=(400,), replicas=(2,), max_num_seqs=(16,))
    assert_quiet_same(inputs)
    assert_quiet_same(dataclasses.replace(inputs, detailed_events=False), tick_us=41_000)


LIFECYCLE = st.dictionaries(
    st.integers(0, 60),
    st.lists(st.tuples(st.sampled_from(["start", "drain"]), st.integers(0, 5), st.integers(0, 500_000)),
             max_size=3),
    max_size=12,
)


def _lifecycle_same(inputs, ops, tick_us):
    a = _run_with_lifecycle(functools.partial(NumbaEngine, lazy=True), inputs, ops, tick_us)
    b = _run_with_lifecycle(functools.partial(NumbaEngine, lazy=False), inputs, ops, tick_us)
    assert_lifecycle_same(a, b)


@settings(max_examples=30, deadline=None)
@given(LIFECYCLE, st.sampled_from([100_000, 230_000]), st.sampled_from(["least-outstanding", "prefix-aware",
                                                                        "round-robin", "least-kv"]))
def test_quiet_runs_match_with_replicas_started_and_drained(ops, tick_us, router):
    """An autoscaler's lifecycle changes between ticks, over replicas in quiet runs."""
    inputs = sparse(n=80, gap_us=150_000, replicas=(5,), router=(router,))
    inputs = dataclasses.replace(inputs, pool_initial_replicas=np.array([3], np.int64))
    _lifecycle_same(inputs, ops, tick_us)


@settings(max_examples=40, deadline=None)
@given(engine_inputs(max_requests=50), st.integers(2, 8), st.sampled_from([1_000_000, 30_000]), routers(),
       st.sampled_from([1_000, 50_000]))
def test_quiet_runs_match_on_generated_fleets(inputs, stretch, tick_us, router, refresh_us):
    """The engine strategy's fleets, every pool on a drawn router, outputs stretched so decodes last."""
    npool = len(inputs.pool_replicas)
    ids, params = router_columns([router] * npool)
    inputs = dataclasses.replace(inputs, output_tokens=inputs.output_tokens * stretch,
                                 pool_max_model_len=np.maximum(inputs.pool_max_model_len, 4096),
                                 pool_router=ids, pool_router_params=params,
                                 pool_refresh_us=np.full(npool, refresh_us, np.int64))
    assert_quiet_same(inputs, tick_us, quiet_used=False)

