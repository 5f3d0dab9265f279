"""Read observed-metrics files: the format found from the content, the bounds kept, the
histograms checked, the known metrics kept and the unknown ones listed.

A file is JSON (it opens with `{` or `[`: Prometheus range-query responses), OpenMetrics text
(its first line a `# TYPE`/`# HELP` descriptor or a sample), or CSV (a header with a Time
column); anything else is an error that names the three.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl

from common.errors import UserError
from common.files import read_text_file
from traces.observed import csvfile, openmetrics, prom_json
from traces.observed.limits import DEFAULT_LIMITS, ObservedLimits
from traces.observed.metrics import KNOWN, lookup
from traces.observed.samples import Counter, Observed, RawSeries, build, labels_of, number, series_text

FORMATS = ("prometheus-json", "openmetrics", "csv")
_PARSERS = {"prometheus-json": prom_json.parse, "openmetrics": openmetrics.parse, "csv": csvfile.parse}
# Two adjacent buckets' counts may differ by float rounding this much (Prometheus' tolerance in
# correctPrecisionErrors, promql/quantile.go) before the file is called non-cumulative.
_TOLERANCE = 1e-12


def detect(text: str) -> str | None:
    head = text.lstrip("\ufeff \t\r\n")
    if head[:1] in ("{", "["):
        return "prometheus-json"
    if openmetrics.looks_like(head):
        return "openmetrics"
    if csvfile.looks_like(head):
        return "csv"
    return None


def _text(path: str | Path, limits: ObservedLimits) -> tuple[str, str]:
    display = str(path)
    data = read_text_file(path, display, "observed metrics", limits.max_bytes)
    try:
        return display, data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(f"{display}: not UTF-8 text (byte {exc.start}); expected Prometheus JSON, "
                        f"OpenMetrics text or CSV") from None


def _parse(path: str | Path, limits: ObservedLimits, counter: Counter) -> list[RawSeries]:
    display, text = _text(path, limits)
    fmt = detect(text)
    if fmt is None:
        raise UserError(f"{display}: not one of the observed-metrics formats (expected Prometheus "
                        f"query_range JSON, OpenMetrics text with timestamps, or a Prometheus/Grafana "
                        f"CSV export with a Time column)")
    return _PARSERS[fmt](text, display, limits, counter)


def read_observed(paths: Sequence[str | Path], limits: ObservedLimits = DEFAULT_LIMITS) -> Observed:
    """Every file read into one `Observed`; an error if no series is of a metric the tool knows
    (naming those found), else the unknown names are in `.unknown` for the caller to report."""
    if not paths:
        raise UserError("no observed-metrics file given")
    if len(paths) > limits.max_files:
        raise UserError(f"{len(paths)} observed-metrics files, more than the {limits.max_files} one read may take")
    counter = Counter(limits)
    raw = [s for p in paths for s in _parse(p, limits, counter)]
    observed = build(raw, limits, tuple(str(p) for p in paths))
    if observed.series.height == 0:
        raise UserError(f"{', '.join(observed.files)}: no series in the file (expected samples of "
                        f"{', '.join(sorted(KNOWN)[:4])}, ...)")
    if len(observed.unknown) == len(set(observed.series["metric"])):
        found = ", ".join(observed.unknown[:12]) + (", ..." if len(observed.unknown) > 12 else "")
        raise UserError(f"{', '.join(observed.files)}: no series of a metric this tool knows; found {found} "
                        f"(expected vLLM's vllm:*, DCGM_FI_DEV_GPU_UTIL or kube_deployment_status_replicas)")
    check_histograms(observed)
    return observed


def read_one(path: str | Path, limits: ObservedLimits = DEFAULT_LIMITS) -> pl.DataFrame:
    """One file's samples as the tidy frame: metric, labels, t (Unix seconds), value."""
    counter = Counter(limits)
    return build(_parse(path, limits, counter), limits, (str(path),)).tidy()


def check_histograms(observed: Observed) -> None:
    """Each known histogram's buckets have a numeric `le`, include `+Inf`, and are cumulative
    (a bucket counts at least what the one below it counts, at every time both were scraped).
    PromQL papers over non-cumulative buckets (ensureMonotonic, promql/quantile.go); here they
    are an error, since they mean an export that mixed series or lost samples."""
    series = observed.series
    metrics = series["metric"].to_list()
    groups: dict[tuple, list[tuple[float, int]]] = defaultdict(list)
    for sid, name, labels, file in zip(series["series"].to_list(), metrics, labels_of(series), series["file"].to_list()):
        metric, used = lookup(name)
        if metric is None or metric.kind != "histogram" or not used:
            continue
        le_text = labels.pop("le", None)
        le = number(le_text) if le_text is not None else None
        if le is None:
            raise UserError(f"{file}: series {series_text(name, {**labels, **({'le': le_text} if le_text else {})})}: "
                            f"a histogram bucket needs a numeric le label (its upper bound)")
        groups[(file, name, tuple(sorted(labels.items())))].append((le, sid))
    if not groups:
        return
    samples = observed.samples
    offsets = np.searchsorted(samples["series"].to_numpy(), np.arange(series.height + 1))
    t_all, v_all = samples["t"].to_numpy(), samples["value"].to_numpy()
    for (file, name, labels), buckets in groups.items():
        buckets.sort()
        where = f"{file}: histogram {series_text(name, dict(labels))}"
        if not np.isinf(buckets[-1][0]) or buckets[-1][0] < 0:
            raise UserError(f"{where} has no le=\"+Inf\" bucket (expected every bucket of a Prometheus histogram)")
        for (le_lo, lo), (le_hi, hi) in zip(buckets, buckets[1:]):
            t_lo, v_lo = t_all[offsets[lo]:offsets[lo + 1]], v_all[offsets[lo]:offsets[lo + 1]]
            t_hi, v_hi = t_all[offsets[hi]:offsets[hi + 1]], v_all[offsets[hi]:offsets[hi + 1]]
            _, i, j = np.intersect1d(t_lo, t_hi, assume_unique=True, return_indices=True)
            bad = np.flatnonzero(v_lo[i] - v_hi[j] > _TOLERANCE * np.abs(v_hi[j]))
            if len(bad):
                k = bad[0]
                raise UserError(f"{where}: bucket le=\"{_le(le_hi)}\" counts {v_hi[j[k]]:g} at t={t_hi[j[k]]:.3f}, "
                                f"less than le=\"{_le(le_lo)}\"'s {v_lo[i[k]]:g}: expected cumulative buckets")


def _le(x: float) -> str:
    return "+Inf" if np.isinf(x) else f"{x:g}"
