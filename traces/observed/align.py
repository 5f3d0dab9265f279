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
from traces.observed.kernels import increases_nb, instants_nb
from traces.observed.promql import bucket_quantile, window_starts


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
    scrapes = mapped.samples
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
    passes = {kind: _Pass(kind, [g for g in groups.values() if g.kind == kind],
                          len(ends) if kind == "histogram" else grid.n) for kind in ("gauge", "counter", "histogram")}
    # Each group's sum is taken in this order of its series (a target's series together), so
    # the floats do not depend on the order the series were read in.
    lengths = np.diff(scrapes.value_start)
    starts = scrapes.time_start[scrapes.target]
    first_t = scrapes.times[np.minimum(starts, len(scrapes.times) - 1)] if len(scrapes.times) else starts * 0.0
    rows.sort(key=lambda r: (r["replica"], int(lengths[r["series"]]), float(first_t[r["series"]]), r["series"]))
    for row in rows:
        key = (row["signal"], row["pool"], row["replica"]) if by_replica else (row["signal"], row["pool"])
        group = groups[key]
        factor = row["scale"] if group.kind == "gauge" else row["scale"] / config.rate_window_s
        passes[group.kind].add(row["series"], group, row["le"], factor)
    # a resetting counter's level; the sample positions / window geometry of the last target
    scratch = np.empty(int(lengths.max()) if len(lengths) else 0)
    at, geo = np.empty((2, grid.n), np.int64), np.empty((3, grid.n))
    layout = (scrapes.times, scrapes.time_start, scrapes.values, scrapes.value_start, scrapes.target)
    passes["gauge"].run(instants_nb, layout, ticks, config.lookback_s, at[0])
    for kind, on in (("counter", ticks), ("histogram", ends)):
        passes[kind].run(increases_nb, layout, on, window_starts(on, config.rate_window_s),
                         config.rate_window_s, scratch, at[:, :len(on)], geo[:, :len(on)])
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
    """One output's running sum (NaN as absent) and count of present values, per slot (a
    histogram's le, else the one): rows of its kind's _Pass arrays."""

    def __init__(self, kind: str, combine: str) -> None:
        self.kind, self.combine, self.bounds = kind, combine, set()
        self.les = np.zeros(1)

    def slot(self, le: float | None) -> int:
        return int(np.searchsorted(self.les, le)) if self.kind == "histogram" else 0


class _Pass:
    """Every series of one kind, listed for one compiled call: which series, into which row of
    `total` / `present` (a group's slot), times what."""

    def __init__(self, kind: str, groups: list[_Group], width: int) -> None:
        base = 0
        for group in groups:
            if kind == "histogram":
                group.les = np.array(sorted(group.bounds))
            group.base, base = base, base + len(group.les)
        self.total = np.zeros((base, width))
        self.present = np.zeros((base, width), dtype=np.int64)
        for group in groups:
            group.total = self.total[group.base:group.base + len(group.les)]
            group.present = self.present[group.base:group.base + len(group.les)]
        self.sids: list[int] = []
        self.rows: list[int] = []
        self.factors: list[float] = []

    def add(self, sid: int, group: _Group, le: float | None, factor: float) -> None:
        self.sids.append(sid)
        self.rows.append(group.base + group.slot(le))
        self.factors.append(factor)

    def run(self, kernel, layout: tuple, *args) -> None:
        if self.sids:
            kernel(*layout, np.array(self.sids, np.int64), np.array(self.rows, np.int64),
                   np.array(self.factors, np.float64), self.total, self.present, *args)
