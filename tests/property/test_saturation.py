"""Properties of the saturation classifier: a draining queue is never overloaded, the class does
not depend on the unit of time or of load, a queue growing linearly under excess arrivals is
overloaded, and the drain after the last arrival changes nothing."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from replay.fleet.saturation import OVERLOADED, classify

TICKS = (1_000, 250_000, 1_000_000, 7_000_000, 3_600_000_000)  # a millisecond to an hour


@st.composite
def pool_ticks(draw, min_ticks: int = 50):
    """A pool's ticks: arrivals and completions per tick, the queue by conservation (a request
    completes only once it is there). At least 20 arrivals a tick, so the span holds enough
    requests that the few-requests floor (QUEUE_MIN_REQUESTS) never decides: only the rates do."""
    n = draw(st.integers(min_ticks, 150))
    arrivals = np.array(draw(st.lists(st.integers(20, 80), min_size=n, max_size=n)), np.int64)
    capacity = draw(st.lists(st.integers(0, 120), min_size=n, max_size=n))
    waiting, finished, queue = [], [], 0
    for came, can in zip(arrivals.tolist(), capacity):
        done = min(can, queue + came)
        queue += came - done
        waiting.append(queue)
        finished.append(done)
    return n, np.array(waiting, np.int64), arrivals, np.array(finished, np.int64)


def times(n: int, tick_us: int) -> np.ndarray:
    return np.arange(1, n + 1, dtype=np.int64) * tick_us


@given(pool_ticks(min_ticks=2), st.sampled_from(TICKS))
def test_a_queue_that_drains_is_never_overloaded(ticks, tick_us):
    n, waiting, arrivals, finished = ticks
    draining = np.sort(waiting)[::-1]  # the same levels, never rising
    assert classify(times(n, tick_us), draining, arrivals, finished).state != OVERLOADED
    # nor is a pool that completes at least what arrives, whatever its queue shows
    assert classify(times(n, tick_us), waiting, arrivals, np.maximum(finished, arrivals)).state != OVERLOADED


@given(pool_ticks(), st.sampled_from(TICKS), st.sampled_from(TICKS), st.integers(1, 7))
def test_the_class_does_not_depend_on_the_units(ticks, tick_us, other_tick_us, k):
    n, waiting, arrivals, finished = ticks
    base = classify(times(n, tick_us), waiting, arrivals, finished)
    slower = classify(times(n, other_tick_us), waiting, arrivals, finished)
    bigger = classify(times(n, tick_us), waiting * k, arrivals * k, finished * k)
    assert slower.state == bigger.state == base.state
    assert np.isclose(slower.queue_slope_per_s * other_tick_us, base.queue_slope_per_s * tick_us)
    assert np.isclose(bigger.queue_slope_per_s, base.queue_slope_per_s * k)


@given(st.integers(20, 200), st.floats(0.03, 0.5), st.integers(24, 200), st.sampled_from(TICKS), st.data())
def test_a_linearly_growing_queue_with_excess_arrivals_is_overloaded(rate, excess_share, n, tick_us, data):
    # each tick `rate` (+- jitter) arrive and all but `excess` of them complete: the queue grows
    # by `excess` a tick, at least 3% of the arrivals and at least one request
    excess = max(1, round(rate * excess_share))
    jitter = np.array(data.draw(st.lists(st.integers(-10, 10), min_size=n, max_size=n)), np.int64)
    arrivals = rate + jitter
    finished = arrivals - excess
    waiting = np.cumsum(arrivals - finished)
    got = classify(times(n, tick_us), waiting, arrivals, finished)
    assert got.state == OVERLOADED
    assert np.isclose(got.queue_slope_per_s, excess / (tick_us / 1e6))


@given(pool_ticks(min_ticks=2), st.sampled_from(TICKS), st.integers(1, 100), st.data())
def test_the_drain_after_the_last_arrival_changes_no_class(ticks, tick_us, tail, data):
    n, waiting, arrivals, finished = ticks
    before = classify(times(n, tick_us), waiting, arrivals, finished)
    # after the last arrival the queue only falls, whatever completes
    steps = np.array(data.draw(st.lists(st.integers(0, 50), min_size=tail, max_size=tail)), np.int64)
    drain = np.maximum(waiting[-1] - np.cumsum(steps), 0)
    done = -np.diff(np.concatenate(([waiting[-1]], drain)))
    after = classify(times(n + tail, tick_us), np.concatenate((waiting, drain)),
                     np.concatenate((arrivals, np.zeros(tail, np.int64))), np.concatenate((finished, done)))
    assert after.state == before.state
    assert after.queue_end == drain[-1] and after.queue_peak == before.queue_peak
