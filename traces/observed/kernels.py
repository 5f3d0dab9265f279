"""promql.py's `instant_at(latest(...))` and `increase_at(windows(...))` as compiled passes,
one call per series kind over every series of that kind, each series' values added straight
into its output row (`total += nan_to_num(value) * factor`, `present += value is not NaN`),
as align.py's groups do. No per-tick temporaries: a day of 1 s scrapes of a fleet is hundreds
of millions of samples, and numpy's dozen temporaries per series cost more than the arithmetic.

The arithmetic is promql.py's, operation for operation and in the same order, so the results
are the same floats; tests/unit/test_observed_fast.py holds the two together on generated
series, and test_observed_promql.py holds promql.py to the literal twins of Prometheus'
engine.go / functions.go.

The samples are layout.Scrapes: each target's sorted times once, each series' values at its
target's times. Where a target's samples sit among the ticks (a gauge's latest sample, a rate
window's first and last) is found once for the target and read by each of its series in turn
(the series of a target come together in align's order), so a series costs a pass over its
values: a histogram bucket's rate windows read two values each, and every value once to find
counter resets.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_MAX = np.finfo(np.float64).max  # what np.nan_to_num makes of +Inf


@njit(cache=True, _nrt=False, inline="always")
def _count_le_nb(t, x, guess):
    """How many of `t` are <= x: `guess` (where the previous search ended, plus one: ticks and
    scrapes advance together) is checked first, then the answer is galloped to from there, so
    the result does not depend on the guess."""
    m = len(t)
    c = min(max(guess, 0), m)
    if (c == 0 or t[c - 1] <= x) and (c == m or t[c] > x):
        return c
    step = 1
    if c > 0 and t[c - 1] > x:  # too far: gallop back until an index at or below x, or the start
        while c - step - 1 >= 0 and t[c - step - 1] > x:
            step *= 2
        return _bisect_nb(t, x, max(c - step - 1, -1), c - step // 2 - 1)
    while c + step < m and t[c + step] <= x:  # t[c] <= x: gallop forward
        step *= 2
    return _bisect_nb(t, x, c + step // 2, min(c + step, m))


@njit(cache=True, _nrt=False, inline="always")
def _bisect_nb(t, x, lo, hi):
    """The count of `t` <= x, given t[lo] <= x (or lo == -1) and t[hi] > x (or hi == len)."""
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
def _latest_nb(t, ticks, lookback, last):
    """promql.latest: each tick's latest sample in (tick - lookback, tick], -1 for none."""
    c = 0
    for i in range(len(ticks)):
        c = _count_le_nb(t, ticks[i], c + 1)  # scrapes and ticks advance together
        last[i] = c - 1 if c > 0 and t[c - 1] > ticks[i] - lookback else -1


@njit(cache=True, _nrt=False, error_model="numpy")
def instants_nb(times, time_start, values, value_start, target, sids, rows, factors, total, present, ticks,
                lookback, last):
    """Each listed series' latest sample in (tick - lookback, tick] at every tick, added into
    `total[rows[k]]`, `present[rows[k]]` times factors[k], in the listed order. `last` keeps
    the positions placed for one target for its next series."""
    held = -1
    for k in range(len(sids)):
        sid, g = sids[k], target[sids[k]]
        if g != held:
            _latest_nb(times[time_start[g]:time_start[g + 1]], ticks, lookback, last)
            held = g
        v = values[value_start[sid]:value_start[sid + 1]]
        out_t, out_p = total[rows[k]], present[rows[k]]
        for i in range(len(ticks)):
            _add_nb(out_t, out_p, i, v[last[i]] if last[i] >= 0 else np.nan, factors[k])


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
def _geometry_nb(t, at, c_hi, lo, window):
    """promql.windows at one point: the range (at - window, at], `c_hi` its samples <= at and
    `lo` those <= the range's open edge (promql.windows' shifted grid). (whether it has a rate,
    last and first sample, their span, the extrapolation to the range's start and end)."""
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
    return count >= 2 and sampled > 0, hi, lo, sampled, to_start, to_end


@njit(cache=True, _nrt=False, error_model="numpy", inline="always")
def _extrapolate_nb(v, level, hi, lo, sampled, to_start, to_end):
    """promql.increase_at at one point of a window with a rate; `level` from _level_nb."""
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
def _place_nb(t, on, lower, window, at, geo):
    """Every point's window geometry over `t` into `at` (hi, first; first = -1: no rate) and
    `geo` (span, to start, to end): shared by the series scraped at the same instants."""
    c_hi, lo = 0, 0
    for i in range(len(on)):
        c_hi = _count_le_nb(t, on[i], c_hi + 1)
        lo = _count_le_nb(t, lower[i], lo + 1)
        ok, hi, first, sampled, to_start, to_end = _geometry_nb(t, on[i], c_hi, lo, window)
        at[0, i], at[1, i] = hi, first if ok else -1
        geo[0, i], geo[1, i], geo[2, i] = sampled, to_start, to_end


@njit(cache=True, _nrt=False, error_model="numpy")
def _dense_nb(v, level, at, geo, factor, out_t, out_p):
    for i in range(at.shape[1]):
        value = np.nan
        if at[1, i] >= 0:
            value = _extrapolate_nb(v, level, at[0, i], at[1, i], geo[0, i], geo[1, i], geo[2, i])
        _add_nb(out_t, out_p, i, value, factor)


@njit(cache=True, _nrt=False, error_model="numpy")
def increases_nb(times, time_start, values, value_start, target, sids, rows, factors, total, present, on, lower,
                 window, scratch, at, geo):
    """Each listed series' extrapolated increase over (on[i] - window, on[i]] at every point of
    `on`, added into `total[rows[k]]`, `present[rows[k]]` times factors[k], in the listed order.
    `scratch`: as long as the longest series, for a counter that resets; `at` / `geo`: the
    window geometry placed for one target, kept for its next series."""
    held = -1
    for k in range(len(sids)):
        sid, g = sids[k], target[sids[k]]
        v = values[value_start[sid]:value_start[sid + 1]]
        if len(v) == 0:
            for i in range(len(on)):
                _add_nb(total[rows[k]], present[rows[k]], i, np.nan, factors[k])
            continue
        if g != held:
            _place_nb(times[time_start[g]:time_start[g + 1]], on, lower, window, at, geo)
            held = g
        if _level_nb(v, scratch):  # two calls: the level is v itself or scratch, two types
            _dense_nb(v, scratch[:len(v)], at, geo, factors[k], total[rows[k]], present[rows[k]])
        else:
            _dense_nb(v, v, at, geo, factors[k], total[rows[k]], present[rows[k]])
