"""Helpers of the end-to-end CLI tests: call `llm_replay.app.main` in-process and read a run directory.

Every test runs in its own temporary working directory (`monkeypatch.chdir`), so a default
`runs/...` output never lands in the repository and the file names in error messages are the
short names the test wrote.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest

from llm_replay.app import main
from replay.fleet.metrics import REQUEST_COLUMNS, TICK_COLUMNS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "e2e"
RUN_FILES = {"requests.parquet", "ticks.parquet", "events.parquet", "summary.json", "config.yaml", "timing.json"}
EVENT_COLUMNS = ("t_us", "pool", "replica", "kind", "detail")
STATUSES = {"finished", "rejected", "unfinished"}
POOL_KEYS = {
    "requests", "finished", "rejected", "unfinished", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
    "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms", "slo_attainment", "goodput_rps",
    "output_tokens_per_s", "gpu_hours", "cost_usd", "cost_per_mtok_out_usd", "cost_per_mtok_all_usd",
    "preemptions", "prefix_hit_rate",
}
TOP_KEYS = {"sim_span_s", "config_sha256", "trace_sha256", "version", "pools"}

# Exact column lists of the issue's contract (kept here, not imported, so a change to the
# product's constants cannot silently change what the tests expect).
ISSUE_REQUEST_COLUMNS = (
    "request_id", "workload", "pool", "replica", "arrival_us", "prompt_tokens", "output_tokens",
    "cached_tokens", "first_scheduled_us", "first_token_us", "finished_us", "ttft_us", "tpot_us",
    "e2e_us", "preemptions", "status", "reject_reason", "slo_met",
)
ISSUE_TICK_COLUMNS = (
    "t_us", "pool", "replicas_active", "replicas_loading", "gpus", "waiting", "running", "kv_usage",
    "kv_used_blocks", "kv_total_blocks", "arrivals", "finished", "rejected", "preemptions",
    "prompt_tokens_per_s", "output_tokens_per_s", "gpu_busy", "cost_usd", "cost_per_mtok_out_usd",
    "ttft_p50_ms", "ttft_p99_ms", "slo_attainment",
)
# The issue's columns come first, in order; later issues may only append (README "Migration notes").
assert REQUEST_COLUMNS[: len(ISSUE_REQUEST_COLUMNS)] == ISSUE_REQUEST_COLUMNS
assert TICK_COLUMNS[: len(ISSUE_TICK_COLUMNS)] == ISSUE_TICK_COLUMNS


@dataclass
class Result:
    code: int
    out: str
    err: str


@dataclass
class Run:
    path: Path
    requests: pl.DataFrame
    ticks: pl.DataFrame
    events: pl.DataFrame
    summary: dict
    config_text: str


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "120")


@pytest.fixture
def cli(capsys):
    """`cli("run", "x.csv", ...)` -> Result(exit code, stdout, stderr)."""

    def call(*argv: str) -> Result:
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 1
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return call


@pytest.fixture
def write(tmp_path):
    """`write("name.yaml", text)` writes dedented text (or bytes) into the test's folder."""

    def put(name: str, content: str | bytes) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(textwrap.dedent(content).lstrip("\n"))
        return path

    return put


def read_run(path: Path) -> Run:
    return Run(
        path=path,
        requests=pl.read_parquet(path / "requests.parquet"),
        ticks=pl.read_parquet(path / "ticks.parquet"),
        events=pl.read_parquet(path / "events.parquet"),
        summary=json.loads((path / "summary.json").read_text()),
        config_text=(path / "config.yaml").read_text(),
    )


def small_fleet(trace: str, *, model: str = "llama-3.1-8b", replicas: int = 1, engine: str = "",
                extra: str = "") -> str:
    """A config text: one small pool on H100 with the given `trace:` section (YAML flow text)."""
    eng = f", engine: {{{engine}}}" if engine else ""
    return (
        f"model: {model}\ngpu: h100-sxm-80gb\ntrace: {trace}\n{extra}"
        f"pools:\n  - {{name: default, replicas: {replicas}, tensor_parallel_size: 1{eng}}}\n"
    )


@pytest.fixture
def cluster():
    """A real local Ray cluster of 2 CPUs for the test (the sweep's and the plan's Ray backends),
    shut down after it; the test is skipped where ray is not installed."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'llm-replay[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield ray
    ray.shutdown()
