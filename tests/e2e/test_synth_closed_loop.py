"""A synthesized chat of sessions, replayed closed-loop: each turn is sent when the replay ended
the turn before it plus its think time, and its prefix hit covers the earlier answer (issue 14
items 1 and 4: synth's session hashes and the engine's closed loop, together)."""

from __future__ import annotations

import polars as pl

SPEC = """
seed: 11
duration_s: 120
prefix_block_tokens: 16
workloads:
  - name: chat
    arrival: {process: poisson, rate: 0.1}
    prompt: {dist: uniform, low: 100, high: 800}
    output: {dist: uniform, low: 20, high: 200}
    sessions: {turns: {dist: constant, value: 4}, think_s: {dist: constant, value: 2}}
"""
FLEET = """
model: llama-3.1-8b
gpu: h100-sxm-80gb
pools: [{replicas: 1}]
trace: {path: chat.parquet, closed_loop: true}
"""


def test_closed_loop_turns_follow_the_replay_and_hit_the_answer(cli, write, tmp_path):
    assert cli("synth", write("spec.yaml", SPEC), "--out", tmp_path / "chat.parquet").code == 0
    write("fleet.yaml", FLEET)
    got = cli("run", "--config", "fleet.yaml", "--out", "r", "--quiet")
    assert got.code == 0, got.err
    trace = pl.read_parquet(tmp_path / "chat.parquet").select("request_id", "session_id", "think_time_us")
    requests = (pl.read_parquet(tmp_path / "r" / "requests.parquet").join(trace, on="request_id")
                .sort("session_id", "arrival_us"))
    assert requests["status"].unique().to_list() == ["finished"]
    later = requests.with_columns(
        prev_finished=pl.col("finished_us").shift(1).over("session_id"),
        prev_context=(pl.col("prompt_tokens") + pl.col("output_tokens")).shift(1).over("session_id"),
    ).filter(pl.col("prev_finished").is_not_null())
    assert later.height > 0
    # released when the replay ended the turn before, plus the think time: never before
    assert (later["arrival_us"] == later["prev_finished"] + later["think_time_us"]).all()
    # one replica, a light load: the earlier prompt and answer are still cached, all but the
    # answer's last token (its KV is never computed), in whole 16-token blocks
    covered = ((later["prev_context"] - 1) // 16) * 16
    assert (later["cached_tokens"] >= covered).all()


def test_open_loop_the_same_trace_hits_only_earlier_prompts(cli, write, tmp_path):
    """Open loop, an answer's blocks are the request's own: a later turn hits at most the earlier
    turn's prompt, and the run keeps an open-loop run's columns."""
    assert cli("synth", write("spec.yaml", SPEC), "--out", tmp_path / "chat.parquet").code == 0
    write("fleet.yaml", FLEET.replace("closed_loop: true", "closed_loop: false"))
    assert cli("run", "--config", "fleet.yaml", "--out", "r", "--quiet").code == 0
    trace = pl.read_parquet(tmp_path / "chat.parquet").select("request_id", "session_id")
    requests = pl.read_parquet(tmp_path / "r" / "requests.parquet")
    assert "recorded_arrival_us" not in requests.columns
    later = (requests.join(trace, on="request_id").sort("session_id", "arrival_us")
             .with_columns(prev_prompt=pl.col("prompt_tokens").shift(1).over("session_id"))
             .filter(pl.col("prev_prompt").is_not_null()))
    assert later.height > 0 and (later["cached_tokens"] <= later["prev_prompt"]).all()
