"""layout.Scrapes, the samples as align reads them: built from the long frame (series, t,
value), it gives that frame back, and series share a target exactly when their times are equal."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, strategies as st

from traces.observed.layout import Scrapes

_TIMES = st.lists(st.integers(0, 50), max_size=6, unique=True).map(lambda xs: np.array(sorted(xs), dtype=float))


@given(st.lists(st.one_of(st.none(), _TIMES), max_size=8), st.data())
def test_the_long_frame_round_trips_and_equal_times_share_a_target(series_times, data):
    pool = [t for t in series_times if t is not None] or [np.zeros(0)]
    times = [data.draw(st.sampled_from(pool)) if t is None else t for t in series_times]  # some repeated
    values = [np.arange(len(t), dtype=float) + 10 * i for i, t in enumerate(times)]
    frame = pl.DataFrame({"series": pl.Series(np.concatenate([np.full(len(t), i, np.uint32) for i, t in enumerate(times)]
                                                             or [np.zeros(0, np.uint32)])),
                          "t": np.concatenate(times or [np.zeros(0)]), "value": np.concatenate(values or [np.zeros(0)])})
    scrapes = Scrapes.from_frame(frame, len(times))
    assert scrapes.frame().equals(frame)
    assert scrapes.height == frame.height
    for i, a in enumerate(times):
        np.testing.assert_array_equal(scrapes.t_of(i), a)
        for j, b in enumerate(times):
            assert (scrapes.target[i] == scrapes.target[j]) == np.array_equal(a, b)
    assert len(scrapes.time_start) - 1 == len({t.tobytes() for t in times})


def test_values_that_do_not_fit_their_targets_times_are_refused():
    with pytest.raises(ValueError, match="one value per time"):
        Scrapes(np.arange(3.0), np.array([0, 3]), np.arange(4.0), np.array([0, 4]), np.array([0]))
