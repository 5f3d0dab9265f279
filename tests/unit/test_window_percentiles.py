"""The ticks' windowed TTFT percentiles (replay/fleet/metrics.py): the Fenwick-tree kernel gives,
bit for bit, what sorting every window afresh gave, and agrees with np.percentile."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, strategies as st
from numba import njit

from replay.fleet.metrics import _window_percentiles

QS = np.array([0.5, 0.99])


@njit
def _window_percentiles_slow(times, values, t_us, window_us, qs):
    """The kernel before issue 15, literally: every window sorted afresh, O(ticks x window x log)."""
    out = np.full((len(t_us), len(qs)), np.nan)
    lo = np.searchsorted(times, t_us - window_us, side="right")
    hi = np.searchsorted(times, t_us, side="right")
    for i in range(len(t_us)):
        n = hi[i] - lo[i]
        if n == 0:
            continue
        window = np.sort(values[lo[i]:hi[i]])
        for k in range(len(qs)):
            pos = qs[k] * (n - 1)
            j = int(np.floor(pos))
            frac = pos - j
            upper = window[min(j + 1, n - 1)]
            out[i, k] = window[j] + (upper - window[j]) * frac
    return out


# Few distinct values and times, so that ties (in value and in time) are common; both zeros.
_values = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 2.5, 2.5, 7.0, 1e9]),
    st.integers(0, 5_000).map(lambda us: us / 1000.0),  # TTFTs: microseconds in ms
    st.floats(-1e12, 1e12, allow_nan=False, allow_infinity=False),
)


@st.composite
def runs(draw, special=False):
    n = draw(st.integers(0, 60))
    times = np.sort(np.array(draw(st.lists(st.integers(0, 200), min_size=n, max_size=n)), dtype=np.int64))
    kinds = st.one_of(_values, st.sampled_from([np.inf, -np.inf, np.nan])) if special else _values
    values = np.array(draw(st.lists(kinds, min_size=n, max_size=n)), dtype=np.float64)
    # a grid in time order, or any order (each tick's window stands alone); ticks before, within
    # and after the values' span
    start, step, count = draw(st.integers(-50, 250)), draw(st.integers(1, 40)), draw(st.integers(0, 30))
    t_us = start + step * np.arange(count, dtype=np.int64)
    if draw(st.booleans()):
        t_us = draw(st.permutations(t_us.tolist()))
    t_us = np.array(t_us, dtype=np.int64)
    window_us = np.int64(draw(st.sampled_from([1, 7, 40, 1_000])))  # 1_000: wider than the span
    qs = np.array(draw(st.lists(st.floats(0.0, 1.0), max_size=3)) + [0.5, 0.99])
    return times, values, t_us, window_us, qs


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.int64)


@given(runs(special=True))
@example((np.array([], np.int64), np.array([]), np.array([0, 10], np.int64), np.int64(5), QS))  # nothing
@example((np.array([3], np.int64), np.array([4.2]), np.array([3, 4, 9], np.int64), np.int64(5), QS))  # one
@example((np.array([1, 1, 1], np.int64), np.array([2.0, -0.0, 0.0]), np.array([1], np.int64), np.int64(1), QS))
def test_the_same_floats_as_sorting_every_window(run):
    times, values, t_us, window_us, qs = run
    fast = _window_percentiles(times, values, t_us, window_us, qs)
    slow = _window_percentiles_slow(times, values, t_us, window_us, qs)
    assert fast.shape == slow.shape == (len(t_us), len(qs))
    np.testing.assert_array_equal(_bits(fast), _bits(slow))


@given(runs())
def test_numpys_percentiles_of_each_trailing_window(run):
    times, values, t_us, window_us, qs = run
    got = _window_percentiles(times, values, t_us, window_us, qs)
    for i, t in enumerate(t_us):
        window = values[(times > t - window_us) & (times <= t)]
        if len(window) == 0:
            assert np.isnan(got[i]).all()
        else:
            want = np.percentile(window, qs * 100)  # numpy's "linear" method
            np.testing.assert_allclose(got[i], want, rtol=1e-12, atol=1e-12 * np.abs(window).max())


def test_a_long_run_in_time_order():
    # 600,000 values through a sliding window, each in and out once; ranks past 2^18, so that
    # every level of the kernel's count tree has more than one entry
    rng = np.random.default_rng(15)
    times = np.sort(rng.integers(0, 10_000_000, 600_000))
    values = rng.integers(0, 4_000_000, len(times)) / 1000.0
    t_us = np.arange(0, 10_500_000, 200_000, dtype=np.int64)
    for window_us in (100_000, 1_000_000, 4_000_000):
        fast = _window_percentiles(times, values, t_us, np.int64(window_us), QS)
        slow = _window_percentiles_slow(times, values, t_us, np.int64(window_us), QS)
        np.testing.assert_array_equal(_bits(fast), _bits(slow))
    assert not np.isnan(fast[1:]).any() and (np.diff(fast[:, 0]) != 0).any()
