"""PromQL's arithmetic (traces/observed/promql.py) against slow, literal twins of
promql/engine.go's lookback, functions.go's extrapolatedRate and quantile.go's bucketQuantile,
and against properties that hold whatever the samples."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

from traces.observed.promql import bucket_quantile, increase, instant, rate, raw_increase


def _instant_twin(t, v, tick, lookback):
    """The latest sample in (tick - lookback, tick], as a loop."""
    best = None
    for ti, vi in zip(t, v):
        if tick - lookback < ti <= tick:
            best = vi
    return math.nan if best is None else best


def _increase_twin(t, v, tick, window):
    """extrapolatedRate(isCounter=true, isRate=false), step by step over (tick - window, tick]."""
    pts = [(ti, vi) for ti, vi in zip(t, v) if tick - window < ti <= tick]
    if len(pts) < 2:
        return math.nan
    result = pts[-1][1] - pts[0][1]
    prev = pts[0][1]
    for _, vi in pts[1:]:
        if vi < prev:
            result += prev
        prev = vi
    first_t, last_t = pts[0][0], pts[-1][0]
    to_start, to_end = first_t - (tick - window), tick - last_t
    sampled = last_t - first_t
    average = sampled / (len(pts) - 1)
    if to_start >= average * 1.1:
        to_start = average / 2
    if result > 0 and pts[0][1] >= 0:
        to_start = min(to_start, sampled * (pts[0][1] / result))
    if to_end >= average * 1.1:
        to_end = average / 2
    return result * (sampled + to_start + to_end) / sampled


def _bucket_quantile_twin(q, bounds, counts):
    """bucketQuantile for one histogram, as quantile.go reads."""
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if len(bounds) < 2 or not math.isinf(bounds[-1]):
        return math.nan
    counts = list(np.maximum.accumulate(counts))
    total = counts[-1]
    if total == 0:
        return math.nan
    rank = q * total
    b = next((i for i in range(len(counts) - 1) if counts[i] >= rank), len(counts) - 1)
    if b == len(counts) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], counts[b]
    if b > 0:
        start, count, rank = bounds[b - 1], counts[b] - counts[b - 1], rank - counts[b - 1]
    return math.nan if count == 0 else start + (end - start) * (rank / count)  # Go: 0/0 is NaN


@st.composite
def _counter_series(draw, resets=True):
    """2-4 series of integer-spaced times (ms) and counter values, some with resets."""
    out = []
    for _ in range(draw(st.integers(1, 4))):
        gaps = draw(st.lists(st.integers(1, 40_000), min_size=1, max_size=30))
        t = 1000.0 + np.cumsum(gaps) / 1000.0
        incs = draw(st.lists(st.integers(0, 50), min_size=len(t), max_size=len(t)))
        v, level = [], draw(st.integers(0, 1000))
        for inc in incs:
            if resets and draw(st.booleans()) and draw(st.booleans()) and level > inc:
                level = inc  # a restart: the counter begins again from zero
            else:
                level += inc
            v.append(float(level))
        out.append((t, np.array(v)))
    return out


def _concat(series):
    t = np.concatenate([s[0] for s in series])
    v = np.concatenate([s[1] for s in series])
    starts = np.concatenate(([0], np.cumsum([len(s[0]) for s in series])))
    return t, v, starts


@given(series=_counter_series(), step=st.sampled_from([0.5, 1.0, 7.0, 15.0]), window=st.sampled_from([5.0, 60.0, 300.0]),
       lookback=st.sampled_from([1.0, 30.0, 300.0]))
def test_instant_and_increase_match_their_twins(series, step, window, lookback):
    t, v, starts = _concat(series)
    ticks = 1000.0 + step * np.arange(int(400 / step))
    got_instant = instant(t, v, starts, ticks, lookback)
    got_increase = increase(t, v, starts, ticks, window)
    for i, (ts, vs) in enumerate(series):
        for j, tick in enumerate(ticks):
            np.testing.assert_equal(np.isnan(got_instant[i, j]), math.isnan(_instant_twin(ts, vs, tick, lookback)))
            if not np.isnan(got_instant[i, j]):
                assert got_instant[i, j] == _instant_twin(ts, vs, tick, lookback)
            want = _increase_twin(ts, vs, tick, window)
            assert (math.isnan(want) and np.isnan(got_increase[i, j])) or math.isclose(got_increase[i, j], want, rel_tol=1e-9, abs_tol=1e-9)


@given(series=_counter_series())
def test_the_raw_increase_of_a_counter_with_resets_is_the_sum_of_its_increments(series):
    for t, v in series:
        increments = [v[i] - v[i - 1] if v[i] >= v[i - 1] else v[i] for i in range(1, len(v))]
        assert raw_increase(v) == pytest.approx(sum(increments))


@given(slope=st.floats(0.1, 1000), interval=st.sampled_from([1.0, 5.0, 15.0]), start=st.floats(1e4, 1e6),
       window_intervals=st.integers(2, 20))
def test_rate_of_a_steady_counter_is_its_slope(slope, interval, start, window_intervals):
    t = np.arange(0, 3600, interval) + 0.25 * interval
    v = start + slope * t
    window = window_intervals * interval
    got = rate(t, v, np.array([0, len(t)]), np.arange(window, 3600 - interval, interval), window)
    np.testing.assert_allclose(got[0], slope, rtol=1e-9)


def test_a_reset_inside_the_window_is_not_a_negative_rate():
    t = np.arange(0.0, 10.0)
    v = np.array([0, 10, 20, 30, 40, 5, 15, 25, 35, 45], dtype=float)  # restart at t=5
    got = increase(t, v, np.array([0, 10]), np.array([9.0]), 10.0)
    assert got[0, 0] == pytest.approx(_increase_twin(t, v, 9.0, 10.0))
    assert raw_increase(v) == 85.0


def test_instant_honours_the_lookback_and_the_left_open_window():
    t, v = np.array([10.0, 20.0]), np.array([1.0, 2.0])
    got = instant(t, v, np.array([0, 2]), np.array([5.0, 10.0, 15.0, 20.0, 25.0, 30.0]), 10.0)
    np.testing.assert_equal(got[0], [np.nan, 1.0, 1.0, 2.0, 2.0, np.nan])  # at 30, 20 is lookback old: out


@pytest.mark.parametrize("q, counts, want", [
    (0.5, [1, 3, 4, 4], 0.75),        # rank 2 in (0.5, 1]: 0.5 + 0.5 * (1 / 2)
    (0.25, [1, 3, 4, 4], 0.5),        # rank 1 is the first bucket's top
    (0.1, [2, 3, 4, 4], 0.1),         # lowest bucket interpolates from 0
    (0.99, [1, 2, 3, 10], 2.0),       # in the +Inf bucket: the second-highest bound
    (0.5, [0, 0, 0, 0], math.nan),    # no observations
    (-0.1, [1, 2, 3, 4], -math.inf),
    (1.5, [1, 2, 3, 4], math.inf),
])
def test_bucket_quantile_cases(q, counts, want):
    bounds = np.array([0.5, 1.0, 2.0, np.inf])
    got = bucket_quantile(q, bounds, np.array([counts], dtype=float))[0]
    assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(want)


def test_a_lowest_bucket_at_or_below_zero_returns_its_bound():
    bounds = np.array([-1.0, 0.0, 1.0, np.inf])
    assert bucket_quantile(0.1, bounds, np.array([[5.0, 6.0, 8.0, 10.0]]))[0] == -1.0


_BOUNDS = st.lists(st.floats(0.001, 1000), min_size=1, max_size=12, unique=True).map(lambda b: sorted(b) + [math.inf])


@given(bounds=_BOUNDS, values=st.lists(st.floats(0, 2000), min_size=1, max_size=200), q=st.floats(0.01, 1.0))
def test_histogram_quantile_of_bucketed_values_is_within_the_bucket_of_the_truth(bounds, values, q):
    bounds_arr = np.array(bounds)
    counts = np.array([[sum(1 for x in values if x <= b) for b in bounds]], dtype=float)
    got = bucket_quantile(q, bounds_arr, counts)[0]
    assert got == pytest.approx(_bucket_quantile_twin(q, bounds, counts[0]))
    truth = sorted(values)[max(0, math.ceil(q * len(values)) - 1)]  # the rank-th smallest
    b = int(np.searchsorted(bounds_arr, truth, side="left"))
    if b == len(bounds) - 1:
        assert got == bounds[-2]
    else:
        assume(not (b == 0 and bounds[0] <= 0))
        lower = bounds[b - 1] if b > 0 else 0.0
        assert lower - 1e-9 <= got <= bounds[b] + 1e-9


@given(rows=st.lists(st.lists(st.integers(0, 5), min_size=4, max_size=4), min_size=1, max_size=20),
       q=st.floats(0, 1))
def test_bucket_quantile_matches_its_twin_row_by_row(rows, q):
    bounds = [0.1, 0.5, 2.0, math.inf]
    counts = np.cumsum(np.array(rows, dtype=float), axis=1)
    got = bucket_quantile(q, np.array(bounds), counts)
    for row, value in zip(counts, got):
        want = _bucket_quantile_twin(q, bounds, row)
        assert (math.isnan(want) and math.isnan(value)) or value == pytest.approx(want)
