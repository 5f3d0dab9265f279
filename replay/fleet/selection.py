"""Exact quantiles of columns too long to hold in memory: polars' linear quantile (what
`replay.fleet.metrics.linear_quantiles` gives from one sort), float for float, found by external
selection over batches of the rows, in memory bounded by `HELD` values a search and a batch.

A quantile needs the values at one or two ranks of the sorted column. Each value gets an unsigned
integer key that sorts as np.sort sorts the values (`order_keys`: ints offset, floats by their bits;
+0.0 and -0.0 one key, every NaN the last). One pass reads each column's count, keeps the values
while there are at most `HELD` of them (every run that did not spill: one pass, then a partition in
memory), and counts them in fixed buckets of about 1% of a value's magnitude (`buckets`: the top
bits of the key of the value as a float, so a bucket is as narrow for a TTFT of 50 ms as for one of
5 s). The bucket that holds each rank is then known, and so how many values are below it: a second
pass collects each such bucket's values (np.partition puts each rank in place within its own), or,
for a bucket that holds more than `HELD` (a crowd of equal-ish values in a day of 100M requests),
the smallest and largest key in it; such a rank's span of keys is then narrowed, a pass at a time,
to the one of 2^16 equal spans that holds it (a histogram of the keys in the span it was in) until
that span holds at most `HELD` values or a single key, and a last pass collects those spans.
A day's rows (24M requests) take two passes (three before the buckets: one only for the column's
smallest and largest key, from which the 2^16 equal spans were cut).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import polars as pl

BIN_BITS = 16  # a histogram's spans: 2^16 (512 KB of counts)
BUCKET_BITS = 7  # of a float's mantissa in a bucket of the first pass: 2^-7 of a power of two wide
_BUCKET_SHIFT = 52 - BUCKET_BITS
BUCKETS = 1 << (12 + BUCKET_BITS)  # the sign and exponent bits, then BUCKET_BITS of the mantissa (4 MB of counts)
HELD = 1 << 21  # values a search holds at most (16 MB of int64s)
BATCH_ROWS = 1 << 20  # rows a batch reads

_TOP = np.uint64(1 << 63)
_LAST = np.uint64((1 << 64) - 1)


def order_keys(values: np.ndarray) -> np.ndarray:
    """uint64 keys that order `values` (ints or floats) as np.sort does: equal keys for what it
    does not tell apart (+0.0 and -0.0), every NaN last, as the largest key."""
    if values.dtype.kind == "f":
        v = values.astype(np.float64, copy=False)
        bits = v.view(np.uint64)
        keys = np.where(bits & _TOP, ~bits, bits | _TOP)  # a negative's magnitude reversed, below every positive
        keys[v == 0] = _TOP
        keys[np.isnan(v)] = _LAST
        return keys
    if values.dtype.kind == "u":
        return values.astype(np.uint64, copy=False)
    return values.astype(np.int64, copy=False).view(np.uint64) ^ _TOP


def buckets(values: np.ndarray) -> np.ndarray:
    """Each value's bucket of the first pass, in np.sort's order (a larger value never in a smaller
    bucket): the sign, exponent and top BUCKET_BITS of the mantissa of the value as a float64 (an
    int rounds to the nearest one, which keeps the order), negatives mirrored below the positives;
    +0.0 and -0.0 one bucket, every NaN the last. A few vector operations: order_keys' masks cost
    4x as much, and this runs on every value of the first two passes."""
    floats = values + 0.0 if values.dtype == np.float64 else values.astype(np.float64)  # -0.0 + 0.0 is +0.0
    nan = np.isnan(floats) if values.dtype.kind == "f" else None
    top = floats.view(np.int64)  # the new array's bits, shifted in place
    top >>= _BUCKET_SHIFT  # arithmetic: a negative's top bits stay negative
    top ^= (top >> 63) & ((BUCKETS >> 1) - 1)  # a negative's magnitude reversed, below every positive
    top += BUCKETS >> 1
    if nan is not None:
        top[nan] = BUCKETS - 1
    return top


def quantile_ranks(n: int, qs: Iterable[float]) -> list[tuple[int, int, float]]:
    """Per q: the ranks either side of polars' position (n - 1) * q and the fraction between."""
    out = []
    for q in qs:
        pos = (n - 1) * q
        j = int(pos)
        out.append((j, j + 1 if pos > j else j, pos - j))
    return out


def interpolate(lower, upper, frac: float) -> float:
    """polars' linear quantile from the values either side of it, as float64."""
    lower, upper = float(lower), float(upper)
    return lower if lower == upper else lower + (upper - lower) * frac


class _Span:
    """Where a rank is searched: keys [lo, hi] (Python ints: no uint64 wraps past the top),
    `below` values with smaller keys, `count` inside."""

    def __init__(self, lo, hi, below: int, count: int):
        self.lo, self.hi, self.below, self.count = int(lo), int(hi), below, count

    @property
    def key(self) -> tuple[int, int]:
        return self.lo, self.hi

    def narrow(self, hist: np.ndarray, rank: int) -> None:
        """To the histogram's bin that holds `rank` (0-based, of the whole column)."""
        shift = _shift(self.lo, self.hi)
        cum = np.cumsum(hist)
        b = int(np.searchsorted(cum, rank - self.below, side="right"))
        self.below += int(cum[b - 1]) if b else 0
        self.count = int(hist[b])
        self.lo += b << shift
        self.hi = min(self.hi, self.lo + (1 << shift) - 1)

    @property
    def settled(self) -> bool:
        return self.count <= HELD or self.lo == self.hi


def _shift(lo: int, hi: int) -> int:
    """Bits a key's offset in [lo, hi] is shifted by to its histogram bin (2^BIN_BITS bins at most)."""
    return max(0, (hi - lo).bit_length() - BIN_BITS)


def _inside(keys: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return (keys >= np.uint64(lo)) & (keys <= np.uint64(hi))


Batches = Callable[[], Iterable[Sequence[np.ndarray]]]


def select_quantiles(batches: Batches, qs: Sequence[Sequence[float]]) -> list[tuple[int, list[float]]]:
    """Per column c of what `batches()` yields afresh on each call (per batch, one array per
    column, nulls dropped): how many values it has and its linear quantiles at `qs[c]` (empty
    where it has none), float for float as `linear_quantiles` gives them from one sort."""
    columns = len(qs)
    counts = [0] * columns
    hists = [np.zeros(BUCKETS, np.int64) for _ in range(columns)]
    kept: list[list[np.ndarray] | None] = [[] for _ in range(columns)]
    for batch in batches():
        for c, values in enumerate(batch):
            if not len(values):
                continue
            counts[c] += len(values)
            which = buckets(values)
            low = int(which.min())  # counted from the batch's lowest bucket: a bincount of the whole
            counted = np.bincount(which - low)  # table per batch took 50 ms a million values, this 3
            hists[c][low:low + len(counted)] += counted
            if kept[c] is not None and counts[c] <= HELD:
                kept[c].append(values.copy())
            else:
                kept[c] = None
    plans = [quantile_ranks(n, q) if n else [] for n, q in zip(counts, qs)]
    found: list[dict[int, object]] = [{} for _ in range(columns)]
    # per column, the buckets that hold a rank: bucket -> (values below it, values in it, its ranks)
    wanted: list[dict[int, tuple[int, int, list[int]]]] = [{} for _ in range(columns)]
    for c, plan in enumerate(plans):
        ranks = sorted({r for lo, hi, _ in plan for r in (lo, hi)})
        if kept[c] is not None:
            found[c] = _place(kept[c], ranks, 0) if ranks else {}
            continue
        cum = np.cumsum(hists[c])
        for r in ranks:
            b = int(np.searchsorted(cum, r, side="right"))
            below = int(cum[b - 1]) if b else 0
            wanted[c].setdefault(b, (below, int(hists[c][b]), []))[2].append(r)
    spans: list[dict[int, _Span]] = [{} for _ in range(columns)]
    if any(wanted):
        for c, held in enumerate(_gather(batches, wanted)):
            for b, (below, count, ranks) in wanted[c].items():
                if count <= HELD:
                    found[c].update(_place(held[b], ranks, below))
                else:  # a crowd: narrowed within the bucket's keys
                    lo, hi = held[b]
                    spans[c].update({r: _Span(lo, hi, below, count) for r in ranks})
    while any(not s.settled for col in spans for s in col.values()):
        _narrow(batches, spans)
    if any(spans):
        for c, held in enumerate(_collect(batches, spans)):
            for key, values in held.items():
                at = {r: s for r, s in spans[c].items() if s.key == key}
                span = next(iter(at.values()))
                found[c].update({r: values[0][0] for r in at} if span.lo == span.hi
                                else _place(values, list(at), span.below))
    return [(n, [interpolate(at[lo], at[hi], frac) for lo, hi, frac in plan])
            for n, plan, at in zip(counts, plans, found)]


def _gather(batches: Batches, wanted: list[dict[int, tuple[int, int, list[int]]]]) -> list[dict[int, object]]:
    """One pass: per column, each wanted bucket's values (a list of arrays) where it holds at most
    HELD, else the smallest and largest key in it (Python ints)."""
    held: list[dict[int, object]] = [{b: [] if count <= HELD else [int(_LAST), 0] for b, (_, count, _) in col.items()}
                                     for col in wanted]
    targets = [np.array(sorted(col), np.intp) for col in wanted]
    for batch in batches():
        for c, values in enumerate(batch):
            if not wanted[c] or not len(values):
                continue
            which = buckets(values)
            # the few values in a wanted bucket, by one search (not a mask per bucket)
            at = np.minimum(np.searchsorted(targets[c], which), len(targets[c]) - 1)
            hit = targets[c][at] == which
            values, which = values[hit], which[hit]
            for b, into in held[c].items():
                inside = values[which == b]
                if not len(inside):
                    continue
                if wanted[c][b][1] <= HELD:
                    into.append(inside)
                else:
                    keys = order_keys(inside)
                    into[0], into[1] = min(into[0], int(keys.min())), max(into[1], int(keys.max()))
    return held


def _place(values: list[np.ndarray], ranks: list[int], below: int) -> dict[int, object]:
    """The values at `ranks` (of the whole column) of these, the column's values with `below`
    smaller ones elsewhere, in np.sort's order."""
    held = np.concatenate(values) if len(values) > 1 else values[0]
    at = [r - below for r in ranks]
    ordered = np.partition(held, at)
    return {r: ordered[k] for r, k in zip(ranks, at)}


def _narrow(batches: Batches, spans: list[dict[int, _Span]]) -> None:
    """One pass: a histogram of the keys in each span that holds too many values, and each such
    rank's span narrowed to its bin."""
    hists = [{s.key: np.zeros(1 << BIN_BITS, np.int64) for s in col.values() if not s.settled} for col in spans]
    for batch in batches():
        for c, values in enumerate(batch):
            if not hists[c] or not len(values):
                continue
            keys = order_keys(values)
            for (lo, hi), hist in hists[c].items():
                offsets = (keys[_inside(keys, lo, hi)] - np.uint64(lo)) >> np.uint64(_shift(lo, hi))
                hist += np.bincount(offsets.astype(np.intp), minlength=1 << BIN_BITS)
    for c, col in enumerate(spans):
        for rank, span in col.items():
            if not span.settled:
                span.narrow(hists[c][span.key], rank)


def _collect(batches: Batches, spans: list[dict[int, _Span]]) -> list[dict[tuple[int, int], list[np.ndarray]]]:
    """One pass: the values of every rank's span (of a single key's span, one value: all are
    the same to np.sort)."""
    held: list[dict[tuple[int, int], list[np.ndarray]]] = [{s.key: [] for s in col.values()} for col in spans]
    for batch in batches():
        for c, values in enumerate(batch):
            if not held[c] or not len(values):
                continue
            keys = order_keys(values)
            for (lo, hi), into in held[c].items():
                if lo == hi and into:
                    continue
                inside = values[_inside(keys, lo, hi)]
                if len(inside):
                    into.append(inside[:1].copy() if lo == hi else inside)
    return held


def frame_batches(lf: pl.LazyFrame, columns: dict[str, pl.Expr], rows: int | None = None) -> Batches:
    """`columns` of `lf`'s rows as batches of arrays (nulls dropped), read afresh by polars'
    streaming engine on each call: `rows` rows at a time (default BATCH_ROWS)."""
    names = list(columns)
    rows = rows or BATCH_ROWS

    def batches():
        query = lf.select(**columns)
        if hasattr(query, "collect_batches"):  # where polars has it (2.1 does; pyproject allows older)
            frames = query.collect_batches(chunk_size=rows, engine="streaming")
        else:  # an older polars: the columns read whole, then sliced (the same values, not the memory bound)
            frames = query.collect(engine="streaming").iter_slices(rows)
        for frame in frames:
            yield [frame[name].drop_nulls().to_numpy() for name in names]
    return batches


def exact_quantiles(lf: pl.LazyFrame, columns: dict[str, tuple[pl.Expr, Sequence[float]]],
                    rows: int | None = None) -> dict[str, tuple[int, list[float]]]:
    """Per column (an expression of `lf`'s rows, nulls not counted): how many values it has and
    its linear quantiles at the qs given (empty where it has none), as `linear_quantiles` gives them."""
    batches = frame_batches(lf, {name: expr for name, (expr, _) in columns.items()}, rows)
    return dict(zip(columns, select_quantiles(batches, [qs for _, qs in columns.values()])))
