"""Hand-checked engine scenarios: step boundaries, chunked prefill, prefix hits, rejections."""

from __future__ import annotations

import numpy as np
import pytest

from replay.engine.common import FINISHED, REJECT_CONTEXT, REJECT_KV, REJECTED
from replay.engine.numba_engine import NumbaEngine
from replay.engine.reference.engine import ReferenceEngine
from replay.model.stepmodel import step_time_us_nb
from tests.strategies import STEP, make_inputs, run_to_end

ENGINES = [NumbaEngine, ReferenceEngine]


def finish(cls, inputs):
    engine = cls(inputs)
    run_to_end(engine)
    return engine.request_columns()


@pytest.mark.parametrize("cls", ENGINES)
def test_one_request_prefill_then_decode_steps(cls):
    cols = finish(cls, make_inputs([1000], [100], [3], max_batched=(8192,)))
    d1 = step_time_us_nb(STEP, 100, 100 * 101 / 2.0, 0, 0, 0, 1)
    d2 = step_time_us_nb(STEP, 0, 0.0, 0, 1, 101, 1)
    d3 = step_time_us_nb(STEP, 0, 0.0, 0, 1, 102, 1)
    assert cols["first_scheduled_us"][0] == 1000
    assert cols["first_token_us"][0] == 1000 + d1
    assert cols["finished_us"][0] == 1000 + d1 + d2 + d3


@pytest.mark.parametrize("cls", ENGINES)
def test_chunked_prefill_spreads_a_long_prompt_over_the_token_budget(cls):
    cols = finish(cls, make_inputs([0], [300], [1], max_batched=(128,), kv_blocks=(64,)))
    chunks = [(128, 0), (128, 128), (44, 256)]
    expected = sum(step_time_us_nb(STEP, n, n * c + n * (n + 1) / 2.0, c, 0, 0, 1) for n, c in chunks)
    assert cols["first_token_us"][0] == expected == cols["finished_us"][0]


@pytest.mark.parametrize("cls", ENGINES)
def test_long_prefill_threshold_caps_each_chunk(cls):
    capped = finish(cls, make_inputs([0], [300], [1], max_batched=(8192,), long_prefill=(100,)))
    whole = finish(cls, make_inputs([0], [300], [1], max_batched=(8192,)))
    assert capped["first_token_us"][0] > whole["first_token_us"][0]


@pytest.mark.parametrize("cls", ENGINES)
def test_shared_prefix_is_a_cache_hit_for_the_second_request(cls):
    # Family 0 shares its first three 32-token trace blocks: 96 tokens = 6 engine blocks of 16.
    cols = finish(cls, make_inputs([0, 10_000_000], [200, 250], [2, 2], families=[0, 0]))
    assert cols["cached_tokens"].tolist() == [0, 96]
    no_cache = finish(cls, make_inputs([0, 10_000_000], [200, 250], [2, 2], families=[0, 0], prefix_caching=(0,)))
    assert no_cache["cached_tokens"].tolist() == [0, 0]
    assert cols["first_token_us"][1] - 10_000_000 < no_cache["first_token_us"][1] - 10_000_000


@pytest.mark.parametrize("cls", ENGINES)
def test_hit_is_capped_so_one_token_is_computed(cls):
    # Same 96-token prompt twice: at most (96 - 1) // 16 = 5 blocks can hit.
    cols = finish(cls, make_inputs([0, 10_000_000], [96, 96], [1, 1], families=[0, 0]))
    assert cols["cached_tokens"].tolist() == [0, 80]


@pytest.mark.parametrize("cls", ENGINES)
def test_impossible_requests_are_rejected_with_a_reason_and_the_rest_goes_on(cls):
    cols = finish(cls, make_inputs([0, 1, 2], [5000, 2000, 10], [10, 10, 10], kv_blocks=(64,), max_model_len=(4096,)))
    assert cols["state"].tolist() == [REJECTED, REJECTED, FINISHED]
    assert cols["reject"].tolist() == [REJECT_CONTEXT, REJECT_KV, 0]


@pytest.mark.parametrize("cls", ENGINES)
def test_kv_pressure_preempts_the_newest_running_request(cls):
    # 20 blocks of 16 tokens; two requests that each grow to ~15 blocks cannot both finish at once.
    cols = finish(cls, make_inputs([0, 0], [150, 150], [90, 90], kv_blocks=(20,), max_batched=(512,)))
    assert cols["preemptions"].tolist() == [0, 1]
    assert np.all(cols["state"] == FINISHED)
    assert cols["finished_us"][0] < cols["finished_us"][1]


@pytest.mark.parametrize("cls", ENGINES)
def test_round_robin_and_least_outstanding_routing(cls):
    rr = finish(cls, make_inputs([0, 0, 0, 0], [10] * 4, [50] * 4, replicas=(2,), router=("round-robin",)))
    assert rr["replica"].tolist() == [0, 1, 0, 1]
    lo = finish(cls, make_inputs([0, 0, 0], [10] * 3, [50] * 3, replicas=(3,), router=("least-outstanding",)))
    assert sorted(lo["replica"].tolist()) == [0, 1, 2]


@pytest.mark.parametrize("cls", ENGINES)
def test_requests_wait_for_a_starting_replica_instead_of_being_rejected(cls):
    import dataclasses

    from replay.engine.common import R_ACTIVE, R_OFF, REJECT_NO_REPLICA

    inputs = dataclasses.replace(make_inputs([2_000_000, 3_000_000], [50, 50], [2, 2]),
                                 pool_initial_replicas=np.array([0]))
    engine = cls(inputs)
    engine.advance(1_000_000)
    assert engine.replica_lifecycle()[0].tolist() == [R_OFF]
    engine.start_replica(0, 5_000_000)  # ready 4 s from now
    run_to_end(engine)
    cols = engine.request_columns()
    assert cols["state"].tolist() == [FINISHED, FINISHED]
    assert cols["first_scheduled_us"][0] == 5_000_000
    assert engine.replica_lifecycle()[0].tolist() == [R_ACTIVE]
    # With nothing starting, the pool has no replica: rejected with a reason.
    idle = cls(dataclasses.replace(inputs, pool_initial_replicas=np.array([0])))
    run_to_end(idle)
    assert idle.request_columns()["reject"].tolist() == [REJECT_NO_REPLICA] * 2


@pytest.mark.parametrize("cls", ENGINES)
def test_prefix_aware_and_kv_cost_routing_find_the_cache(cls):
    rng = np.random.default_rng(5)
    n = 60
    args = (np.arange(n) * 2_000_000, rng.integers(200, 400, n), rng.integers(1, 5, n))
    kwargs = dict(families=rng.integers(0, 3, n), replicas=(3,), kv_blocks=(200,))
    hits = {}
    for name in ("round-robin", "prefix-aware", "kv-cost"):
        hits[name] = finish(cls, make_inputs(*args, router=(name,), **kwargs))["cached_tokens"].sum()
    assert hits["prefix-aware"] > hits["round-robin"] and hits["kv-cost"] > hits["round-robin"]


@pytest.mark.parametrize("cls", ENGINES)
def test_vllm_dp_sees_load_only_at_refreshes(cls):
    """A burst inside one refresh interval all lands on the replica that looked idlest."""
    import dataclasses

    inputs = make_inputs([0, 1, 2, 3], [50] * 4, [20] * 4, replicas=(2,), router=("vllm-dp",))
    stale = finish(cls, dataclasses.replace(inputs, pool_refresh_us=np.array([50_000])))
    assert stale["replica"].tolist() == [0, 0, 0, 0]
    live = finish(cls, dataclasses.replace(inputs, pool_refresh_us=np.array([1])))
    assert sorted(live["replica"].tolist()) == [0, 0, 1, 1]


@pytest.mark.parametrize("cls", ENGINES)
def test_swap_preemption_keeps_progress_and_pays_the_copy(cls):
    """Two requests that cannot both finish at once: recompute redoes the victim's prefill, swap
    copies its KV out and back at the host link's cost and keeps its progress."""
    import dataclasses

    from replay.engine.common import EV_PREEMPT, EV_SWAP_OUT

    base = make_inputs([0, 0], [150, 150], [90, 90], kv_blocks=(20,), max_batched=(512,))
    swap = dataclasses.replace(base, pool_swap=np.array([1]), pool_host_blocks=np.array([100]),
                               pool_swap_us_per_block=np.array([40]))
    no_room = dataclasses.replace(swap, pool_host_blocks=np.array([0]))
    kinds = {}
    for name, inputs in (("recompute", base), ("swap", swap), ("no_room", no_room)):
        engine = cls(inputs)
        run_to_end(engine)
        kinds[name] = engine.take_events()["kind"].tolist()
        assert np.all(engine.request_columns()["state"] == FINISHED)
    assert EV_SWAP_OUT in kinds["swap"] and EV_PREEMPT not in kinds["swap"]
    assert EV_PREEMPT in kinds["recompute"] and EV_SWAP_OUT not in kinds["recompute"]
    assert EV_SWAP_OUT not in kinds["no_room"]  # no swap space left: recompute
