"""A sweep on a real local Ray cluster gives the same results table as the local backend."""

from __future__ import annotations

import polars as pl
import pytest

from tests.e2e.test_sweep_cli import sweep_file

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'llm-replay[ray]')")


def test_ray_and_local_backends_give_the_same_table(cli, write, cluster):
    spec = sweep_file(write, "  pools.0.replicas: [1, 2]\n  trace.rate_scale: [1.0, 3.0]\n"
                             "  model: [llama-3.1-8b, llama-3.1-70b]\n")  # 70b on TP1: failed cells too
    local = cli("sweep", spec, "--out", "local", "--workers", "2")
    assert local.code == 0, local.err
    on_ray = cli("sweep", spec, "--out", "ray", "--backend", "ray")
    assert on_ray.code == 0, on_ray.err
    assert "8 cells (8 replayed, 4 failed" in on_ray.out
    a, b = pl.read_parquet("local/results.parquet"), pl.read_parquet("ray/results.parquet")
    assert a.height == 8 and a.equals(b)
    assert ray.is_initialized()  # a cluster the test started is the test's to shut down
