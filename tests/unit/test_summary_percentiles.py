"""summary.json's percentiles (replay/fleet/metrics.py `linear_quantiles`): one sort for all of a
column's quantiles gives, float for float, what polars' `quantile(q, interpolation="linear")` gave
for each (the summaries of runs before issue 15)."""

from __future__ import annotations

import numpy as np
import polars as pl
from hypothesis import example, given, strategies as st

from replay.fleet.metrics import linear_quantiles

_ints = st.lists(st.integers(-(2**53), 2**53), min_size=1, max_size=80)
_floats = st.lists(st.one_of(st.floats(allow_nan=False), st.sampled_from([0.0, -0.0, 1.5, 1.5, 1e300])),
                   min_size=1, max_size=80)
_qs = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4).map(lambda qs: qs + [0.5, 0.9, 0.99])


@given(st.one_of(_ints.map(lambda v: np.array(v, np.int64)), _floats.map(lambda v: np.array(v, np.float64))), _qs)
@example(np.array([3, 1, 2], np.int64), [0.5, 0.99])
@example(np.array([np.inf, np.inf, 1.0]), [0.5, 0.99])
@example(np.array([-np.inf, 0.0, np.inf]), [0.25, 0.5, 0.75])
@example(np.array([7], np.int64), [0.0, 1.0])
def test_same_floats_as_polars_linear_quantile(values, qs):
    series = pl.Series(values)
    want = [series.quantile(q, interpolation="linear") for q in qs]
    got = linear_quantiles(values, qs)
    assert [np.float64(v).tobytes() for v in got] == [np.float64(v).tobytes() for v in want], (got, want)


def test_large_column_same_as_polars():
    rng = np.random.default_rng(15)
    values = rng.lognormal(11, 1.2, 300_001).astype(np.int64)  # TTFTs in microseconds
    qs = [0.5, 0.9, 0.99]
    assert linear_quantiles(values, qs) == [pl.Series(values).quantile(q, interpolation="linear") for q in qs]
