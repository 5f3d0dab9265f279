"""Per-request observed vs replayed: where the trace came from a request log that recorded each
request's TTFT and E2E (traces/records.py), the run compares them request by request.

requests.parquet gains `observed_ttft_us` and `observed_e2e_us` at its end, and summary.json an
`observed_requests` section: per signal, how many requests were compared (finished in the replay,
observed value recorded and > 0) and the median and p90 of |replayed - observed| / observed.
Runs from other traces are unchanged.
"""

from __future__ import annotations

import polars as pl

from traces.schema import OBSERVED_COLUMNS

SIGNALS = (("ttft", "ttft_us", "observed_ttft_us"), ("e2e", "e2e_us", "observed_e2e_us"))


def has_observed(trace_frame: pl.DataFrame) -> bool:
    return all(name in trace_frame.columns for name in OBSERVED_COLUMNS)


def with_observed(requests: pl.DataFrame, trace_frame: pl.DataFrame) -> pl.DataFrame:
    """`requests` with the trace's observed columns appended, matched by request_id."""
    observed = trace_frame.select("request_id", *OBSERVED_COLUMNS)
    return requests.join(observed, on="request_id", how="left", maintain_order="left")


def compare(requests: pl.DataFrame) -> dict:
    """The `observed_requests` section from requests carrying both replayed and observed columns."""
    finished = requests.filter(pl.col("status") == "finished")
    section: dict = {"requests": requests.height}
    for name, replayed, observed in SIGNALS:
        pairs = finished.filter(pl.col(replayed).is_not_null() & (pl.col(observed) > 0))
        error = ((pl.col(replayed) - pl.col(observed)).abs() / pl.col(observed)).alias("e")
        errors = pairs.select(error)["e"]
        section[name] = {
            "count": errors.len(),
            "median_rel_error": _quantile(errors, 0.5),
            "p90_rel_error": _quantile(errors, 0.9),
            "median_observed_ms": _ms(pairs[observed]),
            "median_replayed_ms": _ms(pairs[replayed]),
        }
    return section


def _quantile(values: pl.Series, q: float) -> float | None:
    # nearest rank, as the run's other percentiles (traces/inspect.py)
    if values.len() == 0:
        return None
    return round(float(values.quantile(q, interpolation="higher")), 6)


def _ms(values: pl.Series) -> float | None:
    return None if values.len() == 0 else round(float(values.median()) / 1000, 3)


def print_comparison(console, section: dict) -> None:
    """One line per signal under the run's table."""
    for name, _, _ in SIGNALS:
        part = section[name]
        if part["count"] == 0:
            console.print(f"observed {name}: no request to compare (none finished with an observed value)")
            continue
        console.print(f"observed {name}: {part['count']:,} requests, median {part['median_observed_ms']:.1f} ms "
                      f"observed vs {part['median_replayed_ms']:.1f} ms replayed; relative error median "
                      f"{part['median_rel_error']:.1%}, p90 {part['p90_rel_error']:.1%}")
