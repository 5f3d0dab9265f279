"""A candidate's fleet: the base config with every pool on the candidate's GPU, TP and precision,
and the replica counts the search tries. Fixed pools take the count as `replicas`; autoscaled
pools as `autoscaler.max_replicas` (the bound a planner sets), their floor and start kept within it.
"""

from __future__ import annotations

import dataclasses

from replay.config import FleetConfig, PoolConfig, SloConfig
from replay.plan.space import Candidate


def start_replicas(base: FleetConfig) -> dict[str, int]:
    """Where each pool's search starts: the count the base config has."""
    return {p.name: p.replicas if p.autoscaler is None else p.autoscaler.max_replicas for p in base.pools}


def with_slo(base: FleetConfig, slo: dict[str, float]) -> FleetConfig:
    """The base with the SLO the plan must meet (by-workload targets kept)."""
    return dataclasses.replace(base, slo=SloConfig(**{"ttft_ms": base.slo.ttft_ms, "tpot_ms": base.slo.tpot_ms,
                                                      "by_workload": base.slo.by_workload, **slo}))


def _on_candidate(base: FleetConfig, pool: PoolConfig, cand: Candidate) -> PoolConfig:
    gpu_was = pool.gpu or base.gpu
    # A price set for the GPU the pool had says nothing of another: the catalog's price then.
    price = (pool.price_usd_per_gpu_hour or base.price_usd_per_gpu_hour) if cand.gpu == gpu_was else None
    engine = pool.engine
    weight_dtype = pool.weight_dtype or base.weight_dtype
    if cand.weight_dtype is not None:  # the candidate's precision replaces a quantization method
        weight_dtype, engine = cand.weight_dtype, dataclasses.replace(engine, quantization=None)
    return dataclasses.replace(pool, gpu=cand.gpu, tensor_parallel_size=cand.tp, weight_dtype=weight_dtype,
                               price_usd_per_gpu_hour=price, engine=engine)


def _with_replicas(pool: PoolConfig, n: int) -> PoolConfig:
    scaler = pool.autoscaler
    if scaler is None:
        return dataclasses.replace(pool, replicas=n)
    low = min(scaler.min_replicas, n)
    return dataclasses.replace(pool, replicas=max(low, min(pool.replicas, n)),
                               autoscaler=dataclasses.replace(scaler, min_replicas=low, max_replicas=n))


def candidate_fleet(base: FleetConfig, choice: dict[str, tuple[Candidate, int]]) -> FleetConfig:
    """`base` with pool `name` on `choice[name]`'s candidate and replica count. The fleet-level
    price moves into the pools that keep their GPU, so a pool moved to another GPU takes its own."""
    pools = tuple(_with_replicas(_on_candidate(base, p, choice[p.name][0]), choice[p.name][1]) for p in base.pools)
    return dataclasses.replace(base, pools=pools, price_usd_per_gpu_hour=None)


def uniform(base: FleetConfig, cand: Candidate, replicas: dict[str, int]) -> FleetConfig:
    return candidate_fleet(base, {name: (cand, n) for name, n in replicas.items()})
