"""`llm-replay sweep`: small grids on 20 s of the bundled trace, bad input, and resuming."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

BASE = """\
model: llama-3.1-8b
gpu: h100-sxm-80gb
trace: {path: azure-conv-2023, window: {start_s: 0, end_s: 20}}
pools:
  - {name: default, replicas: 1, tensor_parallel_size: 1}
"""


def sweep_file(write, grid: str, name: str = "sweep.yaml", extra: str = "") -> Path:
    write("base.yaml", BASE)
    return write(name, f"base: base.yaml\n{extra}grid:\n{grid}")


def test_a_grid_gives_one_row_per_cell_keys_first(cli, write):
    spec = sweep_file(write, "  pools.0.replicas: [1, 2]\n  router: [least-outstanding, round-robin]\n"
                             "  trace.rate_scale: [1.0, 2.0]\n")
    res = cli("sweep", spec, "--out", "q3", "--workers", "2", "--keep-runs")
    assert res.code == 0, res.err
    assert "8 cells (8 replayed)" in res.out
    table = pl.read_parquet("q3/results.parquet")
    assert table.columns[:5] == ["pools.0.replicas", "router", "trace.rate_scale", "cell", "status"]
    assert table.height == 8 and set(table["status"]) == {"ok"}
    assert table["pools.0.replicas"].to_list() == [1, 1, 1, 1, 2, 2, 2, 2]
    for column in ("slo_attainment", "ttft_p99_ms", "pools.default.ttft_p99_ms", "workloads.conv.requests",
                   "pool_plans.default.replicas", "config_sha256"):
        assert column in table.columns
    assert table["pool_plans.default.replicas"].to_list() == table["pools.0.replicas"].to_list()
    # rate_scale 2 replays the window's requests in half the time: the same requests, more per second
    doubled = table.filter(pl.col("trace.rate_scale") == 2.0)["trace_rows"].to_list()
    assert doubled == table.filter(pl.col("trace.rate_scale") == 1.0)["trace_rows"].to_list()
    for cell in table["cell"]:  # --keep-runs: each cell's run directory, as `run` writes one
        summary = json.loads(Path(f"q3/runs/{cell}/summary.json").read_text())
        assert summary["config_sha256"] == table.filter(pl.col("cell") == cell)["config_sha256"][0]


def test_a_cell_that_cannot_start_is_recorded_failed_and_the_sweep_goes_on(cli, write):
    spec = sweep_file(write, "  model: [llama-3.1-8b, llama-3.1-70b]\n")
    res = cli("sweep", spec, "--out", "q")
    assert res.code == 0, res.err
    assert "1 failed" in res.out
    table = pl.read_parquet("q/results.parquet")
    assert table["status"].to_list() == ["ok", "failed"]
    assert table["error"][0] is None
    assert "does not fit" in table["error"][1] or "memory" in table["error"][1]
    assert table["slo_attainment"][1] is None


def test_a_rerun_replays_only_the_cells_not_done(cli, write):
    """Resume: the cells a first (stopped) sweep finished are neither replayed nor rewritten."""
    spec = sweep_file(write, "  pools.0.replicas: [1, 2]\n")
    assert cli("sweep", spec, "--out", "q").code == 0
    records = sorted(Path("q/cells").glob("*.json"))
    before = {p.name: p.stat().st_mtime_ns for p in records}
    records[0].unlink()  # as if the sweep was killed before this cell's record was written
    spec = sweep_file(write, "  pools.0.replicas: [1, 2, 3]\n")  # and the grid grew meanwhile
    res = cli("sweep", spec, "--out", "q")
    assert res.code == 0, res.err
    assert "3 cells (2 replayed, 1 done before)" in res.out
    assert Path(f"q/cells/{records[1].name}").stat().st_mtime_ns == before[records[1].name]
    table = pl.read_parquet("q/results.parquet")
    assert table["pools.0.replicas"].to_list() == [1, 2, 3] and set(table["status"]) == {"ok"}
    again = cli("sweep", spec, "--out", "q")
    assert "3 cells (0 replayed, 3 done before)" in again.out
    assert pl.read_parquet("q/results.parquet").equals(table)


def test_progress_lines_without_a_terminal(cli, write):
    spec = sweep_file(write, "  pools.0.replicas: [1, 2]\n")
    res = cli("sweep", spec, "--out", "q")
    lines = [line for line in res.err.splitlines() if line.startswith("llm-replay: sweep:")]
    assert len(lines) == 2 and lines[-1].startswith("llm-replay: sweep: 2/2 cells (0 failed), ETA")


@pytest.mark.parametrize("grid, extra, words", [
    ("  pools.0.replicaz: [1]\n", "", "key 'pools.0.replicaz': not a config key; nearest known keys: pools.0.replicas"),
    ("  routr: [round-robin]\n", "", "key 'routr': not a config key"),
    ("  pools.0.replicas: [1, two]\n", "", "(cell 1: pools.0.replicas=two): pools[0].replicas: got 'two', "
                                           "expected an integer"),
    ("  router: [no-such-router]\n", "", "router"),
    ("  pools.3.replicas: [1]\n", "", "pools.3: expected an index 0 to 0"),
    ("  pools.0.replicas: 2\n", "", "grid.pools.0.replicas: got 2, expected a non-empty list"),
    ("  trace.rate_scale: [1.0]\n", "sampel: {n: 2}\n", "unknown key 'sampel' (did you mean 'sample'?)"),
    ("  trace.path: [nope.csv]\n", "", "nope.csv"),
])
def test_bad_sweeps_exit_2_naming_the_file_and_key_and_write_nothing(cli, write, grid, extra, words):
    spec = sweep_file(write, grid, extra=extra)
    res = cli("sweep", spec.name, "--out", "q")
    assert res.code == 2
    assert res.err.startswith("llm-replay: error: sweep.yaml") and words in res.err
    assert len(res.err.strip().splitlines()) == 1
    assert not Path("q").exists()


def test_a_folder_that_is_not_a_sweeps_is_refused(cli, write):
    spec = sweep_file(write, "  pools.0.replicas: [1]\n")
    write("q/notes.txt", "mine")
    res = cli("sweep", spec, "--out", "q")
    assert res.code == 2 and "not a sweep's folder" in res.err
    assert sorted(p.name for p in Path("q").iterdir()) == ["notes.txt"]


def test_ray_flags_without_ray_or_with_a_dead_address(cli, write):
    spec = sweep_file(write, "  pools.0.replicas: [1]\n")
    res = cli("sweep", spec, "--out", "q", "--address", "127.0.0.1:1")
    assert res.code == 2 and "--address: only with --backend ray" in res.err
    pytest.importorskip("ray", reason="ray is not installed (pip install 'llm-replay[ray]')")
    res = cli("sweep", spec, "--out", "q", "--backend", "ray", "--address", "127.0.0.1:1")
    assert res.code == 2 and res.err.startswith("llm-replay: error: --address 127.0.0.1:1: no Ray cluster answers")
    assert not Path("q").exists()


def test_a_killed_sweep_rerun_finishes_without_redoing_finished_cells(cli, write, tmp_path):
    """SIGKILL mid-sweep (no handler runs): the records written before stay, the re-run replays the rest."""
    import os
    import signal
    import subprocess
    import sys
    import time

    spec = sweep_file(write, "  pools.0.replicas: [1, 2, 3, 4, 5, 6]\n  trace.rate_scale: [1.0, 2.0]\n")
    code = "import sys; from llm_replay.app import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "sweep", str(spec), "--out", "q", "--workers", "1"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(list(Path("q/cells").glob("*.json"))) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {p.name: p.stat().st_mtime_ns for p in Path("q/cells").glob("*.json")}
    assert 2 <= len(finished) < 12, "the sweep was killed before or after it ran"
    res = cli("sweep", spec, "--out", "q")
    assert res.code == 0, res.err
    assert f"12 cells ({12 - len(finished)} replayed, {len(finished)} done before)" in res.out
    assert {name: Path(f"q/cells/{name}").stat().st_mtime_ns for name in finished} == finished
    table = pl.read_parquet("q/results.parquet")
    assert table.height == 12 and set(table["status"]) == {"ok"}


def test_the_local_backend_never_imports_ray(write, tmp_path):
    import subprocess
    import sys

    spec = sweep_file(write, "  pools.0.replicas: [1, 2]\n")
    code = ("import sys; from llm_replay.app import main; assert main(sys.argv[1:]) == 0; "
            "assert 'ray' not in sys.modules, 'ray was imported'")
    done = subprocess.run([sys.executable, "-c", code, "sweep", str(spec), "--out", "q", "--workers", "2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert pl.read_parquet(tmp_path / "q/results.parquet").height == 2
