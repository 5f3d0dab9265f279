"""Properties of synthesized traces (issue 14 item 1): the same spec and seed give the same
bytes; every trace is in the schema; session turns extend each other's context and hashes in
the contract the closed-loop engine relies on."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from traces.canonical import write_canonical
from traces.schema import TRACE_SCHEMA, cast_to_schema
from traces.synth import parse_spec, synthesize

specs = st.fixed_dictionaries({
    "seed": st.integers(0, 2**32),
    "rate": st.floats(0.05, 5),
    "process": st.sampled_from(["poisson", "gamma", "weibull", "constant"]),
    "turns": st.integers(1, 6),
    "block": st.sampled_from([1, 16, 64]),
    "system": st.one_of(st.none(), st.integers(1, 300)),
    "think": st.floats(0, 30),
})


def _spec(p: dict) -> dict:
    arrival = {"process": p["process"], "rate": p["rate"]}
    if p["process"] in ("gamma", "weibull"):
        arrival["cv"] = 1.5
    workload = {"name": "chat", "arrival": arrival, "prompt": {"dist": "lognormal", "median": 80, "sigma": 1},
                "output": {"dist": "uniform", "low": 1, "high": 200},
                "sessions": {"turns": {"dist": "uniform", "low": 1, "high": p["turns"]},
                             "think_s": {"dist": "constant", "value": p["think"]}}}
    if p["system"]:
        workload["system_prompt"] = {"tokens": p["system"], "groups": 2}
    return {"seed": p["seed"], "duration_s": 300, "prefix_block_tokens": p["block"],
            "workloads": [workload, {"name": "batch", "arrival": {"process": "poisson", "rate": 1},
                                     "prompt": {"dist": "constant", "value": 10},
                                     "output": {"dist": "constant", "value": 5}}]}


@settings(max_examples=25, deadline=None)
@given(specs)
def test_same_spec_and_seed_give_the_same_bytes(tmp_path_factory, p):
    folder = tmp_path_factory.mktemp("det")
    for name in ("a.parquet", "b.parquet"):
        trace = synthesize(parse_spec(_spec(p), "s"))
        write_canonical(trace.frame, folder / name, trace.prefix_block_tokens)
    assert (folder / "a.parquet").read_bytes() == (folder / "b.parquet").read_bytes()
    other = synthesize(parse_spec({**_spec(p), "seed": p["seed"] + 1}, "s")).frame
    assert not other.equals(trace.frame)


@settings(max_examples=40, deadline=None)
@given(specs)
def test_sessions_grow_their_context_and_hashes(p):
    frame = synthesize(parse_spec(_spec(p), "s")).frame
    assert list(frame.columns) == [*TRACE_SCHEMA, "think_time_us"]
    assert cast_to_schema(frame.drop("request_id")).equals(frame)  # valid, sorted, numbered
    block = p["block"]
    sessions = frame.filter(pl.col("session_id").is_not_null())
    for _, turns in sessions.group_by("session_id", maintain_order=True):
        rows = turns.sort("request_id")
        prompt, output = rows["prompt_tokens"].to_numpy(), rows["output_tokens"].to_numpy()
        hashes = rows["prefix_hashes"].to_list()
        think = rows["think_time_us"].to_list()
        assert think[0] is None and all(t == round(p["think"] * 1e6) for t in think[1:])
        for k in range(len(rows)):
            assert len(hashes[k]) == math.ceil(prompt[k] / block)
            if k:
                assert prompt[k] >= prompt[k - 1] + output[k - 1]
                assert hashes[k][: len(hashes[k - 1])] == hashes[k - 1]
                gap = rows["arrival_us"][k] - rows["arrival_us"][k - 1]
                assert gap >= think[k]
    batch = frame.filter(pl.col("workload") == "batch")
    assert batch["session_id"].null_count() == batch.height and batch["think_time_us"].null_count() == batch.height


@settings(max_examples=20, deadline=None)
@given(specs)
def test_system_prompt_blocks_are_shared_by_their_group(p):
    if not p["system"]:
        return
    frame = synthesize(parse_spec(_spec(p), "s")).frame.filter(pl.col("workload") == "chat")
    shared = p["system"] // p["block"]
    if shared == 0:
        return
    firsts = frame.filter(pl.col("think_time_us").is_null())["prefix_hashes"].list.head(shared)
    assert firsts.n_unique() <= 2  # two groups
    rates = frame.group_by("session_id").len()
    assert np.all(rates["len"].to_numpy() <= p["turns"])


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32), st.floats(0.5, 50), st.sampled_from(["poisson", "gamma", "weibull", "constant"]),
       st.floats(0.3, 3), st.floats(10, 600))
def test_arrival_counts_match_the_spec_rate(seed, rate, process, cv, window_s):
    arrival = {"process": process, "rate": rate, "window_s": window_s}
    if process in ("gamma", "weibull"):
        arrival["cv"] = cv
    duration_s = 1200
    spec = {"seed": seed, "duration_s": duration_s, "workloads": [{
        "name": "w", "arrival": arrival, "prompt": {"dist": "constant", "value": 1},
        "output": {"dist": "constant", "value": 1}}]}
    frame = synthesize(parse_spec(spec, "s")).frame
    expected = rate * duration_s
    # Poisson counts spread by sqrt(mean); the others hold each window's count to within one
    assert abs(frame.height - expected) <= 5 * math.sqrt(expected) + math.ceil(duration_s / window_s) + 1
    assert frame["arrival_us"].max() < duration_s * 1e6
