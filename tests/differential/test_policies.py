"""Every registered per-step policy through both engines, and an id without a policy is an error.

The registry is walked, not listed here, so a policy added to policies/registry.py is run
through the numba engine and its plain-Python twin without touching this file.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from policies._dispatch import UnknownPolicyId
from policies.registry import (
    ADMISSION_MODULES, ADMISSIONS, QUEUE_MODULES, QUEUE_ORDERS, ROUTER_MODULES, ROUTERS, VICTIM_MODULES, VICTIMS,
)
from replay.engine.reference.engine import ReferenceEngine
from replay.engine.numba_engine import NumbaEngine
from tests.differential.test_engines import _run, assert_same
from tests.strategies import make_inputs, run_to_end


def busy_inputs(router, **kwargs):
    """Three replicas under bursts of requests that share prefixes: load, KV use and cache
    hits all differ between replicas, so every scorer has something to choose by."""
    rng = np.random.default_rng(11)
    n = 90
    arrivals = np.cumsum(rng.integers(0, 30_000, n) * (rng.random(n) < 0.7))
    shape = dict(replicas=(3,), kv_blocks=(90,), max_num_seqs=(6,), max_batched=(256,)) | kwargs
    return make_inputs(arrivals, rng.integers(20, 400, n), rng.integers(1, 60, n), families=rng.integers(-1, 4, n),
                       router=(router,), **shape)


CUSTOM = {"policy": "weighted", "scorers": {"running": 1, "prefix": 3, "kv_use": 0.5}}


@pytest.mark.parametrize("router", [*sorted(ROUTERS), CUSTOM], ids=[*sorted(ROUTERS), "weighted-custom"])
def test_every_router_matches_the_reference_engine(router):
    inputs = dataclasses.replace(busy_inputs(router), pool_refresh_us=np.array([20_000]))
    _, requests, _, _ = _run(NumbaEngine, inputs)
    assert len(set(requests["replica"].tolist())) > 1, "the scenario must spread requests"
    assert_same(inputs)


def test_weighted_scorers_change_the_choice():
    """The weights are read: the same trace routed by opposite scorers lands differently."""
    by_prefix = _run(NumbaEngine, busy_inputs({"policy": "weighted", "scorers": {"prefix": 1}}))[1]["replica"]
    by_load = _run(NumbaEngine, busy_inputs({"policy": "weighted", "scorers": {"running": 1}}))[1]["replica"]
    assert not np.array_equal(by_prefix, by_load)


@pytest.mark.parametrize("victim", sorted(VICTIMS))
def test_every_preemption_victim_matches_the_reference_engine(victim):
    """Tight KV and mixed priorities: steps preempt, and each victim policy picks differently."""
    rng = np.random.default_rng(3)
    inputs = busy_inputs("least-outstanding", kv_blocks=(40,), victim=(VICTIMS[victim].numba_id,),
                         priority=rng.integers(0, 3, 90))
    _, requests, _, _ = _run(NumbaEngine, inputs)
    assert requests["preemptions"].sum() > 0, "the scenario must preempt"
    assert_same(inputs)


@pytest.mark.parametrize("order", sorted(QUEUE_ORDERS))
def test_every_queue_order_matches_the_reference_engine(order):
    """Queues build up behind one busy replica; priorities, prompts and cache hits all differ."""
    rng = np.random.default_rng(5)
    inputs = busy_inputs("round-robin", replicas=(2,), kv_blocks=(60,), max_num_seqs=(3,),
                         queue=(QUEUE_ORDERS[order].numba_id,), priority=rng.integers(0, 4, 90))
    _, requests, _, _ = _run(NumbaEngine, inputs)
    fifo = _run(NumbaEngine, dataclasses.replace(inputs, pool_queue=np.array([QUEUE_ORDERS["fcfs"].numba_id])))[1]
    if order not in ("fcfs", "edf"):  # one TTFT target: EDF is arrival order, as FCFS without preemption
        assert not np.array_equal(requests["first_scheduled_us"], fifo["first_scheduled_us"]), "order unused"
    assert_same(inputs)


# Each admission policy's parameter columns (EngineInputs.pool_<name>), tight enough to reject.
ADMISSION_LIMITS = {"max_waiting": 3, "max_waiting_tokens": 900, "bucket_tokens": 1500, "bucket_refill_per_s": 4000,
                    "shed_waiting_per_replica": 2, "shed_priority_from": 1, "slo_multiple_milli": 500,
                    "prefill_tokens_per_s": 500}


@pytest.mark.parametrize("admission", sorted(ADMISSIONS))
def test_every_admission_policy_matches_the_reference_engine(admission):
    rng = np.random.default_rng(9)
    limits = {f"pool_{name}": np.array([value]) for name, value in ADMISSION_LIMITS.items()}
    inputs = dataclasses.replace(
        busy_inputs("least-outstanding", priority=rng.integers(0, 3, 90), tenant=rng.integers(0, 3, 90)),
        pool_admission=np.array([ADMISSIONS[admission].numba_id]), **limits)
    _, requests, _, _ = _run(NumbaEngine, inputs)
    if admission != "always":
        assert (requests["reject"] > 0).any(), "the scenario must reject"
    assert_same(inputs)


@pytest.mark.parametrize("cls", [NumbaEngine, ReferenceEngine])
@pytest.mark.parametrize("column, family, modules", [
    ("pool_router", "router", ROUTER_MODULES),
    ("pool_victim", "preemption victim", VICTIM_MODULES),
    ("pool_queue", "queue order", QUEUE_MODULES),
    ("pool_admission", "admission", ADMISSION_MODULES),
])
def test_an_id_without_a_policy_stops_the_run(cls, column, family, modules):
    """Never a silent default: the engine stops with an error status naming the family and id."""
    inputs = dataclasses.replace(busy_inputs("round-robin"), **{column: np.array([len(modules)])})
    engine = cls(inputs)
    with pytest.raises(UnknownPolicyId, match=f"pool 0: {family} id {len(modules)} has no policy"):
        run_to_end(engine)
