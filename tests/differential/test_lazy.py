"""The numba engine with steady decoders kept lazily (engine/lazy.py) against itself advancing every
request at every step (`lazy=False`) and against the reference engine: identical event logs,
request rows, replica and pool counters, on traces that keep many requests decoding for long."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.registry import QUEUE_ORDERS, ROUTERS, VICTIMS
from replay.engine.numba_engine import NumbaEngine
from tests.differential.test_closed_loop import session_trace
from tests.differential.test_engines import assert_same
from tests.strategies import engine_inputs, make_inputs, run_to_end


def _run(inputs, lazy: bool, tick_us: int = 1_000_000):
    engine = NumbaEngine(inputs, lazy=lazy)
    run_to_end(engine, tick_us=tick_us, limit_us=10**11)
    return engine, engine.take_events(), engine.request_columns(), engine.replica_state(), engine.pool_counters()


def assert_lazy_same(inputs, tick_us: int = 1_000_000, lazy_used: bool = True) -> None:
    lazy = _run(inputs, True, tick_us)
    eager = _run(inputs, False, tick_us)
    for what, a, b in zip(("event", "request", "replica", "pool"), lazy[1:], eager[1:]):
        for name in b:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"{what} column {name}: lazy vs eager")
    if lazy_used:
        assert lazy[0].reps.lz_steps.max() > 0, "the scenario must take the lazy path"
    assert eager[0].reps.lz_steps.max() == 0


def long_decodes(n=300, seed=1, **kwargs):
    """Many requests decoding hundreds of tokens at once, with shared prefixes."""
    rng = np.random.default_rng(seed)
    shape = dict(replicas=(3,), kv_blocks=(400,), max_num_seqs=(32,), max_batched=(512,)) | kwargs
    return make_inputs(np.cumsum(rng.integers(0, 40_000, n)), rng.integers(1, 600, n), rng.integers(1, 400, n),
                       families=rng.integers(-1, 4, n), **shape)


@pytest.mark.parametrize("case", [
    {},
    {"prefix_caching": (0,)},
    {"block_size": (1,)},
    {"block_size": (4,), "long_prefill": (64,)},
    {"kv_blocks": (120,)},  # tight: steps fall back to step by step and preempt
    {"kv_blocks": (120,), "swap": (1,), "host_blocks": (60,)},
    {"max_batched": (40,)},  # the budget starves some steps
    {"async_scheduling": (1,)},
    {"watermark_blocks": (8,), "whole_prompt": (1,)},
], ids=lambda c: ",".join(f"{k}={v[0]}" for k, v in c.items()) or "plain")
def test_lazy_matches_eager_on_long_decodes(case):
    inputs = long_decodes(**case)
    assert_lazy_same(inputs)
    assert_lazy_same(inputs, tick_us=37_000)  # reads between advances land mid-batch
    # Without detailed events: only preemptions and rejections are logged.
    assert_lazy_same(dataclasses.replace(inputs, detailed_events=False))
    assert_lazy_same(dataclasses.replace(inputs, detailed_events=False), tick_us=37_000)


@pytest.mark.parametrize("victim", sorted(VICTIMS))
def test_lazy_matches_eager_under_preemption_with_every_victim(victim):
    rng = np.random.default_rng(4)
    inputs = long_decodes(kv_blocks=(90,), victim=(VICTIMS[victim].numba_id,), priority=rng.integers(0, 3, 300))
    engine = _run(inputs, True)[0]
    assert engine.request_columns()["preemptions"].sum() > 0, "the scenario must preempt"
    assert_lazy_same(inputs)


@pytest.mark.parametrize("order", sorted(QUEUE_ORDERS))
def test_lazy_matches_eager_with_every_queue_order(order):
    rng = np.random.default_rng(6)
    inputs = long_decodes(max_num_seqs=(8,), queue=(QUEUE_ORDERS[order].numba_id,), priority=rng.integers(0, 4, 300))
    assert_lazy_same(inputs)


def test_lazy_matches_the_reference_engine_on_long_decodes():
    """The lazy path against the readable step-by-step engine (smaller: the reference is slow)."""
    inputs = long_decodes(n=80, replicas=(2,), kv_blocks=(150,), max_num_seqs=(16,))
    engine = _run(inputs, True)[0]
    assert engine.reps.lz_steps.max() > 0
    assert_same(inputs)
    assert_same(dataclasses.replace(inputs, pool_enable_prefix_caching=np.array([0])))
    assert_same(dataclasses.replace(inputs, detailed_events=False))


def test_lazy_matches_eager_with_prefill_decode():
    rng = np.random.default_rng(8)
    n = 200
    two = lambda x: (x, x)  # noqa: E731
    inputs = make_inputs(np.cumsum(rng.integers(0, 30_000, n)), rng.integers(1, 600, n), rng.integers(1, 300, n),
                         families=rng.integers(-1, 4, n), replicas=(1, 2), kv_blocks=two(300), max_num_seqs=two(16),
                         max_batched=two(512), block_size=two(16), long_prefill=two(0), prefix_caching=two(1),
                         max_model_len=two(4096), router=two("least-outstanding"), pool=[1] * n,
                         pd={"pd_prefill_pool": 0, "pd_decode_pool": 1, "pd_local_threshold": 100,
                             "pd_us_per_token": 2.6, "pd_base_us": 1000, "pd_layers": 4})
    assert_lazy_same(inputs)


def test_lazy_matches_eager_on_closed_loop_sessions():
    """A turn's answer is hashed as its successor's prompt: those blocks are cached as they fill,
    so the turn stays step by step until it is past them."""
    rng = np.random.default_rng(12)
    sessions = [(int(rng.integers(0, 5_000_000)), [(int(rng.integers(1, 200)), int(rng.integers(1, 300)))
                                                  for _ in range(int(rng.integers(1, 5)))]) for _ in range(40)]
    _, inputs = session_trace(sessions, 200_000, kv_blocks=(400,), replicas=(2,), max_num_seqs=(16,))
    assert_lazy_same(inputs)
    assert_lazy_same(dataclasses.replace(inputs, detailed_events=False))
    _, tight = session_trace(sessions, 0, kv_blocks=(60,), replicas=(1,), max_num_seqs=(8,))
    assert_lazy_same(tight)


@settings(max_examples=60, deadline=None)
@given(engine_inputs(max_requests=60), st.integers(1, 8), st.sampled_from([1_000_000, 50_000]))
def test_lazy_matches_eager_on_generated_fleets(inputs, stretch, tick_us):
    """The engine strategy's small fleets under pressure, outputs stretched so decodes last."""
    inputs = dataclasses.replace(inputs, output_tokens=inputs.output_tokens * stretch,
                                 pool_max_model_len=np.maximum(inputs.pool_max_model_len, 4096))
    assert_lazy_same(inputs, tick_us, lazy_used=False)
    assert_lazy_same(dataclasses.replace(inputs, detailed_events=False), tick_us, lazy_used=False)


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_lazy_matches_eager_and_reference_with_every_router(router):
    """Sparse arrivals on four replicas without detailed events; routers that read the scraped
    view (power-of-two, weighted) see it refreshed mid-batch."""
    rng = np.random.default_rng(14)
    n = 120
    inputs = make_inputs(np.cumsum(rng.integers(0, 400_000, n)), rng.integers(1, 600, n), rng.integers(1, 400, n),
                         families=rng.integers(-1, 4, n), replicas=(4,), kv_blocks=(300,), max_num_seqs=(16,),
                         router=(router,), detailed_events=False)
    assert_lazy_same(inputs)
    assert_lazy_same(inputs, tick_us=50_000)
    assert_same(inputs)
