"""The dashboard's windowed percentiles: the count-tree kernel (replay/fleet/metrics.py), told to
interpolate as numpy does, gives the same floats as np.percentile per window, which small
queries still use."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from tui.percentiles import window_percentiles

_values = st.one_of(st.sampled_from([0.0, -0.0, 1.0, 2.5, 7.0, 1e9]), st.integers(0, 5_000).map(lambda us: us / 1000.0),
                    st.floats(-1e12, 1e12, allow_nan=False, allow_infinity=False))


@st.composite
def queries(draw):
    n = draw(st.integers(0, 80))
    values = np.array(draw(st.lists(_values, min_size=n, max_size=n)), dtype=np.float64)
    k = draw(st.integers(0, 20))
    a = np.sort(np.array(draw(st.lists(st.integers(0, n), min_size=k, max_size=k)), dtype=np.int64))
    if draw(st.booleans()):  # windows in any order, some empty or reversed
        a = np.array(draw(st.permutations(a.tolist())), dtype=np.int64)
    b = np.minimum(a + np.array(draw(st.lists(st.integers(-3, 40), min_size=k, max_size=k)), dtype=np.int64), n)
    percents = draw(st.lists(st.sampled_from([0.0, 12.5, 50.0, 90.0, 99.0, 99.9, 100.0]), min_size=1, max_size=3))
    return values, a, b, percents


@settings(max_examples=300, deadline=None)
@given(queries())
def test_the_kernel_gives_np_percentile_floats(query):
    values, a, b, percents = query
    order = lambda: np.argsort(values)  # noqa: E731
    kernel = window_percentiles(values, a, b, percents, order, kernel_from=0)
    numpy = window_percentiles(values, a, b, percents, order, kernel_from=10**18)
    assert kernel.shape == (len(a), len(percents))
    assert np.array_equal(kernel.view(np.int64), numpy.view(np.int64)) or np.array_equal(kernel, numpy, equal_nan=True)


def test_positions_outside_the_values_are_clamped_not_read():
    """The kernel does not check bounds: a negative end (a reversed window's, as the generator
    above draws) once wrapped to memory before an empty array and crashed the process."""
    for n in (0, 3):
        values = np.arange(n, dtype=np.float64)
        a = np.array([0, 0, 1, 2, -5], np.int64)
        b = np.array([-3, -1, 9, 1, 2], np.int64)
        got = window_percentiles(values, a, b, [50.0], lambda: np.argsort(values), kernel_from=0)
        want = [np.nan, np.nan, np.percentile(values[1:], 50) if n > 1 else np.nan, np.nan,
                np.percentile(values[:2], 50) if n else np.nan]
        assert np.array_equal(got[:, 0], np.array(want), equal_nan=True)
