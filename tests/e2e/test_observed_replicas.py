"""Both sides count a Deployment's replicas the same way (issue 13): kube_deployment_status_replicas
is the Deployment's status.replicas, its non-terminated pods, so `export` writes active + loading
replicas and `--observed` compares the replayed active + loading with it. A run that scales
down (its draining replicas terminating), exported and read back, diverges by zero there."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from tests.e2e.conftest import read_run

START = "2024-12-01T11:00:00Z"
SCALED = """
model: llama-3.1-8b
trace: {path: azure-conv-2023, window: {end_s: 1800}, rate_scale: 6}
observed: {offset_s: 1733050800, window_s: 30, rate_window_s: 30}
pools:
  - name: chat
    replicas: 1
    autoscaler: {policy: queue-depth, min_replicas: 1, max_replicas: 4}
    lifecycle: {pod_start_s: 20, load_bytes_per_s: 4.0e9}
"""


def test_a_scaled_down_run_exported_and_read_back_has_no_replica_divergence(cli, write):
    write("f.yaml", SCALED)
    assert cli("run", "-c", "f.yaml", "-o", "r", "-q").code == 0
    ticks = read_run(Path("r")).ticks
    assert (ticks["replicas_draining"] > 0).sum() >= 5, "the run should hold draining replicas for a while"
    res = cli("export", "r", "--format", "openmetrics", "-o", "r.om", "--start", START)
    assert res.code == 0, res.err
    res = cli("validate", "r", "--observed", "r.om", "--json")
    assert res.code == 0, res.err
    replicas = json.loads(res.out)["signals"]["replicas"]["chat"]
    assert replicas["windows"] >= 10
    assert replicas["mae"] == 0.0 and replicas["gap"] == 0.0, replicas
    # the count the two sides agree on is what kube-state-metrics would report: no draining pods
    exported = [line for line in Path("r.om").read_text().splitlines()
                if line.startswith("kube_deployment_status_replicas{")]
    values = [float(line.split()[1]) for line in exported]
    expected = ticks.sort("t_us").select(pl.col("replicas_active") + pl.col("replicas_loading")).to_series()
    assert values == [float(v) for v in expected]
