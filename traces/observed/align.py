"""Observed series on the replay's tick grid, one array per (signal, pool) or (signal, pool,
replica), as a Prometheus range query with the grid's step would return them.

Gauges: the latest sample within the lookback at each tick, summed or averaged over the pool's
series (`sum by (pool)` / `avg by (pool)`). Counters: `sum by (pool) (rate(x[w]))` at every
tick. Histograms: `histogram_quantile(q, sum by (pool, le) (rate(x_bucket[w])))` for q in 0.5,
0.9, 0.99, as `<signal>_p50`, `_p90`, `_p99`, once per window of w (a query whose step is w,
the last window ending at the last tick), each tick carrying its window's value; per tick they would cost 60 times as much for a 60 s window, to say again what
the overlapping windows already said. Values in the signal's unit (metrics.py), NaN where the query
would return nothing (no sample in the lookback, fewer than two in the rate window, no request
observed in the window).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np
import polars as pl

from traces.observed.config import ObservedConfig
from traces.observed.mapping import Mapped
from traces.observed.metrics import QUANTILES
from traces.observed.promql import bucket_quantile, increase_at, instant_at, latest, windows

@dataclasses.dataclass(frozen=True)
class Grid:
    """Ticks at `start_s + i * tick_s`, i = 0..n-1, in trace seconds (a replay's first tick row
    is at one tick: start_s = tick_s)."""

    start_s: float
    tick_s: float
    n: int

    def __post_init__(self) -> None:
        if not (self.tick_s > 0 and self.n >= 1 and np.isfinite(self.start_s)):
            raise ValueError(f"grid: got start_s={self.start_s}, tick_s={self.tick_s}, n={self.n}; "
                             "expected a finite start, tick_s > 0 and n >= 1")

    def times(self) -> np.ndarray:
        return self.start_s + self.tick_s * np.arange(self.n)


@dataclasses.dataclass(frozen=True)
class Aligned:
    grid: Grid
    values: dict[tuple[str, ...], np.ndarray]  # (signal, pool[, replica]) -> one value per tick

    def frame(self) -> pl.DataFrame:
        """Long form: t (trace seconds), signal, pool[, replica], value (null for NaN)."""
        t = self.grid.times()
        names = ["signal", "pool", "replica"]
        parts = [pl.DataFrame({"t": t, **{names[i]: [k] * len(t) for i, k in enumerate(key)}, "value": arr})
                 for key, arr in sorted(self.values.items())]
        return pl.concat(parts).with_columns(pl.col("value").fill_nan(None)) if parts else pl.DataFrame()


def align(mapped: Mapped, grid: Grid, config: ObservedConfig, by_replica: bool = False) -> Aligned:
    ticks = grid.times()
    ids = mapped.samples["series"].to_numpy()
    t_all = mapped.samples["t"].to_numpy()
    v_all = mapped.samples["value"].to_numpy()
    # where each series' samples begin, found once (searchsorted with a needle of another dtype
    # would cast the whole column on every call)
    top = int(mapped.series["series"].max() or 0) + 2 if mapped.series.height else 1
    offsets = np.searchsorted(ids, np.arange(top, dtype=ids.dtype))
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in mapped.series.iter_rows(named=True):
        key = (row["signal"], row["pool"], row["replica"]) if by_replica else (row["signal"], row["pool"])
        groups[key].append(row)
    out: dict[tuple[str, ...], np.ndarray] = {}
    for key, rows in sorted(groups.items()):
        kind = rows[0]["kind"]
        if kind == "histogram":
            rows.sort(key=lambda r: r["le"])
            bounds = np.unique([r["le"] for r in rows])
            # one quantile per window: the query's step is the rate window, the last window ends
            # at the last tick, and every tick carries the quantile of the window it is in
            per = max(1, round(config.rate_window_s / grid.tick_s))
            count = -(-grid.n // per)
            ends = ticks[-1] - per * grid.tick_s * np.arange(count)[::-1]
            window_of = count - 1 - (grid.n - 1 - np.arange(grid.n)) // per
            per_le = _accumulate(rows, offsets, t_all, v_all, ends, config,
                                 np.searchsorted(bounds, [r["le"] for r in rows]), len(bounds))[0]
            for name, q in QUANTILES:
                out[(f"{key[0]}_{name}", *key[1:])] = bucket_quantile(q, bounds, per_le.T)[window_of]
        else:
            total, present = _accumulate(rows, offsets, t_all, v_all, ticks, config, np.zeros(len(rows), int), 1)
            with np.errstate(invalid="ignore", divide="ignore"):
                value = total[0] if rows[0]["combine"] == "sum" else total[0] / present[0]
            out[key] = np.where(present[0] > 0, value, np.nan)
    return Aligned(grid, out)


def _accumulate(rows, offsets, t_all, v_all, ticks, config, slot, slots):
    """Sum (NaN as absent) and count of present values per slot (a histogram's le, else one).
    Rows come grouped by replica, so the series one target exposes at one scrape (a
    histogram's buckets) follow each other and share where their samples fall."""
    total = np.zeros((slots, len(ticks)))
    present = np.zeros((slots, len(ticks)), dtype=np.int64)
    shared_t, shared = None, None
    for row, where in sorted(zip(rows, slot), key=lambda rs: (rs[0]["replica"], rs[0]["series"])):
        a, b = offsets[row["series"]], offsets[row["series"] + 1]
        t, v = t_all[a:b], v_all[a:b]
        if shared_t is None or len(t) != len(shared_t) or not np.array_equal(t, shared_t):
            shared_t = t
            shared = latest(t, ticks, config.lookback_s) if row["kind"] == "gauge" else \
                windows(t, ticks, config.rate_window_s)
        if row["kind"] == "gauge":
            values, factor = instant_at(shared, v), row["scale"]
        else:
            values, factor = increase_at(shared, v), row["scale"] / config.rate_window_s
        seen = ~np.isnan(values)
        total[where] += np.nan_to_num(values, copy=False) * factor
        present[where] += seen
    return total, present
