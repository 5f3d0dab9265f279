"""Request logs of serving and benchmarking tools read as traces: LiteLLM spend logs, aiperf
records, inference-perf per-request lifecycle JSON and BLIS TraceV2 CSV (traces/logs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from common.errors import TraceError
from traces import TRACE_SCHEMA, detect_format, load_trace

FIXTURES = Path(__file__).parent.parent / "fixtures" / "traces"
OBSERVED = {"observed_ttft_us": pl.Int64, "observed_e2e_us": pl.Int64}


@pytest.mark.parametrize("name, fmt", [
    ("litellm_spend_logs.csv", "litellm"),
    ("litellm_spend_logs.json", "litellm"),
    ("aiperf_profile_export.jsonl", "aiperf"),
    ("inference_perf_per_request_lifecycle_metrics.json", "inference-perf"),
    ("blis_trace_v2.csv", "blis"),
    ("genai_perf_profile_export.json", "genai-perf"),
])
def test_detected_from_content_with_observed_columns_after_the_schema(name, fmt):
    assert detect_format(FIXTURES / name) == fmt
    frame = load_trace(FIXTURES / name).frame
    assert dict(frame.schema) == {**TRACE_SCHEMA, **OBSERVED}
    assert frame["arrival_us"][0] == 0


def rows(trace, *cols):
    return trace.frame.select(cols).rows()


def test_litellm_csv_mapping_and_dropped_rows():
    trace = load_trace(FIXTURES / "litellm_spend_logs.csv")
    # failure status, an embedding without completion tokens and a 0-token completion are dropped
    assert trace.dropped == {"failed": 1, "missing_completion_tokens": 1, "zero_output_tokens": 1}
    assert rows(trace, "arrival_us", "prompt_tokens", "output_tokens", "workload", "tenant") == [
        (0, 120, 30, "gpt-4o", "team-a"), (500_000, 200, 40, "gpt-4o", "bob"),  # no team: the user
        (4_000_000, 300, 60, "llama-3-8b", "team-c")]
    assert rows(trace, "observed_ttft_us", "observed_e2e_us") == [
        (250_000, 1_500_000), (None, 2_000_000), (400_000, 2_000_000)]


def test_litellm_unstreamed_call_has_no_ttft(tmp_path):
    text = (FIXTURES / "litellm_spend_logs.csv").read_text().replace(
        "2024-05-01 10:00:06.000+00:00,2024-05-01 10:00:04.400+00:00",
        "2024-05-01 10:00:06.000+00:00,2024-05-01 10:00:06.000+00:00")  # completionStartTime = endTime
    trace = load_trace(write(tmp_path, "spend.csv", text))
    assert rows(trace, "observed_ttft_us", "observed_e2e_us")[-1] == (None, 2_000_000)


def test_litellm_json_array_with_iso_z_times():
    trace = load_trace(FIXTURES / "litellm_spend_logs.json")
    assert trace.dropped == {"missing_prompt_tokens": 1}
    assert rows(trace, "arrival_us", "tenant", "observed_ttft_us") == [(0, "team-a", 250_000), (500_000, "bob", None)]


def test_aiperf_records_exact_nanoseconds_and_ms_metrics():
    trace = load_trace(FIXTURES / "aiperf_profile_export.jsonl")
    assert trace.dropped == {"failed": 1, "missing_input_sequence_length": 1, "warmup": 1}
    assert rows(trace, "arrival_us", "prompt_tokens", "output_tokens", "observed_ttft_us", "observed_e2e_us") == [
        (0, 512, 64, 85_500, 1_200_000), (250_000, 256, 32, 60_000, 750_000)]


def test_aiperf_nanoseconds_as_text(tmp_path):
    text = (FIXTURES / "aiperf_profile_export.jsonl").read_text().replace(
        '"request_start_ns": 1714557600250000000', '"request_start_ns": "1714557600250000000"')
    trace = load_trace(write(tmp_path, "profile_export.jsonl", text))
    assert trace.frame["arrival_us"].to_list() == [0, 250_000]


def test_inference_perf_first_token_time_and_errors_dropped():
    trace = load_trace(FIXTURES / "inference_perf_per_request_lifecycle_metrics.json")
    assert trace.dropped == {"failed": 1}
    assert rows(trace, "arrival_us", "prompt_tokens", "output_tokens", "observed_ttft_us", "observed_e2e_us") == [
        (0, 128, 16, 200_000, 1_500_000), (500_000, 64, 8, None, 1_500_000)]  # no token times: no TTFT


def test_blis_prefix_added_status_dropped_unset_chunks_null():
    trace = load_trace(FIXTURES / "blis_trace_v2.csv")
    assert trace.dropped == {"status_timeout": 1}
    assert rows(trace, "arrival_us", "prompt_tokens", "workload", "tenant", "session_id",
                "observed_ttft_us", "observed_e2e_us") == [
        (0, 500, "llama-8b", "acme", "s1", 80_000, 1_000_000),  # 400 + 100-token prefix
        (1_500_000, 300, "llama-8b", "acme", "s1", 100_000, 600_000),
        (2_000_000, 250, "blis", "globex", None, None, None)]  # chunk times 0: not recorded


def test_genai_perf_tokens_from_usage_and_requests_without_it_counted():
    trace = load_trace(FIXTURES / "genai_perf_profile_export.json")
    assert trace.dropped == {"missing_usage": 1, "no_response": 1}
    assert rows(trace, "arrival_us", "prompt_tokens", "output_tokens", "observed_ttft_us", "observed_e2e_us") == [
        (0, 300, 24, 150_000, 900_000), (400_000, 120, 10, None, 1_000_000)]  # one response: no TTFT


def test_genai_perf_bad_timestamp_names_the_record(tmp_path):
    text = (FIXTURES / "genai_perf_profile_export.json").read_text().replace("1714557600150000000", '"soon"')
    with pytest.raises(TraceError, match=r"^\S*profile_export.json record 1: response_timestamps\[0\]='soon' is not"):
        load_trace(write(tmp_path, "profile_export.json", text))


def test_other_traces_keep_their_shape():
    frame = load_trace(FIXTURES / "vidur_small.csv").frame
    assert list(frame.columns) == list(TRACE_SCHEMA)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_bad_value_names_file_line_and_field(tmp_path):
    text = (FIXTURES / "litellm_spend_logs.csv").read_text().replace("2024-05-01 10:00:04.000+00:00", "noon", 1)
    path = write(tmp_path, "spend.csv", text)
    with pytest.raises(TraceError, match=r"spend.csv line 7: startTime='noon' is not a valid timestamp"):
        load_trace(path)


def test_end_before_start_is_an_error(tmp_path):
    record = {"start_time": 10.0, "end_time": 9.0, "info": {"input_tokens": 5, "output_tokens": 2}, "error": None}
    path = write(tmp_path, "per_request_lifecycle_metrics.json", json.dumps([record], indent=1))
    with pytest.raises(TraceError, match=r"record 1: end_time='9.0' is before the request started"):
        load_trace(path)


def test_non_numeric_tokens_and_bad_unit(tmp_path):
    line = {"metadata": {"request_start_ns": 5}, "error": None, "metrics": {
        "input_sequence_length": {"value": "many"}, "output_sequence_length": {"value": 3}}}
    path = write(tmp_path, "profile_export.jsonl", json.dumps(line) + "\n")
    with pytest.raises(TraceError, match=r"profile_export.jsonl line 1: isl='many'"):
        load_trace(path)
    line["metrics"]["input_sequence_length"]["value"] = 4
    line["metrics"]["time_to_first_token"] = {"value": 3, "unit": "fortnights"}
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(TraceError, match=r"line 1: metrics.time_to_first_token.unit='fortnights'"):
        load_trace(path)


def test_every_row_dropped_is_an_error_that_counts_them(tmp_path):
    header, *body = (FIXTURES / "blis_trace_v2.csv").read_text().splitlines()
    path = write(tmp_path, "t.csv", "\n".join([header, body[1]]) + "\n")
    with pytest.raises(TraceError, match=r"no replayable request \(dropped: status_timeout 1\)"):
        load_trace(path)


def test_broken_json_array_names_the_line(tmp_path):
    path = write(tmp_path, "lifecycle.json", '[\n{"start_time": 1, "end_time": 2, "info": {}},\n{"start_time": \n')
    with pytest.raises(TraceError, match=r"lifecycle.json line 3: invalid JSON"):
        load_trace(path)


def test_bounds_apply(tmp_path):
    from traces.limits import TraceLimits
    with pytest.raises(TraceError, match="more than 3 lines"):
        load_trace(FIXTURES / "litellm_spend_logs.csv", limits=TraceLimits(max_rows=3))
