"""Every registered autoscaler that can reach 0 replicas can leave it, end to end.

A pool that starts at 0 replicas with min_replicas 0 replays a small drawn trace through the
cluster loop (engine, control plane, guard, policy). Whatever the policy, arrivals that find no
replica are held at the pool, not rejected as no_replica, and every request is served. The
policy-level twin is `test_autoscalers.py::test_a_pool_at_zero_with_requests_held_at_it_scales_up`.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.registry import AUTOSCALERS
from replay.fleet.cluster import holds_arrivals, simulate
from replay.config import AutoscalerConfig, FleetConfig, LifecycleConfig, PoolConfig
from replay.engine.common import FINISHED, REJECT_NO_REPLICA
from traces import cast_to_schema

# Params that let each policy leave zero: `fixed` needs a count of its own (see below), the
# sla-planner is sized from traffic, not held at its min_endpoint.
PARAMS = {
    "fixed": {"replicas": 1},
    "kpa": {"enable_scale_to_zero": True, "scale_to_zero_grace_period_s": 5.0, "stable_window_s": 10.0},
    "ray-serve": {"downscale_delay_s": 5.0, "upscale_delay_s": 1.0},
    "sla-planner": {"min_endpoint": 0, "decision_interval_s": 30.0},
}


@st.composite
def traces(draw) -> pl.DataFrame:
    n = draw(st.integers(1, 12))
    # Bursts with quiet gaps long enough for a scale-down to zero in between.
    gaps = draw(st.lists(st.integers(0, 3_000_000) | st.integers(20_000_000, 90_000_000), min_size=n, max_size=n))
    return cast_to_schema(pl.DataFrame({
        "arrival_us": np.cumsum(gaps).astype(np.int64),
        "prompt_tokens": draw(st.lists(st.integers(1, 2000), min_size=n, max_size=n)),
        "output_tokens": draw(st.lists(st.integers(1, 200), min_size=n, max_size=n)),
    }), source="drawn")


def pool_at_zero(policy: str, max_replicas: int, params: dict, guard: dict) -> FleetConfig:
    scaler = AutoscalerConfig(policy=policy, min_replicas=0, max_replicas=max_replicas, params=params, guard=guard)
    pool = PoolConfig(replicas=0, autoscaler=scaler, lifecycle=LifecycleConfig(pod_start_s=2.0, load_bytes_per_s=8e9))
    return FleetConfig(model="llama-3.1-8b", pools=(pool,), max_drain_s=900.0)


@pytest.mark.parametrize("name", sorted(AUTOSCALERS))
@given(trace=traces(), max_replicas=st.integers(1, 3),
       guard=st.sampled_from([{}, {"scale_up_cooldown_s": 20.0}, {"scale_down_cooldown_s": 30.0},
                              {"scrape_delay_s": 2.0}]))
@settings(max_examples=8)
def test_a_pool_at_zero_serves_every_request(name, trace, max_replicas, guard):
    cfg = pool_at_zero(name, max_replicas, PARAMS.get(name, {}), guard)
    assert holds_arrivals(cfg.pools[0])
    raw = simulate(trace, None, cfg)
    reject, state = raw.requests["reject"], raw.requests["state"]
    assert not (reject == REJECT_NO_REPLICA).any(), f"{name}: rejected as no_replica with max_replicas {max_replicas}"
    assert (state == FINISHED).all(), f"{name}: {int((state != FINISHED).sum())} requests never served"
    assert raw.ticks["held"][-1].sum() == 0


def test_a_pool_that_never_gets_a_replica_rejects_instead_of_holding():
    """No autoscaler, or `fixed` at 0: nothing will start, so holding would only hide the loss."""
    fixed_zero = AutoscalerConfig(policy="fixed", min_replicas=0, max_replicas=2)
    assert not holds_arrivals(PoolConfig(replicas=0))
    assert not holds_arrivals(PoolConfig(replicas=0, autoscaler=fixed_zero))
    assert not holds_arrivals(PoolConfig(replicas=0, autoscaler=AutoscalerConfig(
        policy="fixed", min_replicas=0, max_replicas=2, params={"replicas": 0})))
    assert holds_arrivals(PoolConfig(replicas=0, autoscaler=AutoscalerConfig(
        policy="fixed", min_replicas=0, max_replicas=2, params={"replicas": 2})))
    assert holds_arrivals(PoolConfig(replicas=0, autoscaler=AutoscalerConfig(policy="hpa", min_replicas=0)))
    other = PoolConfig(name="other", replicas=1)
    trace = cast_to_schema(pl.DataFrame({"arrival_us": [0, 5_000_000], "prompt_tokens": [10, 10],
                                         "output_tokens": [5, 5], "workload": ["a", "b"]}), source="drawn")
    cfg = FleetConfig(model="llama-3.1-8b", pools=(PoolConfig(name="a", replicas=0, workloads=("a",),
                                                              autoscaler=fixed_zero), other))
    raw = simulate(trace, None, cfg)
    assert raw.requests["reject"].tolist() == [REJECT_NO_REPLICA, 0]
