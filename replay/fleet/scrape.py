"""The control plane's per-tick read of the fleet in one kernel call: per pool, the snapshot's
sums, the replicas by state and the two per-replica means of a scrape (KV use, GPU busy).

Done with numpy, these were ~15 small array operations per pool and tick (boolean gathers,
np.maximum against a Python int, clipping), ~35 us of a tick's ~115 (bench/phases.py on the day,
issue 15); one call with its outputs preallocated is ~2 us. The means are the floats numpy gave:
`pairwise_sum_nb` adds the values in the order np.add.reduce does
(tests/unit/test_scrape.py holds the two to the same bits).
"""

from __future__ import annotations

import replay._numba_cache  # noqa: F401  (before any kernel is defined)

import numpy as np
from numba import njit

from replay.engine.common import R_ACTIVE, R_DRAINING, R_STARTING, SNAPSHOT_COLUMNS

KV_USED, KV_TOTAL, BUSY = (SNAPSHOT_COLUMNS.index(c) for c in ("kv_used_blocks", "kv_total_blocks", "busy_us"))
# numpy's PW_BLOCKSIZE (numpy/_core/src/umath/loops_utils.h.src, `@TYPE@_pairwise_sum`)
PW_BLOCKSIZE = 128


@njit(cache=True, no_cfunc_wrapper=True)
def pairwise_sum_nb(a, lo, n):
    """The sum of a[lo:lo + n] as numpy's float64 add.reduce makes it: its identity 0.0 plus
    `pairwise_sum` of the values."""
    return 0.0 + _pairwise(a, lo, n)


@njit(cache=True, no_cfunc_wrapper=True)
def _pairwise(a, lo, n):
    """numpy's `pairwise_sum`: in order below 8 values (from 0.0); up to a block of 128, eight
    running sums combined as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)) and the rest
    added in order; above it, the two halves (the first a multiple of 8 long) summed apart."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    if n <= PW_BLOCKSIZE:
        r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
        r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
        i = 8
        while i < n - n % 8:
            r0 += a[lo + i]
            r1 += a[lo + i + 1]
            r2 += a[lo + i + 2]
            r3 += a[lo + i + 3]
            r4 += a[lo + i + 4]
            r5 += a[lo + i + 5]
            r6 += a[lo + i + 6]
            r7 += a[lo + i + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < n:
            res += a[lo + i]
            i += 1
        return res
    half = n // 2
    half -= half % 8
    return _pairwise(a, lo, half) + _pairwise(a, lo + half, n - half)


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")  # (dt_us 0: inf and nan, as numpy's)
def scrape_nb(snap, prev_snap, has_prev, states, prev_states, ids, bounds, dt_us, sums, counts, means, scratch):
    """For pool p, whose replicas are ids[bounds[p]:bounds[p + 1]] (in the pool's order):
    sums[p] = its rows of `snap` summed; counts[p, s] = its replicas in state s; means[2p] =
    the mean over its active replicas of used / max(total, 1) KV blocks, means[2p + 1] over its
    serving ones (active or draining) of the busy time since `prev_snap` (all of it if
    `has_prev` is 0) over dt_us, within [0, 1]; a mean of none is 0.0. Returns how many of the
    pools' replicas are active now and were starting at the last tick (`prev_states`), and how
    many are draining. `scratch`: float64, at least as long as `ids`."""
    woke = draining = 0
    cols = snap.shape[1]
    for p in range(len(bounds) - 1):
        for c in range(cols):
            sums[p, c] = 0
        for s in range(counts.shape[1]):
            counts[p, s] = 0
        nkv = 0
        for k in range(bounds[p], bounds[p + 1]):
            r = ids[k]
            for c in range(cols):
                sums[p, c] += snap[r, c]
            state = states[r]
            counts[p, state] += 1
            draining += state == R_DRAINING
            if state == R_ACTIVE:
                woke += prev_states[r] == R_STARTING
                scratch[bounds[p] + nkv] = snap[r, KV_USED] / max(snap[r, KV_TOTAL], 1)
                nkv += 1
        means[2 * p] = pairwise_sum_nb(scratch, bounds[p], nkv) / nkv if nkv else 0.0
        nbusy = 0
        for k in range(bounds[p], bounds[p + 1]):
            r = ids[k]
            if states[r] == R_ACTIVE or states[r] == R_DRAINING:
                busy = snap[r, BUSY] - prev_snap[r, BUSY] if has_prev != 0 else snap[r, BUSY]
                scratch[bounds[p] + nbusy] = min(max(busy / dt_us, 0.0), 1.0)
                nbusy += 1
        means[2 * p + 1] = pairwise_sum_nb(scratch, bounds[p], nbusy) / nbusy if nbusy else 0.0
    return woke, draining


class Scrape:
    """scrape_nb's inputs that never change (the pools' replica ids) and its outputs, reused:
    each tick's `read` returns new arrays only where a caller keeps them (`sums`, `counts`)."""

    def __init__(self, slots: list[np.ndarray], columns: int, states: int = 4):
        self.ids = np.concatenate(slots).astype(np.int64) if slots else np.zeros(0, np.int64)
        self.bounds = np.concatenate(([0], np.cumsum([len(s) for s in slots]))).astype(np.int64)
        self.columns, self.states = columns, states
        self.means = np.zeros(2 * len(slots))  # [kv_usage, gpu_busy] of pool 0, then pool 1, ...
        self.scratch = np.zeros(len(self.ids))

    def read(self, snap: np.ndarray, prev_snap: np.ndarray | None, states: np.ndarray, prev_states: np.ndarray,
             dt_us: int) -> tuple[np.ndarray, np.ndarray, int, int]:
        """(sums [pool, column], counts [pool, state], replicas that woke, replicas draining);
        `self.means` the means."""
        npool = len(self.bounds) - 1
        sums = np.empty((npool, self.columns), np.int64)
        counts = np.empty((npool, self.states), np.int64)
        has_prev = np.int64(prev_snap is not None)
        woke, draining = scrape_nb(snap, snap if prev_snap is None else prev_snap, has_prev, states, prev_states,
                                   self.ids, self.bounds, np.int64(dt_us), sums, counts, self.means, self.scratch)
        return sums, counts, woke, draining
