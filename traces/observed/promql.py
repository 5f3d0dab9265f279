"""PromQL's arithmetic on series held as numpy arrays, evaluated at every tick of a grid at once.

`instant`: what a range query's step returns for a bare selector (promql/engine.go): the latest
sample at or before the step, no older than the lookback delta; since Prometheus 3.0 the window
is left-open, (step - lookback, step]. `rate` / `increase`: `extrapolatedRate` of
promql/functions.go over the left-open range (step - w, step]: at least two samples, a drop in
value is a counter reset that adds the value before it, and the result is extrapolated to the
range's edges when the first and last samples lie within 1.1 average intervals of them (else
by half an interval), never to before the counter's zero point. `bucket_quantile`:
`bucketQuantile` of promql/quantile.go. Times are seconds.

Series come concatenated: `t` and `v` sorted by series then time, `starts[i]:starts[i+1]` the
samples of series i; `ticks` is a regular grid (Grid.times()). Each function returns one row per series, one column per tick, NaN where
PromQL returns no value.
"""

from __future__ import annotations

import numpy as np


def _upto(t: np.ndarray, starts: np.ndarray, ticks: np.ndarray) -> np.ndarray:
    """How many samples of each series are at or before each tick: one row per series. A
    sample's first tick at or after it is found by arithmetic on the regular grid (then nudged
    by one where rounding put it on the wrong side), so this costs a bincount, not a binary
    search per tick."""
    k, n = len(starts) - 1, len(ticks)
    step = (ticks[-1] - ticks[0]) / (n - 1) if n > 1 else 1.0
    first = np.clip(np.ceil((t - ticks[0]) / step), 0, n).astype(np.int64)
    edge = np.append(ticks, np.inf)  # edge[n]: past the grid
    first = np.where((first > 0) & (edge[np.maximum(first - 1, 0)] >= t), first - 1, first)
    first = np.where(edge[first] < t, first + 1, first)
    seg = np.repeat(np.arange(k), np.diff(starts))
    counts = np.bincount(seg * (n + 1) + first, minlength=k * (n + 1)).reshape(k, n + 1)[:, :n]
    return np.cumsum(counts, axis=1)


def _window_ends(t: np.ndarray, starts: np.ndarray, ticks: np.ndarray, window: float):
    """(the last sample <= tick, the first sample > tick - window) of each series at each tick.
    A window of whole ticks is the same count shifted, so one pass over a longer grid gives both."""
    n = len(ticks)
    step = (ticks[-1] - ticks[0]) / (n - 1) if n > 1 else window
    shift = window / step
    if n > 1 and abs(shift - round(shift)) < 1e-9 and 0 < round(shift) <= 10 * n:
        m = int(round(shift))
        upto = _upto(t, starts, np.concatenate((ticks[0] + step * np.arange(-m, 0), ticks)))
        below, upto = upto[:, :n], upto[:, m:]
    else:
        upto, below = _upto(t, starts, ticks), _upto(t, starts, ticks - window)
    return starts[:-1, None] + upto - 1, starts[:-1, None] + below


def instant(t: np.ndarray, v: np.ndarray, starts: np.ndarray, ticks: np.ndarray, lookback: float) -> np.ndarray:
    k = len(starts) - 1
    if len(t) == 0:
        return np.full((k, len(ticks)), np.nan)
    last = starts[:-1, None] + _upto(t, starts, ticks) - 1
    ok = last >= starts[:-1, None]  # a sample of this series at or before the tick
    last = np.maximum(last, 0)
    ok &= t[last] > ticks[None, :] - lookback
    return np.where(ok, v[last], np.nan)


def raw_increase(v: np.ndarray) -> float:
    """A counter's increase from its first sample to its last, resets added back (the part of
    extrapolatedRate before extrapolation)."""
    if len(v) < 2:
        return 0.0
    drops = v[1:] < v[:-1]
    return float(v[-1] - v[0] + v[:-1][drops].sum())


def increase(t: np.ndarray, v: np.ndarray, starts: np.ndarray, ticks: np.ndarray, window: float) -> np.ndarray:
    k = len(starts) - 1
    if len(t) == 0:
        return np.full((k, len(ticks)), np.nan)
    hi, lo = _window_ends(t, starts, ticks, window)
    count = hi - lo + 1
    ok = count >= 2
    hi, lo = np.maximum(hi, 0), np.minimum(lo, len(t) - 1)
    # v plus every reset's value before the drop, so that one difference is the increase
    drops = np.zeros(len(v))
    reset = v[1:] < v[:-1]
    reset[starts[1:-1] - 1] = False  # a series' first sample is no reset of the one before
    drops[1:] = np.where(reset, v[:-1], 0.0)
    level = v + np.cumsum(drops)
    result = level[hi] - level[lo]
    first_t, last_t, first_v = t[lo], t[hi], v[lo]
    with np.errstate(divide="ignore", invalid="ignore"):
        sampled = last_t - first_t
        average = sampled / (count - 1)
        threshold = average * 1.1
        to_start = first_t - (ticks[None, :] - window)
        to_start = np.where(to_start >= threshold, average / 2, to_start)
        # Counters start at zero: extrapolate no further back than where this slope meets it.
        rising = (result > 0) & (first_v >= 0)
        to_start = np.where(rising, np.minimum(to_start, sampled * first_v / result), to_start)
        to_end = ticks[None, :] - last_t
        to_end = np.where(to_end >= threshold, average / 2, to_end)
        out = result * ((sampled + to_start + to_end) / sampled)
    return np.where(ok & (sampled > 0), out, np.nan)


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
