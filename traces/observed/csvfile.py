"""Prometheus / Grafana CSV exports, wide or long.

Wide is what Grafana's panel inspector writes with "Download CSV" (series joined by time): a
`Time` column, then one column per series headed by its display name, which for a Prometheus
query without a legend is the series in PromQL notation, `vllm:num_requests_waiting{pod="a"}`
(also read: `{__name__="...", ...}` and a bare metric name); an empty cell is no sample. Long is
one sample a row: a time column, a `value` column, and either a `series` column in that notation
or a `metric` (`__name__`, `name`) column with every other column a label. Times are epoch
seconds, epoch milliseconds (Grafana's raw export; any number past 1e11), or ISO 8601 / Grafana's
formatted `2024-05-01 14:05:00` (no zone: UTC). A leading `sep=;` line (Excel's hint) sets the
delimiter.
"""

from __future__ import annotations

import csv
import datetime as dt
import re

import numpy as np

from common.errors import UserError
from traces.observed.limits import ObservedLimits
from traces.observed.samples import Counter, RawSeries, check_labels, number

TIME_NAMES = ("time", "timestamp", "t")
SERIES_NAMES = ("series", "metric", "__name__", "name")
_SERIES = re.compile(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*(\{.*\})?\s*")
_PAIR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_MS_FROM = 1e11  # a number of seconds past this is 5138 AD: milliseconds


def looks_like(text: str) -> bool:
    header = _header_line(text)
    return header is not None and any(c.strip().strip('"').lower() in TIME_NAMES for c in re.split(r"[,;\t]", header))


def _header_line(text: str) -> str | None:
    lines = [line for line in text.splitlines()[:3] if line.strip()]
    if lines and lines[0].startswith("sep="):
        lines = lines[1:]
    return lines[0] if lines else None


def parse(text: str, display: str, limits: ObservedLimits, counter: Counter) -> list[RawSeries]:
    delimiter = None
    if text.startswith("sep=") and len(text) > 4:
        delimiter, text = text[4], text.split("\n", 1)[1] if "\n" in text else ""
    header = _header_line(text) or ""
    if delimiter is None:
        delimiter = max(",;\t", key=header.count)
    csv.field_size_limit(limits.max_line_bytes)
    try:
        rows = list(csv.reader(text.splitlines(), delimiter=delimiter))
    except csv.Error as exc:
        raise UserError(f"{display}: not a CSV file this tool reads ({exc})") from None
    rows = [r for r in rows if any(c.strip() for c in r)]
    if not rows:
        raise UserError(f"{display}: an empty CSV file (expected a Time column and series)")
    head = [c.strip() for c in rows[0]]
    lower = [c.lower() for c in head]
    time_col = next((i for i, c in enumerate(lower) if c in TIME_NAMES), None)
    if time_col is None:
        raise UserError(f"{display}: CSV header {', '.join(head)[:100]} has no Time column "
                        f"(expected one of {', '.join(TIME_NAMES)})")
    if "value" in lower and any(c in SERIES_NAMES for c in lower):
        return _long(rows, head, lower, time_col, display, limits, counter)
    return _wide(rows, head, time_col, display, limits, counter)


def _wide(rows, head, time_col, display, limits, counter) -> list[RawSeries]:
    columns = [i for i in range(len(head)) if i != time_col]
    if not columns:
        raise UserError(f"{display}: CSV has a Time column and no series columns")
    counter.add(display, len(columns), 0)
    named = [(i, *parse_series(head[i], f"{display}: column {head[i][:60]!r}")) for i in columns]
    for _, name, labels in named:
        check_labels(labels, name, display, limits)
    times = np.array([parse_time(r[time_col] if time_col < len(r) else "", display, n)
                      for n, r in enumerate(rows[1:], 2)])
    out = []
    for i, name, labels in named:
        t, v = [], []
        for n, row in enumerate(rows[1:], 2):
            cell = row[i].strip() if i < len(row) else ""
            if not cell:
                continue
            x = number(cell)
            if x is None:
                raise UserError(f"{display}: row {n}, column {head[i][:80]!r}: {cell[:40]!r} is not a number "
                                f"(export with Grafana's \"Formatted data\" off, so values carry no units)")
            t.append(times[n - 2])
            v.append(x)
        counter.add(display, 0, len(t))
        out.append(RawSeries(name, labels, np.array(t, dtype=np.float64), np.array(v, dtype=np.float64), display))
    return out


def _long(rows, head, lower, time_col, display, limits, counter) -> list[RawSeries]:
    value_col = lower.index("value")
    name_col = next(i for i, c in enumerate(lower) if c in SERIES_NAMES)
    label_cols = [i for i in range(len(head)) if i not in (time_col, value_col, name_col)]
    found: dict[tuple, tuple[list, list]] = {}
    for n, row in enumerate(rows[1:], 2):
        cells = row + [""] * (len(head) - len(row))
        name, labels = parse_series(cells[name_col], f"{display}: row {n}")
        labels.update({head[i]: cells[i] for i in label_cols if cells[i] != ""})
        key = (name, tuple(sorted(labels.items())))
        if key not in found:
            check_labels(labels, name, display, limits)
            found[key] = ([], [])
            counter.add(display, 1, 0)
        x = number(cells[value_col])
        if x is None:
            raise UserError(f"{display}: row {n}: value {cells[value_col][:40]!r} of {name} is not a number")
        found[key][0].append(parse_time(cells[time_col], display, n))
        found[key][1].append(x)
        counter.add(display, 0, 1)
    return [RawSeries(name, dict(labels), np.array(t, dtype=np.float64), np.array(v, dtype=np.float64), display)
            for (name, labels), (t, v) in found.items()]


def parse_series(text: str, where: str) -> tuple[str, dict[str, str]]:
    """`name{a="1"}`, `{__name__="name", a="1"}` or `name` -> (name, labels)."""
    match = _SERIES.fullmatch(text)
    labels: dict[str, str] = {}
    if match and match.group(2):
        inner, pos = match.group(2)[1:-1], 0
        while pos < len(inner):
            pair = _PAIR.match(inner, pos)
            if not pair:
                match = None
                break
            labels[pair.group(1)] = re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), pair.group(2))
            pos = pair.end()
    name = (match.group(1) if match else None) or labels.pop("__name__", None)
    if not match or not name:
        raise UserError(f"{where}: {text[:80]!r} does not name a series (expected metric{{label=\"value\", ...}}, "
                        f"as Grafana heads a Prometheus series without a legend)")
    return name, labels


def parse_time(cell: str, display: str, row: int) -> float:
    cell = cell.strip()
    x = number(cell)
    if x is not None and np.isfinite(x):
        return x / 1000.0 if abs(x) >= _MS_FROM else x
    try:
        when = dt.datetime.fromisoformat(cell)
    except ValueError:
        raise UserError(f"{display}: row {row}: time {cell[:40]!r} is neither epoch seconds, epoch "
                        f"milliseconds nor an ISO 8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()
