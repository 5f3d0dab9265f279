"""The tick's scrape kernel (replay/fleet/scrape.py): its sums are numpy's add.reduce bit for bit
at every length (the block of 8 running sums, the split above 128), and a pool of hundreds of
replicas reads as gathering its columns with numpy did (tests/unit/test_control_metrics.py holds
small fleets to the scrape before issue 15)."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings, strategies as st

from replay.engine.common import R_ACTIVE, R_DRAINING, R_STARTING, SNAPSHOT_COLUMNS
from replay.fleet.scrape import BUSY, KV_TOTAL, KV_USED, Scrape, pairwise_sum_nb

floats = st.floats(-1e300, 1e300, width=64)  # (700 of them sum to no infinity)


@settings(max_examples=200, deadline=None)
@given(st.lists(floats, max_size=700), st.integers(0, 3), st.integers(0, 700))
@example([0.1] * 7, 0, 7)
@example([1e16, 1.0, -1e16] * 43, 1, 129)  # 129 values: the split
def test_the_sum_is_numpys(values, lo, cut):
    a = np.array([0.5] * lo + values, np.float64)
    n = min(cut, len(values))
    want = np.add.reduce(a[lo:lo + n])
    assert np.float64(pairwise_sum_nb(a, lo, n)).tobytes() == np.float64(want).tobytes()


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 400), st.integers(0, 2**32 - 1))
def test_a_large_pool_reads_as_numpy_gathers_it(n, seed):
    rng = np.random.default_rng(seed)
    cols = len(SNAPSHOT_COLUMNS)
    prev = rng.integers(0, 10**6, (n, cols))
    snap = prev + rng.integers(0, 2 * 10**6, (n, cols))
    states = rng.integers(0, 4, n)
    prev_states = rng.integers(0, 4, n)
    ids = rng.permutation(n)
    dt = 1_000_000
    scrape = Scrape([ids], cols)
    sums, counts, woke, draining = scrape.read(snap, prev, states, prev_states, dt)
    active = ids[states[ids] == R_ACTIVE]
    serving = ids[(states[ids] == R_ACTIVE) | (states[ids] == R_DRAINING)]
    kv = snap[active, KV_USED] / np.maximum(snap[active, KV_TOTAL], 1)
    busy = np.clip((snap[serving, BUSY] - prev[serving, BUSY]) / dt, 0.0, 1.0)
    assert sums.tolist() == [snap.sum(axis=0).tolist()]
    assert counts.tolist() == [np.bincount(states, minlength=4).tolist()]
    assert woke == int(((states == R_ACTIVE) & (prev_states == R_STARTING)).sum())
    assert draining == int((states == R_DRAINING).sum())
    assert scrape.means.tobytes() == np.array([kv.mean() if len(kv) else 0.0,
                                               busy.mean() if len(busy) else 0.0]).tobytes()
