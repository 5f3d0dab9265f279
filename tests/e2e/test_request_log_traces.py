"""`llm-replay run` and `trace inspect` on request logs (LiteLLM, aiperf, inference-perf, BLIS):
the observed TTFT/E2E they record are compared with the replay, request by request."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

FIXTURES = Path(__file__).parent.parent / "fixtures" / "traces"
LOGS = ["litellm_spend_logs.csv", "litellm_spend_logs.json", "aiperf_profile_export.jsonl",
        "inference_perf_per_request_lifecycle_metrics.json", "blis_trace_v2.csv", "genai_perf_profile_export.json"]


@pytest.mark.parametrize("name", LOGS)
def test_run_compares_observed_and_replayed_per_request(cli, name):
    result = cli("run", FIXTURES / name, "--out", "out", "--quiet")
    assert result.code == 0, result.err
    summary = json.loads(Path("out/summary.json").read_text())
    requests = pl.read_parquet("out/requests.parquet")
    assert requests.columns[-2:] == ["observed_ttft_us", "observed_e2e_us"]
    section = summary["observed_requests"]
    assert section["requests"] == requests.height == summary["trace_rows"]
    for signal, replayed, observed in (("e2e", "e2e_us", "observed_e2e_us"), ("ttft", "ttft_us", "observed_ttft_us")):
        pairs = requests.filter((pl.col("status") == "finished") & (pl.col(observed) > 0))
        assert section[signal]["count"] == pairs.height
        if pairs.height:
            errors = ((pairs[replayed] - pairs[observed]).abs() / pairs[observed]).sort()
            assert section[signal]["p90_rel_error"] >= section[signal]["median_rel_error"] >= errors[0] - 1e-9
    if summary["trace_dropped"]:
        assert "dropped" in result.err  # never silent


def test_run_table_says_how_close_the_replay_came(cli):
    result = cli("run", FIXTURES / "inference_perf_per_request_lifecycle_metrics.json", "--out", "out")
    assert result.code == 0, result.err
    assert "observed ttft: 1 requests, median 200.0 ms observed" in result.out
    assert "observed e2e: 2 requests, median 1500.0 ms observed" in result.out


def test_runs_of_other_traces_gain_nothing(cli):
    assert cli("run", FIXTURES / "vidur_small.csv", "--out", "out", "--quiet").code == 0
    assert "observed_requests" not in json.loads(Path("out/summary.json").read_text())
    assert "observed_ttft_us" not in pl.read_parquet("out/requests.parquet").columns


@pytest.mark.parametrize("name", LOGS)
def test_trace_inspect(cli, name):
    result = cli("trace", "inspect", FIXTURES / name)
    assert result.code == 0, result.err
    assert "rows" in result.out


def test_bad_log_is_one_line_exit_2_and_no_run(cli, write):
    text = (FIXTURES / "blis_trace_v2.csv").read_text().replace(",1080000,", ",soon,", 1)
    path = write("blis.csv", text)
    result = cli("run", path, "--out", "out")
    assert result.code == 2
    assert result.err.strip().count("\n") == 0
    assert "blis.csv line 2: first_chunk_time_us='soon'" in result.err
    assert not Path("out").exists()
