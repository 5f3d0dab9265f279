"""The arrays the dashboard keeps of a run's requests: ones that grow as a live run is followed
(Grow, SortedTimes), and a finished run's ended requests counted by tick as it opens (EndedCounts),
which hold a count per tick, not a value per request."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tui.validate import CHECK_BATCH


class Grow:
    """An array that grows at its end in amortised O(new values); `view()` is what it holds, and
    stays valid (unchanged) however much is appended later."""

    def __init__(self, dtype=np.float64):
        self.buf = np.zeros(0, dtype)
        self.n = 0

    def append(self, values: np.ndarray) -> None:
        need = self.n + len(values)
        if need > len(self.buf):
            buf = np.zeros(max(need, 2 * len(self.buf), 1024), self.buf.dtype)
            buf[:self.n] = self.buf[:self.n]
            self.buf = buf
        self.buf[self.n:need] = values
        self.n = need

    def view(self) -> np.ndarray:
        return self.buf[:self.n]

    def last(self, default: float = 0.0) -> float:
        return self.buf[self.n - 1] if self.n else default


class SortedTimes:
    """Times and values kept sorted by time, for window queries; appends in time order are O(new)."""

    def __init__(self, dtype=np.float64):
        self.t = Grow(np.int64)
        self.v = Grow(dtype)

    def append(self, times: np.ndarray, values: np.ndarray) -> None:
        if not len(times):
            return
        if (np.diff(times) < 0).any():  # (a finished run's are sorted already: no copy)
            order = np.argsort(times, kind="stable")
            times, values = times[order], values[order]
        if self.t.n and times[0] < self.t.last():  # out of order: merge (not expected from the writer)
            times = np.concatenate((self.t.view(), times))
            values = np.concatenate((self.v.view(), values))
            order = np.argsort(times, kind="stable")
            times, values = times[order], values[order]
            self.t.n = self.v.n = 0
        self.t.append(times)
        self.v.append(values)


def ended_counts(requests: pl.LazyFrame, edges: np.ndarray) -> EndedCounts:
    """How many requests had ended by each of `edges` (sorted, unique), and how many of those met
    their SLO, in one pass a batch at a time: it holds a count per edge, never a column."""
    n, met = np.zeros(len(edges) + 1, np.int64), np.zeros(len(edges) + 1, np.int64)
    ended = (requests.filter(pl.col("status") != "unfinished")
             .select(ended_us=pl.coalesce("finished_us", "arrival_us"), met=pl.col("slo_met").fill_null(False)))
    for batch in ended.collect_batches(chunk_size=CHECK_BATCH, engine="streaming"):
        at = np.searchsorted(edges, batch["ended_us"].to_numpy(), side="left")  # edges[at - 1] < ended <= edges[at]
        n += np.bincount(at, minlength=len(n))
        met += np.bincount(at, weights=batch["met"].to_numpy(), minlength=len(n)).astype(np.int64)
    return EndedCounts(edges, np.cumsum(n), np.cumsum(met))


@dataclass(frozen=True)
class EndedCounts:
    """Requests ended by each edge time x, and those of them that met their SLO: ended_us <= x."""
    edges: np.ndarray  # int64, sorted, unique
    ended: np.ndarray  # int64 [len(edges) + 1], cumulative (the last: after every edge)
    met: np.ndarray

    def at(self, t_us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        i = np.searchsorted(self.edges, t_us)
        if (i >= len(self.edges)).any() or (self.edges[np.minimum(i, len(self.edges) - 1)] != t_us).any():
            raise ValueError("EndedCounts.at: a time that is not one of the edges counted")
        return self.ended[i], self.met[i]
