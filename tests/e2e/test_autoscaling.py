"""Autoscaled pools end to end: lifecycle events, replicas by state, billing, config errors."""

from __future__ import annotations

import json

import polars as pl
import pytest

from tests.e2e.conftest import read_run

SCALED = """
model: llama-3.1-8b
trace: {{path: azure-conv-2023, window: {{end_s: 900}}, rate_scale: 6}}
pools:
  - name: chat
    replicas: 1
    autoscaler: {{policy: {policy}, min_replicas: 1, max_replicas: 4}}
    lifecycle: {{pod_start_s: 20, load_bytes_per_s: 4.0e9}}
"""


@pytest.mark.parametrize("policy", ["kpa", "hpa", "queue-depth", "kv-usage", "ray-serve", "wva", "gpu-util", "sla-planner"])
def test_an_autoscaled_pool_starts_replicas_that_load_then_serve(cli, write, tmp_path, policy):
    write("f.yaml", SCALED.format(policy=policy))
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q")
    assert res.code == 0, res.err
    run = read_run(tmp_path / "o")
    ev, ticks = run.events, run.ticks
    ups = ev.filter(pl.col("kind") == "scale_up")
    assert ups.height >= 1, f"{policy} never scaled up at 6x the conversation rate"
    assert ups["detail"][0].startswith(f"{policy}: 1 -> ")
    starting = ev.filter(pl.col("kind") == "replica_starting")
    active = ev.filter((pl.col("kind") == "replica_active") & (pl.col("t_us") > 0))
    # 20 s pod start + 16.06 GB / 4 GB/s: a replica takes requests 24.015 s after it starts
    # (unless a scale-down cancels it first).
    delays = []
    for row in starting.iter_rows(named=True):
        later = active.filter((pl.col("replica") == row["replica"]) & (pl.col("t_us") >= row["t_us"]))
        if later.height:
            delays.append(later["t_us"].min() - row["t_us"])
    assert delays and all(24_000_000 < d < 24_100_000 for d in delays), delays
    assert ticks["replicas_loading"].max() >= 1
    assert (ticks["replicas_active"] + ticks["replicas_loading"] + ticks["replicas_draining"]).max() <= 8
    assert ticks["replicas_active"].max() <= 4
    # Billing covers loading replicas: GPUs billed exceed what active replicas alone would cost.
    assert (ticks["gpus"] >= ticks["replicas_active"]).all()
    assert (ticks["gpus"] > ticks["replicas_active"]).any()
    assert run.summary["finished"] + run.summary["rejected"] + run.summary["unfinished"] == run.summary["requests"]


def test_a_scaled_down_replica_drains_before_it_is_gone(cli, write, tmp_path):
    write("f.yaml", SCALED.format(policy="queue-depth").replace("window: {end_s: 900}", "window: {end_s: 1800}"))
    assert cli("run", "--config", "f.yaml", "--out", "o", "-q").code == 0
    ev = read_run(tmp_path / "o").events
    drained = ev.filter(pl.col("kind") == "replica_draining")
    gone = ev.filter(pl.col("kind") == "replica_gone")
    assert drained.height >= 1 and gone.height >= 1
    for row in gone.iter_rows(named=True):
        began = drained.filter((pl.col("replica") == row["replica"]) & (pl.col("t_us") <= row["t_us"]))
        assert began.height >= 1, "a replica went away without draining"
    # Nothing is routed to a replica after it started draining.
    requests = read_run(tmp_path / "o").requests
    for row in drained.iter_rows(named=True):
        later = requests.filter((pl.col("replica") == row["replica"]) & (pl.col("arrival_us") > row["t_us"]))
        restarted = ev.filter((pl.col("kind") == "replica_starting") & (pl.col("replica") == row["replica"])
                              & (pl.col("t_us") > row["t_us"]))
        if restarted.height == 0:
            assert later.height == 0


def test_fixed_pools_bill_every_replica_for_the_whole_run(cli, write, tmp_path):
    write("f.yaml", "model: llama-3.1-8b\ntrace: {path: azure-conv-2023, window: {end_s: 60}}\n"
                    "pools: [{name: a, replicas: 3}]\n")
    assert cli("run", "--config", "f.yaml", "--out", "o", "-q").code == 0
    run = read_run(tmp_path / "o")
    assert (run.ticks["gpus"] == 3).all()
    hours = run.ticks.height * 3 / 3600
    assert run.summary["gpu_hours"] == pytest.approx(hours, rel=1e-3)


@pytest.mark.parametrize(
    "autoscaler, fragments",
    [
        ("{policy: magic}", ["pools[0].autoscaler.policy", "unknown autoscaler 'magic'", "kpa", "hpa"]),
        ("{policy: kpa, min_replicas: 5, max_replicas: 2}", ["pools[0].autoscaler.max_replicas", "got 2"]),
        ("{policy: kpa, params: {panic_treshold: 2}}", ["pools[0].autoscaler.params.panic_treshold", "known keys"]),
        ("{policy: hpa, guard: {scrape_delay_s: -1}}", ["pools[0].autoscaler.guard.scrape_delay_s", "-1"]),
    ],
)
def test_autoscaler_config_errors_name_the_key(cli, write, tmp_path, autoscaler, fragments):
    write("f.yaml", f"model: llama-3.1-8b\npools:\n  - {{name: a, replicas: 1, autoscaler: {autoscaler}}}\n")
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q")
    assert res.code == 2 and res.err.count("\n") == 1 and "Traceback" not in res.err
    for fragment in fragments:
        assert fragment in res.err, (fragment, res.err)
    assert not (tmp_path / "o").exists()


def test_summary_of_a_scaled_run_is_consistent(cli, write, tmp_path):
    write("f.yaml", SCALED.format(policy="kpa"))
    assert cli("run", "--config", "f.yaml", "--out", "o", "-q").code == 0
    run = read_run(tmp_path / "o")
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["gpu_hours"] == pytest.approx(run.ticks["gpus"].sum() / 3600, rel=1e-3)


def test_a_users_autoscaler_loads_from_a_plugin_file(cli, write, tmp_path):
    from pathlib import Path

    plugin = Path(__file__).resolve().parents[1] / "fixtures" / "plugins" / "my_scaler.py"
    write("f.yaml", SCALED.format(policy="'my_scaler:by_queue'").replace(
        "max_replicas: 4}", "max_replicas: 4, params: {per_replica: 3}}"))
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q", "--plugin", str(plugin))
    assert res.code == 0, res.err
    ups = read_run(tmp_path / "o").events.filter(pl.col("kind") == "scale_up")
    assert ups.height >= 1 and ups["detail"][0].startswith("my_scaler:by_queue: 1 -> ")


@pytest.mark.parametrize("fn, got", [("forgets_to_return", "returned None"),
                                     ("text_replicas", "returned Decision(replicas='3', signals={})")])
def test_a_users_autoscaler_that_returns_no_decision_ends_the_run_naming_it(cli, write, tmp_path, fn, got):
    from pathlib import Path

    plugin = Path(__file__).resolve().parents[1] / "fixtures" / "plugins" / "my_scaler.py"
    write("f.yaml", SCALED.format(policy=f"'my_scaler:{fn}'"))
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q", "--plugin", str(plugin))
    assert res.code == 2 and "Traceback" not in res.err
    assert res.err.splitlines()[-1] == (f"llm-replay: error: autoscaler my_scaler:{fn} {got}; expected "
                               "policies.api.Decision(replicas=<an int>, state, signals=<a dict>)")
    assert not (tmp_path / "o").exists()


def test_a_config_alone_never_imports_the_module_its_policy_names(cli, write, tmp_path, monkeypatch):
    """`policy: "mod:fn"` without --plugin mod: the module stays unimported, the run is refused."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "fixtures" / "plugins"))
    monkeypatch.delitem(sys.modules, "my_scaler", raising=False)
    write("f.yaml", SCALED.format(policy="'my_scaler:by_queue'"))
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q")
    assert res.code == 2 and "my_scaler" not in sys.modules
    assert res.err.strip() == ("llm-replay: error: f.yaml: pools[0].autoscaler.policy: 'my_scaler:by_queue' names "
                               "code in module 'my_scaler'; pass --plugin my_scaler to allow loading it")
    assert not (tmp_path / "o").exists()


def test_a_missing_user_autoscaler_is_a_config_error(cli, write, tmp_path):
    write("f.yaml", SCALED.format(policy="'nowhere.mod:fn'"))
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q")
    assert res.code == 2 and "pools[0].autoscaler.policy" in res.err and "nowhere" in res.err


def test_sla_planner_sizes_both_sides_of_a_prefill_decode_split(cli, write, tmp_path):
    """Every request arrives at the decode pool; the prefill pool's planner sees the same stream
    (as Dynamo's planner reads the frontend's), so both pools are sized from it."""
    write("f.yaml", """
        model: llama-3.1-8b
        trace: {window: {end_s: 600}, rate_scale: 20}
        split: {policy: prefill-decode}
        pools:
          - name: prefill
            replicas: 1
            autoscaler: {policy: sla-planner, min_replicas: 1, max_replicas: 6,
                         params: {role: prefill, decision_interval_s: 60}}
          - name: decode
            replicas: 1
            autoscaler: {policy: sla-planner, min_replicas: 1, max_replicas: 6,
                         params: {role: decode, decision_interval_s: 60}}
    """)
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q")
    assert res.code == 0, res.err
    ups = read_run(tmp_path / "o").events.filter(pl.col("kind") == "scale_up")
    for pool, role in (("prefill", "role=prefill"), ("decode", "role=decode")):
        mine = ups.filter(pl.col("pool") == pool)
        assert mine.height >= 1 and role in mine["detail"][0] and "prompt_tokens_per_s=0," not in mine["detail"][0]


FROM_ZERO = """
model: llama-3.1-8b
trace: {{path: azure-conv-2023, window: {{end_s: 120}}}}
pools:
  - name: chat
    replicas: 0
    autoscaler: {{policy: {policy}, min_replicas: 0, max_replicas: 2{params}}}
    lifecycle: {{pod_start_s: 20, load_bytes_per_s: 4.0e9}}
"""


@pytest.mark.parametrize("policy, params", [
    ("kpa", ", params: {enable_scale_to_zero: true}"),  # Knative: the activator holds them
    ("ray-serve", ""),  # Ray Serve: the handle queues them before the first decision
])
def test_a_pool_at_zero_holds_its_first_requests_and_scales_up(cli, write, tmp_path, policy, params):
    write("f.yaml", FROM_ZERO.format(policy=policy, params=params))
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q")
    assert res.code == 0, res.err
    run = read_run(tmp_path / "o")
    req, ticks, ev = run.requests, run.ticks, run.events
    assert req.filter(pl.col("reject_reason") == "no_replica").height == 0
    assert run.summary["rejected"] == 0 and run.summary["finished"] == run.summary["requests"]
    ups = ev.filter(pl.col("kind") == "scale_up")
    assert ups["detail"][0].startswith(f"{policy}: 0 -> 1"), ups["detail"][0]
    # Held while the first replica loads (20 s + 16.06 GB / 4 GB/s): their TTFT counts the hold.
    first_up_us = ups["t_us"][0]
    early = req.filter(pl.col("arrival_us") < first_up_us)
    assert early.height >= 1
    assert (early["first_token_us"] > first_up_us + 24_015_000).all()
    assert (early["ttft_us"] == early["first_token_us"] - early["arrival_us"]).all()
    # The tick table shows them: held at the pool, and counted as waiting.
    before = ticks.filter(pl.col("t_us") < first_up_us + 1_000_000)
    assert before["held"].max() >= 1
    assert (ticks["waiting"] >= ticks["held"]).all()
    assert ticks.filter(pl.col("t_us") > first_up_us)["held"].max() == 0


def test_a_pool_without_an_autoscaler_at_zero_still_rejects_as_no_replica(cli, write, tmp_path):
    write("f.yaml", """
        model: llama-3.1-8b
        trace: {path: azure-conv-2023, window: {end_s: 30}}
        split: {policy: by-prompt-length, prompt_thresholds: [1000]}
        pools:
          - {name: short, replicas: 1}
          - {name: long, replicas: 0}
    """)
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q")
    assert res.code == 0, res.err
    run = read_run(tmp_path / "o")
    long = run.requests.filter(pl.col("pool") == "long")
    assert long.height >= 1 and (long["reject_reason"] == "no_replica").all()
    assert (run.ticks["held"] == 0).all()
