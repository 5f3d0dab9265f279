"""Each router's, queue order's, victim's and admission policy's run is what it was before they
became plug-ins: prefix-aware, least-kv, vllm-dp and kv-cost are now presets of the weighted
router.

tests/fixtures/golden/routers.json, queues_victims.json and admission.json hold content digests
(tests/golden.py) of mooncake-synthetic runs, written by main at f18d447, where these policies
were if-chains in engine_nb.py. Never rewrite them to make this pass: a difference is a change
of behaviour.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import golden

FIXTURES = Path(golden.__file__).parent / "fixtures" / "golden"
DIGESTS = json.loads((FIXTURES / "routers.json").read_text())
QUEUE_DIGESTS = json.loads((FIXTURES / "queues_victims.json").read_text())
ADMISSION_DIGESTS = json.loads((FIXTURES / "admission.json").read_text())
FLEET = """model: llama-3.1-8b
trace: {{path: mooncake-synthetic, window: {{end_s: 400}}, rate_scale: 3}}
pools:
  - name: a
    replicas: 3
    router: {router}
    engine: {{num_gpu_blocks_override: 4000, max_model_len: 60000}}
"""


QUEUE_FLEET = """model: llama-3.1-8b
trace: {{path: mooncake-synthetic, window: {{end_s: 300}}, rate_scale: 3}}
pools:
  - name: a
    replicas: 2
    router: prefix-aware
    engine: {{scheduling_policy: {queue}, num_gpu_blocks_override: 1200, max_model_len: 16000}}
    preemption: {{victim: {victim}}}
"""


def _check(cli, write, tmp_path, config: str, expected: dict[str, str], name: str) -> None:
    write("f.yaml", config)
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q")
    assert res.code == 0, res.err
    files = sorted(p for p in (tmp_path / "o").rglob("*") if p.is_file() and p.name not in golden.SKIPPED)
    got = {str(p.relative_to(tmp_path / "o")): golden.file_digest(p) for p in files}
    assert sorted(got) == sorted(expected)
    changed = [f for f in got if got[f] != expected[f]]
    assert not changed, f"{name}: {', '.join(changed)} changed"


@pytest.mark.parametrize("router", sorted(DIGESTS))
def test_router_run_matches_its_digest_from_before_the_plug_ins(cli, write, tmp_path, router):
    _check(cli, write, tmp_path, FLEET.format(router=router), DIGESTS[router], router)


@pytest.mark.parametrize("run", sorted(QUEUE_DIGESTS))
def test_queue_order_and_victim_runs_match_their_digests(cli, write, tmp_path, run):
    queue, victim = run.split("/")
    _check(cli, write, tmp_path, QUEUE_FLEET.format(queue=queue, victim=victim), QUEUE_DIGESTS[run], run)


ADMISSION_FLEET = """model: llama-3.1-8b
trace: {{path: azure-conv-2023, window: {{end_s: 300}}, rate_scale: 8}}
pools:
  - name: a
    replicas: 2
    admission: {adm}
"""
ADMISSION = {"always": "{policy: always}", "queue-limit": "{policy: queue-limit, params: {max_waiting: 4}}",
             "token-bucket": "{policy: token-bucket, params: {capacity_tokens: 20000, refill_tokens_per_s: 3000}}",
             "priority-shed": "{policy: priority-shed, params: {waiting_per_replica: 2, shed_priority_from: 0}}",
             "slo-aware": "{policy: slo-aware, params: {ttft_multiple: 0.05}}"}


@pytest.mark.parametrize("policy", sorted(ADMISSION_DIGESTS))
def test_admission_runs_match_their_digests(cli, write, tmp_path, policy):
    _check(cli, write, tmp_path, ADMISSION_FLEET.format(adm=ADMISSION[policy]), ADMISSION_DIGESTS[policy], policy)


def test_the_weighted_router_spelled_out_is_its_preset(cli, write, tmp_path):
    write("f.yaml", FLEET.format(router="{policy: weighted, scorers: {prefix: 2, queue: 1, kv_free: 1}}"))
    assert cli("run", "--config", "f.yaml", "--out", "o", "-q").code == 0
    assert golden.file_digest(tmp_path / "o" / "requests.parquet") == DIGESTS["prefix-aware"]["requests.parquet"]
