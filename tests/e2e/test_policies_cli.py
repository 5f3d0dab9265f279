"""Policies by name from the config and the CLI: queue orders, victims, routers, the listing."""

from __future__ import annotations

import json

import pytest

from policies.registry import policy_rows
from tests.e2e.conftest import read_run

FLEET = """
model: llama-3.1-8b
trace: {{path: mooncake-synthetic, window: {{end_s: 120}}}}
pools:
  - name: a
    replicas: 2
    router: {router}
    engine: {{scheduling_policy: {queue}, num_gpu_blocks_override: 6000, max_model_len: 60000}}
    preemption: {{victim: {victim}, watermark: 0.01}}
"""


@pytest.mark.parametrize("router, queue, victim", [
    ("prefix-aware", "longest-prefix", "most-kv"),
    ("kv-cost", "priority", "auto"),
    ("power-of-two", "shortest-prompt", "least-progress"),
    ("vllm-dp", "edf", "vllm-priority"),
])
def test_policies_run_by_name(cli, write, tmp_path, router, queue, victim):
    write("f.yaml", FLEET.format(router=router, queue=queue, victim=victim))
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q")
    assert res.code == 0, res.err
    run = read_run(tmp_path / "o")
    assert run.summary["finished"] + run.summary["rejected"] + run.summary["unfinished"] == run.summary["requests"]


@pytest.mark.parametrize("pool_extra, fragments", [
    ("engine: {scheduling_policy: lifo}", ["pools[0].engine.scheduling_policy", "'lifo'", "fcfs", "priority"]),
    ("preemption: {victim: oldest}", ["pools[0].preemption.victim", "'oldest'", "most-kv"]),
    ("preemption: {mode: teleport}", ["pools[0].preemption.mode", "'teleport'", "recompute or swap"]),
    ("router_refresh_ms: 0", ["pools[0].router_refresh_ms", "got 0"]),
    ("router: {policy: weighted, scorers: {prefx: 2}}",
     ["pools[0].router.scorers", "'prefx'", "did you mean 'prefix'", "kv_cost"]),
    ("router: {policy: weighted, weights: {prefix: 2}}", ["pools[0].router", "'weights'", "known: policy, scorers"]),
    ("router: {policy: least-kv, scorers: {queue: -1}}", ["pools[0].router.scorers.queue", "got -1", ">= 0"]),
    ("router: {policy: fastest}", ["pools[0].router", "'fastest'", "weighted"]),
])
def test_unknown_policy_names_list_the_known_ones(cli, write, tmp_path, pool_extra, fragments):
    write("f.yaml", f"model: llama-3.1-8b\npools:\n  - name: a\n    {pool_extra}\n")
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q")
    assert res.code == 2 and res.err.count("\n") == 1
    for fragment in fragments:
        assert fragment in res.err, (fragment, res.err)


def test_policies_lists_every_family(cli):
    res = cli("policies", "--json")
    assert res.code == 0
    rows = json.loads(res.out)
    assert {r["name"] for r in rows} == {r["name"] for r in policy_rows()}
    assert {"router", "queue order", "preemption victim", "autoscaler"} <= {r["family"] for r in rows}
    text = cli("policies")
    assert "prefix-aware" in text.out and "kpa" in text.out
    weighted = next(r for r in rows if r["family"] == "router" and r["name"] == "weighted")
    assert weighted["params"] == {"scorers": {"prefix": 2.0, "queue": 1.0, "kv_free": 1.0}}
    assert "weighted" in text.out and "scorers" in text.out


def test_weighted_router_from_the_config_and_its_presets(cli, write, tmp_path):
    """`router: {policy: weighted, scorers: ...}` runs; with llm-d's weights it is prefix-aware
    exactly, and other weights route differently."""
    runs = {"preset": "prefix-aware", "spelled": "{policy: weighted, scorers: {prefix: 2, queue: 1, kv_free: 1}}",
            "running": "{policy: weighted, scorers: {running: 1}}"}
    replicas = {}
    for name, router in runs.items():
        write(f"{name}.yaml", FLEET.format(router=router, queue="fcfs", victim="auto"))
        res = cli("run", "--config", f"{name}.yaml", "--out", name, "-q")
        assert res.code == 0, res.err
        replicas[name] = read_run(tmp_path / name).requests["replica"].to_list()
    assert replicas["spelled"] == replicas["preset"]
    assert replicas["running"] != replicas["preset"]


@pytest.mark.parametrize("admission, fragments", [
    ("{policy: bouncer}", ["pools[0].admission.policy", "'bouncer'", "token-bucket"]),
    ("{policy: queue-limit}", ["pools[0].admission.params.max_waiting", "set max_waiting"]),
    ("{policy: token-bucket, params: {capacity: 5}}", ["pools[0].admission.params.capacity", "known keys"]),
])
def test_admission_config_errors(cli, write, tmp_path, admission, fragments):
    write("f.yaml", f"model: llama-3.1-8b\npools:\n  - {{name: a, admission: {admission}}}\n")
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q")
    assert res.code == 2 and res.err.count("\n") == 1, res.err
    for fragment in fragments:
        assert fragment in res.err, (fragment, res.err)


def test_token_bucket_rejects_with_a_reason_per_tenant(cli, write, tmp_path):
    write("f.yaml", "model: llama-3.1-8b\ntrace: {path: azure-conv-2023, window: {end_s: 120}}\n"
                    "pools:\n  - {name: a, admission: {policy: token-bucket, params: {capacity_tokens: 20000, "
                    "refill_tokens_per_s: 2000}}}\n")
    assert cli("run", "--config", "f.yaml", "--out", "o", "-q").code == 0
    req = read_run(tmp_path / "o").requests
    reasons = set(req["reject_reason"].drop_nulls().to_list())
    assert reasons == {"rate_limit"}
    admitted = req.filter(req["status"] != "rejected")
    assert (admitted["prompt_tokens"] + admitted["output_tokens"]).sum() <= 20_000 + 2_000 * 121


def test_a_workload_can_have_its_own_slo(cli, write, tmp_path):
    base = ("model: llama-3.1-8b\ntrace: {path: azure-conv-2023, workload: chat, window: {end_s: 300}, rate_scale: 6, "
            "merge: [{path: azure-code-2023, workload: batch, window: {end_s: 300}, rate_scale: 6}]}\n"
            "pools: [{name: a, replicas: 1}]\n")
    write("strict.yaml", base)
    write("loose.yaml", "slo: {ttft_ms: 2000, tpot_ms: 100, by_workload: {batch: {ttft_ms: 600000, tpot_ms: 1000}}}\n" + base)
    assert cli("run", "--config", "strict.yaml", "--out", "s", "-q").code == 0
    assert cli("run", "--config", "loose.yaml", "--out", "l", "-q").code == 0
    strict, loose = read_run(tmp_path / "s").requests, read_run(tmp_path / "l").requests

    def met(req, workload):
        return req.filter(req["workload"] == workload)["slo_met"].mean()

    assert met(loose, "chat") == met(strict, "chat")
    assert met(loose, "batch") > met(strict, "batch")
    finished_batch = loose.filter((loose["workload"] == "batch") & (loose["status"] == "finished"))
    assert finished_batch["slo_met"].all() or finished_batch["ttft_us"].max() > 600_000_000


def test_swap_preemption_from_the_config(cli, write, tmp_path):
    fleet = ("model: llama-3.1-8b\ntrace: {path: mooncake-synthetic, window: {end_s: 120}}\n"
             "pools:\n  - name: a\n    replicas: 1\n"
             "    engine: {num_gpu_blocks_override: 3000, max_model_len: 40000}\n"
             "    preemption: {mode: MODE, swap_space_gib: 64}\n")
    write("swap.yaml", fleet.replace("MODE", "swap"))
    write("recompute.yaml", fleet.replace("MODE", "recompute"))
    assert cli("run", "--config", "swap.yaml", "--out", "s", "-q").code == 0
    assert cli("run", "--config", "recompute.yaml", "--out", "r", "-q").code == 0
    swap, recompute = read_run(tmp_path / "s").events, read_run(tmp_path / "r").events
    assert (swap["kind"] == "preempt_swap").sum() > 0 and (swap["kind"] == "preempt").sum() == 0
    assert (recompute["kind"] == "preempt").sum() > 0


def test_defaults_read_as_a_config_writes_them(cli):
    res = cli("policies")
    assert res.code == 0
    assert "scorers={prefix: 2, queue: 1, kv_free: 1}" in res.out
    assert "{'" not in res.out and "=None" not in res.out and "=True" not in res.out


def test_a_router_of_neither_kind_says_both_kinds(cli, write, tmp_path):
    write("f.yaml", "model: llama-3.1-8b\npools:\n  - {name: a, replicas: 1, router: [1]}\n")
    res = cli("run", "azure-conv-2023", "-c", "f.yaml", "--out", "o")
    assert res.code == 2 and "pools[0].router: got [1], expected a string or a mapping" in res.err
    assert not (tmp_path / "o").exists()
