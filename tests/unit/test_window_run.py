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
