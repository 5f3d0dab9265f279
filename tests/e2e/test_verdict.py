"""Results never hide: every run's table ends with what it covers and a verdict when something
went wrong, also under --quiet and --json (on stderr there, so stdout stays JSON)."""

from __future__ import annotations

import json

from tests.e2e.conftest import FIXTURES, small_fleet


def test_an_overloaded_run_says_so_in_its_table(cli, write):
    cfg = write("f.yaml", small_fleet("{path: azure-conv-2023, window: {end_s: 120}, rate_scale: 20}",
                                      extra="max_drain_s: 0\n"))
    res = cli("run", "--config", cfg, "--out", "o")
    assert res.code == 0, res.err
    summary = json.loads(open("o/summary.json").read())
    share = summary["unfinished"] / summary["requests"]
    assert share > 0.05
    assert f"verdict: overloaded: {share:.0%} of requests unfinished at the end of the trace" in res.out
    assert "percentiles cover: TTFT the" in res.out
    assert summary["verdict"][0].startswith("overloaded:")


def test_all_rejected_names_the_reason_under_quiet_and_json(cli, write):
    trace = write("long.csv", "ts,in,out\n0,9000,64\n250,10240,128\n")
    cfg = write("f.yaml", "model: llama-3.1-8b\npools:\n  - {name: a, engine: {max_model_len: 8192}}\n")
    flags = ("--format", "csv", "--column-map", "arrival=ts,prompt_tokens=in,output_tokens=out",
             "--time-unit", "ms")
    expected = "verdict: all requests rejected: context_length 2 (prompt + output > max_model_len 8192)"
    quiet = cli("run", trace, "--config", cfg, *flags, "--out", "q", "-q")
    assert quiet.code == 0 and quiet.out == "" and expected in quiet.err
    as_json = cli("run", trace, "--config", cfg, *flags, "--out", "j", "--json")
    assert as_json.code == 0 and expected in as_json.err
    body = json.loads(as_json.out)
    assert body["rejected_by_reason"] == {"context_length": 2}
    assert body["ttft_requests"] == 0


def test_a_healthy_run_says_it_is_healthy_and_some_rejects_are_counted_by_reason(cli, write):
    cfg = write("l2.yaml", "model: llama-2-7b\npools:\n  - {name: a, replicas: 1}\n")
    res = cli("run", FIXTURES / "azure_conv_context_overflow.csv", "--config", cfg, "--out", "ctx")
    assert res.code == 0, res.err
    assert "verdict: 50.0% of requests rejected (2 of 4): context_length 2" in res.out
    summary = json.loads(open("ctx/summary.json").read())
    assert summary["pools"]["a"]["rejected_by_reason"] == {"context_length": 2}
    assert summary["tpot_requests"] == summary["e2e_requests"] == summary["finished"] == 2
