"""`llm-replay export`: the OpenMetrics exposition of a run (names, types, labels, timestamps,
counters and cumulative buckets), the Grafana dashboard, and every refusal (one line, exit 2,
nothing written). The run is a small hand-written run directory, so every value is known."""

from __future__ import annotations

import errno
import json
import re
from collections import defaultdict

import numpy as np
import polars as pl
import pytest

from replay.outputs.openmetrics import TTFT_BUCKETS, cumulative_histogram

SAMPLE = re.compile(r'^(?P<name>[^{ ]+)(?P<labels>\{[^}]*\})? (?P<value>\S+) (?P<ts>\S+)$')
START_S = 1735689600  # the default --start, 2025-01-01T00:00:00Z


@pytest.fixture
def run_dir(tmp_path):
    """Two pools, three 1 s ticks; pool a's two replicas finish three requests."""
    d = tmp_path / "incident"
    d.mkdir()
    t = [1_000_000, 2_000_000, 3_000_000]
    pl.DataFrame({
        "t_us": t * 2, "pool": ["a"] * 3 + ["b"] * 3,
        "replicas_active": [2, 2, 2, 1, 1, 1], "replicas_loading": [0, 1, 0, 0, 0, 0],
        "waiting": [0, 5, 2, 0, 0, 1], "running": [1, 3, 3, 0, 1, 1],
        "kv_usage": [0.125, 0.5, None, 0.0, 0.25, 0.75],
        "preemptions": [0, 2, 1, 0, 0, 0],
        "prompt_tokens_per_s": [100.0, 0.0, 50.0, 0.0, 0.0, 10.0],
        "output_tokens_per_s": [10.0, 20.0, 30.0, 0.0, 1.0, 2.0],
        "gpu_busy": [0.5, 1.0, 0.25, 0.0, 0.1, 0.2],
    }).write_parquet(d / "ticks.parquet")
    pl.DataFrame({
        "pool": ["a", "a", "a", "b"], "replica": [0, 1, 0, None],
        "status": ["finished", "finished", "finished", "rejected"],
        "output_tokens": [3, 1, 5, 4],
        "first_token_us": [500_000, 1_200_000, 2_000_000, None], "ttft_us": [400_000, 100_000, 1_000_000, None],
        "finished_us": [900_000, 2_500_000, 3_000_000, None], "tpot_us": [20_000.0, None, 50_000.0, None],
        "e2e_us": [800_000, 1_400_000, 2_000_000, None],
    }).write_parquet(d / "requests.parquet")
    (d / "summary.json").write_text(json.dumps({"pool_plans": {"a": {"model": "llama-3.1-8b"},
                                                               "b": {"model": "qwen"}}}))
    (d / "config.yaml").write_text("model: llama-3.1-8b\n")
    return d


def _parse(text: str) -> tuple[dict[str, str], dict[tuple[str, str], list[tuple[float, float]]]]:
    types, series = {}, defaultdict(list)
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ")
            types[family] = kind
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m, line
            series[(m["name"], m["labels"])].append((float(m["value"]), float(m["ts"])))
    return types, series


def _values(series, name: str, **labels) -> list[float]:
    (key,) = [k for k in series if k[0] == name and all(f'{n}="{v}"' in k[1] for n, v in labels.items())]
    return [v for v, _ in series[key]]


def test_openmetrics_names_types_labels_and_values(cli, run_dir, tmp_path):
    res = cli("export", run_dir, "--format", "openmetrics", "-o", "run.om")
    assert res.code == 0, res.err
    text = (tmp_path / "run.om").read_text()
    assert text.endswith("\n# EOF\n")
    types, series = _parse(text)
    assert types == {
        "vllm:num_requests_waiting": "gauge", "vllm:num_requests_running": "gauge",
        "vllm:kv_cache_usage_perc": "gauge", "vllm:num_preemptions": "counter", "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter", "kube_deployment_status_replicas": "gauge",
        "DCGM_FI_DEV_GPU_UTIL": "gauge", "vllm:request_success": "counter",
        "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram"}
    for samples in series.values():  # promtool refuses a series whose timestamps do not increase
        stamps = [ts for _, ts in samples]
        assert stamps == sorted(set(stamps))
    assert _values(series, "vllm:num_requests_waiting", pool="a") == [0, 5, 2]
    assert _values(series, "vllm:kv_cache_usage_perc", pool="a") == [0.125, 0.5]  # a null tick is a gap
    assert _values(series, "vllm:num_preemptions_total", pool="a") == [0, 2, 3]
    assert _values(series, "vllm:prompt_tokens_total", pool="a") == [100, 100, 150]
    assert _values(series, "vllm:generation_tokens_total", pool="b") == [0, 1, 3]
    assert _values(series, "kube_deployment_status_replicas", deployment="a") == [2, 3, 2]
    assert _values(series, "DCGM_FI_DEV_GPU_UTIL", pool="a") == [50, 100, 25]
    assert _values(series, "vllm:request_success_total", pool="a", replica="0") == [1, 1, 2]
    assert _values(series, "vllm:request_success_total", pool="a", replica="1") == [0, 0, 1]
    # the e2e of replica 0: 0.8 s (finished by tick 1), then 2.0 s (at tick 3); le is inclusive
    e2e = dict(pool="a", replica="0", model_name="llama-3.1-8b", run="incident")
    assert _values(series, "vllm:e2e_request_latency_seconds_bucket", **e2e, le="0.8") == [1, 1, 1]
    assert _values(series, "vllm:e2e_request_latency_seconds_bucket", **e2e, le="2.0") == [1, 1, 2]
    assert _values(series, "vllm:e2e_request_latency_seconds_bucket", **e2e, le="+Inf") == [1, 1, 2]
    assert _values(series, "vllm:e2e_request_latency_seconds_sum", **e2e) == [0.8, 0.8, 2.8]
    # the mean gap stands for each of a request's output_tokens - 1 gaps
    assert _values(series, "vllm:inter_token_latency_seconds_count", pool="a", replica="0") == [2, 2, 6]
    assert not [k for k in series if 'pool="b"' in k[1] and "replica=" in k[1]]  # b served no request
    (_, first_ts), *_ = series[next(iter(series))]
    assert first_ts == START_S + 1


def test_openmetrics_is_reproducible_and_start_and_step_shift_and_thin_it(cli, run_dir, tmp_path):
    assert cli("export", run_dir, "-f", "openmetrics", "-o", "a.om").code == 0
    assert cli("export", run_dir, "-f", "openmetrics", "-o", "b.om").code == 0
    assert (tmp_path / "a.om").read_bytes() == (tmp_path / "b.om").read_bytes()
    res = cli("export", run_dir, "-f", "openmetrics", "-o", "c.om", "--start", "2026-12-01T14:00:00+01:00",
              "--step", "2", "--run-label", "before")
    assert res.code == 0, res.err
    _, series = _parse((tmp_path / "c.om").read_text())
    key = ("vllm:num_preemptions_total", '{model_name="llama-3.1-8b",pool="a",run="before"}')
    assert series[key] == [(2, 1796130000 + 2)]  # kept tick 2 s only, counting tick 1's too


def test_cumulative_histogram_counts_from_the_tick_an_observation_falls_in():
    counts, sums = cumulative_histogram(np.array([10, 20]), np.array([5, 10, 11, 25]),
                                        np.array([0.001, 0.5, 3000.0, 1.0]), np.array([1, 2, 1, 1]), TTFT_BUCKETS)
    assert counts[:, 0].tolist() == [1, 1]  # 0.001 <= le 0.001
    assert counts[:, -1].tolist() == [3, 4]  # +Inf: everything by the tick; the one after the last never
    assert sums.tolist() == [pytest.approx(1.001), pytest.approx(3001.001)]


def test_grafana_dashboard_opens_on_the_run(cli, run_dir, tmp_path):
    assert cli("export", run_dir, "--format", "grafana", "-o", "dash.json").code == 0
    dash = json.loads((tmp_path / "dash.json").read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["run"]["current"]["value"] == ["incident"] and variables["pool"]["allValue"] == ".*"
    assert variables["datasource"]["type"] == "datasource"
    assert dash["time"] == {"from": "2025-01-01T00:00:00.000Z", "to": "2025-01-01T00:00:03.000Z"}
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert all('run=~"$run"' in e and "$pool" in e for e in exprs)
    assert sum("histogram_quantile" in e for e in exprs) == 6


@pytest.mark.parametrize("setup, argv, fragment", [
    (None, ("nowhere", "-f", "openmetrics", "-o", "x.om"), "nowhere: not a directory"),
    (lambda d: (d / "requests.parquet").unlink(), ("{run}", "-f", "openmetrics", "-o", "x.om"),
     "not a run directory (missing requests.parquet)"),
    (lambda d: (d / "ticks.parquet").write_text("no"), ("{run}", "-f", "openmetrics", "-o", "x.om"),
     "ticks.parquet: cannot be read as Parquet"),
    (None, ("{run}", "-f", "prom", "-o", "x.om"), "export: argument --format/-f: invalid choice: 'prom'"),
    (None, ("{run}", "-f", "openmetrics", "-o", "x.om", "--start", "yesterday"), "--start 'yesterday': not an ISO"),
    (None, ("{run}", "-f", "openmetrics", "-o", "x.om", "--start", "1969-12-31T23:00:00Z"), "before 1970-01-01"),
    (None, ("{run}", "-f", "openmetrics", "-o", "x.om", "--step", "1.5"), "--step 1.5: expected a positive multiple"),
    (None, ("{run}", "-f", "openmetrics", "-o", "no/x.om"), "--out no/x.om: no folder no"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(cli, run_dir, tmp_path, setup, argv, fragment):
    if setup:
        setup(run_dir)
    before = sorted(p.name for p in tmp_path.iterdir())
    res = cli("export", *(str(a).replace("{run}", str(run_dir)) for a in argv))
    assert res.code == 2 and len(res.err.splitlines()) == 1, res.err
    assert res.err.startswith("llm-replay: error: ") and fragment in res.err, res.err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_an_existing_out_is_kept_without_force_and_replaced_with_it(cli, run_dir, tmp_path):
    (tmp_path / "run.om").write_text("mine\n")
    res = cli("export", run_dir, "-f", "openmetrics", "-o", "run.om")
    assert res.code == 2 and "--out run.om: already exists; pass --force" in res.err
    assert (tmp_path / "run.om").read_text() == "mine\n"
    assert cli("export", run_dir, "-f", "openmetrics", "-o", "run.om", "--force").code == 0
    assert (tmp_path / "run.om").read_text().endswith("# EOF\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["incident", "run.om"]


def test_a_full_disk_is_one_line_and_leaves_no_partial_file(cli, run_dir, tmp_path, monkeypatch):
    import replay.outputs.openmetrics as om

    def half_then_full(out, *args):
        out.write("# TYPE vllm:num_requests_waiting gauge\n")
        out.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(om, "write_openmetrics", half_then_full)
    res = cli("export", run_dir, "-f", "openmetrics", "-o", "run.om")
    assert res.code == 2 and res.err == "llm-replay: error: --out run.om: cannot write (No space left on device)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["incident"]
