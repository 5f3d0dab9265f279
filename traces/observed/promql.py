"""PromQL's arithmetic on series held as numpy arrays, evaluated at every tick of a grid at once.

`instant`: what a range query's step returns for a bare selector (promql/engine.go): the latest
sample at or before the step, no older than the lookback delta; since Prometheus 3.0 the window
is left-open, (step - lookback, step]. `rate` / `increase`: `extrapolatedRate` of
promql/functions.go over the left-open range (step - w, step]: at least two samples, a drop in
value is a counter reset that adds the value before it, and the result is extrapolated to the
range's edges when the first and last samples lie within 1.1 average intervals of them (else
by half an interval), never to before the counter's zero point. `bucket_quantile`:
`bucketQuantile` of promql/quantile.go. Times are seconds.

One series is `t` and `v`, sorted by time; `ticks` is a regular grid (Grid.times()). Where a
sample sits among the ticks (`latest`, `windows`) depends on the times alone, so series scraped
together share it and only their values are gathered (`instant_at`, `increase_at`). `instant` /
`increase` / `rate` take several series concatenated, `starts[i]:starts[i+1]` the samples of
series i, and return one row per series. NaN where PromQL returns no value.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def _upto(t: np.ndarray, ticks: np.ndarray) -> np.ndarray:
    """How many of a series' samples `t` are at or before each tick. A sample's first tick at or
    after it is found by arithmetic on the regular grid (then nudged by one where rounding put
    it on the wrong side), so this costs a bincount, not a binary search per tick."""
    n = len(ticks)
    step = (ticks[-1] - ticks[0]) / (n - 1) if n > 1 else 1.0
    first = np.clip(np.ceil((t - ticks[0]) / step), 0, n).astype(np.int64)
    edge = np.append(ticks, np.inf)  # edge[n]: past the grid
    first = np.where((first > 0) & (edge[np.maximum(first - 1, 0)] >= t), first - 1, first)
    first = np.where(edge[first] < t, first + 1, first)
    return np.cumsum(np.bincount(first, minlength=n + 1)[:n])


class Latest(NamedTuple):
    """Where each tick's latest sample within the lookback is: shared by every series scraped
    at the same times (a histogram's buckets)."""

    last: np.ndarray
    ok: np.ndarray


def latest(t: np.ndarray, ticks: np.ndarray, lookback: float) -> Latest:
    last = _upto(t, ticks) - 1
    ok = last >= 0
    last = np.maximum(last, 0)
    ok &= t[last] > ticks - lookback if len(t) else False
    return Latest(last, ok)


def instant_at(where: Latest, v: np.ndarray) -> np.ndarray:
    return np.where(where.ok, v[where.last], np.nan) if len(v) else np.full(len(where.ok), np.nan)


class Windows(NamedTuple):
    """Each tick's rate window over one series' sample times: its first (`lo`) and last (`hi`)
    sample, whether it has two, and the extrapolation before the zero-point rule, which needs
    the values. Shared by every series scraped at the same times."""

    lo: np.ndarray
    hi: np.ndarray
    ok: np.ndarray
    sampled: np.ndarray
    to_start: np.ndarray
    to_end: np.ndarray


def window_starts(ticks: np.ndarray, window: float) -> np.ndarray:
    """Each tick's `tick - window`, the open edge of its range: for a window of whole ticks, the
    grid's own earlier ticks (extended before the first), so that a sample on a tick falls in
    the same windows whatever rounding `tick - window` would have."""
    n = len(ticks)
    step = (ticks[-1] - ticks[0]) / (n - 1) if n > 1 else window
    shift = window / step
    if n > 1 and abs(shift - round(shift)) < 1e-9 and 0 < round(shift) <= 10 * n:
        m = int(round(shift))
        return np.concatenate((ticks[0] + step * np.arange(-m, 0), ticks))[:n]
    return ticks - window


def windows(t: np.ndarray, ticks: np.ndarray, window: float) -> Windows:
    n = len(ticks)
    upto, below = _upto(t, ticks), _upto(t, window_starts(ticks, window))
    hi, lo = upto - 1, below  # the last sample <= tick; the first > tick - window
    count = hi - lo + 1
    ok = count >= 2
    hi, lo = np.maximum(hi, 0), np.minimum(lo, max(len(t) - 1, 0))
    if not len(t):
        nothing = np.zeros(n)
        return Windows(lo, hi, ok, nothing, nothing, nothing)
    first_t, last_t = t[lo], t[hi]
    with np.errstate(divide="ignore", invalid="ignore"):
        sampled = last_t - first_t
        average = sampled / (count - 1)
        threshold = average * 1.1
        to_start = first_t - (ticks - window)
        to_start = np.where(to_start >= threshold, average / 2, to_start)
        to_end = ticks - last_t
        to_end = np.where(to_end >= threshold, average / 2, to_end)
    return Windows(lo, hi, ok & (sampled > 0), sampled, to_start, to_end)


def increase_at(w: Windows, v: np.ndarray) -> np.ndarray:
    if not len(v):
        return np.full(len(w.ok), np.nan)
    # v plus every reset's value before the drop, so that one difference is the increase
    falls = v[1:] < v[:-1]
    level = v
    if falls.any():
        drops = np.zeros(len(v))
        drops[1:] = np.where(falls, v[:-1], 0.0)
        level = v + np.cumsum(drops)
    result = level[w.hi] - level[w.lo]
    first_v = v[w.lo]
    with np.errstate(divide="ignore", invalid="ignore"):
        # Counters start at zero: extrapolate no further back than where this slope meets it.
        rising = (result > 0) & (first_v >= 0)
        to_start = np.where(rising, np.minimum(w.to_start, w.sampled * first_v / result), w.to_start)
        out = result * ((w.sampled + to_start + w.to_end) / w.sampled)
    return np.where(w.ok, out, np.nan)


def instant(t: np.ndarray, v: np.ndarray, starts: np.ndarray, ticks: np.ndarray, lookback: float) -> np.ndarray:
    return np.array([instant_at(latest(t[a:b], ticks, lookback), v[a:b]) for a, b in zip(starts[:-1], starts[1:])]) \
        .reshape(len(starts) - 1, len(ticks))


def raw_increase(v: np.ndarray) -> float:
    """A counter's increase from its first sample to its last, resets added back (the part of
    extrapolatedRate before extrapolation)."""
    if len(v) < 2:
        return 0.0
    drops = v[1:] < v[:-1]
    return float(v[-1] - v[0] + v[:-1][drops].sum())


def increase(t: np.ndarray, v: np.ndarray, starts: np.ndarray, ticks: np.ndarray, window: float) -> np.ndarray:
    return np.array([increase_at(windows(t[a:b], ticks, window), v[a:b]) for a, b in zip(starts[:-1], starts[1:])]) \
        .reshape(len(starts) - 1, len(ticks))


def rate(t: np.ndarray, v: np.ndarray, starts: np.ndarray, ticks: np.ndarray, window: float) -> np.ndarray:
    """Per-second rate over (tick - window, tick]: increase / window."""
    return increase(t, v, starts, ticks, window) / window


def bucket_quantile(q: float, bounds: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The q-quantile of each row of `counts` (rows: ticks; columns: cumulative bucket counts at
    the upper `bounds`, sorted ascending, unique, the last +Inf): linear interpolation inside
    the bucket the rank falls in, 0 as the lowest bucket's lower bound when its upper bound is
    positive, the second-highest bound when the rank falls in the +Inf bucket; NaN with no
    observations, fewer than two buckets or no +Inf bucket."""
    rows, width = counts.shape
    if np.isnan(q):
        return np.full(rows, np.nan)
    if q < 0 or q > 1:
        return np.full(rows, -np.inf if q < 0 else np.inf)
    if width < 2 or not np.isposinf(bounds[-1]):
        return np.full(rows, np.nan)
    # PromQL forces monotonic counts (ensureMonotonic): rates of cumulative counters can dip by
    # rounding or by a reset seen in one bucket's series and not yet in the next.
    counts = np.maximum.accumulate(np.nan_to_num(counts, nan=0.0), axis=1)
    total = counts[:, -1]
    rank = q * total
    reached = counts[:, :-1] >= rank[:, None]
    b = np.where(reached.any(axis=1), reached.argmax(axis=1), width - 1)
    inner = np.minimum(b, width - 2)
    below = np.where(b > 0, counts[np.arange(rows), np.maximum(b - 1, 0)], 0.0)
    start = np.where(b > 0, bounds[np.maximum(b - 1, 0)], 0.0)
    end = bounds[inner]
    in_bucket = counts[np.arange(rows), inner] - below
    with np.errstate(divide="ignore", invalid="ignore"):
        value = start + (end - start) * ((rank - below) / in_bucket)
    value = np.where(b == width - 1, bounds[width - 2], value)
    value = np.where((b == 0) & (bounds[0] <= 0), bounds[0], value)
    return np.where(total > 0, value, np.nan)
