"""Observed samples as two polars frames: one row per series, one row per sample.

Every reader ends here. `series`: `series` (UInt32 id), `metric`, `labels` (a struct of every
label name seen, null where a series lacks one), `file`; `samples`: `series`, `t` (Unix seconds,
Float64), `value` (Float64), sorted by series then time with one sample per timestamp (the last
one read wins, as a re-scraped point replaces the earlier). `tidy()` joins them into the one
frame a person reads: metric, labels, t, value.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Sequence

import numpy as np
import polars as pl

from common.errors import UserError
from traces.observed.limits import ObservedLimits
from traces.observed.metrics import lookup

# Prometheus writes NaN and +Inf/-Inf as such (model/value.go); Python's float() would also take
# "1_000" and " 1 ", which no exporter writes and a damaged file might.
_NUMBER_TEXT = r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[Ii]nf(?:inity)?|NaN|nan)"
_NUMBER = re.compile(_NUMBER_TEXT)
# Many numbers, one a line, checked by one pass of the regex engine instead of a call each: lines
# of decimal digits, points, signs and exponents only (what exporters mostly write) are numbers
# wherever float() reads them, and it reads the same grammar as _NUMBER there; others (NaN, +Inf)
# are matched against _NUMBER line by line.
_DECIMAL_LINES = re.compile(r"[0-9.eE+\-\n]*")
_NUMBER_LINES = re.compile(f"{_NUMBER_TEXT}(?:\n{_NUMBER_TEXT})*")


@dataclasses.dataclass
class RawSeries:
    """One series as a reader found it, before the frames are built."""

    metric: str
    labels: dict[str, str]
    t: np.ndarray
    value: np.ndarray
    file: str


@dataclasses.dataclass(frozen=True)
class Observed:
    series: pl.DataFrame
    samples: pl.DataFrame
    unknown: tuple[str, ...] = ()  # metric names read that the tool does not know, sorted
    files: tuple[str, ...] = ()

    def tidy(self) -> pl.DataFrame:
        return (self.samples.join(self.series.select("series", "metric", "labels"), on="series", how="left")
                .select("metric", "labels", "t", "value"))


def number(text: str) -> float | None:
    """The float `text` spells in Prometheus' notation, or None if it is not a number."""
    text = text.strip()
    return float(text) if _NUMBER.fullmatch(text) else None


def numbers(texts: Sequence[str]) -> np.ndarray | None:
    """The floats of `texts` (strings) when every one is a number in Prometheus' notation, with
    no space around it, as `number` reads it; None when any is not, for the caller's one-by-one
    check to say which (and what `number` makes of a number with spaces around it)."""
    if not texts:
        return np.empty(0)
    lines = "\n".join(texts)
    # each text is one line of `lines` only if none holds a line break of its own
    if lines.count("\n") != len(texts) - 1:
        return None
    if _DECIMAL_LINES.fullmatch(lines) is None and _NUMBER_LINES.fullmatch(lines) is None:
        return None
    try:
        return np.array(texts, dtype=np.float64)
    except ValueError:  # digits and signs that spell no number ("1-2", "")
        return None


def series_text(metric: str, labels: dict[str, str], limit: int = 160) -> str:
    """`name{a="1", b="2"}` as PromQL writes a series, cut to `limit` characters."""
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    text = f"{metric}{{{inner}}}" if labels else metric
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_labels(labels: dict[str, str], metric: str, display: str, limits: ObservedLimits) -> None:
    if len(labels) > limits.max_labels:
        raise UserError(f"{display}: series {series_text(metric, {})} has {len(labels)} labels, "
                        f"more than the {limits.max_labels} a series may have")
    for key, value in ((metric, ""), *labels.items()):
        for text in (key, value):
            if len(text.encode()) > limits.max_label_bytes:
                raise UserError(f"{display}: series {series_text(metric, {})}: a label name or value of "
                                f"{len(text.encode()):,} bytes, more than the {limits.max_label_bytes:,} allowed")


class Counter:
    """Counts series and samples across the files of one read against the limits."""

    def __init__(self, limits: ObservedLimits) -> None:
        self.limits, self.series, self.samples = limits, 0, 0

    def add(self, display: str, series: int, samples: int) -> None:
        self.series += series
        self.samples += samples
        if self.series > self.limits.max_series:
            raise UserError(f"{display}: more than {self.limits.max_series:,} series "
                            f"(the most one read of observed metrics may hold)")
        if self.samples > self.limits.max_samples:
            raise UserError(f"{display}: more than {self.limits.max_samples:,} samples "
                            f"(the most one read of observed metrics may hold)")


def build(raw: Iterable[RawSeries], limits: ObservedLimits, files: tuple[str, ...] = ()) -> Observed:
    """The two frames from a reader's series; a series found twice (two files, two queries)
    is one series with both sets of samples."""
    merged: dict[tuple, list[RawSeries]] = {}
    for s in raw:
        merged.setdefault((s.metric, tuple(sorted(s.labels.items()))), []).append(s)
    names = sorted({k for key in merged for k, _ in key[1]})
    if len(names) > limits.max_label_names:
        raise UserError(f"{', '.join(files) or 'observed metrics'}: {len(names):,} distinct label names, "
                        f"more than the {limits.max_label_names} allowed")
    metrics, files_col, label_cols = [], [], {n: [] for n in names}
    ts, vs, ids = [], [], []
    for i, ((metric, labels), parts) in enumerate(merged.items()):
        t = np.concatenate([p.t for p in parts]).astype(np.float64, copy=False)
        v = np.concatenate([p.value for p in parts]).astype(np.float64, copy=False)
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
        if len(t) > 1:  # one sample per timestamp: the last one read
            keep = np.append(t[1:] != t[:-1], True)
            t, v = t[keep], v[keep]
        ts.append(t)
        vs.append(v)
        ids.append(np.full(len(t), i, dtype=np.uint32))
        metrics.append(metric)
        files_col.append(parts[0].file)
        as_dict = dict(labels)
        for n in names:
            label_cols[n].append(as_dict.get(n))
    labels_frame = pl.DataFrame({n: pl.Series(n, label_cols[n], dtype=pl.String) for n in names}) if names \
        else pl.DataFrame({"_": [None] * len(metrics)}, schema={"_": pl.String})
    series = pl.DataFrame({
        "series": pl.Series(np.arange(len(metrics), dtype=np.uint32)),
        "metric": pl.Series(metrics, dtype=pl.String),
        "labels": labels_frame.to_struct("labels") if len(metrics) else pl.Series("labels", [], pl.Struct({})),
        "file": pl.Series(files_col, dtype=pl.String),
    })
    cat = (lambda parts, dt: np.concatenate(parts) if parts else np.empty(0, dt))
    samples = pl.DataFrame({
        "series": pl.Series(cat(ids, np.uint32)),
        "t": pl.Series(cat(ts, np.float64)),
        "value": pl.Series(cat(vs, np.float64)),
    })
    unknown = tuple(sorted({m for m in metrics if lookup(m)[0] is None}))
    return Observed(series, samples, unknown, files)


def labels_of(series: pl.DataFrame) -> list[dict[str, str]]:
    """Each series' labels as a dict without the nulls (the labels it has)."""
    return [{k: v for k, v in row.items() if v is not None and k != "_"} for row in series["labels"].to_list()]
