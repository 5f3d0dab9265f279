"""`llm-replay demo incident`: the numbers the incident must reproduce."""

from __future__ import annotations

import polars as pl

from tests.e2e.conftest import read_run


def test_incident_before_and_after(cli, tmp_path):
    res = cli("demo", "incident", "--out", "inc")
    assert res.code == 0, res.err
    assert "chat TTFT p99" in res.out and "GPU-hours" in res.out
    before, after = read_run(tmp_path / "inc" / "before"), read_run(tmp_path / "inc" / "after")

    def chat_p99_ms(run) -> float:
        chat = run.requests.filter(pl.col("workload") == "chat")
        return chat["ttft_us"].quantile(0.99, "linear") / 1000

    # Before: TTFT p99 past 30 s on the shared pool, while GPU-Util reads busy all along and the
    # request rate stays what it always is; the queue and the KV cache show the cause.
    assert chat_p99_ms(before) > 30_000
    shared = before.ticks
    serving = shared.filter(pl.col("replicas_active") > 0)
    assert serving["gpu_busy"].mean() > 0.9
    assert shared["waiting"].max() > 100 and shared["kv_usage"].max() > 0.8
    assert (before.events["kind"] == "scale_up").sum() >= 1  # GPU-Util can only scale up
    # After: chat within its 2 s SLO, on at most 1.25x the GPU-hours.
    assert chat_p99_ms(after) <= 2_000
    assert after.summary["gpu_hours"] <= 1.25 * before.summary["gpu_hours"]
    assert set(after.requests["pool"].unique()) == {"chat", "background"}


def test_incident_refuses_to_overwrite(cli, tmp_path):
    assert cli("demo", "incident", "--out", "inc").code == 0
    again = cli("demo", "incident", "--out", "inc")
    assert again.code == 2 and "--force" in again.err
