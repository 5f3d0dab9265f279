"""`llm-replay run` on a canonical Parquet trace (what `llm-replay synth` writes) reads it in batches
as the replay goes (traces/stream.py, replay/fleet/streamed.py): the run directory is the one the
whole frame's path writes, and a bad row is refused before anything is replayed, naming the row."""

from __future__ import annotations

import polars as pl

import replay.fleet.streamed as streamed
import replay.run
from tests.e2e.conftest import small_fleet
from tests.golden import file_digest
from traces import load_trace
from traces.canonical import write_canonical


def _digests(folder) -> dict[str, str]:
    return {p.name: file_digest(p) for p in sorted(folder.iterdir()) if p.name != "timing.json"}


def test_run_reads_a_canonical_trace_in_batches_and_writes_what_the_whole_frame_writes(cli, write, tmp_path,
                                                                                         monkeypatch):
    write_canonical(load_trace("azure-conv-2023").frame.head(600), tmp_path / "day.parquet", None)
    write("fleet.yaml", small_fleet("{path: day.parquet}", replicas=2))
    calls = []
    real = replay.run.simulate_streamed
    monkeypatch.setattr(replay.run, "simulate_streamed", lambda *a, **k: calls.append(1) or real(*a, **k))
    res = cli("run", "--config", tmp_path / "fleet.yaml", "--out", tmp_path / "streamed", "-q")
    assert res.code == 0 and calls == [1], res.err
    monkeypatch.setattr(streamed, "replays_in_batches", lambda *a, **k: False)
    res = cli("run", "--config", tmp_path / "fleet.yaml", "--out", tmp_path / "whole", "-q")
    assert res.code == 0 and calls == [1], res.err
    assert _digests(tmp_path / "streamed") == _digests(tmp_path / "whole")


def test_a_bad_row_of_a_trace_read_in_batches_is_refused_before_the_replay(cli, write, tmp_path):
    frame = load_trace("azure-conv-2023").frame.head(50)
    bad = frame.with_columns(output_tokens=pl.when(pl.col("request_id") == 42).then(0).otherwise("output_tokens"))
    write_canonical(bad, tmp_path / "bad.parquet", None)
    write("fleet.yaml", small_fleet("{path: bad.parquet}"))
    res = cli("run", "--config", tmp_path / "fleet.yaml", "--out", tmp_path / "out")
    assert res.code == 2 and res.out == "" and len(res.err.splitlines()) == 1, res.err
    assert "bad.parquet: row 42 (request_id 42): output_tokens < 1" in res.err
    assert not (tmp_path / "out").exists()
