"""summary.json's percentiles read without holding their columns (replay/fleet/selection.py): the
external selection gives, float for float, what `linear_quantiles` gives from one sort of the
whole column (and so polars' linear quantile), whatever the data: ties, NaN, infinities, both
zeros, one value, values at every histogram bin's edge, batches of 1-7 rows, and searches that
must narrow their span several times (`HELD` lowered to a few values)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import example, given, settings, strategies as st

import replay.fleet.selection as selection
from replay.fleet.metrics import linear_quantiles
from replay.fleet.selection import exact_quantiles, order_keys, select_quantiles

QS = [0.0, 0.5, 0.9, 0.99, 1.0]
_ints = st.lists(st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-3, 3),
                           st.sampled_from([0, 1 << 16, (1 << 16) - 1, 1 << 32, 2**63 - 1, -(2**63)])),
                 min_size=1, max_size=300).map(lambda v: np.array(v, np.int64))
_floats = st.lists(st.one_of(st.floats(), st.sampled_from([0.0, -0.0, 1.5, np.inf, -np.inf, np.nan, 1e300])),
                   min_size=1, max_size=300).map(lambda v: np.array(v, np.float64))
_qs = st.lists(st.floats(0.0, 1.0), min_size=0, max_size=3).map(lambda qs: qs + QS)


def _batches(values: np.ndarray, sizes: list[int]):
    """The column in batches of these sizes (cycled), fresh on each call."""
    def batches():
        at, i = 0, 0
        while at < len(values):
            size = sizes[i % len(sizes)]
            yield [values[at:at + size]]
            at, i = at + size, i + 1
    return batches


def _bits(values: list[float]) -> list[bytes]:
    # +0.0 and -0.0 are one value to np.sort, and so is every NaN (whatever its sign and payload):
    # which of them a rank holds is the sort's choice
    return [np.float64(0.0 if v == 0 else np.nan if np.isnan(v) else v).tobytes() for v in values]


@settings(max_examples=300, deadline=None)
@given(st.one_of(_ints, _floats), _qs, st.lists(st.integers(1, 7), min_size=1, max_size=4),
       st.sampled_from([1, 2, 3, 5, 1 << 21]), st.sampled_from([1, 2, 16]))
@example(np.array([7], np.int64), QS, [1], 1, 16)
@example(np.array([5] * 40 + [6], np.int64), QS, [3], 2, 1)
@example(np.array([np.nan, 1.0, np.nan, -np.inf]), QS, [1], 1, 1)
@example(np.arange(1 << 10, dtype=np.int64) << 40, QS, [7], 3, 2)
def test_same_floats_as_one_sort(values, qs, sizes, held, bin_bits):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(selection, "HELD", held)
        patch.setattr(selection, "BIN_BITS", bin_bits)
        [(n, got)] = select_quantiles(_batches(values, sizes), [qs])
    assert n == len(values)
    assert _bits(got) == _bits(linear_quantiles(values, qs))


def test_order_keys_sort_as_numpy_sorts():
    values = np.array([np.nan, 3.0, -0.0, 0.0, -np.inf, np.inf, -1e-300, 1e-300, -2.5, -np.nan])
    keys = order_keys(values)
    assert keys[2] == keys[3] and keys[0] == keys[-1] == keys.max()
    assert _bits(values[np.argsort(keys, kind="stable")].tolist()) == _bits(np.sort(values).tolist())
    ints = np.array([-(2**63), -1, 0, 1, 2**63 - 1], np.int64)
    assert (np.diff(order_keys(ints).astype(object)) > 0).all()


def test_empty_columns_and_columns_of_nulls(monkeypatch):
    monkeypatch.setattr(selection, "HELD", 2)
    lf = pl.LazyFrame({"a": [None, 3, None, 1, 2], "b": [None] * 5}, schema={"a": pl.Int64, "b": pl.Float64})
    got = exact_quantiles(lf, {"a": (pl.col("a"), [0.5, 1.0]), "b": (pl.col("b"), [0.5])}, rows=2)
    assert got == {"a": (3, [2.0, 3.0]), "b": (0, [])}


@pytest.mark.parametrize("held", [1 << 21, 1000])
def test_a_large_skewed_column_read_in_batches(monkeypatch, held):
    """Lognormal TTFTs with an outlier far out (the bins span it: the crowd is in a few of them)."""
    monkeypatch.setattr(selection, "HELD", held)
    rng = np.random.default_rng(15)
    values = np.concatenate([rng.lognormal(11, 1.2, 200_001).astype(np.int64), [10**15, 3, 3, 3]])
    lf = pl.LazyFrame({"ttft_us": values, "tpot_us": values / 7.0})
    got = exact_quantiles(lf, {"ttft": (pl.col("ttft_us"), QS), "tpot": (pl.col("tpot_us"), QS)}, rows=4096)
    assert got["ttft"] == (len(values), linear_quantiles(values, QS))
    assert got["tpot"] == (len(values), linear_quantiles(values / 7.0, QS))
