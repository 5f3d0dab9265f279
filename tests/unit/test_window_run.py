"""A whole replay (`replay_trace`: the tick loop, the control plane, the output frames) with a
request window of a few slots (engine/window.py) against one slot per request: identical
request, tick and event frames and summary, on an autoscaled pool that scales from zero (requests
held at the pool until the autoscaler starts replicas) and on a fixed fleet short of KV."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from polars.testing import assert_frame_equal

import replay.fleet.cluster as cluster
from replay.config import build_config
from replay.engine.numba_engine import NumbaEngine
from replay.run import replay_trace
from traces import load_trace

SCALED = """
model: llama-3.1-8b
pools:
  - name: chat
    replicas: 0
    autoscaler: {policy: kpa, min_replicas: 0, max_replicas: 3, params: {container_concurrency: 4}}
    lifecycle: {pod_start_s: 5}
"""
FIXED = """
model: llama-3.1-8b
pools:
  - {name: chat, replicas: 2, engine: {num_gpu_blocks_override: 600, max_model_len: 8192}}
"""


def _replay(monkeypatch, cfg, trace, window):
    engines = []

    def make(name, inputs):
        engines.append(NumbaEngine(inputs, window=window))
        return engines[-1]

    monkeypatch.setattr(cluster, "make_engine", make)
    return replay_trace(trace, cfg), engines[0]


@pytest.mark.parametrize("text", [SCALED, FIXED], ids=["kpa-from-zero", "fixed"])
def test_a_replay_with_a_small_window_matches_one_slot_per_request(monkeypatch, text):
    cfg = build_config(yaml.safe_load(text), "test", Path("."))
    trace = load_trace("azure-conv-2023")
    trace = dataclasses.replace(trace, frame=trace.frame.head(1500))
    small, engine = _replay(monkeypatch, cfg, trace, 16)
    whole, _ = _replay(monkeypatch, cfg, trace, None)
    assert engine.window.base > 0 and engine.window.capacity < trace.frame.height, "the window must slide"
    for name in ("requests", "ticks", "events"):
        assert_frame_equal(getattr(small, name), getattr(whole, name))
    assert small.summary == whole.summary
    if text is SCALED:  # from zero: the first requests were held at the pool until a replica started
        assert "scale_up" in whole.events["kind"].to_list() and whole.ticks["held"].max() > 0
    else:
        assert whole.summary["preemptions"] > 0, "the fixed fleet's KV must be tight enough to preempt"


class KeptColumns(NumbaEngine):
    """The engine keeping every request's columns to the end (as the reference engine does)."""

    stream_rows = None


@pytest.mark.parametrize("engine", [NumbaEngine, KeptColumns], ids=["streamed", "kept"])
def test_rows_made_and_spilled_in_tiny_chunks_match_one_frame(monkeypatch, tmp_path, engine):
    """Request rows made 100 at a time (as the window hands them over, or from the whole
    columns at the end) and, past 250 rows, written to requests.parquet as they come
    (replay/outputs/rows.py): the same frames, summary and run files as one frame in memory, and
    the file beside the run to be, removed with the rows."""
    import gc

    import replay.fleet.request_rows as request_rows
    import replay.fleet.selection as selection
    import replay.outputs.rows as rows
    from replay.outputs.write import write_run
    from tests.golden import run_digests

    cfg = build_config(yaml.safe_load(FIXED), "test", Path("."))
    trace = load_trace("azure-conv-2023")
    trace = dataclasses.replace(trace, frame=trace.frame.head(1500))
    whole, _ = _replay(monkeypatch, cfg, trace, None)
    assert not whole.request_rows.spilled
    monkeypatch.setattr(request_rows, "CHUNK_ROWS", 100)
    monkeypatch.setattr(rows, "MEMORY_ROWS", 250)
    # the summary's percentiles from batches of 64 rows, each search narrowed until it holds 7 values at most
    monkeypatch.setattr(selection, "HELD", 7)
    monkeypatch.setattr(selection, "BATCH_ROWS", 64)
    monkeypatch.setattr(cluster, "make_engine", lambda name, inputs: engine(inputs, window=16))
    chunked = replay_trace(trace, cfg, spill_dir=tmp_path / "run")
    parts = [p for p in tmp_path.iterdir() if p.name.startswith(".run.tmp-")]
    assert len(parts) == 1 and [p.name for p in parts[0].iterdir()] == ["requests.parquet"]
    for name in ("requests", "ticks", "events"):
        assert_frame_equal(getattr(chunked, name), getattr(whole, name))
    assert chunked.summary == whole.summary
    write_run(tmp_path / "run", chunked)
    write_run(tmp_path / "one", whole)
    assert run_digests(tmp_path / "run") == run_digests(tmp_path / "one")
    del chunked
    gc.collect()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "run"]


def test_decode_windows_hold_by_the_whole_runs_median_step_however_rows_are_chunked(monkeypatch):
    """A pool with vLLM V0's decode windows (replay/model/serving.py) holds each request's last
    token by its replica's median step over the whole run: rows made 100 at a time are the rows
    of one chunk, and the windows do hold tokens (later finishes than the same run without them)."""
    import replay.fleet.request_rows as request_rows

    windowed = FIXED.replace("max_model_len: 8192}", "max_model_len: 8192}, serving: {decode_window_steps: 4}")
    cfg = build_config(yaml.safe_load(windowed), "test", Path("."))
    trace = load_trace("azure-conv-2023")
    trace = dataclasses.replace(trace, frame=trace.frame.head(1500))
    one, _ = _replay(monkeypatch, cfg, trace, 16)
    monkeypatch.setattr(request_rows, "CHUNK_ROWS", 100)
    chunked, _ = _replay(monkeypatch, cfg, trace, 16)
    assert_frame_equal(chunked.requests, one.requests)
    assert chunked.summary == one.summary
    plain, _ = _replay(monkeypatch, build_config(yaml.safe_load(FIXED), "test", Path(".")), trace, 16)
    later = (one.requests["finished_us"] - plain.requests["finished_us"]).drop_nulls()
    assert later.min() >= 0 and later.max() > 0
