"""The numba engine against the readable reference engine: identical event logs and outputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from replay.engine.common import EV_PREEMPT, EV_SCHEDULE, EV_SWAP_OUT
from replay.engine.numba_engine import NumbaEngine
from replay.engine.reference.engine import ReferenceEngine
from tests.strategies import engine_inputs, make_inputs, run_to_end


def _run(cls, inputs):
    engine = cls(inputs)
    run_to_end(engine, limit_us=10**10)
    return engine.take_events(), engine.request_columns(), engine.replica_state(), engine.pool_counters()


def assert_same(inputs) -> None:
    ev_nb, req_nb, rep_nb, pool_nb = _run(NumbaEngine, inputs)
    ev_ref, req_ref, rep_ref, pool_ref = _run(ReferenceEngine, inputs)
    for name in ev_ref:
        np.testing.assert_array_equal(ev_nb[name], ev_ref[name], err_msg=f"event column {name}")
    for name in req_ref:
        np.testing.assert_array_equal(req_nb[name], req_ref[name], err_msg=f"request column {name}")
    for name in rep_ref:
        np.testing.assert_array_equal(rep_nb[name], rep_ref[name], err_msg=f"replica column {name}")
    for name in pool_ref:
        np.testing.assert_array_equal(pool_nb[name], pool_ref[name], err_msg=f"pool column {name}")


@given(engine_inputs())
@example(make_inputs([0, 0, 0], [300, 300, 300], [30, 30, 30], families=[0, 0, 0], kv_blocks=(40,)))
def test_numba_engine_matches_reference(inputs):
    assert_same(inputs)


def test_preemption_and_prefix_hits_on_a_busy_replica():
    """A fixed scenario that exercises recompute preemption and prefix-cache hits together."""
    rng = np.random.default_rng(7)
    n = 120
    inputs = make_inputs(
        np.cumsum(rng.integers(0, 20_000, n)), rng.integers(1, 500, n), rng.integers(1, 80, n),
        families=rng.integers(-1, 3, n), replicas=(2,), kv_blocks=(60,), max_num_seqs=(8,), max_batched=(256,),
    )
    ev, req, _, _ = _run(NumbaEngine, inputs)
    assert req["preemptions"].sum() > 0
    assert req["cached_tokens"].sum() > 0
    assert_same(inputs)


@pytest.mark.parametrize("case", [{}, {"swap": (1,), "host_blocks": (30,)}, {"pd": "pd"}], ids=["recompute", "swap", "pd"])
def test_a_preempted_request_hits_its_own_blocks_again(case):
    """A trace without prefix hashes: every block's key is its request's own, so a prefix-cache
    hit can only be a preempted request finding its own blocks again (the numba engine offers
    those to the cache only when the request is released unfinished: kvblocks.free_request_blocks' offer)."""
    rng = np.random.default_rng(11)
    n = 80
    shape = dict(replicas=(2,), kv_blocks=(50,), max_num_seqs=(8,))
    if case.get("pd"):  # pool 0 prefills, pool 1 decodes; every request arrives at 1
        shape = dict(replicas=(1, 2), kv_blocks=(50, 30), max_num_seqs=(8, 8), pool=np.ones(n, np.int64),
                     pd={"pd_prefill_pool": 0, "pd_decode_pool": 1, "pd_local_threshold": 0,
                         "pd_us_per_token": 0.37, "pd_base_us": 1000, "pd_layers": 4},
                     block_size=(16, 16), max_batched=(256, 256), long_prefill=(0, 0), prefix_caching=(1, 1),
                     max_model_len=(4096, 4096), router=("least-outstanding",) * 2)
    inputs = make_inputs(
        np.cumsum(rng.integers(0, 5_000, n)), rng.integers(100, 400, n), rng.integers(20, 200, n),
        **shape, **{k: v for k, v in case.items() if k != "pd"},
    )
    ev, req, _, _ = _run(NumbaEngine, inputs)
    assert req["preemptions"].sum() > 0
    preempted = set(ev["request"][np.isin(ev["kind"], (EV_PREEMPT, EV_SWAP_OUT))].tolist())
    rehit = (ev["kind"] == EV_SCHEDULE) & (ev["value"] > 0) & np.isin(ev["request"], list(preempted))
    if not case:  # recompute: the request's own blocks come back from the cache
        assert rehit.any()
    assert_same(inputs)


def assert_lifecycle_same(a, b) -> None:
    """Two `_run_with_lifecycle` results are identical: events, request rows, lifecycle, counters."""
    for x, y in zip(a[:2], b[:2]):
        for name in x:
            np.testing.assert_array_equal(x[name], y[name], err_msg=name)
    for x, y in zip(a[2:], b[2:]):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)


def _run_with_lifecycle(cls, inputs, ops, tick_us=200_000):
    """Replay with replicas started, drained and retired at tick boundaries, as an autoscaler would."""
    from replay.engine.common import R_DRAINING, R_OFF

    engine = cls(inputs)
    t = 0
    for k in range(2000):
        t += tick_us
        engine.advance(t)
        states, _ = engine.replica_lifecycle()
        for op, r, delay_us in ops.get(k, ()):
            r %= len(states)
            if op == "start" and states[r] == R_OFF:
                engine.start_replica(r, t + delay_us)
            elif op == "drain":
                engine.drain_replica(r)
            states, _ = engine.replica_lifecycle()
        for r in np.nonzero(states == R_DRAINING)[0]:
            if engine.idle(int(r)):
                engine.retire_replica(int(r))
        if engine.done:
            break
    return engine.take_events(), engine.request_columns(), engine.replica_lifecycle(), engine.pool_counters().values()


@given(engine_inputs(max_requests=30), st.dictionaries(
    st.integers(0, 40),
    st.lists(st.tuples(st.sampled_from(["start", "drain"]), st.integers(0, 5), st.integers(0, 500_000)),
             max_size=3),
    max_size=10,
))
def test_replica_lifecycle_matches_reference(inputs, ops):
    import dataclasses

    inputs = dataclasses.replace(inputs, pool_initial_replicas=np.maximum(inputs.pool_replicas - 1, 1))
    a = _run_with_lifecycle(NumbaEngine, inputs, ops)
    b = _run_with_lifecycle(ReferenceEngine, inputs, ops)
    for x, y in zip(a[:2], b[:2]):
        for name in x:
            np.testing.assert_array_equal(x[name], y[name], err_msg=name)
    for x, y in zip(a[2], b[2]):
        np.testing.assert_array_equal(x, y)


@given(engine_inputs(max_requests=30), st.lists(st.integers(0, 1), min_size=2, max_size=2), st.dictionaries(
    st.integers(0, 40),
    st.lists(st.tuples(st.sampled_from(["start", "drain"]), st.integers(0, 5), st.integers(0, 500_000)),
             max_size=3),
    max_size=10,
))
@example(make_inputs([0, 50_000, 900_000, 1_000_000], [100, 300, 50, 80], [10, 5, 20, 3], replicas=(2,)), [1, 0],
         {3: [("start", 1, 300_000), ("start", 0, 300_000)], 9: [("drain", 0, 0), ("drain", 1, 0)]})
def test_requests_held_at_a_pool_at_zero_match_reference(inputs, hold, ops):
    """Pools that start at 0 replicas and hold arrivals until a replica starts (scale from zero):
    the held requests are placed, in order, at the start, in both engines alike."""
    import dataclasses

    npool = len(inputs.pool_replicas)
    inputs = dataclasses.replace(inputs, pool_initial_replicas=np.zeros(npool, np.int64),
                                 pool_hold=np.array(hold[:npool], np.int64))
    a = _run_with_lifecycle(NumbaEngine, inputs, ops)
    b = _run_with_lifecycle(ReferenceEngine, inputs, ops)
    assert_lifecycle_same(a, b)
