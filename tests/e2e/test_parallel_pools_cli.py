"""`llm-replay run --jobs N`: pools that share nothing replayed in worker processes write the
files one process writes (timing.json apart), and the run says how it replayed its pools."""

from __future__ import annotations

import pytest

from replay.fleet import parallel
from tests.e2e.conftest import RUN_FILES

FLEET = """\
model: llama-3.1-8b
trace:
  path: azure-conv-2023
  workload: chat
  merge:
    - {path: azure-code-2023, workload: code, offset_s: 0}
  window: {end_s: 300}
pools:
  - {name: chat, replicas: 2, workloads: [chat], router: power-of-two}
  - name: coder
    workloads: [code]
    replicas: 1
    engine: {num_gpu_blocks_override: 2000, max_model_len: 16384}
    autoscaler: {policy: queue-depth, min_replicas: 1, max_replicas: 3}
    lifecycle: {pod_start_s: 5}
"""


def test_run_in_worker_processes_writes_the_files_of_one_process(cli, write, tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "PAYS_OFF", 0.0)  # a short window: split it anyway
    cfg = write("pools.yaml", FLEET)
    one = cli("run", "--config", cfg, "--out", tmp_path / "one", "--jobs", "1", "--detailed-events")
    assert one.code == 0, one.err
    assert "replayed the" not in one.err  # --jobs 1: nothing to say
    two = cli("run", "--config", cfg, "--out", tmp_path / "two", "--jobs", "2", "--detailed-events")
    assert two.code == 0, two.err
    assert "note: replayed the 2 pools in 2 worker processes (--jobs 2)" in two.err
    for name in RUN_FILES - {"timing.json"}:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name


@pytest.mark.parametrize(("config", "reason"), [
    (FLEET, "too little work to share"),
    ("""\
model: llama-3.1-8b
trace: {window: {end_s: 60}}
split: {policy: prefill-decode}
pools:
  - {name: prefill, replicas: 1}
  - {name: decode, replicas: 1}
""", "prefill/decode disaggregation: the decode pool sends its prefills to the prefill pool"),
])
def test_a_fleet_kept_in_one_process_says_why(cli, write, tmp_path, config, reason):
    cfg = write("pools.yaml", config)
    res = cli("run", "--config", cfg, "--out", tmp_path / "run", "--jobs", "2")
    assert res.code == 0, res.err
    assert f"note: replayed the 2 pools in one process: {reason}" in res.err
    quiet = cli("run", "--config", cfg, "--out", tmp_path / "quiet", "--jobs", "2", "--quiet")
    assert quiet.code == 0 and "replayed the" not in quiet.err


def test_worker_processes_run_the_kernels_the_fleet_warmed_up(cli, write, tmp_path, monkeypatch):
    """The chat pool's power-of-two router needs the full kernel variant (replay/engine/variants.py),
    which the run warms up; the coder pool alone would run the plain one, and compile it in its
    worker: it runs the fleet's."""
    from replay.engine import numba_engine

    monkeypatch.setattr(parallel, "PAYS_OFF", 0.0)
    seen = tmp_path / "variants"
    real = numba_engine.NumbaEngine.__init__

    def init(self, *args, **kwargs):
        real(self, *args, **kwargs)
        with open(seen, "a") as fh:  # the forked workers' too
            fh.write(f"{self.variant} {len(self.reps.pool)}\n")

    monkeypatch.setattr(numba_engine.NumbaEngine, "__init__", init)
    res = cli("run", "--config", write("pools.yaml", FLEET), "--out", tmp_path / "two", "--jobs", "2")
    assert res.code == 0, res.err
    assert "in 2 worker processes" in res.err
    engines = seen.read_text().split("\n")[:-1]
    assert len(engines) >= 3 and {line.split()[0] for line in engines} == {"full"}, engines
