"""Property: any table of requests written as CSV or JSONL loads back sorted, zeroed and intact."""

from __future__ import annotations

import json
import pathlib
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from traces import load_trace

rows = st.lists(
    st.tuples(
        st.integers(0, 10**12),  # arrival, microseconds (up to ~11.6 days)
        st.integers(1, 200_000),  # prompt tokens
        st.integers(1, 5_000),  # output tokens
    ),
    min_size=1,
    max_size=40,
)


def expected(table):
    ordered = sorted(table, key=lambda r: r[0])  # Python's sort is stable, like the loader's
    first = ordered[0][0]
    late = sum(1 for i, r in enumerate(table) if i and r[0] < max(t[0] for t in table[:i]))
    return [(a - first, p, o) for a, p, o in ordered], late


def loaded(trace):
    f = trace.frame
    return list(zip(f["arrival_us"], f["prompt_tokens"], f["output_tokens"])), trace.reordered


@settings(max_examples=40)
@given(rows)
def test_vidur_csv_roundtrip(table):
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "t.csv"
        lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
        lines += [f"{a // 10**6}.{a % 10**6:06d},{p},{o}" for a, p, o in table]
        path.write_text("\n".join(lines) + "\n")
        assert loaded(load_trace(path)) == expected(table)


@settings(max_examples=40)
@given(rows)
def test_mooncake_jsonl_roundtrip(table):
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "t.jsonl"
        with path.open("w") as out:
            for a, p, o in table:
                ms = a // 1000  # Mooncake timestamps are whole milliseconds
                out.write(json.dumps({"timestamp": ms, "input_length": p, "output_length": o,
                                      "hash_ids": [ms % 7]}) + "\n")
        in_ms = [(a // 1000 * 1000, p, o) for a, p, o in table]
        assert loaded(load_trace(path)) == expected(in_ms)
