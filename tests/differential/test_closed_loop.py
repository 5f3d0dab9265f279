"""Closed-loop sessions (replay/fleet/sessions.py, engine/sessions.py): both engines release a
session's next turn at the previous turn's end plus its gap, identically, and the next turn's
prefix hit covers the previous turn's answer."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.engine.common import FINISHED
from replay.engine.numba_engine import NumbaEngine
from replay.engine.reference.engine import ReferenceEngine
from replay.fleet.sessions import closed_loop_inputs
from replay.model.serving import ServingTerms
from tests.differential.test_engines import _run, assert_same
from tests.strategies import make_inputs

TBS = 32  # tokens per trace hash block
NO_SERVING = ServingTerms(api_server_us=0.0, tokenize_us_per_token=0.0, token_return_us=0.0)


def session_trace(sessions, think_us, kv_blocks=(64,), replicas=(1,), max_num_seqs=(8,)):
    """EngineInputs of chat sessions: `sessions` is a list of (start_us, [(question, answer), ...]);
    each turn's prompt is the session's context so far plus its question, hashed as one growing
    stream (block i of a session has one hash for every turn)."""
    rows = []
    for s, (start, turns) in enumerate(sessions):
        context, t = 0, start
        for k, (question, answer) in enumerate(turns):
            prompt = context + question
            rows.append((t, prompt, answer, f"s{s}", None if k == 0 else think_us))
            context = prompt + answer
            t += 1_000_000 * (k + 1)  # recorded gaps, ignored: think_time_us is given
    rows.sort(key=lambda r: r[0])
    frame = pl.DataFrame(rows, schema={"arrival_us": pl.Int64, "prompt_tokens": pl.Int64, "output_tokens": pl.Int64,
                                       "session_id": pl.String, "think_time_us": pl.Int64}, orient="row")
    prompt = frame["prompt_tokens"].to_numpy()
    base = make_inputs(frame["arrival_us"].to_numpy(), prompt, frame["output_tokens"].to_numpy(),
                       trace_block_tokens=TBS, kv_blocks=kv_blocks, replicas=replicas, max_num_seqs=max_num_seqs,
                       max_model_len=(1 << 20,))
    hash_len = -(-prompt // TBS)
    session = [int(x[1:]) for x in frame["session_id"]]
    flat = np.array([s * 10_000 + b for s, n in zip(session, hash_len) for b in range(n)], np.uint64)
    hash_off = np.concatenate(([0], np.cumsum(hash_len)[:-1])).astype(np.int64)
    cl = closed_loop_inputs(frame, np.zeros(frame.height, np.int64), [NO_SERVING], hash_off, hash_len, flat)
    return frame, dataclasses.replace(base, trace_hashes=flat, **cl)


turns = st.lists(st.tuples(st.integers(1, 120), st.integers(1, 60)), min_size=1, max_size=4)
session_lists = st.lists(st.tuples(st.integers(0, 3_000_000), turns), min_size=1, max_size=5)


@settings(max_examples=30, deadline=None)
@given(session_lists, st.integers(0, 2_000_000), st.sampled_from([(24,), (64,), (400,)]), st.integers(1, 2))
def test_engines_agree_on_closed_loop_sessions(sessions, think, kv_blocks, replicas):
    _, inputs = session_trace(sessions, think, kv_blocks=kv_blocks, replicas=(replicas,), max_num_seqs=(2,))
    assert_same(inputs)


@settings(max_examples=30, deadline=None)
@given(session_lists, st.integers(0, 2_000_000), st.sampled_from([(24,), (400,)]))
def test_turns_never_arrive_before_the_previous_turn_ends_plus_think_time(sessions, think, kv_blocks):
    frame, inputs = session_trace(sessions, think, kv_blocks=kv_blocks)
    for cls in (NumbaEngine, ReferenceEngine):
        _, req, _, _ = _run(cls, inputs)
        arrival, ended = req["arrival_us"], np.where(req["finished_us"] >= 0, req["finished_us"], -1)
        for k, s in enumerate(inputs.next_turn):
            if s < 0:
                continue
            # a rejected turn ends at its arrival (its session goes on)
            end = ended[k] if ended[k] >= 0 else arrival[k]
            assert arrival[s] == end + think, (cls.__name__, k, s)
            assert arrival[s] >= end + think


def test_next_turn_hits_the_previous_answer():
    """One session on an unloaded replica: turn 2's cached prefix covers turn 1's prompt and answer."""
    p1, o1 = 100, 70
    frame, inputs = session_trace([(0, [(p1, o1), (40, 10)])], 500_000, kv_blocks=(400,))
    for cls in (NumbaEngine, ReferenceEngine):
        _, req, _, _ = _run(cls, inputs)
        assert (req["state"] == FINISHED).all()
        bs = int(inputs.pool_block_size[0])
        # the last answer token's KV is never computed: full blocks of P + O - 1 tokens are cached
        assert req["cached_tokens"][1] >= (p1 + o1 - 1) // bs * bs > p1


def test_open_loop_answer_blocks_stay_private():
    """Without closed loop (the same trace), turn 2 hits turn 1's prompt only: outputs keep own hashes."""
    p1, o1 = 100, 70
    _, inputs = session_trace([(0, [(p1, o1), (40, 10)])], 500_000, kv_blocks=(400,))
    open_loop = dataclasses.replace(inputs, next_turn=None, turn_gap_us=None, hash_tokens=None,
                                    hash_off=np.array([0, 4], np.int64), hash_len=np.array([4, 7], np.int64))
    _, req, _, _ = _run(NumbaEngine, open_loop)
    assert req["cached_tokens"][1] <= p1
