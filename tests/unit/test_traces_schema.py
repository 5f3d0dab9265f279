"""TRACE_SCHEMA and cast_to_schema: column order, defaults, and what a valid frame must hold."""

from __future__ import annotations

import polars as pl
import pytest

from common.errors import TraceError
from traces import TRACE_SCHEMA, cast_to_schema


def test_schema_columns_and_types():
    assert list(TRACE_SCHEMA) == [
        "request_id", "arrival_us", "prompt_tokens", "output_tokens", "workload", "tenant",
        "priority", "session_id", "prefix_hashes", "adapter",
    ]  # fmt: skip
    assert TRACE_SCHEMA["arrival_us"] == pl.Int64 and TRACE_SCHEMA["prompt_tokens"] == pl.Int32
    assert TRACE_SCHEMA["prefix_hashes"] == pl.List(pl.UInt64)


def test_cast_fills_defaults_and_orders_columns():
    columns = {"output_tokens": [2, 3], "prompt_tokens": [5, 6], "arrival_us": [0, 7]}
    out = cast_to_schema(pl.DataFrame(columns))
    assert dict(out.schema) == TRACE_SCHEMA
    assert out["request_id"].to_list() == [0, 1]
    assert out["workload"].to_list() == ["default"] * 2 and out["tenant"].to_list() == ["default"] * 2
    assert out["priority"].to_list() == [0, 0] and out["session_id"].null_count() == 2


@pytest.mark.parametrize("columns, message", [
    ({"arrival_us": [0], "prompt_tokens": [0], "output_tokens": [1]}, "prompt_tokens < 1"),
    ({"arrival_us": [0], "prompt_tokens": [1], "output_tokens": [0]}, "output_tokens < 1"),
    ({"arrival_us": [-1], "prompt_tokens": [1], "output_tokens": [1]}, "arrival_us is negative"),
    ({"arrival_us": [5, 1], "prompt_tokens": [1, 1], "output_tokens": [1, 1]}, "row 1 (request_id 1): arrival_us is earlier"),
    ({"arrival_us": [0, 1], "prompt_tokens": [1, 1], "output_tokens": [1, 1], "request_id": [0, 5]}, "request_id out of sequence"),
    ({"arrival_us": [0], "prompt_tokens": [None], "output_tokens": [1]}, "prompt_tokens is null"),
    ({"arrival_us": [0], "prompt_tokens": ["x"], "output_tokens": [1]}, "column 'prompt_tokens' of type String"),
    ({"arrival_us": [0], "output_tokens": [1]}, "missing column 'prompt_tokens'"),
    ({"arrival_us": [0, 1], "prompt_tokens": [1, 1], "output_tokens": [1, 1], "prefix_hashes": [None, [7, None]]},
     "row 1 (request_id 1): prefix_hashes holds a null hash"),
])  # fmt: skip
def test_cast_rejects_invalid_frames(columns, message):
    with pytest.raises(TraceError, match="^mine: ") as err:
        cast_to_schema(pl.DataFrame(columns), source="mine")
    assert message in str(err.value)


def test_a_null_hash_list_is_a_request_without_hashes():
    out = cast_to_schema(pl.DataFrame({"arrival_us": [0, 1], "prompt_tokens": [1, 1], "output_tokens": [1, 1],
                                       "prefix_hashes": [None, [7, 8]]}))
    assert out["prefix_hashes"].to_list() == [None, [7, 8]]
