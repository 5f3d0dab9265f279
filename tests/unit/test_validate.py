"""Scenario files: parsing (every bad input names the file and key path), the metrics taken from a
replay's requests, the MAPE per group, and the shipped file of published measurements."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from common.errors import ConfigError
from replay.cli.validate import scenario_path
from replay.validate import DRAIN_S, METRICS, Row, load_scenarios, mape_by_group, measure, run_scenario

FLEET = "{model: llama-3.1-8b, gpu: h100-sxm-80gb, pools: [{replicas: 1}]}"


def write(tmp_path: Path, body: str, name: str = "sc.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def one(workload: str, checks: str = "[{metric: ttft_p50_ms, expected: 10}]", fleet: str = FLEET,
        extra: str = "") -> str:
    return f"""\
    scenarios:
      - name: s
        source: "https://example.org table 1"
        fleet: {fleet}
        workload: {workload}
        checks: {checks}
    {extra}"""


def test_workloads_become_the_requests_they_describe(tmp_path):
    path = write(tmp_path, """\
    tolerance: 0.3
    scenarios:
      - name: static
        source: a
        fleet: {model: llama-3.1-8b, gpu: h100-sxm-80gb}
        workload: {kind: static-batch, batch: 4, prompt_tokens: 32, output_tokens: 8}
        checks: [{metric: e2e_mean_ms, expected: 100}]
      - name: offline-listed
        source: b
        fleet: {model: llama-3.1-8b, gpu: h100-sxm-80gb}
        workload: {kind: offline, prompt_tokens: [5, 6, 7], output_tokens: [1, 2, 3]}
        checks: [{metric: ttft_p99_ms, expected: 5, tolerance: 0.05}]
      - name: poisson-fixed
        source: c
        fleet: {model: llama-3.1-8b, gpu: h100-sxm-80gb}
        workload: {kind: poisson, rate_rps: 10, duration_s: 20, prompt_tokens: 100, output_tokens: 10, seed: 3}
        checks: [{metric: output_throughput_tok_s, expected: 100}]
      - name: poisson-trace
        source: d
        fleet: {model: llama-3.1-8b, gpu: h100-sxm-80gb}
        workload: {kind: poisson, rate_rps: 2, requests: 50, lengths_from: azure-conv-2023}
        checks: [{metric: tpot_p50_ms, expected: 10}]
    """)
    static, listed, fixed, traced = load_scenarios(path)
    assert list(static.workload.arrival_us) == [0] * 4 and set(static.workload.prompt_tokens) == {32}
    assert static.checks[0].tolerance == 0.3  # the file's default
    assert list(listed.workload.prompt_tokens) == [5, 6, 7] and list(listed.workload.output_tokens) == [1, 2, 3]
    assert listed.checks[0].tolerance == 0.05
    arr = fixed.workload.arrival_us
    assert arr[0] == 0 and np.all(np.diff(arr) >= 0) and arr[-1] < 20e6
    assert 120 < len(arr) < 280  # 10 req/s for 20 s
    assert len(traced.workload.arrival_us) == 50 and len(set(traced.workload.prompt_tokens.tolist())) > 5
    assert static.fleet.max_drain_s == DRAIN_S and static.fleet.trace is None


def test_a_fleet_may_be_a_path_relative_to_the_scenario_file(tmp_path):
    (tmp_path / "fleets").mkdir()
    (tmp_path / "fleets" / "f.yaml").write_text("model: llama-3.1-8b\ngpu: h200-sxm-141gb\n")
    path = write(tmp_path, one("{kind: static-batch, batch: 1, prompt_tokens: 8, output_tokens: 2}",
                               fleet="fleets/f.yaml"))
    assert load_scenarios(path)[0].fleet.gpu == "h200-sxm-141gb"


@pytest.mark.parametrize("body, says", [
    (one("{kind: burst, batch: 1}"), "scenarios[0].workload.kind: got 'burst', expected one of static-batch"),
    (one("{kind: static-batch, batch: 1, prompt_tokens: 8}"), "missing key 'scenarios[0].workload.output_tokens'"),
    (one("{kind: static-batch, batch: -2, prompt_tokens: 8, output_tokens: 2}"),
     "scenarios[0].workload.batch: got -2, expected a whole number > 0"),
    (one("{kind: static-batch, batch: 1, prompt_tokens: 8.5, output_tokens: 2}"),
     "scenarios[0].workload.prompt_tokens: got 8.5, expected a whole number > 0"),
    (one("{kind: offline, prompt_tokens: [1, 2], output_tokens: [3]}"),
     "scenarios[0].workload.output_tokens: got [3], expected a list of 2 token counts"),
    (one("{kind: offline, prompt_tokens: 4, output_tokens: 3}"),
     "scenarios[0].workload.prompt_tokens: got 4, expected a list of token counts"),
    (one("{kind: poisson, rate_rps: 1, prompt_tokens: 4, output_tokens: 3}"),
     "scenarios[0].workload: give exactly one of 'duration_s' and 'requests'"),
    (one("{kind: poisson, rate_rps: 0, requests: 3, prompt_tokens: 4, output_tokens: 3}"),
     "scenarios[0].workload.rate_rps: got 0, expected a number > 0"),
    (one("{kind: poisson, rate_rps: 1, requests: 3, lengths_from: nowhere.csv}"),
     "scenarios[0].workload.lengths_from:"),
    (one("{kind: static-batch, batch: 1, prompt_tokens: 8, output_tokens: 2, rate: 3}"),
     "unknown key 'scenarios[0].workload.rate'"),
    (one("{kind: static-batch, batch: 1, prompt_tokens: 8, output_tokens: 2}", "[{metric: ttft_p95_ms, expected: 1}]"),
     "scenarios[0].checks[0].metric: got 'ttft_p95_ms', expected one of output_throughput_tok_s"),
    (one("{kind: static-batch, batch: 1, prompt_tokens: 8, output_tokens: 2}", "[{metric: ttft_p50_ms}]"),
     "missing key 'scenarios[0].checks[0].expected'"),
    (one("{kind: static-batch, batch: 1, prompt_tokens: 8, output_tokens: 2}",
         "[{metric: ttft_p50_ms, expected: 'fast'}]"),
     "scenarios[0].checks[0].expected: got 'fast', expected a number > 0"),
    (one("{kind: static-batch, batch: 1, prompt_tokens: 8, output_tokens: 2}",
         "[{metric: ttft_p50_ms, expected: 3, tolerance: 20}]"),
     "scenarios[0].checks[0].tolerance: got 20, expected a relative tolerance"),
    (one("{kind: static-batch, batch: 1, prompt_tokens: 8, output_tokens: 2}", "[]"),
     "scenarios[0].checks: got [], expected a non-empty list"),
    (one("{kind: static-batch, batch: 1, prompt_tokens: 8, output_tokens: 2}",
         fleet="{model: llama-9b, gpu: h100-sxm-80gb}"), "scenarios[0].fleet.model: unknown model 'llama-9b'"),
    (one("{kind: static-batch, batch: 1, prompt_tokens: 8, output_tokens: 2}",
         fleet="{model: llama-3.1-70b, gpu: h100-sxm-80gb, pools: [{replicas: 1}]}"), "scenarios[0].fleet"),
    (one("{kind: static-batch, batch: 1, prompt_tokens: 8, output_tokens: 2}", fleet="{gpus: 3}"),
     "unknown key 'scenarios[0].fleet.gpus'"),
    (one("{kind: static-batch, batch: 1, prompt_tokens: 8, output_tokens: 2}", fleet="missing.yaml"),
     "scenarios[0].fleet: "),
    ("scenarios: []\n", "scenarios: got [], expected a non-empty list"),
    ("- a\n- b\n", "top level: got ['a', 'b'], expected a mapping"),
    ("tolerance: 0.1\n", "missing key 'top level.scenarios'"),
    ("scenarios: [{name: s}]\n", "missing key 'scenarios[0].source'"),
])
def test_bad_scenario_files_name_the_file_and_the_key(tmp_path, body, says):
    path = write(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        load_scenarios(path)
    assert str(err.value).startswith(str(path)) and says in str(err.value), str(err.value)


def test_missing_file_and_duplicate_names(tmp_path):
    with pytest.raises(ConfigError, match="scenario file not found"):
        load_scenarios(tmp_path / "none.yaml")
    body = textwrap.dedent(one("{kind: static-batch, batch: 1, prompt_tokens: 8, output_tokens: 2}"))
    twice = body.rstrip() + "\n" + body.split("scenarios:\n", 1)[1]
    with pytest.raises(ConfigError, match=r"scenarios\[1\].name: got 's', expected a name no other scenario uses"):
        load_scenarios(write(tmp_path, twice, "twice.yaml"))


def requests_frame(arrival, first, finish, prompt, output, status=None) -> pl.DataFrame:
    arrival, first, finish = (np.array(a, dtype=np.int64) for a in (arrival, first, finish))
    output = np.array(output)
    tpot = np.where(output > 1, (finish - first) / np.maximum(output - 1, 1), np.nan)
    return pl.DataFrame({
        "arrival_us": arrival, "first_token_us": first, "finished_us": finish, "prompt_tokens": prompt,
        "output_tokens": output, "ttft_us": first - arrival, "e2e_us": finish - arrival,
        "tpot_us": pl.Series(tpot).fill_nan(None), "status": status or ["finished"] * len(arrival),
    })


def test_measure_takes_throughput_over_the_span_and_linear_percentiles():
    req = requests_frame([0, 0, 1_000_000], [100_000, 200_000, 1_300_000], [1_100_000, 2_200_000, 4_000_000],
                         [10, 20, 30], [11, 21, 1])
    m = measure(req)
    assert m["output_throughput_tok_s"] == pytest.approx(33 / 4.0)
    assert m["total_throughput_tok_s"] == pytest.approx((33 + 60) / 4.0)
    assert m["request_throughput_rps"] == pytest.approx(3 / 4.0)
    assert m["ttft_mean_ms"] == pytest.approx(200.0)
    assert m["ttft_p50_ms"] == pytest.approx(200.0)
    assert m["ttft_p99_ms"] == pytest.approx(np.percentile([100, 200, 300], 99))
    # TPOT over the two requests of more than one output token: 1000 ms / 10 and 2000 ms / 20.
    assert m["tpot_p50_ms"] == pytest.approx(100.0) and m["tpot_mean_ms"] == pytest.approx(100.0)
    assert m["e2e_p99_ms"] == pytest.approx(np.percentile([1100, 2200, 3000], 99))
    assert set(m) == set(METRICS)


def test_measure_of_nothing_finished_is_empty():
    req = requests_frame([0], [0], [0], [5], [5], status=["rejected"])
    assert all(v is None for v in measure(req).values())


def test_mape_is_per_group_and_skips_rows_without_prediction():
    def row(metric, err):
        return Row("s", "w", metric, METRICS[metric][0], 10.0, None if err is None else 10 + err / 10, err, 20, False,
                   "", "src")
    m = mape_by_group([row("ttft_p50_ms", 10.0), row("ttft_p99_ms", -30.0), row("tpot_p50_ms", None),
                       row("output_throughput_tok_s", 5.0)])
    assert m["ttft"] == {"rows": 2, "mape_pct": 20.0}
    assert m["tpot"] == {"rows": 0, "mape_pct": None}
    assert m["throughput"]["mape_pct"] == 5.0 and m["e2e"]["rows"] == 0


def test_a_replayed_static_batch_is_self_consistent(tmp_path):
    """Identical requests arriving together finish together: e2e = TTFT + TPOT x (O - 1), and
    the output throughput is B x O over that latency."""
    path = write(tmp_path, one("{kind: static-batch, batch: 4, prompt_tokens: 64, output_tokens: 16}", """
          - {metric: e2e_mean_ms, expected: 100}
          - {metric: ttft_p50_ms, expected: 10}
          - {metric: tpot_p50_ms, expected: 5}
          - {metric: output_throughput_tok_s, expected: 1000}"""))
    rows = {r.metric: r for r in run_scenario(load_scenarios(path)[0])}
    e2e, ttft, tpot = rows["e2e_mean_ms"].predicted, rows["ttft_p50_ms"].predicted, rows["tpot_p50_ms"].predicted
    assert ttft > 0 and tpot > 0
    assert e2e == pytest.approx(ttft + 15 * tpot, abs=0.002)
    assert rows["output_throughput_tok_s"].predicted == pytest.approx(4 * 16 / (e2e / 1000), rel=1e-6)
    for r in rows.values():
        assert r.error_pct == pytest.approx((r.predicted - r.expected) / r.expected * 100)
        assert r.passed == (abs(r.error_pct) <= 20)


def test_the_shipped_published_file_loads_and_cites_every_scenario():
    scenarios = load_scenarios(scenario_path("published"))
    assert len(scenarios) >= 10
    for s in scenarios:
        assert "http" in s.source, s.name
    groups = {METRICS[c.metric][0] for s in scenarios for c in s.checks}
    assert groups == {"throughput", "ttft", "tpot", "e2e"}


def test_the_published_fleets_carry_only_the_terms_their_source_ran():
    """In-process benchmarks (vLLM's benchmark_latency, trtllm-bench) have no API server, so no serving
    terms; TensorRT-LLM's rows drop vLLM's host overheads (its overlap scheduler hides its own); Lambda's
    rows, a vLLM server streamed over HTTP, keep every default."""
    from replay.fleet.cluster import plan_pools

    by_source: dict[str, list] = {}
    for s in load_scenarios(scenario_path("published")):
        by_source.setdefault(s.name.split("-")[0], []).append(s)
    assert sorted(by_source) == ["lambda", "trtllm", "vllm"]
    zero_serving = {"api_server_us": 0.0, "tokenize_us_per_token": 0.0, "token_return_us": 0.0}
    for source, scenarios in by_source.items():
        for s in scenarios:
            (plan,) = plan_pools(s.fleet, s.name)
            step, serving = plan.step_model, plan.serving.to_dict()
            if source == "lambda":
                assert serving != zero_serving and step["per_step_overhead_us"] > 0, s.name
            else:
                assert serving == zero_serving, s.name
            if source == "trtllm":
                assert step["per_step_overhead_us"] == 0 and step["per_seq_overhead_us"] == 0, s.name
                assert 0 < step["mbu"] <= 1, s.name
