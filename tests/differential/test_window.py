"""The numba engine's request window (engine/window.py) against one slot per request: with a few
slots, so that the window slides (and grows) many times in a run, the event logs, request rows,
replica and pool counters, and the requests' progress read mid-run are identical, on generated
fleets (preemption, swap, prefill/decode, LoRA, speculative decoding, every policy family),
closed-loop sessions, and replicas started and drained mid-run."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replay.engine.window as window_module
from replay.engine.numba_engine import NumbaEngine
from tests.differential.test_closed_loop import session_trace
from tests.differential.test_engines import _run_with_lifecycle
from tests.differential.test_lazy import long_decodes
from tests.strategies import engine_inputs

SMALL = (1, 3, 8, 64)


def _run(inputs, window, tick_us):
    """The outputs, and every fifth tick's request progress."""
    engine = NumbaEngine(inputs, window=window)
    progress = []
    t = 0
    while not engine.done and t < 10**11:
        t += tick_us
        engine.advance(t)
        if t // tick_us % 5 == 0:
            columns = engine.request_columns()
            progress.append(np.stack([columns["state"], columns["computed"], columns["generated"]]))
    reads = {"progress": np.stack(progress) if progress else np.zeros(0)}
    return engine, (engine.take_events(), engine.request_columns(), engine.replica_state(), engine.pool_counters(),
                    reads)


def assert_window_same(inputs, window: int, tick_us: int = 1_000_000, slides: bool = True) -> NumbaEngine:
    windowed, a = _run(inputs, window, tick_us)
    whole, b = _run(inputs, None, tick_us)
    for what, x, y in zip(("event", "request", "replica", "pool", "mid-run"), a, b):
        assert x.keys() == y.keys()
        for name in y:
            np.testing.assert_array_equal(x[name], y[name], err_msg=f"{what} column {name}: window {window} vs whole")
    assert whole.window.base == 0 and whole.window.capacity == inputs.num_requests
    if slides:
        assert windowed.window.base > 0, "the scenario must slide the window"
    return windowed


@pytest.mark.parametrize("case", [
    {},
    {"kv_blocks": (120,)},  # tight: preemptions
    {"kv_blocks": (120,), "swap": (1,), "host_blocks": (60,)},
    {"max_batched": (40,), "async_scheduling": (1,)},
])
@pytest.mark.parametrize("window", SMALL)
def test_window_matches_whole_on_long_decodes(case, window):
    """Arrivals spread so that the fleet keeps up: few requests in flight, a window that slides
    (an overloaded fleet has every request in flight, and the window grows to hold them)."""
    inputs = long_decodes(**case)
    inputs = dataclasses.replace(inputs, arrival_us=inputs.arrival_us * 6)
    engine = assert_window_same(inputs, window, tick_us=37_000)
    assert engine.window.capacity < inputs.num_requests, "the window must stay smaller than the trace"
    assert_window_same(dataclasses.replace(inputs, detailed_events=False), window)


def test_window_grows_when_in_flight_requests_fill_it():
    """A burst of arrivals at one instant: every one is in flight at once."""
    inputs = long_decodes(n=200)
    inputs = dataclasses.replace(inputs, arrival_us=np.repeat(inputs.arrival_us[::20] * 20, 20))
    engine = assert_window_same(inputs, 2)
    assert engine.window.capacity >= 20


@pytest.mark.parametrize("window", SMALL)
def test_window_matches_whole_on_closed_loop_sessions(window):
    """A turn's successor is loaded with it (it arrives when the turn ends), so the window ends
    only between sessions: sessions spread over 300 s leave such places."""
    rng = np.random.default_rng(12)
    sessions = [(int(rng.integers(0, 300_000_000)), [(int(rng.integers(1, 200)), int(rng.integers(1, 300)))
                                                   for _ in range(int(rng.integers(1, 6)))]) for _ in range(60)]
    _, inputs = session_trace(sessions, 200_000, kv_blocks=(400,), replicas=(2,), max_num_seqs=(16,))
    assert_window_same(inputs, window)
    _, tight = session_trace(sessions, 0, kv_blocks=(60,), replicas=(1,), max_num_seqs=(8,))
    assert_window_same(tight, window, tick_us=50_000)


@pytest.mark.parametrize("window", (16, 64))
def test_window_loaded_a_step_ahead_matches_whole(monkeypatch, window):
    """Fills of a few requests at a time (Window.step: 1 of 16 slots, 4 of 64), not to the
    window's end: on long decodes, and on closed-loop sessions, whose load ends a step must
    reach past (the end of a session) without passing the slots."""
    monkeypatch.setattr(window_module, "LOAD_STEP", 1)
    inputs = long_decodes()
    inputs = dataclasses.replace(inputs, arrival_us=inputs.arrival_us * 6)
    engine = assert_window_same(inputs, window, tick_us=37_000)
    assert engine.window.step < engine.window.capacity < inputs.num_requests
    rng = np.random.default_rng(5)
    sessions = [(int(rng.integers(0, 300_000_000)), [(int(rng.integers(1, 200)), int(rng.integers(1, 300)))
                                                   for _ in range(int(rng.integers(1, 6)))]) for _ in range(60)]
    _, closed = session_trace(sessions, 200_000, kv_blocks=(400,), replicas=(2,), max_num_seqs=(16,))
    engine = assert_window_same(closed, window)
    assert engine.window.step < engine.window.capacity


@settings(max_examples=80, deadline=None)
@given(engine_inputs(max_requests=60), st.sampled_from(SMALL[:3]), st.sampled_from([1_000_000, 50_000, 7_000]))
def test_window_matches_whole_on_generated_fleets(inputs, window, tick_us):
    assert_window_same(inputs, window, tick_us, slides=False)


@settings(max_examples=30, deadline=None)
@given(engine_inputs(max_requests=60, pd=True), st.sampled_from(SMALL[:3]))
def test_window_matches_whole_with_prefill_decode(inputs, window):
    assert_window_same(inputs, window, 20_000, slides=False)


@settings(max_examples=40, deadline=None)
@given(engine_inputs(max_requests=40), st.sampled_from(SMALL[:3]), st.dictionaries(
    st.integers(0, 40),
    st.lists(st.tuples(st.sampled_from(["start", "drain"]), st.integers(0, 5), st.integers(0, 500_000)),
             max_size=3),
    max_size=10,
), st.booleans())
def test_window_matches_whole_with_replicas_started_and_drained(inputs, window, ops, hold):
    """Autoscaling's operations mid-run; with `hold`, requests that find no replica wait at
    their pool (linked through the held FIFO) until one starts."""
    inputs = dataclasses.replace(inputs, pool_initial_replicas=np.maximum(inputs.pool_replicas - 1, 1) * (1 - hold),
                                 pool_hold=np.full(len(inputs.pool_replicas), int(hold), np.int64))
    a = _run_with_lifecycle(functools.partial(NumbaEngine, window=window), inputs, ops)
    b = _run_with_lifecycle(functools.partial(NumbaEngine, window=None), inputs, ops)
    for x, y in zip(a[:2], b[:2]):
        for name in y:
            np.testing.assert_array_equal(x[name], y[name], err_msg=name)
    for x, y in zip((*a[2], *a[3]), (*b[2], *b[3])):
        np.testing.assert_array_equal(x, y)
