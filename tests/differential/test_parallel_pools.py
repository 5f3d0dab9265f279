"""Pools replayed in parallel worker processes (replay/fleet/parallel.py) against the whole fleet
in one engine: the same tick rows, engine and control events (in the same order), request
columns and end, on drawn multi-pool fleets and traces; and fleets whose pools are coupled are
replayed in one engine, saying why."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.errors import ConfigError
from policies.registry import AUTOSCALERS
from replay.config import build_config
from replay.fleet import parallel
from replay.fleet.cluster import build_inputs, plan_pools, simulate
from replay.fleet.split import split_requests
from replay.engine.common import EngineInputs
from tests.strategies import routers
from tests.e2e.test_plugins import PLUGINS
from traces import cast_to_schema

# Params that make each autoscaler act within a short trace.
SCALER_PARAMS = {
    "fixed": {"replicas": 2},
    "kpa": {"stable_window_s": 6.0, "enable_scale_to_zero": True, "scale_to_zero_grace_period_s": 3.0},
    "ray-serve": {"downscale_delay_s": 4.0, "upscale_delay_s": 1.0},
    "sla-planner": {"decision_interval_s": 5.0},
    "hpa": {"decision_interval_s": 2.0, "downscale_stabilization_s": 5.0},
}


@pytest.fixture(autouse=True)
def _always_split(monkeypatch):
    """The drawn traces are tiny: split them anyway (the pay-off rule is tested on its own)."""
    monkeypatch.setattr(parallel, "PAYS_OFF", 0.0)


@st.composite
def pool_dicts(draw, i: int, workload: str | None) -> dict:
    pool = {
        "name": f"p{i}",
        "replicas": draw(st.integers(1, 3)),
        "router": draw(routers()),
        "router_refresh_ms": draw(st.sampled_from([50.0, 700.0])),
        "engine": {"num_gpu_blocks_override": draw(st.sampled_from([70, 150, 2000])), "max_model_len": 1100,
                   "max_num_seqs": draw(st.sampled_from([2, 8, 64])), "max_num_batched_tokens": 512,
                   "long_prefill_token_threshold": draw(st.sampled_from([0, 128])),
                   "async_scheduling": draw(st.booleans()), "scheduling_policy": draw(st.sampled_from(["fcfs", "priority"]))},
    }
    if workload is not None:
        pool["workloads"] = [workload]
    if draw(st.booleans()):
        pool["preemption"] = {"mode": "swap", "swap_space_gib": 0.001}
    if draw(st.booleans()):
        pool["admission"] = {"policy": "queue-limit", "params": {"max_waiting": draw(st.integers(1, 6))}}
    if draw(st.booleans()):
        policy = draw(st.sampled_from(sorted(AUTOSCALERS)))
        low = draw(st.integers(0, 1))
        pool["replicas"] = min(pool["replicas"], 3)
        pool["autoscaler"] = {"policy": policy, "min_replicas": low, "max_replicas": 3,
                              "params": SCALER_PARAMS.get(policy, {}), "guard": draw(st.sampled_from(
                                  [{}, {"scrape_delay_s": 2.0}, {"scale_down_cooldown_s": 4.0}]))}
        pool["lifecycle"] = {"pod_start_s": draw(st.sampled_from([0.5, 3.0])), "load_bytes_per_s": 8e9}
    return pool


@st.composite
def fleets(draw) -> tuple[pl.DataFrame, dict]:
    npool = draw(st.integers(2, 4))
    by_length = draw(st.booleans())
    workloads = [f"w{i}" for i in range(npool)]
    pools = [draw(pool_dicts(i, None if by_length else workloads[i])) for i in range(npool)]
    split = ({"policy": "by-prompt-length", "prompt_thresholds": sorted(draw(st.lists(
        st.integers(50, 1100), min_size=npool - 1, max_size=npool - 1, unique=True)))} if by_length
        else {"policy": "by-workload"})
    cfg = {"model": "llama-3.1-8b", "gpu": "h100-sxm-80gb", "seed": draw(st.integers(0, 3)),
           "tick_s": draw(st.sampled_from([1.0, 0.37])), "max_drain_s": 900.0, "split": split, "pools": pools}
    n = draw(st.integers(npool, 60))
    # coarse gaps: arrivals (and so steps) at equal times in different pools are common
    gaps = draw(st.lists(st.sampled_from([0, 0, 10_000, 250_000, 2_000_000, 9_000_000]), min_size=n, max_size=n))
    labels = workloads + draw(st.lists(st.sampled_from(workloads), min_size=n - npool, max_size=n - npool))
    families = draw(st.lists(st.integers(-1, 2), min_size=n, max_size=n))
    prompt = draw(st.lists(st.integers(1, 1200), min_size=n, max_size=n))  # a few over max_model_len
    hashes = [None if f < 0 else [f * 100 + b for b in range(-(-p // 32))] for f, p in zip(families, prompt)]
    frame = cast_to_schema(pl.DataFrame({
        "arrival_us": np.cumsum(gaps).astype(np.int64), "prompt_tokens": prompt,
        "output_tokens": draw(st.lists(st.integers(1, 400), min_size=n, max_size=n)),
        "priority": draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)),
        "workload": labels, "prefix_hashes": pl.Series(hashes, dtype=pl.List(pl.UInt64)),
    }), source="drawn")
    return frame, cfg


def assert_same_run(a, b) -> None:
    assert a.end_us == b.end_us and a.tick_us == b.tick_us
    for what in ("ticks", "events", "requests"):
        x, y = getattr(a, what), getattr(b, what)
        assert list(x) == list(y), what
        for name in x:
            assert x[name].dtype == y[name].dtype, (what, name)
            np.testing.assert_array_equal(x[name], y[name], err_msg=f"{what} column {name}: serial vs parallel")
    assert dataclasses.asdict(a.control_events) == dataclasses.asdict(b.control_events)
    np.testing.assert_array_equal(a.pool_index, b.pool_index)


def serial_and_parallel(frame, cfg_dict, jobs: int, engine: str = "numba", detailed: bool = True):
    cfg = build_config(cfg_dict, "drawn", ".")
    serial = simulate(frame, 32, cfg, engine=engine, detailed_events=detailed, jobs=1)
    par = simulate(frame, 32, cfg, engine=engine, detailed_events=detailed, jobs=jobs)
    return serial, par


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(fleets(), st.integers(2, 4), st.booleans())
def test_parallel_pools_replay_the_serial_run(fleet, jobs, detailed):
    frame, cfg = fleet
    serial, par = serial_and_parallel(frame, cfg, jobs, detailed=detailed)
    assert serial.workers == 1
    if par.workers == 1:  # by prompt length, every request may go to one pool
        assert par.serial_reason == "fewer than two pools have requests", par.serial_reason
    else:
        assert par.serial_reason is None and 2 <= par.workers <= jobs
    assert_same_run(serial, par)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(fleets())
def test_parallel_pools_replay_the_serial_run_on_the_reference_engine(fleet):
    frame, cfg = fleet
    serial, par = serial_and_parallel(frame.head(25), cfg, 2, engine="reference")
    assert_same_run(serial, par)


def session_frame(sessions: list[tuple[str, int, list[tuple[int, int]]]]) -> pl.DataFrame:
    """Chat sessions (workload, start, [(question, answer), ...]), each turn's prompt the context so far."""
    rows = []
    for s, (workload, start, turns) in enumerate(sessions):
        context = 0
        for k, (question, answer) in enumerate(turns):
            rows.append((start + 3_000_000 * k, context + question, answer, f"s{s}", workload, 500_000))
            context += question + answer
    rows.sort(key=lambda r: r[0])
    return cast_to_schema(pl.DataFrame(rows, orient="row", schema={
        "arrival_us": pl.Int64, "prompt_tokens": pl.Int64, "output_tokens": pl.Int64, "session_id": pl.String,
        "workload": pl.String, "think_time_us": pl.Int64}), source="sessions")


def closed_fleet(split: dict, pools: int = 2) -> dict:
    return {"model": "llama-3.1-8b", "gpu": "h100-sxm-80gb", "trace": {"path": "drawn", "closed_loop": True},
            "split": split, "pools": [{"name": f"w{i}", "replicas": 1, "workloads": [f"w{i}"],
                                       "engine": {"num_gpu_blocks_override": 300, "max_model_len": 4096,
                                                  "max_num_seqs": 4}}
                                      for i in range(pools)]}


turn_lists = st.lists(st.tuples(st.integers(1, 300), st.integers(1, 120)), min_size=1, max_size=4)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["w0", "w1", "w2"]), st.integers(0, 4_000_000), turn_lists),
                min_size=2, max_size=8))
def test_closed_loop_sessions_within_their_pools_replay_the_serial_run(sessions):
    frame = session_frame(sessions)
    serial, par = serial_and_parallel(frame, closed_fleet({"policy": "by-workload"}, 3), 3)
    assert_same_run(serial, par)
    if frame["workload"].n_unique() > 1:
        assert par.workers > 1


def test_sessions_that_cross_pools_keep_the_fleet_in_one_engine():
    frame = session_frame([("w0", 0, [(100, 50), (400, 20)]), ("w0", 10_000, [(900, 10)])])
    cfg = closed_fleet({"policy": "by-prompt-length", "prompt_thresholds": [300]})
    for pool in cfg["pools"]:
        pool.pop("workloads")
    serial, par = serial_and_parallel(frame, cfg, 2)
    assert par.workers == 1 and "a session's turns go to more than one pool" in par.serial_reason
    assert_same_run(serial, par)


def pd_fleet() -> dict:
    return {"model": "llama-3.1-8b", "gpu": "h100-sxm-80gb", "split": {"policy": "prefill-decode"},
            "pools": [{"name": "prefill", "replicas": 1}, {"name": "decode", "replicas": 1}]}


def small_frame(n: int = 30, workloads: tuple[str, ...] = ("w0", "w1"), gap_us: int = 400_000) -> pl.DataFrame:
    rng = np.random.default_rng(3)
    return cast_to_schema(pl.DataFrame({
        "arrival_us": np.cumsum(rng.integers(0, gap_us, n)), "prompt_tokens": rng.integers(1, 2000, n),
        "output_tokens": rng.integers(1, 300, n), "workload": [workloads[i % len(workloads)] for i in range(n)],
    }), source="small")


def test_a_prefill_decode_fleet_is_replayed_in_one_engine_and_says_why():
    serial, par = serial_and_parallel(small_frame(), pd_fleet(), 2)
    assert par.workers == 1 and par.serial_reason.startswith("prefill/decode disaggregation")
    assert_same_run(serial, par)


def _reason(frame, cfg_dict, jobs=2, engine="numba", on_tick=None):
    cfg = build_config(cfg_dict, "drawn", ".")
    plans = plan_pools(cfg)
    inputs = build_inputs(frame, None, plans, split_requests(frame, cfg, plans))
    return parallel.serial_reason(cfg, plans, inputs, engine, jobs, on_tick)


def two_pools(**pool) -> dict:
    return {"model": "llama-3.1-8b", "gpu": "h100-sxm-80gb",
            "pools": [{"name": "a", "workloads": ["w0"], **pool}, {"name": "b", "workloads": ["w1"], **pool}]}


def test_what_keeps_a_fleet_in_one_engine():
    frame = small_frame()
    assert _reason(frame, two_pools()) is None
    assert _reason(frame, two_pools(), jobs=1).startswith("one job")
    assert _reason(frame, {"model": "llama-3.1-8b", "pools": [{"name": "a"}]}) == "one pool"
    assert _reason(frame, two_pools(), on_tick=lambda **_: None).startswith("a live run")
    assert _reason(small_frame(workloads=("w0",)), two_pools()) == "fewer than two pools have requests"


@pytest.mark.parametrize(("plugin", "pool", "fragment"), [
    (PLUGINS / "my_scaler.py", {"autoscaler": {"policy": "my_scaler:by_queue", "min_replicas": 1, "max_replicas": 2}},
     "pools[0].autoscaler.policy is a user-written autoscaler (my_scaler:by_queue)"),
    ("policies.examples", {"router": "policies.examples:least_waiting_tokens"},
     "config: pools[0].router is a user-written router policy"),
])
def test_a_user_written_policy_keeps_the_fleet_in_one_engine(plugin, pool, fragment):
    from policies.plugins import load_plugins

    load_plugins([str(plugin)])
    try:
        frame = small_frame()
        reason = _reason(frame, two_pools(**pool))
        assert reason is not None and reason.startswith(fragment), reason
        serial, par = serial_and_parallel(frame, two_pools(**pool), 2)
        assert par.workers == 1 and par.serial_reason == reason
        assert_same_run(serial, par)
    finally:
        load_plugins([])


def test_the_pay_off_rule_keeps_small_fleets_in_one_engine(monkeypatch):
    monkeypatch.setattr(parallel, "PAYS_OFF", 2.0)
    reason = _reason(small_frame(), two_pools())
    assert reason is not None and reason.startswith("too little work to share")
    assert _reason(small_frame(200_000, gap_us=10_000), two_pools()) is None
    # as many requests over four and a half days: every worker would run ~400,000 ticks
    reason = _reason(small_frame(200_000, gap_us=4_000_000), dict(two_pools(), tick_s=1.0))
    assert reason is not None and reason.startswith("too little work to share")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=8), st.integers(1, 6))
def test_pool_groups_cover_every_pool_once_and_balance_the_busiest(counts, jobs):
    pool = np.repeat(np.arange(len(counts)), counts)
    inputs = EngineInputs(
        arrival_us=np.arange(len(pool)), prompt_tokens=np.ones(len(pool), np.int64),
        output_tokens=np.ones(len(pool), np.int64), priority=np.zeros(len(pool), np.int64), pool=pool,
        hash_off=np.zeros(len(pool), np.int64), hash_len=np.zeros(len(pool), np.int64),
        trace_hashes=np.zeros(0, np.uint64), trace_block_tokens=1,
        **{f"pool_{k}": np.ones(len(counts), np.int64) for k in (
            "replicas", "kv_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
            "long_prefill_token_threshold", "enable_prefix_caching", "max_model_len", "router")},
        pool_step_params=np.zeros((len(counts), 1)))
    groups = parallel.pool_groups(inputs, jobs)
    assert sorted(p for g in groups for p in g) == list(range(len(counts)))
    busy = sum(c > 0 for c in counts)
    assert len(groups) == max(1, min(jobs, busy))
    assert all(g == sorted(g) for g in groups)
    assert all(sum(counts[p] for p in g) > 0 for g in groups) or busy == 0
    # greedy: no group is heavier than the lightest one plus the largest pool
    loads = [sum(counts[p] * (1 + 1 / parallel.TOKENS_PER_WORK) for p in g) for g in groups]
    assert max(loads) <= min(loads) + max(counts) * (1 + 1 / parallel.TOKENS_PER_WORK) + 1e-9


def test_every_engine_input_is_known_to_the_split():
    """A new EngineInputs field must be said to be per request or per pool before pools split."""
    for f in dataclasses.fields(EngineInputs):
        known = (f.name in parallel.REQUEST_FIELDS or f.name in parallel.WHOLE_FIELDS or f.name.startswith("pool_")
                 or "np.ndarray" not in str(f.type))
        assert known, f.name


def test_a_worker_error_is_the_serial_run_s_error(monkeypatch):
    """A fleet still draining past the tick-row bound: the same ConfigError, from a worker."""
    from replay.fleet import ticks

    monkeypatch.setattr(ticks, "MAX_TICK_POOL_ROWS", 40)
    frame = cast_to_schema(pl.DataFrame({"arrival_us": [0, 0, 10_000, 20_000], "prompt_tokens": [500] * 4,
                                         "output_tokens": [400] * 4, "workload": ["w0", "w1", "w0", "w1"]}),
                           source="long")
    cfg = dict(two_pools(), tick_s=0.05)
    with pytest.raises(ConfigError) as serial:
        simulate(frame, None, build_config(cfg, "drawn", "."), jobs=1)
    with pytest.raises(ConfigError) as par:
        simulate(frame, None, build_config(cfg, "drawn", "."), jobs=2)
    assert str(serial.value) == str(par.value) and "still draining" in str(par.value)


@pytest.mark.parametrize(("cores", "load", "jobs", "busy"), [
    (2, 0.3, 2, False), (8, 3.0, 6, False), (2, 6.3, 1, True), (2, 2.2, 1, True), (1, 0.0, 1, False),
    (16, 40.0, 1, True),
])
def test_the_default_jobs_leave_out_the_cores_the_load_keeps_busy(monkeypatch, cores, load, jobs, busy):
    monkeypatch.setattr(parallel, "default_jobs", lambda: cores)
    monkeypatch.setattr(parallel.os, "getloadavg", lambda: (load, load, load))
    got, reason = parallel.auto_jobs()
    assert got == jobs and (reason is not None) == busy
    if busy:
        assert reason.startswith(f"the machine is busy: a load average of {load:.1f} on {cores} cores")
