"""inspect_trace on hand-checkable frames: rates, nearest-rank percentiles, prefix reuse."""

from __future__ import annotations

import pathlib

import polars as pl
import pytest

from traces import cast_to_schema, inspect_trace, load_trace
from traces.inspect import nearest_rank, peak_window_count

FIX = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "traces"


def test_rates_and_percentiles():
    f = cast_to_schema(pl.DataFrame({
        "arrival_us": [0, 10_000_000, 59_999_999, 60_000_000, 100_000_000],
        "prompt_tokens": [1, 2, 3, 4, 100],
        "output_tokens": [5, 5, 5, 5, 5],
        "workload": ["a", "b", "a", "a", "b"],
    }))  # fmt: skip
    info = inspect_trace(f)
    assert info["rows"] == 5 and info["span_s"] == 100.0
    assert info["mean_rate_rps"] == pytest.approx(0.05)
    assert info["peak_1min_requests"] == 3  # [0, 60 s) holds 3; [10 s, 70 s) holds 3
    assert info["prompt_tokens"] == {"mean": 22.0, "p50": 3, "p90": 100, "p99": 100, "min": 1, "max": 100}
    assert info["workloads"] == {"a": 3, "b": 2}
    assert info["prefix_reuse"] is None


def test_helpers():
    import numpy as np

    assert nearest_rank(np.arange(1, 101), 50) == 50
    assert nearest_rank(np.arange(1, 101), 99) == 99
    assert nearest_rank(np.array([7]), 1) == 7
    assert peak_window_count(np.array([], dtype=np.int64), 60) == 0
    assert peak_window_count(np.array([0, 59, 60, 61, 62]), 60) == 4


def test_single_request():
    f = cast_to_schema(pl.DataFrame({"arrival_us": [0], "prompt_tokens": [3], "output_tokens": [4]}))
    info = inspect_trace(f)
    assert info["span_s"] == 0.0 and info["mean_rate_rps"] is None and info["peak_1min_requests"] == 1


def test_prefix_reuse_is_strict_prefix_in_arrival_order():
    trace = load_trace(FIX / "mooncake_small.jsonl")
    # hashes in arrival order: [0,1,2] [0,1] [0,1,2,3] [4] [5,6] [0,1,7]
    # reused prefix blocks: 0, 2, 3, 0, 0, 2 -> 7 of 15 references
    reuse = inspect_trace(trace)["prefix_reuse"]
    assert reuse["block_references"] == 15 and reuse["unique_blocks"] == 8
    assert reuse["reused_block_fraction"] == pytest.approx(7 / 15)
    # tokens: min(600, 1024) + min(1536, 1536) + min(1200, 1024) over all prompt tokens
    total = 1030 + 600 + 1536 + 200 + 513 + 1200
    assert reuse["reused_prompt_token_fraction"] == pytest.approx((600 + 1536 + 1024) / total)
    assert inspect_trace(trace.frame)["prefix_reuse"]["reused_prompt_token_fraction"] is None
    assert inspect_trace(trace.frame, prefix_block_tokens=512)["prefix_reuse"] == reuse


def test_strict_prefix_stops_at_first_unseen_block():
    f = cast_to_schema(pl.DataFrame({
        "arrival_us": [0, 1],
        "prompt_tokens": [30, 30],
        "output_tokens": [1, 1],
        "prefix_hashes": [[1, 2, 3], [1, 9, 3]],
    }, schema_overrides={"prefix_hashes": pl.List(pl.UInt64)}))  # fmt: skip
    reuse = inspect_trace(f, prefix_block_tokens=10)["prefix_reuse"]
    assert reuse["reused_block_fraction"] == pytest.approx(1 / 6)  # block 3 is seen but after a miss
    assert reuse["reused_prompt_token_fraction"] == pytest.approx(10 / 60)
