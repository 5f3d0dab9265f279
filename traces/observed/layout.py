"""Observed samples as align() reads them: each target's scrape times stored once, every
series' values beside them.

A Prometheus target's series are scraped together and share their sample times: a vLLM
replica's 73 series (gauges, counters, 65 histogram buckets) have one set. Stored once per
target, the times cost 8 bytes a scrape of the target instead of 8 a sample, and no sample
carries its series' id (series i's values are `values[value_start[i]:value_start[i + 1]]`, at
its target's times): about 8 bytes a sample where the long frame (series, t, value) takes 20.
Which series share times is also what align's kernels reuse a search for, known here without
comparing the times again on every call.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl


@dataclasses.dataclass(frozen=True, eq=False)
class Scrapes:
    """`times`: each target's sample times (sorted, one per scrape), one target after another,
    target g's at `time_start[g]:time_start[g + 1]`; `values`: each series' values by series id,
    series i's at `value_start[i]:value_start[i + 1]` and at the times of target `target[i]`.
    A series id without samples has an empty target."""

    times: np.ndarray
    time_start: np.ndarray
    values: np.ndarray
    value_start: np.ndarray
    target: np.ndarray

    def __post_init__(self) -> None:
        n_times = np.diff(self.time_start)[self.target] if len(self.target) else np.zeros(0, np.int64)
        if (self.time_start[-1] != len(self.times) or self.value_start[-1] != len(self.values)
                or not np.array_equal(np.diff(self.value_start), n_times)):
            raise ValueError("scrapes: every series needs one value per time of its target")

    @classmethod
    def from_frame(cls, frame: pl.DataFrame, ids: int) -> Scrapes:
        """From the long frame (series, t, value), sorted by series then t, of series ids below
        `ids`: series whose times are equal share a target."""
        sid = frame["series"].to_numpy()
        t = np.ascontiguousarray(frame["t"].to_numpy(), dtype=np.float64)
        value_start = np.searchsorted(sid, np.arange(ids + 1, dtype=sid.dtype)).astype(np.int64)
        spans: list[tuple[int, int]] = []
        by_key: dict[tuple[int, int], list[int]] = {}  # (length, hash of the times) -> targets
        target = np.empty(ids, np.int64)
        for i in range(ids):
            a, b = int(value_start[i]), int(value_start[i + 1])
            key = (b - a, hash(t[a:b].tobytes()))
            same = [g for g in by_key.get(key, ()) if np.array_equal(t[spans[g][0]:spans[g][1]], t[a:b])]
            if same:
                target[i] = same[0]
            else:
                target[i] = len(spans)
                by_key.setdefault(key, []).append(len(spans))
                spans.append((a, b))
        times = np.concatenate([t[a:b] for a, b in spans]) if spans else np.zeros(0)
        time_start = np.concatenate(([0], np.cumsum([b - a for a, b in spans], dtype=np.int64))).astype(np.int64)
        values = np.ascontiguousarray(frame["value"].to_numpy(), dtype=np.float64)
        return cls(times, time_start, values, value_start, target)

    @property
    def height(self) -> int:
        """Samples in all (values, not times)."""
        return len(self.values)

    def t_of(self, series: int) -> np.ndarray:
        g = self.target[series]
        return self.times[self.time_start[g]:self.time_start[g + 1]]

    def frame(self) -> pl.DataFrame:
        """The long form: series (UInt32), t, value, sorted by series then t."""
        lengths = np.diff(self.value_start)
        t = np.concatenate([self.t_of(i) for i in range(len(self.target))]) if len(self.target) else np.zeros(0)
        return pl.DataFrame({"series": pl.Series(np.repeat(np.arange(len(lengths), dtype=np.uint32), lengths)),
                             "t": pl.Series(t, dtype=pl.Float64), "value": pl.Series(self.values, dtype=pl.Float64)})
