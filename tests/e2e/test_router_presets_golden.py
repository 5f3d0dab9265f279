"""Each router's run is what it was before routers became plug-ins: prefix-aware, least-kv,
vllm-dp and kv-cost are now presets of the weighted router, the others their own files.

tests/fixtures/golden/routers.json holds content digests (tests/golden.py) of a 3-replica
mooncake-synthetic run per router, written by main at f18d447, where the routers were an
if-chain in engine_nb.route. Never rewrite them to make this pass: a difference is a change
of behaviour.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import golden

DIGESTS = json.loads((Path(golden.__file__).parent / "fixtures" / "golden" / "routers.json").read_text())
FLEET = """model: llama-3.1-8b
trace: {{path: mooncake-synthetic, window: {{end_s: 400}}, rate_scale: 3}}
pools:
  - name: a
    replicas: 3
    router: {router}
    engine: {{num_gpu_blocks_override: 4000, max_model_len: 60000}}
"""


@pytest.mark.parametrize("router", sorted(DIGESTS))
def test_router_run_matches_its_digest_from_before_the_plug_ins(cli, write, tmp_path, router):
    write("f.yaml", FLEET.format(router=router))
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q")
    assert res.code == 0, res.err
    files = sorted(p for p in (tmp_path / "o").rglob("*") if p.is_file() and p.name not in golden.SKIPPED)
    got = {str(p.relative_to(tmp_path / "o")): golden.file_digest(p) for p in files}
    assert sorted(got) == sorted(DIGESTS[router])
    changed = [f for f in got if got[f] != DIGESTS[router][f]]
    assert not changed, f"{router}: {', '.join(changed)} changed"


def test_the_weighted_router_spelled_out_is_its_preset(cli, write, tmp_path):
    write("f.yaml", FLEET.format(router="{policy: weighted, scorers: {prefix: 2, queue: 1, kv_free: 1}}"))
    assert cli("run", "--config", "f.yaml", "--out", "o", "-q").code == 0
    assert golden.file_digest(tmp_path / "o" / "requests.parquet") == DIGESTS["prefix-aware"]["requests.parquet"]
