"""`llm-replay validate` end to end: the table, the exit codes (0 pass, 1 some fail, 2 bad input),
--json, --only, and the shipped file of published measurements."""

from __future__ import annotations

import json

import pytest

from llm_replay.app import main

SCENARIOS = """\
tolerance: 0.2
scenarios:
  - name: easy
    source: "https://example.org/bench table 2: H100, TP1, BF16, batch 2, 64 in / 8 out"
    fleet: {model: llama-3.1-8b, gpu: h100-sxm-80gb, pools: [{replicas: 1}]}
    workload: {kind: static-batch, batch: 2, prompt_tokens: 64, output_tokens: 8}
    checks:
      - {metric: e2e_p50_ms, expected: EXPECTED, tolerance: 9.0}
  - name: poisson
    source: "https://example.org/bench table 3"
    fleet: {model: llama-3.1-8b, gpu: h100-sxm-80gb, pools: [{replicas: 1}]}
    workload: {kind: poisson, rate_rps: 5, requests: 20, prompt_tokens: 100, output_tokens: 10}
    checks:
      - {metric: ttft_p99_ms, expected: 50, tolerance: 9.0}
"""


def write(tmp_path, expected: float, name: str = "sc.yaml"):
    path = tmp_path / name
    path.write_text(SCENARIOS.replace("EXPECTED", str(expected)))
    return path


def test_rows_within_tolerance_exit_0_and_print_the_table(tmp_path, capsys):
    assert main(["validate", str(write(tmp_path, 100.0))]) == 0
    out = capsys.readouterr().out
    assert "easy" in out and "e2e_p50_ms" in out and "pass" in out and "FAIL" not in out
    assert "MAPE: ttft" in out and "e2e" in out and "2 of 2 rows within tolerance" in out


def test_a_row_outside_its_tolerance_exits_1(tmp_path, capsys):
    path = tmp_path / "sc.yaml"
    path.write_text(SCENARIOS.replace("EXPECTED", "100000").replace("tolerance: 9.0}\n  - name", "tolerance: 0.1}\n  - name", 1))
    assert main(["validate", str(path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    easy = [r for r in doc["rows"] if r["scenario"] == "easy"][0]
    assert easy["passed"] is False and easy["error_pct"] < -90
    assert doc["failed"] == 1 and doc["passed"] == 1
    assert doc["mape"]["e2e"]["rows"] == 1 and doc["mape"]["e2e"]["mape_pct"] == pytest.approx(abs(easy["error_pct"]))


def test_only_selects_scenarios_by_name(tmp_path, capsys):
    assert main(["validate", str(write(tmp_path, 100.0)), "--only", "pois", "--json"]) == 0
    assert {r["scenario"] for r in json.loads(capsys.readouterr().out)["rows"]} == {"poisson"}
    assert main(["validate", str(write(tmp_path, 100.0)), "--only", "nothing"]) == 2
    assert "--only nothing: no scenario" in capsys.readouterr().err


@pytest.mark.parametrize("edit, says", [
    (lambda t: t.replace("kind: poisson", "kind: closed-loop"), "scenarios[1].workload.kind: got 'closed-loop'"),
    (lambda t: t.replace("metric: ttft_p99_ms", "metric: ttft_p42_ms"), "scenarios[1].checks[0].metric"),
    (lambda t: t.replace("rate_rps: 5", "rate_rps: -5"), "scenarios[1].workload.rate_rps: got -5"),
    (lambda t: t.replace("    source: \"https://example.org/bench table 3\"\n", ""),
     "missing key 'scenarios[1].source'"),
    (lambda t: t.replace("gpu: h100-sxm-80gb, pools", "gpu: h900, pools", 1), "scenarios[0].fleet.gpu: unknown"),
    (lambda t: "scenarios: {}\n", "scenarios: got {}, expected a non-empty list"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_on_stdout(tmp_path, capsys, edit, says):
    path = tmp_path / "bad.yaml"
    path.write_text(edit(SCENARIOS.replace("EXPECTED", "100")))
    assert main(["validate", str(path)]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    line = cap.err.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"llm-replay: error: {path}") and says in line, line


def test_a_missing_file_is_exit_2(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "none.yaml")]) == 2
    assert "scenario file not found" in capsys.readouterr().err


def test_the_shipped_published_scenarios_run(capsys):
    """Two cited rows of the shipped file; whether they pass is a finding, so only the run is held."""
    code = main(["validate", "published", "--only", "vllm-nightly-latency-llama8b", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code in (0, 1) and code == (1 if doc["failed"] else 0)
    (row,) = doc["rows"]
    assert row["expected"] == 833.421 and row["predicted"] > 0 and "buildkite.com/vllm" in row["source"]
