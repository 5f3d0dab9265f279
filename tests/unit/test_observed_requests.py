"""Per-request observed vs replayed (replay/outputs/observed_requests.py)."""

from __future__ import annotations

import polars as pl

from replay.outputs.observed_requests import compare, has_observed, with_observed


def test_compare_counts_finished_requests_with_an_observation():
    requests = pl.DataFrame({
        "request_id": [0, 1, 2, 3, 4],
        "status": ["finished", "finished", "finished", "rejected", "finished"],
        "ttft_us": [110, 200, 300, None, 50],
        "e2e_us": [1_000, 1_500, 2_000, None, 800],
    })
    trace = pl.DataFrame({
        "request_id": [4, 3, 2, 1, 0],  # matched by id, not position
        "observed_ttft_us": [None, 100, 100, 100, 100],
        "observed_e2e_us": [800, 1_000, 1_000, 1_000, 1_000],
    })
    assert has_observed(trace) and not has_observed(trace.drop("observed_e2e_us"))
    joined = with_observed(requests, trace)
    assert joined.columns[-2:] == ["observed_ttft_us", "observed_e2e_us"]
    assert joined["observed_ttft_us"].to_list() == [100, 100, 100, 100, None]
    section = compare(joined)
    assert section["requests"] == 5
    # TTFT: requests 0-2 (3 rejected, 4 unobserved): errors 0.1, 1.0, 2.0
    assert section["ttft"]["count"] == 3
    assert section["ttft"]["median_rel_error"] == 1.0 and section["ttft"]["p90_rel_error"] == 2.0
    # E2E: requests 0, 1, 2, 4: errors 0, 0.5, 1.0, 0
    assert section["e2e"]["count"] == 4
    assert section["e2e"]["median_rel_error"] == 0.5 and section["e2e"]["p90_rel_error"] == 1.0


def test_nothing_to_compare_gives_counts_of_zero():
    requests = pl.DataFrame({"request_id": [0], "status": ["rejected"], "ttft_us": [None], "e2e_us": [None]},
                            schema_overrides={"ttft_us": pl.Int64, "e2e_us": pl.Int64})
    trace = pl.DataFrame({"request_id": [0], "observed_ttft_us": [5], "observed_e2e_us": [9]})
    section = compare(with_observed(requests, trace))
    assert section["ttft"] == {"count": 0, "median_rel_error": None, "p90_rel_error": None,
                               "median_observed_ms": None, "median_replayed_ms": None}
