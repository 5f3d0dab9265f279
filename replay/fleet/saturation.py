"""Whether a pool kept up with its load, judged as a load test judges it: from the trend of its
waiting queue while requests arrive. A pure function of one pool's tick series (times in integer
microseconds, counts in requests, rates in requests per second).

- stable: the queue stayed small while load was offered;
- backlogged: a backlog built up (a cold start, a burst, a stage over capacity followed by a
  lighter one, an admission cap) but did not keep growing through the later part of the load;
- overloaded: arrivals outpaced completions and the queue grew through the later part of the
  load, as it does without bound when the offered rate is over the pool's capacity.

Only the arrival span is judged (the first to the last tick with arrivals in the window): after
the last arrival every queue drains, so a window that holds the drain is judged on its load.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.outputs.schema import SATURATION_CLASSES

CLASSES = SATURATION_CLASSES  # summary.json's, declared with the run outputs
STABLE, BACKLOGGED, OVERLOADED = CLASSES

# Overloaded: over the later half of the arrival span the queue's least-squares trend grows by at
# least this share of the arrival rate (2%: at an offered rate 1.02x capacity the queue gains
# (1 - 1/1.02) ~ 2% of what arrives; at 1.05x a two-minute stage at 10 req/s ends 57 requests,
# ~6 s of TTFT, behind: a replay that far off is no longer "stable"). Relative to the rate, so
# the rule reads the same for a pool of 1 req/s and one of 1,000, and in any time unit.
GROWTH_MIN_SHARE = 0.02
# Backlogged: at its peak the queue held at least this share of the requests that arrived over
# the span (a cold start holding 2 minutes of a 1-hour run's requests: 3%).
BACKLOG_MIN_SHARE = 0.02
# Neither a trend nor a backlog of fewer requests than this counts: a few requests waiting for a
# batch slot are noise, not saturation, however small the pool's load.
QUEUE_MIN_REQUESTS = 10
# The trend needs this many ticks in the later half; a shorter span is fitted whole.
TREND_MIN_TICKS = 4


@dataclass(frozen=True)
class Saturation:
    state: str  # one of CLASSES
    queue_slope_per_s: float  # least-squares trend of the waiting queue over the judged ticks
    arrival_rate_per_s: float  # over the judged ticks
    completion_rate_per_s: float  # over the judged ticks
    queue_end: int  # waiting at the window's last tick
    queue_peak: int  # most waiting at any tick of the window
    judged_from_us: int  # the judged ticks' interval: the later half of the arrival span
    judged_to_us: int

    def to_dict(self) -> dict:
        """summary.json's `pools.<name>.saturation`."""
        return {
            "class": self.state,
            "queue_slope_per_s": round(self.queue_slope_per_s, 4),
            "arrival_rate_per_s": round(self.arrival_rate_per_s, 4),
            "completion_rate_per_s": round(self.completion_rate_per_s, 4),
            "queue_end": self.queue_end,
            "queue_peak": self.queue_peak,
            "judged_from_s": round(self.judged_from_us / 1e6, 3),
            "judged_to_s": round(self.judged_to_us / 1e6, 3),
        }


def classify(t_us, waiting, arrivals, finished, window_us: tuple[int, int] | None = None) -> Saturation:
    """Classify one pool from its ticks: `t_us` the ticks' end times (a tick row at t covers
    (t - tick, t], as in ticks.parquet), `waiting` the queue at each tick's end (held requests
    included), `arrivals` and `finished` the requests that arrived and completed in each tick.
    `window_us` = (t0, t1) keeps the ticks whose interval lies in [t0, t1) (t0 < t <= t1)."""
    t = np.asarray(t_us, np.int64)
    q = np.asarray(waiting, np.float64)
    arr = np.asarray(arrivals, np.float64)
    fin = np.asarray(finished, np.float64)
    if not len(t) == len(q) == len(arr) == len(fin):
        raise ValueError(f"tick series of unequal lengths: {len(t)}, {len(q)}, {len(arr)}, {len(fin)}")
    # Where each tick's interval starts: the previous tick's end (the first tick's: one tick
    # before it, the run's ticks being evenly spaced from 0).
    starts = np.concatenate(([t[0] - (t[1] - t[0] if len(t) > 1 else t[0])], t[:-1])) if len(t) else t
    if window_us is not None:
        keep = (t > window_us[0]) & (t <= window_us[1])
        t, q, arr, fin, starts = t[keep], q[keep], arr[keep], fin[keep], starts[keep]
    if not len(t):
        at = int(window_us[0]) if window_us is not None else 0
        return Saturation(STABLE, 0.0, 0.0, 0.0, 0, 0, at, at)
    loaded = np.flatnonzero(arr > 0)
    first, last = (int(loaded[0]), int(loaded[-1])) if len(loaded) else (0, len(t) - 1)
    span_from, span_to = int(starts[first]), int(t[last])
    mid = (span_from + span_to) / 2
    judged = np.arange(first, last + 1)
    later = judged[starts[judged] >= mid]
    if len(later) < TREND_MIN_TICKS:
        later = judged
    from_us, to_us = int(starts[later[0]]), int(t[later[-1]])
    seconds = max(to_us - from_us, 1) / 1e6
    slope = _slope(t[later] / 1e6, q[later])
    came, done = float(arr[later].sum()), float(fin[later].sum())
    peak = float(q.max())
    growth = slope * seconds
    if done < came and slope >= GROWTH_MIN_SHARE * came / seconds and growth >= QUEUE_MIN_REQUESTS:
        state = OVERLOADED
    elif peak >= max(QUEUE_MIN_REQUESTS, BACKLOG_MIN_SHARE * float(arr[judged].sum())):
        state = BACKLOGGED
    else:
        state = STABLE
    return Saturation(state, slope, came / seconds, done / seconds, int(q[-1]), int(peak), from_us, to_us)


def _slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of y on x (0 for fewer than two distinct x)."""
    if len(x) < 2:
        return 0.0
    dx = x - x.mean()
    var = float(dx @ dx)
    return float(dx @ (y - y.mean())) / var if var > 0 else 0.0


def pool_series(ticks, pool: str, requests=None) -> tuple[np.ndarray, ...]:
    """(t_us, waiting, arrivals, finished) of one pool from a ticks.parquet frame (polars). With
    the run's requests, a prefill pool's load is the prompts it prefilled for another pool (they
    arrive, and finish, at their decode pool): each counts as arriving in the tick of its arrival
    and completing in that of its prefill's end."""
    import polars as pl

    rows = ticks.filter(pl.col("pool") == pool).sort("t_us")
    t_us = rows["t_us"].to_numpy().astype(np.int64)
    arrivals = rows["arrivals"].to_numpy().astype(np.int64)
    finished = rows["finished"].to_numpy().astype(np.int64)
    remote = None if requests is None else requests.filter(
        (pl.col("prefill_pool") == pool) & (pl.col("pool") != pool))
    if remote is not None and remote.height and len(t_us):
        tick_us = int(t_us[1] - t_us[0]) if len(t_us) > 1 else int(t_us[0])

        def per_tick(times) -> np.ndarray:
            # a tick row at t covers (t - tick, t]; what happened at 0 is in the first one
            idx = np.clip(-(-times.drop_nulls().to_numpy() // tick_us) - 1, 0, len(t_us) - 1)
            return np.bincount(idx, minlength=len(t_us))

        arrivals = arrivals + per_tick(remote["arrival_us"])
        finished = finished + per_tick(remote["prefill_end_us"])
    return t_us, rows["waiting"].to_numpy().astype(np.int64), arrivals, finished


def classify_pool(ticks, pool: str, window_us: tuple[int, int] | None = None, requests=None) -> Saturation:
    """classify() on one pool of a run (ticks.parquet's frame, and requests.parquet's for a
    prefill pool's load), over the whole run or a window of it, e.g. one load stage."""
    return classify(*pool_series(ticks, pool, requests), window_us)
