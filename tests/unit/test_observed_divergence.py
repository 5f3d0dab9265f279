"""Divergence of a replayed series from the observed one: MAPE over windows (zero-observed
windows left out and counted), correlation (None when constant), the largest gap and when."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from traces.observed import Grid, score, score_all, unmatched

GRID = Grid(1.0, 1.0, 240)  # four 60 s windows


def test_a_replay_ten_percent_high_has_mape_one_tenth_and_correlation_one():
    observed = 10 + np.sin(np.arange(240) / 20.0)
    got = score(observed, observed * 1.1, GRID, 60.0)
    assert got.windows == 4 and got.zero_windows == 0
    assert got.mape == pytest.approx(0.1)
    assert got.correlation == pytest.approx(1.0)


def test_zero_observed_windows_are_left_out_of_mape_and_counted_but_not_out_of_mae():
    observed = np.r_[np.zeros(60), np.full(180, 4.0)]
    replayed = np.r_[np.full(60, 3.0), np.full(180, 5.0)]
    got = score(observed, replayed, GRID, 60.0)
    assert got.zero_windows == 1
    assert got.mape == pytest.approx(0.25)
    assert got.mae == pytest.approx((3 + 1 + 1 + 1) / 4)
    assert (got.gap, got.gap_at_s, got.observed_at_gap, got.replayed_at_gap) == (3.0, 60.0, 0.0, 3.0)


def test_correlation_is_none_when_a_side_is_constant_and_mape_none_when_all_observed_is_zero():
    assert score(np.full(240, 2.0), np.arange(240.0), GRID, 60.0).correlation is None
    idle = score(np.zeros(240), np.ones(240), GRID, 60.0)
    assert idle.mape is None and idle.zero_windows == 4 and idle.mae == 1.0


def test_ticks_missing_on_either_side_are_not_compared():
    observed = np.full(240, 2.0)
    observed[:120] = np.nan
    replayed = np.full(240, 2.0)
    replayed[200:] = np.nan
    got = score(observed, replayed, GRID, 60.0)
    assert got.windows == 2 and got.mape == 0.0
    assert score(np.full(240, np.nan), replayed, GRID, 60.0).to_dict()["mape"] is None


def test_the_largest_gap_is_found_and_timed():
    observed = np.full(240, 5.0)
    replayed = observed.copy()
    replayed[130:150] = 50.0  # in the third window (ticks 121-180)
    got = score(observed, replayed, GRID, 60.0)
    assert got.gap_at_s == 180.0 and got.gap == pytest.approx(45 * 20 / 60)


def test_score_all_scores_the_keys_on_both_sides():
    observed = {("waiting", "chat"): np.ones(240), ("waiting", "batch"): np.ones(240)}
    replayed = {("waiting", "chat"): np.ones(240) * 2, ("running", "chat"): np.ones(240)}
    scores = score_all(observed, replayed, GRID, 60.0)
    assert list(scores) == [("waiting", "chat")] and scores[("waiting", "chat")].mape == 1.0
    assert unmatched(observed, replayed) == ([("waiting", "batch")], [("running", "chat")])


def test_series_of_another_length_are_refused():
    with pytest.raises(ValueError, match="240 ticks"):
        score(np.ones(10), np.ones(240), GRID, 60.0)


@given(values=st.lists(st.floats(0.1, 1e4), min_size=240, max_size=240), factor=st.floats(0.1, 10))
def test_a_scaled_replay_has_mape_of_the_scale(values, factor):
    observed = np.array(values)
    got = score(observed, observed * factor, GRID, 60.0)
    assert got.mape == pytest.approx(abs(factor - 1), rel=1e-9)
    assert got.correlation is None or got.correlation == pytest.approx(1.0, abs=1e-6)
