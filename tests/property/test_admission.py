"""Admission policies never admit past their limits, reject only with a reason, lose nothing."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from replay.engine.common import (
    EV_ARRIVE, EV_PREEMPT, EV_SCHEDULE, EV_SWAP_OUT, FINISHED, REJECT_NAMES,
    REJECTED,
)
from policies.registry import ADMISSIONS
from replay.engine.numba_engine import NumbaEngine
from tests.strategies import engine_inputs, run_to_end


def _run(inputs):
    engine = NumbaEngine(inputs)
    run_to_end(engine, limit_us=10**10)
    return engine.take_events(), engine.request_columns()


@given(engine_inputs(), st.integers(1, 4))
def test_queue_limit_never_admits_into_a_full_queue(inputs, limit):
    npool = len(inputs.pool_replicas)
    inputs = dataclasses.replace(inputs, pool_admission=np.full(npool, ADMISSIONS["queue-limit"].numba_id),
                                 pool_max_waiting=np.full(npool, limit), pool_max_waiting_tokens=np.zeros(npool))
    ev, cols = _run(inputs)
    waiting = np.zeros(npool, np.int64)
    pool_of = inputs.replica_pool
    for kind, q, r, value in zip(ev["kind"].tolist(), ev["request"].tolist(), ev["replica"].tolist(),
                                 ev["value"].tolist()):
        p = pool_of[r] if r >= 0 else inputs.pool[q]
        if kind == EV_ARRIVE:
            if value == 0:  # admitted by the policy (value > 0: its KV landed from a prefill replica)
                assert waiting[p] < limit
            waiting[p] += 1
        elif kind in (EV_PREEMPT, EV_SWAP_OUT):
            waiting[p] += 1
        elif kind == EV_SCHEDULE:
            waiting[p] -= 1
    _conserved(cols)


@given(engine_inputs(), st.sampled_from([300, 1000, 5000]), st.sampled_from([10, 200, 1000]))
def test_token_bucket_admits_at_most_capacity_plus_refill(inputs, capacity, refill):
    npool = len(inputs.pool_replicas)
    inputs = dataclasses.replace(inputs, pool_admission=np.full(npool, ADMISSIONS["token-bucket"].numba_id),
                                 pool_bucket_tokens=np.full(npool, capacity),
                                 pool_bucket_refill_per_s=np.full(npool, refill))
    ev, cols = _run(inputs)
    cost = inputs.prompt_tokens + inputs.output_tokens
    admitted = np.zeros((npool, inputs.num_tenants))
    for kind, t, q, r, value in zip(ev["kind"].tolist(), ev["t_us"].tolist(), ev["request"].tolist(),
                                    ev["replica"].tolist(), ev["value"].tolist()):
        if kind == EV_ARRIVE and value == 0:  # admitted at the pool of the replica it joined
            key = (inputs.replica_pool[r], inputs.tenants[q])
            admitted[key] += cost[q]
            assert admitted[key] <= capacity + refill * t / 1e6 + 1e-6
    _conserved(cols)


def _conserved(cols):
    state = cols["state"]
    assert np.all((state == FINISHED) | (state == REJECTED))
    reasons = cols["reject"][state == REJECTED]
    assert np.all((reasons > 0) & (reasons < len(REJECT_NAMES)))
