"""Percentiles over many windows of one time-sorted series, as np.percentile gives them.

Small queries (a few windows of a few thousand values, what most redraws ask) take np.percentile
per window; large ones (a chart of a day of millions of requests, where every column's window
holds its own share of them) take the windowed kernel of the tick columns (replay/fleet/metrics.py:
each value ranked once, counted in and out as the windows slide), told to interpolate as numpy
does, so the figures are the same floats either way. The kernel is imported when first needed:
numba's import is not paid by a dashboard that never asks for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

# values summed over the windows of one query past which the kernel pays for itself (its import
# and ranking every value once, about 0.1 s per million values, against np.percentile's partition
# of every window)
KERNEL_FROM = 2_000_000
T = TypeVar("T")


def window_percentiles(values: np.ndarray, a: np.ndarray, b: np.ndarray, percents: Sequence[float],
                       order: Callable[[], np.ndarray], kernel_from: int = KERNEL_FROM) -> np.ndarray:
    """np.percentile(values[a[i]:b[i]], percents) per i, NaN where empty; `order()` gives the
    positions of `values` from smallest to largest (kept by the caller, asked for only when used)."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    if int(np.maximum(b - a, 0).sum()) >= kernel_from:
        from replay.fleet.metrics import percentiles_in_spans

        qs = np.true_divide(np.asarray(percents, np.float64), 100)  # as np.percentile turns them into quantiles
        return percentiles_in_spans(np.asarray(values, np.float64), order(), a, b, qs, True)
    out = np.full((len(a), len(percents)), np.nan)
    for i in np.flatnonzero(b > a):
        out[i] = np.percentile(values[a[i]:b[i]], percents)
    return out


def by_pass(read: Callable[[int, int], T], of: Callable[[T, np.ndarray, np.ndarray], np.ndarray],
            lo_us: np.ndarray, hi_us: np.ndarray, reach_us: int, span_us: int, width: int) -> np.ndarray:
    """Figures over windows (lo - reach, hi] of a series too large to keep, each pass over the
    windows ending in one `span_us` of time: `read(t0, t1)` gives what is timed in (t0, t1] (a
    query of the file that skips what is outside), `of(got, lo, hi)` the `width` figures of each
    of those windows from it. What it holds at once is one pass's values."""
    lo, hi = np.asarray(lo_us, np.int64), np.asarray(hi_us, np.int64)
    out = np.full((len(lo), width), np.nan)
    if not len(lo):
        return out
    by_end = np.argsort(hi, kind="stable")
    passes = (hi[by_end] - hi[by_end[0]]) // max(span_us, 1)
    for k in np.unique(passes):
        mine = by_end[passes == k]
        got = read(int((lo[mine] - reach_us).min()), int(hi[mine].max()))
        out[mine] = of(got, lo[mine], hi[mine])
    return out


def percentiles_by_pass(read: Callable[[int, int], tuple[np.ndarray, np.ndarray]], lo_us: np.ndarray,
                        hi_us: np.ndarray, window_us: int, percents: Sequence[float], span_us: int) -> np.ndarray:
    """window_percentiles of a series too large to keep, per window (lo - window, hi], by_pass:
    `read(t0, t1)` gives the values timed in (t0, t1] by time. The figures are those of the
    whole series held."""
    def of(got: tuple[np.ndarray, np.ndarray], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        times, values = got
        at, to = np.searchsorted(times, lo - window_us, side="right"), np.searchsorted(times, hi, side="right")
        return window_percentiles(values, at, to, percents, lambda: np.argsort(values))

    return by_pass(read, of, lo_us, hi_us, window_us, span_us, len(percents))
