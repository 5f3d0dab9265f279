"""Odd but real trace content: clean errors or clear warnings, never a traceback or a silent guess.

Token counts of thousands of digits, CR-only line endings, a UInt64 arrival column, JSONL lines
that repeat a key, a time unit that does not fit the data, merged traces sharing hash ids, and
filter labels that match nothing.
"""

from __future__ import annotations

import polars as pl
import pytest

from common.errors import TraceError
from traces import FilterConfig, MergeSource, TraceConfig, load_from_config, load_trace

AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = "2023-11-16 18:15:46.6805900,374,44\n"
CMAP = {"arrival": "ts", "prompt_tokens": "p", "output_tokens": "o"}


def error(path, **kw) -> str:
    with pytest.raises(TraceError) as err:
        load_trace(path, **kw)
    return str(err.value)


@pytest.mark.parametrize("digits", [5000, 30])
def test_a_token_count_of_thousands_of_digits_is_too_large(tmp_path, digits):
    path = tmp_path / "big.csv"
    path.write_text(AZ + ROW + "2023-11-16 18:15:47.0," + "9" * digits + ",3\n")
    message = error(path)
    assert message.startswith(f"{path} line 3: ContextTokens='99999")
    assert message.endswith("is too large (more than 2,147,483,647) (expected a non-negative integer token count)")


def test_a_jsonl_number_of_thousands_of_digits_is_too_large_on_the_slow_path(tmp_path):
    path = tmp_path / "big.jsonl"
    huge = "5" + "0" * 5000
    # The second line's timestamp as text forces the slow (Python json) pass.
    path.write_text(f'{{"timestamp": 0, "input_length": 5, "output_length": {huge}, "hash_ids": [0]}}\n'
                    '{"timestamp": "1", "input_length": 5, "output_length": 1, "hash_ids": [1]}\n')
    assert "line 1: output_length='5000" in error(path) and "is too large" in error(path)


def test_cr_only_line_endings_read_like_lf(tmp_path):
    lf, cr = tmp_path / "lf.csv", tmp_path / "cr.csv"
    text = AZ + ROW + "2023-11-16 18:15:47.0,10,2\n"
    lf.write_text(text)
    cr.write_bytes(text.replace("\n", "\r").encode())
    assert load_trace(cr).frame.equals(load_trace(lf).frame)
    cr.write_bytes((AZ + ROW + "2023-11-16 18:15:47.0,x,2\n").replace("\n", "\r").encode())
    assert error(cr).startswith(f"{cr} line 3: ContextTokens='x' is not a number")


def test_a_uint64_arrival_beyond_int64_names_the_row(tmp_path):
    path = tmp_path / "u64.parquet"
    pl.DataFrame({"ts": pl.Series([0, 1, 2**63 + 5], dtype=pl.UInt64), "p": [1, 2, 3], "o": [1, 2, 3]}).write_parquet(path)
    assert error(path, column_map=CMAP) == f"{path} row 3: ts=9223372036854775813 is out of range (expected seconds)"
    ok = tmp_path / "ok.parquet"
    pl.DataFrame({"ts": pl.Series([0, 1, 2], dtype=pl.UInt64), "p": [1, 2, 3], "o": [1, 2, 3]}).write_parquet(ok)
    assert load_trace(ok, column_map=CMAP).frame["arrival_us"].to_list() == [0, 1_000_000, 2_000_000]


DUP = '{"timestamp": 0, "input_length": 5, "input_length": 7, "output_length": 1, "hash_ids": [0]}\n'


@pytest.mark.parametrize("tail", [
    "",  # every line fits the declared schema: the fast (polars) path
    '{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": "[1]"}\n',  # forces the slow pass
])
def test_a_repeated_jsonl_key_is_one_error_on_both_read_paths(tmp_path, tail):
    path = tmp_path / "dup.jsonl"
    path.write_text(DUP + tail)
    assert error(path) == f"{path} line 1: key 'input_length' appears twice (expected each key once)"


def test_a_repeated_key_that_is_not_read_is_allowed(tmp_path):
    path = tmp_path / "extra.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0], "x": 1, "x": 2}\n')
    assert load_trace(path, format="mooncake").frame.height == 1


def test_milliseconds_read_as_seconds_warn_naming_time_unit(tmp_path):
    path = tmp_path / "ms.csv"
    path.write_text("ts,p,o\n" + "".join(f"{i * 250},5,5\n" for i in range(100)))  # 250 ms apart
    notes = load_trace(path, format="csv", column_map=CMAP).notes
    assert notes == (f"{path}: read as seconds, arrivals span 24,750 s with a median gap of 250 s between "
                     "requests; if the arrival column holds milliseconds, pass --time-unit ms",)
    assert load_trace(path, format="csv", column_map=CMAP, time_unit="ms").notes == ()


def test_seconds_read_as_microseconds_warn(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("ts,p,o\n" + "".join(f"{i},5,5\n" for i in range(200)))
    (note,) = load_trace(path, format="csv", column_map=CMAP, time_unit="us").notes
    assert "200 requests arrive within 0.199 ms" in note and "pass --time-unit ms" in note


def test_merging_a_trace_with_itself_warns_that_reuse_is_inflated():
    cfg = TraceConfig(path="mooncake-synthetic", merge=(MergeSource(path="mooncake-synthetic"),))
    (note,) = load_from_config(cfg).notes
    assert note.startswith("mooncake-synthetic and mooncake-synthetic (the same file twice) share ")
    assert note.endswith("prefix-block hash ids: their requests will be replayed as sharing prompt prefixes, "
                         "so prefix reuse and cache hits will be inflated")
    assert load_from_config(TraceConfig(path="mooncake-synthetic")).notes == ()


def test_a_filter_label_matching_nothing_lists_the_labels_present():
    cfg = TraceConfig(path="azure-conv-2023", filter=FilterConfig(workloads=("conv", "cnv")))
    with pytest.raises(TraceError) as err:
        load_from_config(cfg)
    assert str(err.value) == ("azure-conv-2023: --only-workload / trace.filter.workloads: workload 'cnv' matches no "
                              "request; the trace's workloads: 'conv' (19,366)")
