"""The export, for real: replay a minute of the bundled Azure trace, export it as OpenMetrics,
backfill it with `promtool tsdb create-blocks-from openmetrics`, start Prometheus on that TSDB and
read the series back through /api/v1/query_range. What comes back must be the run's own ticks
(and, for the histograms, what the run's requests put in vLLM's buckets), sample for sample;
every query of the shipped Grafana dashboard finds the run; and the range-query JSON, read as an
observed export by traces.observed, diverges from the run by zero.

Needs Debian's `prometheus` package (promtool and prometheus on PATH; .ci/run installs it).
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from llm_replay.app import main
from replay.outputs.grafana import shipped_dashboard
from replay.outputs.openmetrics import E2E_BUCKETS, TTFT_BUCKETS
from tests.e2e.conftest import read_run, small_fleet

pytestmark = pytest.mark.skipif(
    not (shutil.which("promtool") and shutil.which("prometheus")),
    reason="promtool/prometheus not on PATH (apt-get install prometheus)")

START = "2025-01-01T00:00:00Z"
START_S = 1735689600  # START in Unix seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(base: str, path: str, **params) -> dict:
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _wait_ready(base: str, proc: subprocess.Popen, log) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"prometheus exited: {log.read_text()[-2000:]}"
        try:
            with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"prometheus not ready within 30 s: {log.read_text()[-2000:]}")


def _range(base: str, query: str, first_s: int, last_s: int) -> dict[int, float]:
    """{t_us in trace time: value} of a query_range with one point per second (the run's tick)."""
    body = _get(base, "/api/v1/query_range", query=query, start=first_s, end=last_s, step="1s")
    assert body["status"] == "success", body
    (series,) = body["data"]["result"]
    return {(int(t) - START_S) * 1_000_000: float(v) for t, v in series["values"]}


def _bucket_quantile(q: float, bounds: tuple[float, ...], cumulative: list[int]) -> float:
    """PromQL's histogram_quantile over cumulative bucket counts (promql/quantile.go
    bucketQuantile, Prometheus 2.x): the rank's bucket, interpolated linearly inside it."""
    total = cumulative[-1]
    if total == 0:
        return math.nan
    rank = q * total
    b = next(i for i, c in enumerate(cumulative) if c >= rank)
    if b == len(bounds):  # the +Inf bucket: the highest finite bound
        return bounds[-1]
    lo, below = (0.0, 0) if b == 0 else (bounds[b - 1], cumulative[b - 1])
    return lo + (bounds[b] - lo) * ((rank - below) / (cumulative[b] - below))


def _expected_quantiles(q: float, at_us: np.ndarray, values_s: np.ndarray, bounds, ticks: list[int]) -> dict:
    out = {}
    for t in ticks:
        seen = values_s[at_us <= t]
        cumulative = [int((seen <= b).sum()) for b in bounds] + [len(seen)]
        out[t] = _bucket_quantile(q, bounds, cumulative)
    return out


def _dashboard_queries_answer(base: str, first_s: int, last_s: int) -> None:
    """Every query of the shipped dashboard, with its variables at All, finds the exported run
    (a PromQL typo or a name the export does not write would come back empty)."""
    dash = shipped_dashboard()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$run", ".*").replace("$pool", ".*").replace("$__rate_interval", "1m")
            body = _get(base, "/api/v1/query_range", query=expr, start=first_s, end=last_s, step="5s")
            assert body["status"] == "success", (panel["title"], body)
            values = [float(v) for series in body["data"]["result"] for _, v in series["values"]]
            assert any(not math.isnan(v) for v in values), (panel["title"], expr)


@dataclass
class Served:
    base: str  # Prometheus' URL
    dir: Path  # the folder holding the run (r/), the export and the TSDB
    first_s: int  # the run's first and last tick, wall-clock seconds
    last_s: int


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A minute of azure-conv-2023 replayed on two replicas, exported, backfilled with promtool
    and served by a Prometheus on 127.0.0.1 (killed at the end, whatever happens)."""
    d = tmp_path_factory.mktemp("roundtrip")
    (d / "fleet.yaml").write_text(small_fleet("{path: azure-conv-2023, window: {end_s: 60}}", replicas=2))
    assert main(["run", "-c", str(d / "fleet.yaml"), "--out", str(d / "r"), "--quiet"]) == 0
    assert main(["export", str(d / "r"), "--format", "openmetrics", "-o", str(d / "run.om"), "--start", START]) == 0
    done = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "run.om", "tsdb"],
                          capture_output=True, text=True, timeout=60, cwd=d)
    assert done.returncode == 0, done.stderr
    ticks = read_run(d / "r").ticks
    (d / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    port, log = _free_port(), d / "prometheus.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(["prometheus", f"--storage.tsdb.path={d / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}", f"--config.file={d / 'prometheus.yml'}"],
                                stdout=sink, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_ready(base, proc, log)
        yield Served(base, d, START_S + int(ticks["t_us"].min()) // 1_000_000,
                     START_S + int(ticks["t_us"].max()) // 1_000_000)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_an_exported_run_backfilled_into_prometheus_reads_back_as_its_ticks(served):
    base, first_s, last_s = served.base, served.first_s, served.last_s
    run = read_run(served.dir / "r")
    ticks = run.ticks.sort("t_us")
    sel = '{run="r",pool="default"}'
    for metric, column in (("vllm:num_requests_waiting", "waiting"), ("vllm:num_requests_running", "running"),
                           ("vllm:kv_cache_usage_perc", "kv_usage")):
        got = _range(base, metric + sel, first_s, last_s)
        assert got == dict(zip(ticks["t_us"].to_list(), map(float, ticks[column].to_list()))), metric
    replicas = _range(base, 'kube_deployment_status_replicas{run="r",deployment="default"}', first_s, last_s)
    assert replicas == {t: float(a + b) for t, a, b in
                        ticks.select("t_us", "replicas_active", "replicas_loading").iter_rows()}
    util = _range(base, f"DCGM_FI_DEV_GPU_UTIL{sel}", first_s, last_s)
    assert util == pytest.approx(dict(zip(ticks["t_us"].to_list(), (ticks["gpu_busy"] * 100).to_list())),
                                 rel=1e-12)

    finished = run.requests.filter(run.requests["status"] == "finished")
    success = _range(base, f"sum by (pool) (vllm:request_success_total{sel})", first_s, last_s)
    done_us = np.sort(finished["finished_us"].to_numpy())
    assert success == {t: float(np.searchsorted(done_us, t, side="right")) for t in ticks["t_us"].to_list()}
    assert success[ticks["t_us"][-1]] == finished.height > 100

    grid = ticks["t_us"].to_list()
    for family, bounds, at, value in (
            ("vllm:e2e_request_latency_seconds", E2E_BUCKETS, finished["finished_us"], finished["e2e_us"]),
            ("vllm:time_to_first_token_seconds", TTFT_BUCKETS, run.requests["first_token_us"],
             run.requests["ttft_us"])):
        for q in (0.5, 0.99):
            got = _range(base, f"histogram_quantile({q}, sum by (le, pool) ({family}_bucket{sel}))",
                         first_s, last_s)
            want = _expected_quantiles(q, at.to_numpy(), value.to_numpy() / 1e6, bounds, grid)
            assert set(got) == set(grid)
            for t in grid:
                assert (math.isnan(got[t]) and math.isnan(want[t])) or got[t] == pytest.approx(want[t], rel=1e-9), \
                    (family, q, t)


def test_every_dashboard_query_answers_from_the_export(served):
    _dashboard_queries_answer(served.base, served.first_s, served.last_s)


def test_the_range_query_json_read_as_observed_diverges_from_the_run_by_zero(served):
    """The query_range JSON, read by traces.observed (issue 13 items 1-2) as an observed export,
    aligned on the run's tick grid and scored against the run's own ticks: zero everywhere."""
    observed = pytest.importorskip("traces.observed", reason="traces.observed (the observed-metrics reader) absent")
    ticks = read_run(served.dir / "r").ticks.sort("t_us")
    files = []
    for metric in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                   "DCGM_FI_DEV_GPU_UTIL", "kube_deployment_status_replicas"):
        body = _get(served.base, "/api/v1/query_range", query=metric + '{run="r"}', start=served.first_s,
                    end=served.last_s, step="1s")
        files.append(served.dir / f"{metric.replace(':', '_')}.json")
        files[-1].write_text(json.dumps(body))
    grid = observed.Grid(start_s=ticks["t_us"][0] / 1e6, tick_s=1.0, n=ticks.height)  # the run's 1 s ticks
    seen = observed.observe(files, observed.ObservedConfig(), ["default"], grid, trace_offset_s=float(START_S))
    replayed = {(column, "default"): ticks[column].cast(float).to_numpy()
                for column in ("waiting", "running", "kv_usage", "gpu_busy")}
    replayed["replicas", "default"] = (ticks["replicas_active"] + ticks["replicas_loading"]).cast(float).to_numpy()
    scores = observed.score_all(seen.aligned.values, replayed, grid, 10.0)
    assert sorted(scores) == sorted(replayed)
    for key, divergence in scores.items():
        # GPU utilisation goes out in % and comes back x 0.01: equal to the last bit or two
        assert divergence.windows >= 6 and divergence.mae == pytest.approx(0, abs=1e-12), (key, divergence)
        assert divergence.gap == pytest.approx(0, abs=1e-12), (key, divergence)
