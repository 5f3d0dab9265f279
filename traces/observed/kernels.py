"""promql.py's `instant_at(latest(...))` and `increase_at(windows(...))` as compiled passes,
one call per series kind over every series of that kind, each series' values added straight
into its output row (`total += nan_to_num(value) * factor`, `present += value is not NaN`),
as align.py's groups do. No per-tick temporaries: a day of 1 s scrapes of a fleet is hundreds
of millions of samples, and numpy's dozen temporaries per series cost more than the arithmetic.

The arithmetic is promql.py's, operation for operation and in the same order, so the results
are the same floats; tests/unit/test_observed_fast.py holds the two together on generated
series, and test_observed_promql.py holds promql.py to the literal twins of Prometheus'
engine.go / functions.go. Each series' `t` is sorted, one sample per timestamp (samples.py).

Where a sample sits among the ticks is found by galloping from where the previous tick's
search ended (ticks only go forward), so a histogram bucket's rate windows, one per 60 ticks,
read a few of its timestamps per window and not all of them; its values are read once, to
find counter resets.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_MAX = np.finfo(np.float64).max  # what np.nan_to_num makes of +Inf


@njit(cache=True, _nrt=False, inline="always")
def _count_le_nb(t, x, c):
    """How many of `t` are <= x, searched forward from `c`, the previous answer (for an x no
    smaller than the previous one; a smaller x walks back, so the answer is right either way)."""
    m = len(t)
    while c > 0 and t[c - 1] > x:
        c -= 1
    if c >= m or t[c] > x:
        return c
    lo, step = c, 1  # t[lo] <= x
    while lo + step < m and t[lo + step] <= x:
        lo += step
        step *= 2
    hi = min(lo + step, m)  # t[hi] > x, or past the end
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if t[mid] <= x:
            lo = mid
        else:
            hi = mid
    return hi


@njit(cache=True, _nrt=False, inline="always")
def _add_nb(total, present, i, value, factor):
    """align._Group.add for one tick: NaN counts as absent and adds 0, +-Inf add +-max float."""
    if np.isnan(value):
        total[i] += 0.0 * factor
    else:
        present[i] += 1
        if value == np.inf:
            value = _MAX
        elif value == -np.inf:
            value = -_MAX
        total[i] += value * factor


@njit(cache=True, _nrt=False, error_model="numpy")
def instants_nb(t_all, v_all, offsets, sids, rows, factors, total, present, ticks, lookback):
    """Each listed series' latest sample in (tick - lookback, tick] at every tick, added into
    `total[rows[k]]`, `present[rows[k]]` times factors[k]."""
    for k in range(len(sids)):
        a, b = offsets[sids[k]], offsets[sids[k] + 1]
        t, v = t_all[a:b], v_all[a:b]
        out_t, out_p = total[rows[k]], present[rows[k]]
        c = 0
        for i in range(len(ticks)):
            c = _count_le_nb(t, ticks[i], c)
            value = np.nan
            if c > 0 and t[c - 1] > ticks[i] - lookback:
                value = v[c - 1]
            _add_nb(out_t, out_p, i, value, factors[k])


@njit(cache=True, _nrt=False, error_model="numpy")
def _level_nb(v, scratch):
    """Whether the counter `v` drops (resets) and, if it does, v plus every earlier reset's
    value before the drop (promql.increase_at's `level`) written into `scratch`."""
    falls = 0
    for j in range(1, len(v)):
        falls += v[j] < v[j - 1]
    if falls == 0:
        return False
    drops = 0.0
    scratch[0] = v[0] + drops
    for j in range(1, len(v)):
        drops += v[j - 1] if v[j] < v[j - 1] else 0.0
        scratch[j] = v[j] + drops
    return True


@njit(cache=True, _nrt=False, error_model="numpy", inline="always")
def _increase_nb(t, v, level, at, c_hi, lo, window):
    """promql.increase_at(windows(...)) at one point: the range (at - window, at], with `c_hi`
    its samples <= at and `lo` those <= the range's open edge (promql.windows' shifted grid);
    `level` from _level_nb."""
    count = c_hi - lo
    hi = max(c_hi - 1, 0)
    lo = min(lo, max(len(t) - 1, 0))
    first_t, last_t = t[lo], t[hi]
    sampled = last_t - first_t
    average = sampled / (count - 1)
    threshold = average * 1.1
    to_start = first_t - (at - window)
    if to_start >= threshold:
        to_start = average / 2
    to_end = at - last_t
    if to_end >= threshold:
        to_end = average / 2
    if not (count >= 2 and sampled > 0):
        return np.nan
    result = level[hi] - level[lo]
    first_v = v[lo]
    if result > 0 and first_v >= 0:
        # Counters start at zero: no further back than where the slope meets it (np.minimum,
        # NaN winning as it does there)
        limit = sampled * first_v / result
        if np.isnan(to_start) or np.isnan(limit):
            to_start = np.nan
        elif limit < to_start:
            to_start = limit
    return result * ((sampled + to_start + to_end) / sampled)


@njit(cache=True, _nrt=False, error_model="numpy")
def _increases_one_nb(t, v, level, on, lower, window, factor, out_t, out_p):
    c_hi, lo = 0, 0
    for i in range(len(on)):
        value = np.nan
        if len(t):
            c_hi, lo = _count_le_nb(t, on[i], c_hi), _count_le_nb(t, lower[i], lo)
            value = _increase_nb(t, v, level, on[i], c_hi, lo, window)
        _add_nb(out_t, out_p, i, value, factor)


@njit(cache=True, _nrt=False, error_model="numpy")
def increases_nb(t_all, v_all, offsets, sids, rows, factors, total, present, on, lower, window, scratch):
    """Each listed series' extrapolated increase over (on[i] - window, on[i]] at every point of
    `on`, added into `total[rows[k]]`, `present[rows[k]]` times factors[k]. `scratch`: as long as
    the longest series, for a counter that resets."""
    for k in range(len(sids)):
        a, b = offsets[sids[k]], offsets[sids[k] + 1]
        t, v = t_all[a:b], v_all[a:b]
        out_t, out_p = total[rows[k]], present[rows[k]]
        if _level_nb(v, scratch):
            _increases_one_nb(t, v, scratch[:b - a], on, lower, window, factors[k], out_t, out_p)
        else:
            _increases_one_nb(t, v, v, on, lower, window, factors[k], out_t, out_p)
