"""A canonical Parquet trace replayed as it is read in batches (traces/stream.py,
replay/fleet/streamed.py) against the same trace read whole: every file of the run directory has
the same content digest (tests/golden.py's), with batches of a few rows and a window of a few
slots, on fleets that exercise what crosses batches: tenant ranks, a workload split over two
autoscaled pools, a prompt-length split, the engine arrivals' running maximum and the autoscaler's
arrival counts. And the checks the loader makes of each batch name the rows the whole frame's
checks name."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

import replay.fleet.cluster as cluster
import traces.stream
from common.errors import TraceError
from replay.config import build_config
from replay.engine.numba_engine import NumbaEngine
from replay.fleet.streamed import StreamedRequests
from replay.fleet.split import split_requests
from replay.model.serving import engine_arrivals
from replay.outputs.write import write_run
from replay.run import replay_trace
from tests.golden import file_digest
from traces import load_trace
from traces.canonical import write_canonical

TWO_POOLS = """
model: llama-3.1-8b
split: {policy: by-workload}
pools:
  - name: chat
    workloads: [conv]
    replicas: 0
    autoscaler: {policy: kpa, min_replicas: 0, max_replicas: 3, params: {container_concurrency: 4}}
    lifecycle: {pod_start_s: 5}
    serving: {api_server_us: 900, tokenize_us_per_token: 0.7}
  - name: code
    replicas: 1
    autoscaler: {policy: kpa, min_replicas: 1, max_replicas: 2, params: {container_concurrency: 8}}
    lifecycle: {pod_start_s: 3}
"""
BY_LENGTH = """
model: llama-3.1-8b
split: {policy: by-prompt-length, prompt_thresholds: [800]}
pools:
  - name: short
    replicas: 2
    engine: {num_gpu_blocks_override: 600, max_model_len: 8192}
    admission: {policy: token-bucket, params: {capacity_tokens: 4000, refill_tokens_per_s: 200}}
  - {name: long, replicas: 1, engine: {scheduling_policy: priority}}
"""


def _canonical(tmp_path: Path, rows: int = 1200) -> Path:
    frame = load_trace("azure-conv-2023").frame.head(rows)
    i = np.arange(frame.height)
    frame = frame.with_columns(
        workload=pl.Series(np.where(i % 3 == 0, "code", "conv")),
        # a tenant that most batches lack: its rank must be the whole trace's, not a batch's
        tenant=pl.Series(np.where(i % 97 == 5, "a-rare", np.where(i % 2 == 0, "t-b", "t-c"))),
        priority=pl.Series((i % 5).astype(np.int32)),
    )
    path = tmp_path / "trace.parquet"
    write_canonical(frame, path, None)
    return path


def _run_files(monkeypatch, tmp_path: Path, name: str, trace, cfg, window) -> tuple[dict[str, str], NumbaEngine]:
    engines = []

    def make(engine, inputs):
        engines.append(NumbaEngine(inputs, window=window))
        return engines[-1]

    monkeypatch.setattr(cluster, "make_engine", make)
    out = tmp_path / name
    write_run(out, replay_trace(trace, cfg))
    return {p.name: file_digest(p) for p in sorted(out.iterdir()) if p.name != "timing.json"}, engines[0]


@pytest.mark.parametrize("text", [TWO_POOLS, BY_LENGTH], ids=["by-workload-kpa", "by-prompt-length"])
def test_a_trace_read_in_tiny_batches_replays_as_the_whole_frame(monkeypatch, tmp_path, text):
    cfg = build_config(yaml.safe_load(text), "test", Path("."))
    streamed = load_trace(_canonical(tmp_path), stream=True)
    assert streamed.stream is not None and streamed.frame.height == 0
    tiny = dataclasses.replace(streamed, stream=dataclasses.replace(streamed.stream, batch_rows=7))
    whole = streamed.whole()
    assert whole.frame.equals(load_trace(_canonical(tmp_path)).frame)
    a, engine = _run_files(monkeypatch, tmp_path, "streamed", tiny, cfg, 16)
    b, _ = _run_files(monkeypatch, tmp_path, "whole", whole, cfg, None)
    requests = engine.inputs.requests
    assert requests is not None and engine.window.base > 0, "read in batches, through a window that slides"
    assert not requests._fields and len(requests._frames) <= 1, "no batch held once every row has left"
    assert a == b and "requests.parquet" in a
    if text is BY_LENGTH:  # the token buckets (per tenant) turned requests away
        assert pl.read_parquet(tmp_path / "whole" / "requests.parquet")["reject_reason"].drop_nulls().len() > 0


def _set(frame: pl.DataFrame, row: int, **values) -> pl.DataFrame:
    return frame.with_columns(**{name: pl.when(pl.col("request_id") == row).then(value).otherwise(name)
                                 for name, value in values.items()})


def test_the_batches_checks_name_the_rows_the_whole_frames_checks_name(tmp_path):
    frame = load_trace("azure-conv-2023").frame.head(40)
    for bad, expected in (
        (_set(frame, 21, arrival_us=0), "row 21 (request_id 21): arrival_us is earlier than the previous row's"),
        (_set(frame, 33, prompt_tokens=0), "row 33 (request_id 33): prompt_tokens < 1"),
        (_set(frame, 10, arrival_us=pl.col("arrival_us").shift(-1) + 1),  # inside a batch: row 11 is earlier
         "row 11 (request_id 11): arrival_us is earlier than the previous row's"),
        (_set(frame, 30, output_tokens=-2), "row 30 (request_id 30): output_tokens < 1"),
        (_set(frame, 0, arrival_us=-5), "row 0 (request_id 0): arrival_us is negative"),
        (_set(frame, 17, output_tokens=None), "row 17 (request_id 17): output_tokens is null"),
    ):
        path = tmp_path / "bad.parquet"
        write_canonical(bad, path, None)
        for stream in (False, True):
            with pytest.raises(TraceError, match=expected.replace("(", r"\(").replace(")", r"\)")):
                # batches of 7 rows: row 21 is the first of its batch, compared with the last of the one before
                from traces.source import open_source
                from traces.stream import open_batches

                if stream:
                    open_batches(open_source(path), None, batch_rows=7)
                else:
                    load_trace(path)


HASHED = """
model: llama-3.1-8b
split: {policy: by-prompt-length, prompt_thresholds: [6000]}
pools:
  - {name: short, replicas: 1, engine: {num_gpu_blocks_override: 3000, max_model_len: 16384}}
  - {name: long, replicas: 4, router: {policy: prefix-aware}}
"""


def _hashed(tmp_path: Path, rows: int = 500) -> Path:
    """The Mooncake sample's first rows, a quarter of them without hashes (offsets that do not
    move)."""
    trace = load_trace("mooncake-synthetic")
    frame = trace.frame.head(rows)
    i = np.arange(frame.height)
    frame = frame.with_columns(
        prefix_hashes=pl.when(pl.Series(i % 4 == 1)).then(None).otherwise(pl.col("prefix_hashes")),
    )
    path = tmp_path / "hashed.parquet"
    write_canonical(frame, path, trace.prefix_block_tokens)
    return path


@pytest.mark.parametrize("batch_rows", [7, 64])
def test_a_trace_with_prefix_hashes_replays_in_batches_as_the_whole_frame(monkeypatch, tmp_path, batch_rows):
    cfg = build_config(yaml.safe_load(HASHED), "test", Path("."))
    streamed = load_trace(_hashed(tmp_path), stream=True)
    assert streamed.stream is not None and streamed.stream.hashed and streamed.prefix_block_tokens == 512
    tiny = dataclasses.replace(streamed, stream=dataclasses.replace(streamed.stream, batch_rows=batch_rows))
    whole = streamed.whole()
    assert whole.frame.equals(load_trace(_hashed(tmp_path)).frame)
    a, engine = _run_files(monkeypatch, tmp_path, "streamed", tiny, cfg, 16)
    b, _ = _run_files(monkeypatch, tmp_path, "whole", whole, cfg, None)
    assert engine.window.base > 0 and engine.window.capacity < whole.rows, "a window that slides"
    assert len(engine.th) < int(whole.frame["prefix_hashes"].list.len().sum()), "the window's hashes, not all"
    assert a == b and "requests.parquet" in a
    cached = [pl.read_parquet(tmp_path / run / "requests.parquet")["cached_tokens"] for run in ("streamed", "whole")]
    assert cached[0].sum() > 0 and cached[0].equals(cached[1]), "the same prefix-cache hits"


def test_a_hashed_trace_without_a_block_size_is_refused_read_in_batches_as_whole(tmp_path):
    frame = load_trace("mooncake-synthetic").frame.head(20)
    path = tmp_path / "hashed.parquet"
    write_canonical(frame, path, None)
    for stream in (False, True):
        with pytest.raises(TraceError, match=r"prefix_hashes without a block size .*; set prefix_block_tokens"):
            load_trace(path, stream=stream)
    assert load_trace(path, stream=True, prefix_block_tokens=256).stream is not None


SLOW_TOKENIZER = """
model: llama-3.1-8b
split: {policy: by-prompt-length, prompt_thresholds: [800]}
pools:
  - {name: short, replicas: 1, serving: {api_server_us: 900, tokenize_us_per_token: 0.7}}
  - {name: long, replicas: 1, serving: {api_server_us: 200, tokenize_us_per_token: 40}}
"""


@pytest.mark.parametrize("late", [0, 1, 5, 250])
def test_the_last_engine_arrival_read_from_the_trace_tail_is_the_whole_traces(monkeypatch, tmp_path, late):
    """The last request to reach its engine is found in the rows read from the tail of the trace
    (TraceBatches.marks every 4 rows here), also when it is not the last to arrive: a long prompt
    `late` rows before the end, tokenised slowly, reaches its engine after every later request."""
    monkeypatch.setattr(traces.stream, "MARK_ROWS", 4)
    cfg = build_config(yaml.safe_load(SLOW_TOKENIZER), "test", Path("."))
    frame = load_trace("azure-conv-2023").frame.head(300)
    frame = frame.with_columns(prompt_tokens=pl.when(pl.col("request_id") == 299 - late).then(60_000)
                               .otherwise(pl.min_horizontal("prompt_tokens", 4000)))
    path = tmp_path / "trace.parquet"
    write_canonical(frame, path, None)
    trace = load_trace(path, stream=True)
    assert len(trace.stream.marks) == 75 and trace.stream.max_prompt_tokens == 60_000
    plans = cluster.plan_pools(cfg)
    terms = [p.serving for p in plans]
    pools = split_requests(frame, cfg, plans)
    expected = engine_arrivals(frame["arrival_us"].to_numpy(), frame["prompt_tokens"].to_numpy(), pools, terms)
    starts = []
    scan = traces.stream._scan_batches
    monkeypatch.setattr(traces.stream, "_scan_batches", lambda src, columns, rows, start=0: (
        starts.append(start), scan(src, columns, rows, start))[1])
    requests = StreamedRequests(trace.stream, cfg, plans)
    assert requests.last_arrival_us == int(expected[-1])
    latest = int(np.searchsorted(expected, expected[-1]))  # the request that reaches its engine last
    assert 0 < starts[0] <= latest, "read from the tail, from a row no later than the one that reaches it last"
    # the scenario: a long prompt a few rows before the end reaches its engine last (a long one
    # long before the end does not), the last arrival's own earlier where it is not the latest
    assert (latest == 299 - late) == (late < 250)
    own = engine_arrivals(frame["arrival_us"].to_numpy()[-1:], frame["prompt_tokens"].to_numpy()[-1:],
                          pools[-1:], terms)
    assert (int(own[-1]) < requests.last_arrival_us) == (0 < late < 250)
