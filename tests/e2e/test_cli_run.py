"""`llm-replay run | capacity | trace inspect | catalog` end to end, through `llm_replay.app.main`.

Small fleets (llama-3.1-8b, TP1) on windows or samples of the bundled traces keep each run to
about a second; one full default run goes through the installed console script.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from replay.config import load_config
from replay.model.specs import GPUS, MODELS
from tests.e2e.conftest import (
    EVENT_COLUMNS, FIXTURES, ISSUE_REQUEST_COLUMNS, ISSUE_TICK_COLUMNS, POOL_KEYS, RUN_FILES, STATUSES,
    TOP_KEYS, read_run, small_fleet,
)
from traces import TraceConfig, load_from_config

BUNDLED_ROWS = {"azure-conv-2023": 19_366, "azure-code-2023": 8_819, "mooncake-synthetic": 3_993}


def expected_trace(config_path: Path, trace_arg: str | None = None) -> pl.DataFrame:
    """The trace frame the run should have replayed, loaded without the CLI."""
    cfg = load_config(config_path)
    return load_from_config(cfg.trace or TraceConfig(), path_override=trace_arg, base_dir=config_path.parent).frame


def check_contract(run, trace: pl.DataFrame) -> None:
    """Everything the issue's run-output contract promises, for any run."""
    # Exactly the five files, and no temp dir left beside the run.
    assert {p.name for p in run.path.iterdir()} == RUN_FILES
    leftovers = [p.name for p in run.path.parent.iterdir() if p.name.startswith(f".{run.path.name}.")]
    assert leftovers == []
    req, ticks, events, summary = run.requests, run.ticks, run.events, run.summary
    assert tuple(req.columns)[: len(ISSUE_REQUEST_COLUMNS)] == ISSUE_REQUEST_COLUMNS
    assert tuple(ticks.columns)[: len(ISSUE_TICK_COLUMNS)] == ISSUE_TICK_COLUMNS
    assert tuple(events.columns)[: len(EVENT_COLUMNS)] == EVENT_COLUMNS

    # Every trace row exactly once, with its own arrival and token counts.
    n = trace.height
    assert req.height == n
    assert req["request_id"].to_list() == trace["request_id"].to_list() == list(range(n))
    for col in ("arrival_us", "prompt_tokens", "output_tokens", "workload"):
        assert req[col].to_list() == trace[col].to_list(), col

    # Statuses and conservation.
    assert set(req["status"].unique().to_list()) <= STATUSES
    counts = {s: int((req["status"] == s).sum()) for s in STATUSES}
    assert sum(counts.values()) == n
    fin = req.filter(pl.col("status") == "finished")
    rej = req.filter(pl.col("status") == "rejected")
    unf = req.filter(pl.col("status") == "unfinished")
    assert fin["finished_us"].null_count() == 0 and fin["first_token_us"].null_count() == 0
    assert (fin["ttft_us"] == fin["first_token_us"] - fin["arrival_us"]).all()
    assert (fin["e2e_us"] == fin["finished_us"] - fin["arrival_us"]).all()
    assert (fin["first_token_us"] >= fin["arrival_us"]).all() and (fin["finished_us"] >= fin["first_token_us"]).all()
    assert rej["reject_reason"].null_count() == 0 and rej["first_token_us"].null_count() == rej.height
    assert fin["reject_reason"].null_count() == fin.height and unf["reject_reason"].null_count() == unf.height
    assert unf["finished_us"].null_count() == unf.height
    assert not req.filter(pl.col("status") != "finished")["slo_met"].any()
    assert (req["cached_tokens"] <= req["prompt_tokens"]).all() and (req["cached_tokens"] >= 0).all()

    # Ticks: one row per pool per tick, ticks evenly spaced from the first tick to the end.
    pools = sorted(summary["pools"])
    assert sorted(ticks["pool"].unique().to_list()) == pools
    assert ticks.select("t_us", "pool").is_duplicated().sum() == 0
    times = ticks["t_us"].unique().sort().to_list()
    assert ticks.height == len(times) * len(pools)
    step = times[0]
    assert step > 0 and times == [step * (i + 1) for i in range(len(times))]
    assert times[-1] == round(summary["sim_span_s"] * 1e6)
    assert ((ticks["kv_usage"] >= 0) & (ticks["kv_usage"] <= 1)).all()
    for pool in pools:
        tp = ticks.filter(pl.col("pool") == pool)
        pr = req.filter(pl.col("pool") == pool)
        assert int(tp["arrivals"].sum()) == pr.height
        assert int(tp["finished"].sum()) == int((pr["status"] == "finished").sum())
        assert int(tp["rejected"].sum()) == int((pr["status"] == "rejected").sum())
        assert int(tp["preemptions"].sum()) == int(pr["preemptions"].sum())
        assert tp["cost_usd"].is_sorted()

    # summary.json: fleet keys, top-level keys, one block per pool, counts that add up.
    assert POOL_KEYS | TOP_KEYS <= set(summary)
    for name, block in summary["pools"].items():
        assert set(block) >= POOL_KEYS, name
        assert block["requests"] == block["finished"] + block["rejected"] + block["unfinished"]
    assert summary["requests"] == n
    assert (summary["finished"], summary["rejected"], summary["unfinished"]) == (
        counts["finished"], counts["rejected"], counts["unfinished"])
    # each request counts in its pool, and a P/D request also in the pool that prefilled it
    remote = (summary.get("prefill_decode") or {}).get("remote_prefills", 0)
    assert sum(b["requests"] for b in summary["pools"].values()) == n + remote
    assert re.fullmatch(r"[0-9a-f]{64}", summary["config_sha256"])
    assert re.fullmatch(r"[0-9a-f]{64}", summary["trace_sha256"])
    assert summary["version"]

    # Parquet metadata carries the version and both hashes of summary.json.
    for name in ("requests", "ticks", "events"):
        meta = pl.read_parquet_metadata(run.path / f"{name}.parquet")
        assert meta.get("llm_replay.version") == summary["version"], name
        assert meta.get("llm_replay.config_sha256") == summary["config_sha256"], name
        assert meta.get("llm_replay.trace_sha256") == summary["trace_sha256"], name

    # config.yaml is the resolved fleet; it loads again and hashes to summary's config_sha256.
    assert load_config(run.path / "config.yaml").sha256() == summary["config_sha256"]


# --- each bundled trace, end to end --------------------------------------------------------------


@pytest.mark.parametrize("trace", sorted(BUNDLED_ROWS))
def test_run_each_bundled_trace(cli, write, tmp_path, trace):
    cfg = write("fleet.yaml", small_fleet(f"{{path: {trace}, window: {{end_s: 120}}}}", replicas=2))
    res = cli("run", "--config", cfg, "--out", "runs/one", "-q")
    assert res.code == 0, res.err
    assert res.out == ""
    run = read_run(tmp_path / "runs" / "one")
    frame = expected_trace(cfg)
    assert 0 < frame.height < BUNDLED_ROWS[trace]
    check_contract(run, frame)
    assert run.summary["trace_rows"] == frame.height
    assert run.summary["trace_dropped"]["outside_window"] == BUNDLED_ROWS[trace] - frame.height
    assert run.summary["finished"] > 0


def test_issue_fleet_config_loads_and_runs_on_the_default_trace(cli, tmp_path):
    cfg_path = FIXTURES / "issue_fleet.yaml"
    cfg = load_config(cfg_path)
    pool = cfg.pools[0]
    assert (cfg.model, cfg.gpu, cfg.slo.ttft_ms, cfg.slo.tpot_ms) == ("llama-3.1-70b", "h100-sxm-80gb", 2000, 100)
    assert (pool.name, pool.replicas, pool.tensor_parallel_size, pool.router) == ("default", 4, 4, "least-outstanding")
    assert (pool.engine.max_num_seqs, pool.engine.max_num_batched_tokens, pool.engine.enable_prefix_caching) == (
        256, 8192, True)
    res = cli("run", "--config", cfg_path, "--out", "issue", "--json")
    assert res.code == 0, res.err
    run = read_run(tmp_path / "issue")
    check_contract(run, expected_trace(cfg_path))
    assert json.loads(res.out) == run.summary
    assert run.summary["requests"] == BUNDLED_ROWS["azure-conv-2023"]
    assert run.summary["pool_plans"]["default"]["replicas"] == 4
    assert run.ticks["gpus"].unique().to_list() == [16]
    assert run.ticks["replicas_active"].unique().to_list() == [4]


def test_mooncake_prefix_hit_rate_follows_prefix_caching(cli, write, tmp_path):
    rates = {}
    for on in ("true", "false"):
        cfg = write(f"{on}.yaml", small_fleet("{path: mooncake-synthetic, window: {end_s: 300}}",
                                              engine=f"enable_prefix_caching: {on}"))
        res = cli("run", "--config", cfg, "--out", f"mc-{on}", "-q")
        assert res.code == 0, res.err
        run = read_run(tmp_path / f"mc-{on}")
        rates[on] = (run.summary["prefix_hit_rate"], run.summary["pools"]["default"]["prefix_hit_rate"],
                     int(run.requests["cached_tokens"].sum()))
    hit, pool_hit, cached = rates["true"]
    assert hit > 0 and pool_hit > 0 and cached > 0
    assert rates["false"] == (0, 0, 0)


def test_context_length_overflow_is_rejected_and_the_replay_goes_on(cli, write, tmp_path):
    trace = FIXTURES / "azure_conv_context_overflow.csv"
    cfg = write("l2.yaml", "model: llama-2-7b\npools:\n  - {name: a, replicas: 1}\n")
    res = cli("run", trace, "--config", cfg, "--out", "ctx", "-q")
    assert res.code == 0, res.err
    assert "error" not in res.err
    run = read_run(tmp_path / "ctx")
    check_contract(run, expected_trace(cfg, str(trace)))
    req = run.requests.sort("request_id")
    assert req["status"].to_list() == ["finished", "rejected", "finished", "rejected"]
    assert req["reject_reason"].to_list() == [None, "context_length", None, "context_length"]
    rejects = run.events.filter(pl.col("kind") == "reject")
    assert rejects.height == 2 and all("context_length" in d for d in rejects["detail"])


def test_unfinished_when_the_drain_is_cut_short(cli, write, tmp_path):
    cfg = write("f.yaml", small_fleet("{path: azure-conv-2023, window: {end_s: 60}}", extra="max_drain_s: 0\n"))
    res = cli("run", "--config", cfg, "--out", "cut", "-q")
    assert res.code == 0, res.err
    run = read_run(tmp_path / "cut")
    check_contract(run, expected_trace(cfg))
    assert run.summary["unfinished"] >= 1


# --- engines and determinism ---------------------------------------------------------------------


@pytest.mark.parametrize("trace", ["mooncake-synthetic", "azure-conv-2023"])
def test_reference_engine_gives_the_same_outputs(cli, write, tmp_path, trace):
    cfg = write("f.yaml", small_fleet(f"{{path: {trace}, sample: {{n: 200, seed: 1}}}}", replicas=2))
    for engine in ("numba", "reference"):
        res = cli("run", "--config", cfg, "--out", engine, "--engine", engine, "-q", "--detailed-events")
        assert res.code == 0, res.err
    nb, ref = read_run(tmp_path / "numba"), read_run(tmp_path / "reference")
    assert nb.requests.height == 200
    assert_frame_equal(nb.requests, ref.requests)
    assert_frame_equal(nb.ticks, ref.ticks)
    assert_frame_equal(nb.events, ref.events)
    strip = ("engine",)
    assert {k: v for k, v in nb.summary.items() if k not in strip} == {
        k: v for k, v in ref.summary.items() if k not in strip}
    assert (nb.summary["engine"], ref.summary["engine"]) == ("numba", "reference")


def test_two_runs_of_the_same_command_are_identical(cli, write, tmp_path):
    cfg = write("f.yaml", small_fleet("{path: mooncake-synthetic, window: {end_s: 120}}", replicas=2))
    for out in ("a", "b"):
        res = cli("run", "--config", cfg, "--out", out, "-q", "--detailed-events")
        assert res.code == 0, res.err
    a, b = read_run(tmp_path / "a"), read_run(tmp_path / "b")
    assert a.events.height > 2  # detailed events: arrivals, admissions, first tokens, finishes
    for name in ("requests", "ticks", "events"):
        assert_frame_equal(getattr(a, name), getattr(b, name))
    assert a.summary == b.summary
    assert a.config_text == b.config_text
    # every file but timing.json is byte-identical (no wall time in summary.json or in any
    # parquet file's metadata); timing.json holds the wall seconds of each phase
    for name in RUN_FILES - {"timing.json"}:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert "wall_s" not in a.summary
    timing = json.loads((tmp_path / "a" / "timing.json").read_text())
    assert set(timing) == {"load_trace_s", "warm_up_s", "replay_s", "write_s", "wall_s"}
    assert all(v >= 0 for v in timing.values()) and timing["wall_s"] >= timing["replay_s"]


# --- multi-pool ----------------------------------------------------------------------------------

MERGED_TRACE = """\
model: llama-3.1-8b
trace:
  path: azure-conv-2023
  workload: chat
  merge:
    - {path: azure-code-2023, workload: code, offset_s: 0}
  window: {end_s: 120}
"""


def test_two_pools_each_serve_their_workload(cli, write, tmp_path):
    cfg = write("pools.yaml", MERGED_TRACE + (
        "pools:\n"
        "  - {name: chat, replicas: 1, workloads: [chat]}\n"
        "  - {name: coder, replicas: 2, workloads: [code], router: round-robin}\n"
    ))
    res = cli("run", "--config", cfg, "--out", "mp", "-q")
    assert res.code == 0, res.err
    run = read_run(tmp_path / "mp")
    check_contract(run, expected_trace(cfg))
    req = run.requests
    assert set(req["workload"].unique().to_list()) == {"chat", "code"}
    pairs = req.select("workload", "pool").unique().sort("workload").rows()
    assert pairs == [("chat", "chat"), ("code", "coder")]
    for pool, wl in (("chat", "chat"), ("coder", "code")):
        assert run.summary["pools"][pool]["requests"] == int((req["workload"] == wl).sum())
    # Replica indices are per pool: the chat pool's one replica and the coder pool's two.
    assert set(req.filter(pl.col("pool") == "chat")["replica"].drop_nulls().to_list()) <= {0}
    assert run.ticks.filter(pl.col("pool") == "coder")["gpus"].unique().to_list() == [2]


def test_a_pool_without_workloads_takes_the_rest(cli, write, tmp_path):
    cfg = write("pools.yaml", MERGED_TRACE + (
        "pools:\n"
        "  - {name: rest, replicas: 1}\n"
        "  - {name: chat, replicas: 1, workloads: [chat]}\n"
    ))
    res = cli("run", "--config", cfg, "--out", "mp", "-q")
    assert res.code == 0, res.err
    run = read_run(tmp_path / "mp")
    check_contract(run, expected_trace(cfg))
    pairs = run.requests.select("workload", "pool").unique().sort("workload").rows()
    assert pairs == [("chat", "chat"), ("code", "rest")]


# --- run options -----------------------------------------------------------------------------------


def test_default_out_dir_and_force(cli, write, tmp_path):
    cfg = write("fleet.yaml", small_fleet("{path: azure-code-2023, window: {end_s: 30}}"))
    res = cli("run", "--config", cfg, "-q")
    assert res.code == 0, res.err
    out = tmp_path / "runs" / "azure-code-2023-fleet"
    first = read_run(out)
    (out / "stale.txt").write_text("from an older run")
    again = cli("run", "--config", cfg, "-q")
    assert again.code == 2 and "already exists" in again.err
    assert (out / "stale.txt").exists()
    # --force replaces a run directory only: a file no run writes is kept, and named
    kept = cli("run", "--config", cfg, "-q", "--force")
    assert kept.code == 2 and "stale.txt" in kept.err and (out / "stale.txt").exists()
    (out / "stale.txt").unlink()
    forced = cli("run", "--config", cfg, "-q", "--force")
    assert forced.code == 0, forced.err
    assert {p.name for p in out.iterdir()} == RUN_FILES
    assert_frame_equal(read_run(out).requests, first.requests)
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["azure-code-2023-fleet"]


def test_trace_argument_overrides_the_config_trace_and_keeps_its_transforms(cli, write, tmp_path):
    cfg = write("fleet.yaml", small_fleet("{path: azure-conv-2023, window: {end_s: 60}}"))
    res = cli("run", "azure-code-2023", "--config", cfg, "--out", "o", "-q")
    assert res.code == 0, res.err
    run = read_run(tmp_path / "o")
    frame = expected_trace(cfg, "azure-code-2023")
    check_contract(run, frame)
    assert run.requests["workload"].unique().to_list() == ["code"]
    assert run.summary["trace_dropped"]["outside_window"] == BUNDLED_ROWS["azure-code-2023"] - frame.height


def test_summary_table_without_quiet(cli, write, tmp_path):
    cfg = write("fleet.yaml", small_fleet("{path: azure-code-2023, window: {end_s: 30}}"))
    res = cli("run", "--config", cfg, "--out", "o")
    assert res.code == 0, res.err
    for label in ("requests", "finished", "TTFT p99", "SLO attainment", "cost"):
        assert label in res.out
    assert "o" in res.out and "run written" in res.out


def test_run_dir_mode_follows_umask(cli, write, tmp_path):
    cfg = write("fleet.yaml", small_fleet("{path: azure-code-2023, window: {end_s: 30}}"))
    mask = os.umask(0o022)
    try:
        res = cli("run", "--config", cfg, "--out", "o", "-q")
    finally:
        os.umask(mask)
    assert res.code == 0, res.err
    assert (tmp_path / "o").stat().st_mode & 0o777 == 0o755


# --- the full default run, through the installed console script ---------------------------------


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    exe = Path(sys.executable).with_name("llm-replay")
    if not exe.exists():
        exe = shutil.which("llm-replay")
    assert exe, "the llm-replay console script is not installed"
    cwd = tmp_path_factory.mktemp("default")
    env = {**os.environ, "COLUMNS": "120"}
    proc = subprocess.run([str(exe), "run"], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    return proc, cwd / "runs" / "azure-conv-2023"


def test_console_script_default_run(default_run):
    proc, out = default_run
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    run = read_run(out)
    cfg = load_config(None)
    frame = load_from_config(cfg.trace or TraceConfig()).frame
    check_contract(run, frame)
    assert run.summary["requests"] == BUNDLED_ROWS["azure-conv-2023"]
    assert run.summary["trace"] == "azure-conv-2023"
    # config.yaml records what ran (the bundled trace included) and hashes to the summary's sha.
    assert run.summary["config_sha256"] == load_config(out / "config.yaml").sha256()
    assert load_config(out / "config.yaml").trace.path == "azure-conv-2023"
    assert "run written to" in proc.stdout and "SLO attainment" in proc.stdout


def test_summary_table_never_shows_full_attainment_when_some_missed(default_run):
    proc, out = default_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["slo_attainment"] < 1
    line = next(line for line in proc.stdout.splitlines() if "SLO attainment" in line)
    assert "100.0%" not in line


# --- capacity, trace inspect, catalog --------------------------------------------------------------


def capacity(cli, *args: str) -> dict:
    res = cli("capacity", *args, "--json")
    assert res.code == 0, res.err
    return json.loads(res.out)


@pytest.mark.parametrize(("model", "bf16"), [("llama-3.1-8b", 131_072), ("llama-3.1-70b", 327_680)])
def test_capacity_kv_bytes_per_token(cli, model, bf16):
    base = capacity(cli, "--model", model, "--gpu", "h100-sxm-80gb", "--tp", "4")
    fp8 = capacity(cli, "--model", model, "--gpu", "h100-sxm-80gb", "--tp", "4", "--kv-cache-dtype", "fp8")
    assert base["kv_bytes_per_token"] == bf16
    assert fp8["kv_bytes_per_token"] == bf16 // 2
    assert base["kv_bytes_per_token_per_gpu"] == bf16 // 4
    assert fp8["kv_tokens"] > base["kv_tokens"]


def test_capacity_llama_70b_tp4_h100(cli):
    # The reference lesson's replica: 90% of "80 GB" (80e9 bytes) gives it 399,169 KV tokens.
    lesson = ("--model", "llama-3.1-70b", "--gpu", "h100-sxm-80gb", "--tp", "4", "--gpu-memory-bytes", "80e9")
    cap = capacity(cli, *lesson)
    assert (cap["model"], cap["gpu"], cap["tp"]) == ("llama-3.1-70b", "h100-sxm-80gb", 4)
    assert (cap["gpu_memory_bytes"], cap["gpu_memory_source"]) == (80_000_000_000, "override")
    assert 34.5e9 <= cap["weights_bytes_per_gpu"] <= 35.5e9
    assert abs(cap["kv_tokens"] - 399_169) <= 0.05 * 399_169
    assert cap["kv_tokens"] == cap["kv_blocks"] * cap["block_size"]
    table = cli("capacity", *lesson)
    assert table.code == 0 and f"{cap['kv_tokens']:,}" in table.out
    assert "80.00 GB = 74.51 GiB (--gpu-memory-bytes); vLLM uses 0.9 of it" in table.out
    # Without the flag the GPU's memory is what CUDA reports: 79.22 GiB, 13% more KV than 80e9 bytes.
    real = capacity(cli, *lesson[:-2])
    assert (real["gpu_memory_bytes"], real["gpu_memory_source"]) == (round(79.22 * 2**30), "cuda")
    assert real["kv_tokens"] == pytest.approx(1.13 * cap["kv_tokens"], rel=0.01)
    shown = cli("capacity", *lesson[:-2])
    assert "85.06 GB = 79.22 GiB (as CUDA reports it); vLLM uses 0.9 of it" in shown.out


def test_trace_inspect_json_bundled_conv(cli):
    res = cli("trace", "inspect", "azure-conv-2023", "--json")
    assert res.code == 0, res.err
    info = json.loads(res.out)
    assert info["rows"] == 19_366
    assert info["peak_1min_requests"] == 522
    assert info["format"] == "azure" and info["workloads"] == {"conv": 19_366}
    table = cli("trace", "inspect", "azure-conv-2023")
    assert table.code == 0 and "522" in table.out


def test_catalog_lists_every_model_and_gpu(cli):
    res = cli("catalog")
    assert res.code == 0, res.err
    for ident in [*MODELS, *GPUS]:
        assert re.search(rf"(?<![\w.-]){re.escape(ident)}(?![\w.-])", res.out), ident
    as_json = json.loads(cli("catalog", "--json").out)
    assert [m["id"] for m in as_json["models"]] == list(MODELS)
    assert [g["id"] for g in as_json["gpus"]] == list(GPUS)


# --- summary.json agrees with the frames, under load -------------------------------------------------


def test_summary_agrees_with_requests_and_ticks(cli, write, tmp_path):
    """A small KV pool and tight SLO: preemptions, context rejections and missed SLOs all occur."""
    cfg = write("stress.yaml", small_fleet(
        "{path: mooncake-synthetic, window: {end_s: 200}}",
        engine="max_num_seqs: 16, num_gpu_blocks_override: 3000, max_model_len: 40000",
        extra="slo: {ttft_ms: 500, tpot_ms: 20}\n",
    ))
    res = cli("run", "--config", cfg, "--out", "s", "-q")
    assert res.code == 0, res.err
    run = read_run(tmp_path / "s")
    check_contract(run, expected_trace(cfg))
    req, ticks, s = run.requests, run.ticks, run.summary
    fin = req.filter(pl.col("status") == "finished")
    assert s["preemptions"] == int(req["preemptions"].sum()) > 0
    assert s["rejected"] > 0 and set(req["reject_reason"].drop_nulls().to_list()) == {"context_length"}
    served = req.filter(pl.col("first_token_us").is_not_null())
    for q, key in ((0.5, "ttft_p50_ms"), (0.9, "ttft_p90_ms"), (0.99, "ttft_p99_ms")):
        # TTFT over every request that got a first token, as the windowed tick columns.
        assert s[key] == pytest.approx(served["ttft_us"].quantile(q, "linear") / 1000, abs=1e-3)
    assert s["tpot_p50_ms"] == pytest.approx(fin["tpot_us"].drop_nulls().quantile(0.5, "linear") / 1000, abs=1e-3)
    assert s["e2e_p99_ms"] == pytest.approx(fin["e2e_us"].quantile(0.99, "linear") / 1000, abs=1e-3)
    met = fin.filter((pl.col("ttft_us") <= 500_000) & (pl.col("tpot_us").is_null() | (pl.col("tpot_us") <= 20_000)))
    assert int(req["slo_met"].sum()) == met.height
    # Over every request: a rejection or an unfinished request is a miss.
    assert s["slo_attainment"] == pytest.approx(met.height / req.height, abs=1e-4)
    assert s["goodput_rps"] == pytest.approx(met.height / s["sim_span_s"], abs=1e-4)
    assert s["output_tokens_per_s"] == pytest.approx(fin["output_tokens"].sum() / s["sim_span_s"], abs=0.01)
    gpu_hours = ticks["gpus"].sum() / 3600  # 1 s ticks
    assert s["gpu_hours"] == pytest.approx(gpu_hours, abs=1e-4)
    assert s["cost_usd"] == pytest.approx(gpu_hours * s["pool_plans"]["default"]["price_usd_per_gpu_hour"], abs=1e-4)
    assert s["cost_usd"] == pytest.approx(ticks["cost_usd"][-1], abs=1e-4)
    assert ticks["output_tokens_per_s"].sum() == fin["output_tokens"].sum()
    assert s["prefix_hit_rate"] == pytest.approx(req["cached_tokens"].sum() / served["prompt_tokens"].sum(), abs=1e-4)
    assert ((ticks["gpu_busy"] >= 0) & (ticks["gpu_busy"] <= 1)).all()
    assert ticks["running"].max() <= 16
    assert ticks["kv_total_blocks"].unique().to_list() == [2999]  # vLLM keeps one as the null block
    assert (ticks["kv_used_blocks"] <= ticks["kv_total_blocks"]).all()
    one = req.filter(pl.col("output_tokens") == 1)
    assert one["tpot_us"].null_count() == one.height


def test_unsorted_trace_is_sorted_with_a_note_or_refused_with_strict(cli, write, tmp_path):
    write("unsorted.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,1\n2.0,20,2\n1.0,30,3\n")
    cfg = write("f.yaml", "model: llama-3.1-8b\npools: [{name: a}]\n")
    res = cli("run", "unsorted.csv", "--config", cfg, "--out", "o", "-q")
    assert res.code == 0, res.err
    assert "out of order" in res.err and "--strict" in res.err
    run = read_run(tmp_path / "o")
    assert run.requests["prompt_tokens"].to_list() == [10, 30, 20]
    assert run.summary["trace_reordered"] >= 1
    strict = cli("run", "unsorted.csv", "--config", cfg, "--out", "o2", "-q", "--strict")
    assert strict.code == 2 and strict.err.startswith("llm-replay: error: unsorted.csv line 4")
    assert not (tmp_path / "o2").exists()


def test_prefill_decode_fleet_moves_every_prompt_once(cli, write, tmp_path):
    """A P/D fleet on the bundled trace: every request prefilled on the prefill pool, its KV moved
    once in the link formula's time (serial: nothing overlaps), decoded on the decode pool."""
    config = write("pd.yaml", """
        model: llama-3.1-8b
        trace: {window: {end_s: 120}}
        split: {policy: prefill-decode, link: pcie5x16, transfer: serial, base_latency_ms: 2}
        pools:
          - {name: prefill, replicas: 1}
          - {name: decode, replicas: 2}
    """)
    res = cli("run", "--config", str(config), "--out", str(tmp_path / "pd"), "--quiet")
    assert res.code == 0, res.err
    run = read_run(tmp_path / "pd")
    reqs = run.requests.filter(pl.col("status") == "finished")
    assert reqs.height > 0 and (reqs["pool"] == "decode").all() and (reqs["prefill_pool"] == "prefill").all()
    kv_bytes = 131_072  # llama-3.1-8b, BF16 KV
    expected = reqs["prompt_tokens"].cast(pl.Float64) * kv_bytes / 64e9 * 1e6 + 2000
    took = reqs["kv_transfer_end_us"] - reqs["kv_transfer_start_us"]
    assert ((took.cast(pl.Float64) - expected).abs() <= 1).all(), "whole microseconds, rounded up"
    assert (reqs["kv_transfer_end_us"] < reqs["first_token_us"]).all()
    check_contract(run, expected_trace(config))
    pd = run.summary["prefill_decode"]
    assert pd["remote_prefills"] == run.requests.height and pd["local_prefills"] == 0
    prefill = run.ticks.filter(pl.col("pool") == "prefill")
    assert prefill["prompt_tokens_per_s"].sum() > 0 and prefill["output_tokens_per_s"].sum() == 0
    assert prefill["ttft_p99_ms"].drop_nulls().len() > 0, "windowed TTFT of the requests it prefilled"


USER_SPLIT_FLEET = """
    model: llama-3.1-8b
    trace: {{window: {{end_s: 60}}}}
    split: {{policy: "my_split:{fn}"}}
    pools: [{{name: short, replicas: 1}}, {{name: long, replicas: 1}}]
"""


@pytest.fixture
def plugins(monkeypatch):
    """my_split importable by name; each run still has to allow it with --plugin my_split."""
    import sys

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "fixtures" / "plugins"))
    yield
    sys.modules.pop("my_split", None)


def test_a_users_pool_split_sends_requests_by_name(cli, write, tmp_path, plugins):
    write("f.yaml", USER_SPLIT_FLEET.format(fn="long_prompts_to_last"))
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q", "--plugin", "my_split")
    assert res.code == 0, res.err
    req = read_run(tmp_path / "o").requests
    assert (req.filter(pl.col("prompt_tokens") >= 1000)["pool"] == "long").all()
    assert (req.filter(pl.col("prompt_tokens") < 1000)["pool"] == "short").all()
    assert set(req["pool"].unique().to_list()) == {"short", "long"}


@pytest.mark.parametrize(("fn", "fragments"), [
    ("to_nowhere", ["split.policy", "my_split:to_nowhere", "request 2 to 7, which is no pool", "0..1", "short, long"]),
    ("too_few", ["split.policy", "returned 1 values", "expected one pool per request"]),
    ("forgets_to_return", ["split.policy", "my_split:forgets_to_return returned None; expected one pool"]),
    ("not_there", ["f.yaml: split.policy", "cannot load pool split", "my_split:not_there", "has no 'not_there'"]),
    ("wrong_arguments", ["f.yaml: split.policy", "pool split 'my_split:wrong_arguments' takes (trace)",
                         "expected a function of (trace, pools)"]),
    ("NOT_A_FUNCTION", ["f.yaml: split.policy", "is not callable (a value of type int)"]),
])
def test_a_users_split_that_sends_a_request_to_no_pool_is_a_config_error(cli, write, tmp_path, plugins, fn,
                                                                        fragments):
    write("f.yaml", USER_SPLIT_FLEET.format(fn=fn))
    res = cli("run", "--config", "f.yaml", "--out", "o", "-q", "--plugin", "my_split")
    assert res.code == 2, res.err
    assert all(f in res.err for f in fragments), res.err
    assert "Traceback" not in res.err and not (tmp_path / "o").exists()


def test_the_summary_records_the_step_model_each_pool_ran_with(cli, write, tmp_path):
    """Post-mortems need the coefficients a run used, not the config's nulls: a default pool shows
    its GPU's shipped defaults, a pool with keys shows them and says it set them."""
    from replay.calibration.profiles import default_coefficients, request_fit

    write("fleet.yaml", "model: llama-3.1-8b\ngpu: h100-sxm-80gb\npools:\n"
                        "  - {name: a, replicas: 1}\n"
                        "  - {name: b, replicas: 1, workloads: [none], step_model: {mfu: 0.4, per_step_overhead_us: 500,"
                        " knee_tokens: 2048, past_knee_mfu: 0.3}}\n"
                        "split: {policy: by-workload}\n")
    assert cli("run", "azure-conv-2023", "-c", "fleet.yaml", "--window", "0:30", "--out", "r", "--quiet").code == 0
    plans = read_run(tmp_path / "r").summary["pool_plans"]
    a, b = plans["a"]["step_model"], plans["b"]["step_model"]
    # the GPU's Vidur-fitted efficiencies, with the request-level fit's keys over them
    shipped = {**default_coefficients("h100-sxm-80gb"), **request_fit("h100-sxm-80gb")["step_model"]}
    assert a["source"].startswith("h100-sxm-80gb defaults (request-level fit") and a["set_in_config"] == []
    assert (a["mfu"], a["mbu"], a["link_efficiency"]) == (shipped["mfu"], shipped["mbu"], shipped["link_efficiency"])
    assert (a["attention_mbu"], a["per_seq_overhead_us"]) == (shipped["attention_mbu"], shipped["per_seq_overhead_us"])
    assert (b["mfu"], b["mbu"], b["per_step_overhead_us"]) == (0.4, shipped["mbu"], 500.0)
    assert b["set_in_config"] == ["mfu", "per_step_overhead_us", "knee_tokens", "past_knee_mfu"]
    assert (b["knee_tokens"], b["past_knee_mfu"], a["knee_tokens"]) == (2048, 0.3, 0)
