"""Observed series on the replay's tick grid, one array per (signal, pool) or (signal, pool,
replica), as a Prometheus range query with the grid's step would return them.

Gauges: the latest sample within the lookback at each tick, summed or averaged over the pool's
series (`sum by (pool)` / `avg by (pool)`). Counters: `sum by (pool) (rate(x[w]))` at every
tick. Histograms: `histogram_quantile(q, sum by (pool, le) (rate(x_bucket[w])))` for q in 0.5,
0.9, 0.99, as `<signal>_p50`, `_p90`, `_p99`, once per window of w (a query whose step is w,
the last window ending at the last tick), each tick carrying its window's value: per tick they
would cost w / tick_s times as much to repeat what overlapping windows already said. Values in
the signal's unit (metrics.py); NaN where the query would return nothing (no sample in the
lookback, fewer than two in the rate window, no request observed in the window).
"""

from __future__ import annotations

import dataclasses

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
    # Histograms: one quantile per window, a query whose step is the rate window, the last
    # window ending at the last tick; each tick carries the quantile of the window it is in.
    per = max(1, round(config.rate_window_s / grid.tick_s))
    count = -(-grid.n // per)
    ends = ticks[-1] - per * grid.tick_s * np.arange(count)[::-1]
    window_of = count - 1 - (grid.n - 1 - np.arange(grid.n)) // per
    rows = list(mapped.series.iter_rows(named=True))
    groups: dict[tuple, _Group] = {}
    for row in rows:
        key = (row["signal"], row["pool"], row["replica"]) if by_replica else (row["signal"], row["pool"])
        groups.setdefault(key, _Group(row["kind"], row["combine"])).bounds.add(row["le"])
    for group in groups.values():
        group.start(len(ends) if group.kind == "histogram" else grid.n)
    # A target's series (one scrape: a replica's gauges, counters and buckets) share their
    # sample times, and so where those fall among the ticks: computed once per target.
    lengths = np.diff(offsets)
    first_t = t_all[np.minimum(offsets[:-1], len(t_all) - 1)] if len(t_all) else np.zeros(top - 1)
    rows.sort(key=lambda r: (r["replica"], int(lengths[r["series"]]), float(first_t[r["series"]]), r["series"]))
    cache: dict[tuple, tuple[np.ndarray, object]] = {}
    for row in rows:
        key = (row["signal"], row["pool"], row["replica"]) if by_replica else (row["signal"], row["pool"])
        group = groups[key]
        t = t_all[offsets[row["series"]]:offsets[row["series"] + 1]]
        v = v_all[offsets[row["series"]]:offsets[row["series"] + 1]]
        on = ends if group.kind == "histogram" else ticks
        how = ("gauge" if group.kind == "gauge" else "rate", group.kind == "histogram")
        hit = cache.get(how)
        if hit is None or len(hit[0]) != len(t) or not np.array_equal(hit[0], t):
            shared = latest(t, on, config.lookback_s) if group.kind == "gauge" else windows(t, on, config.rate_window_s)
            cache[how] = hit = (t, shared)
        if group.kind == "gauge":
            values, factor = instant_at(hit[1], v), row["scale"]
        else:
            values, factor = increase_at(hit[1], v), row["scale"] / config.rate_window_s
        group.add(row["le"], values, factor)
    out: dict[tuple[str, ...], np.ndarray] = {}
    for key, group in sorted(groups.items()):
        if group.kind == "histogram":
            for name, q in QUANTILES:
                out[(f"{key[0]}_{name}", *key[1:])] = bucket_quantile(q, group.les, group.total.T)[window_of]
        else:
            with np.errstate(invalid="ignore", divide="ignore"):
                value = group.total[0] if group.combine == "sum" else group.total[0] / group.present[0]
            out[key] = np.where(group.present[0] > 0, value, np.nan)
    return Aligned(grid, out)


class _Group:
    """The running sum (NaN as absent) and count of present values of one output, per slot
    (a histogram's le, else the one)."""

    def __init__(self, kind: str, combine: str) -> None:
        self.kind, self.combine, self.bounds = kind, combine, set()

    def start(self, width: int) -> None:
        self.les = np.array(sorted(self.bounds)) if self.kind == "histogram" else np.zeros(1)
        self.total = np.zeros((len(self.les), width))
        self.present = np.zeros((len(self.les), width), dtype=np.int64)

    def add(self, le: float | None, values: np.ndarray, factor: float) -> None:
        slot = int(np.searchsorted(self.les, le)) if self.kind == "histogram" else 0
        self.present[slot] += ~np.isnan(values)
        self.total[slot] += np.nan_to_num(values, copy=False) * factor
