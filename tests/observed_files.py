"""Write observed series in each format the readers take, for tests: a series is
(metric, {label: value}, [(unix_seconds, value), ...])."""

from __future__ import annotations

import json
import math
from pathlib import Path

Series = tuple[str, dict[str, str], list[tuple[float, float]]]


def _num(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def series_name(metric: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return f"{metric}{{{inner}}}" if labels else metric


def prom_json(series: list[Series]) -> dict:
    return {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": m, **labels}, "values": [[t, _num(v)] for t, v in points]}
        for m, labels, points in series]}}


def write_json(path: Path, series: list[Series]) -> Path:
    path.write_text(json.dumps(prom_json(series)))
    return path


def write_openmetrics(path: Path, series: list[Series]) -> Path:
    lines = []
    for m, labels, points in series:
        lines += [f"{series_name(m, labels)} {_num(v)} {t!r}" for t, v in points]
    path.write_text("\n".join(lines + ["# EOF", ""]))
    return path


def write_csv_long(path: Path, series: list[Series]) -> Path:
    rows = ["time,series,value"]
    for m, labels, points in series:
        name = series_name(m, labels).replace('"', '""')
        rows += [f'{t!r},"{name}",{_num(v)}' for t, v in points]
    path.write_text("\n".join(rows) + "\n")
    return path


def write_csv_wide(path: Path, series: list[Series], ms: bool = True) -> Path:
    """Grafana's "Series joined by time": Time in epoch milliseconds, a column per series."""
    times = sorted({t for _, _, points in series for t, _ in points})
    head = ["Time"] + ['"' + series_name(m, labels).replace('"', '""') + '"' for m, labels, _ in series]
    cells = [dict(points) for _, _, points in series]
    rows = [",".join(head)]
    for t in times:
        stamp = repr(int(round(t * 1000))) if ms else repr(t)
        rows.append(",".join([stamp] + [_num(c[t]) if t in c else "" for c in cells]))
    path.write_text("\n".join(rows) + "\n")
    return path
