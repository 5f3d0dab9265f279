"""Engine invariants over generated traces: conservation, causality, determinism."""

from __future__ import annotations

import numpy as np
from hypothesis import given

from replay.engine.common import FINISHED, REJECTED
from replay.engine.numba_engine import NumbaEngine
from tests.strategies import engine_inputs, run_to_end


@given(engine_inputs())
def test_every_request_ends_finished_or_rejected_and_none_is_lost(inputs):
    engine = NumbaEngine(inputs)
    run_to_end(engine, limit_us=10**10)
    cols = engine.request_columns()
    state = cols["state"]
    assert engine.done
    assert np.all((state == FINISHED) | (state == REJECTED))
    pools = engine.pool_counters()
    reps = engine.replica_state()
    assert pools["arrivals"].sum() == inputs.num_requests
    assert reps["finished"].sum() + pools["rejected"].sum() == inputs.num_requests
    # Nothing is left holding KV, and every block is back in the free queue.
    assert reps["kv_used_blocks"].sum() == 0
    assert reps["waiting"].sum() == 0 and reps["running"].sum() == 0


@given(engine_inputs())
def test_times_are_causal_and_outputs_complete(inputs):
    engine = NumbaEngine(inputs)
    run_to_end(engine, limit_us=10**10)
    cols = engine.request_columns()
    done = cols["state"] == FINISHED
    arrival = inputs.arrival_us[done]
    sched = cols["first_scheduled_us"][done]
    first = cols["first_token_us"][done]
    fin = cols["finished_us"][done]
    assert np.all(arrival <= sched) and np.all(sched < first) and np.all(first <= fin)
    np.testing.assert_array_equal(cols["generated"][done], inputs.output_tokens[done])
    # A request emitting one token finishes at its first token.
    one = inputs.output_tokens[done] == 1
    np.testing.assert_array_equal(first[one], fin[one])
    # Cached tokens are whole blocks and never the whole prompt.
    assert np.all(cols["cached_tokens"][done] < inputs.prompt_tokens[done])
    rejected = cols["state"] == REJECTED
    assert np.all(cols["reject"][rejected] > 0) and np.all(cols["reject"][~rejected] == 0)


@given(engine_inputs())
def test_two_runs_are_identical(inputs):
    outs = []
    for _ in range(2):
        engine = NumbaEngine(inputs)
        run_to_end(engine, limit_us=10**10)
        outs.append((engine.take_events(), engine.request_columns()))
    for a, b in zip(outs[0], outs[1]):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
