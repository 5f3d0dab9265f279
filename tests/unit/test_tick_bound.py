"""A replay's ticks x pools are bounded: up front over the arrivals, and while the fleet drains."""

import polars as pl
import pytest

from common.errors import ConfigError
from replay.fleet import ticks
from replay.fleet.cluster import simulate
from replay.config import FleetConfig, PoolConfig
from traces import cast_to_schema


def frame(*arrival_s: float, output_tokens: int = 10) -> pl.DataFrame:
    n = len(arrival_s)
    return cast_to_schema(pl.DataFrame({"arrival_us": [round(a * 1e6) for a in arrival_s], "prompt_tokens": [100] * n,
                                        "output_tokens": [output_tokens] * n}), source="t")


def fleet(**kw) -> FleetConfig:
    return FleetConfig(model="llama-3.1-8b", pools=(PoolConfig(replicas=1, tensor_parallel_size=1),), **kw)


def test_simulate_refuses_a_month_of_ticks_before_it_starts():
    # the tester's two requests 2.5M s apart: 290 s and 5.6 GB, refused now before any engine runs
    with pytest.raises(ConfigError, match=r"2,500,000 ticks x 1 pool = 2,500,000 tick rows .* raise tick_s to 3 s"):
        simulate(frame(0, 2_500_000), None, fleet(), engine="reference")


def test_a_drain_past_the_bound_stops_with_an_error(monkeypatch):
    monkeypatch.setattr(ticks, "MAX_TICK_POOL_ROWS", 20)
    cfg = fleet(tick_s=0.1)
    with pytest.raises(ConfigError, match=r"still draining .* after the last arrival, 21 ticks x 1 pool"):
        simulate(frame(0, output_tokens=3_000), None, cfg, engine="reference")  # 3,000 tokens take > 2 s
    monkeypatch.setattr(ticks, "MAX_TICK_POOL_ROWS", 1_000_000)
    assert simulate(frame(0, output_tokens=3_000), None, cfg, engine="reference").ticks["t_us"].size > 21
