"""Queue orders and preemption, replayed from the event log: the admitted request is always the
policy's first among those waiting on that replica, and preemption keeps KV within capacity."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from replay.engine.common import (
    EV_ARRIVE, EV_PREEMPT, EV_SCHEDULE, EV_SWAP_OUT, FINISHED, REJECTED,
)
from policies.registry import QUEUE_ORDERS
from replay.engine.numba_engine import NumbaEngine
from tests.strategies import engine_inputs, run_to_end


@given(engine_inputs(), st.sampled_from(["priority", "shortest-prompt"]))
def test_admission_follows_the_queue_order(inputs, order):
    # Without LoRA: a request whose adapter would exceed max_loras is skipped, not admitted in order.
    # Without async scheduling: there a request queued after the step was scheduled waits for the
    # next one whatever its rank (the differential test and test_serving_terms hold that part).
    inputs = dataclasses.replace(inputs, pool_queue=np.full(len(inputs.pool_replicas), QUEUE_ORDERS[order].numba_id),
                                 pool_lora_slots=None,
                                 pool_async_scheduling=None)
    engine = NumbaEngine(inputs)
    run_to_end(engine, limit_us=10**10)
    ev = engine.take_events()
    key = inputs.priority if order == "priority" else inputs.prompt_tokens
    waiting: dict[int, set[int]] = {}
    received: set[int] = set()  # prefill/decode: KV landed, blocks held; these go first
    for kind, replica, q, value in zip(ev["kind"].tolist(), ev["replica"].tolist(), ev["request"].tolist(),
                                       ev["value"].tolist()):
        if kind in (EV_ARRIVE, EV_PREEMPT, EV_SWAP_OUT):
            waiting.setdefault(replica, set()).add(q)
            if kind == EV_ARRIVE and value > 0:
                received.add(q)
        elif kind == EV_SCHEDULE:
            queue = waiting[replica]
            if q in received:
                received.discard(q)
            else:
                assert not received & queue, "a request holding its received KV goes first"
                first = min(queue, key=lambda x: (key[x], inputs.arrival_us[x], x))
                assert q == first, f"admitted {q} while {first} came first in the {order} order"
            queue.remove(q)


@given(engine_inputs())
def test_preemption_keeps_kv_within_capacity_and_every_preempted_request_finishes(inputs):
    engine = NumbaEngine(inputs)
    t = 0
    while not engine.done and t < 10**9:
        t += 200_000
        engine.advance(t)
        st_ = engine.replica_state()
        assert np.all(st_["kv_used_blocks"] <= st_["kv_total_blocks"])
    cols = engine.request_columns()
    assert engine.done
    preempted = cols["preemptions"] > 0
    assert np.all(cols["state"][preempted] == FINISHED)
    assert np.all((cols["state"] == FINISHED) | (cols["state"] == REJECTED))
