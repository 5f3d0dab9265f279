"""`llm-replay synth` and `trace: {synthetic: ...}` end to end (issue 14 item 1)."""

from __future__ import annotations

import json

import polars as pl

SPEC = """
seed: 4
duration_s: 60
workloads:
  - name: chat
    tenant: acme
    arrival: {process: gamma, rate: 1.5, cv: 2}
    prompt: {dist: lognormal, median: 400, sigma: 0.5}
    output: {dist: lognormal, median: 60, sigma: 0.5}
    system_prompt: {tokens: 256, groups: 2}
    sessions: {turns: {dist: uniform, low: 1, high: 4}, think_s: {dist: constant, value: 3}}
"""


def test_synth_writes_a_trace_that_runs(cli, write, tmp_path):
    spec = write("spec.yaml", SPEC)
    out = tmp_path / "trace.parquet"
    result = cli("synth", spec, "--out", out)
    assert result.code == 0, result.err
    assert "requests over" in result.out and "sessions" in result.out
    frame = pl.read_parquet(out)
    assert frame["session_id"].null_count() == 0 and "think_time_us" in frame.columns
    again = tmp_path / "again.parquet"
    assert cli("synth", spec, "--out", again).code == 0
    assert again.read_bytes() == out.read_bytes()
    assert cli("synth", spec, "--out", out).code == 2  # exists, no --force
    run = cli("run", out, "--out", tmp_path / "run", "--quiet")
    assert run.code == 0, run.err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["requests"] == frame.height and summary["finished"] == frame.height
    assert summary["prefix_hit_rate"] > 0  # later turns hit the earlier turns' blocks


def test_a_fleet_config_can_name_a_synthetic_trace(cli, write, tmp_path):
    write("spec.yaml", SPEC)
    config = write("fleet.yaml", "trace: {synthetic: spec.yaml}\n")
    inline = write("inline.yaml", "trace:\n  synthetic:\n" + "".join(f"    {line}\n" for line in SPEC.strip().splitlines()))
    by_file = cli("trace", "inspect", "--config", config, "--json")
    by_mapping = cli("trace", "inspect", "--config", inline, "--json")
    assert by_file.code == 0 and by_mapping.code == 0, by_file.err + by_mapping.err
    rows = lambda text: json.loads(text)["rows"]  # noqa: E731
    assert rows(by_file.out) == rows(by_mapping.out) > 0
    run = cli("run", "--config", config, "--out", tmp_path / "run", "--quiet")
    assert run.code == 0, run.err
    recorded = (tmp_path / "run" / "config.yaml").read_text()
    assert "synthetic:" in recorded and str(tmp_path / "spec.yaml") in recorded


def test_bad_input_is_one_line_and_exit_2(cli, write, tmp_path):
    cases = {
        "dist": SPEC.replace("dist: lognormal, median: 400", "dist: lognorm, median: 400"),
        "cv": SPEC.replace("cv: 2", "cv: -2"),
        "rate": SPEC.replace("rate: 1.5", "rate: 0"),
    }
    for key, text in cases.items():
        spec = write(f"{key}.yaml", text)
        result = cli("synth", spec, "--out", tmp_path / f"{key}.parquet")
        assert result.code == 2, (key, result.err)
        assert result.err.count("\n") == 1 and result.err.startswith("llm-replay: error: ") and f"{key}.yaml" in result.err
        assert not (tmp_path / f"{key}.parquet").exists()
    write("sg/chunk-1-trace.csv", "0,1,1,Gamma\n")
    bad = write("sg.yaml", """
        duration_s: 600
        workloads: [{name: x, servegen: {path: sg}, prompt: {dist: constant, value: 5}, output: {dist: constant, value: 5}}]
    """)
    result = cli("synth", bad, "--out", tmp_path / "sg.parquet")
    assert result.code == 2 and "chunk-1-trace.csv line 1: 4 fields, expected 6" in result.err
    both = write("both.yaml", "trace: {path: azure-conv-2023, synthetic: spec.yaml}\n")
    result = cli("run", "--config", both, "--out", tmp_path / "r")
    assert result.code == 2 and "give path or synthetic, not both" in result.err


def test_a_runs_config_of_an_inline_spec_replays_from_anywhere(cli, write, tmp_path, monkeypatch):
    # Lengths drawn from a trace file next to the config, named relative to it inside an inline spec:
    # the run's config.yaml names it absolutely, so a replay of that file from elsewhere is the same run.
    write("cfg/lengths.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(  # Azure's format
        f"2023-11-16 18:{i:02d}:00.0000000,{300 + 37 * i},{20 + 3 * i}\n" for i in range(40)))
    spec = SPEC.replace("prompt: {dist: lognormal, median: 400, sigma: 0.5}",
                        "prompt: {dist: empirical, trace: lengths.csv, column: prompt_tokens}")
    write("cfg/fleet.yaml", "trace:\n  synthetic:\n" + "".join(f"    {line}\n" for line in spec.strip().splitlines()))
    first = cli("run", "--config", "cfg/fleet.yaml", "--out", "first", "--quiet")
    assert first.code == 0, first.err
    recorded = (tmp_path / "first" / "config.yaml").read_text()
    assert str(tmp_path / "cfg" / "lengths.csv") in recorded
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    again = cli("run", "--config", tmp_path / "first" / "config.yaml", "--out", "again", "--quiet")
    assert again.code == 0, again.err
    a = pl.read_parquet(tmp_path / "first" / "requests.parquet")
    b = pl.read_parquet(tmp_path / "elsewhere" / "again" / "requests.parquet")
    assert a.height > 0 and a.equals(b)
