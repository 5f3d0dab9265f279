"""Prefill/decode disaggregation: every remotely prefilled request that decodes had its KV moved
exactly once, in the time the link formula gives, and both engines agree on all of it."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings

from replay.engine.common import FINISHED
from replay.engine.reference.engine import ReferenceEngine
from replay.engine.numba_engine import NumbaEngine
from tests.differential.test_engines import assert_same
from tests.strategies import engine_inputs, make_inputs, run_to_end


def _pd_fleet(arrival, prompt, output, *, pd, replicas=(1, 1), kv_blocks=(64, 64), **kw):
    """Pool 0 prefills, pool 1 decodes; every request arrives at the decode pool."""
    two = {"block_size": (16, 16), "max_num_seqs": (8, 8), "max_batched": (512, 512), "long_prefill": (0, 0),
           "prefix_caching": (1, 1), "max_model_len": (4096, 4096), "router": ("least-outstanding",) * 2}
    pd = {"pd_prefill_pool": 0, "pd_decode_pool": 1, **pd}
    return make_inputs(arrival, prompt, output, replicas=replicas, kv_blocks=kv_blocks, pool=[1] * len(arrival),
                       pd=pd, **{**two, **kw})


def _finish(inputs):
    engine = NumbaEngine(inputs)
    run_to_end(engine, limit_us=10**11)
    assert engine.done, "bounded load: every request finishes or is rejected"
    return engine.request_columns()


@given(engine_inputs(max_requests=30, pd=True))
def test_every_decoded_request_was_transferred_once_in_the_formula_time(inputs):
    cols = _finish(inputs)
    first = inputs.pool_first_replica
    replica_pool = inputs.replica_pool
    for q in np.nonzero(cols["state"] == FINISHED)[0]:
        prefill = cols["prefill_replica"][q]
        assert replica_pool[cols["replica"][q]] == inputs.pd_decode_pool, "decoded on the decode pool"
        if prefill < 0:  # prefilled locally by its decode replica: nothing moved
            assert cols["kv_transfers"][q] == 0 and cols["kv_transfer_start_us"][q] == -1
            continue
        assert cols["kv_transfers"][q] == 1
        assert first[inputs.pd_prefill_pool] <= prefill < first[inputs.pd_prefill_pool] + inputs.pool_replicas[0]
        start, end = cols["kv_transfer_start_us"][q], cols["kv_transfer_end_us"][q]
        prefill_end = cols["prefill_end_us"][q]
        assert prefill_end <= start <= end <= cols["first_token_us"][q]
        x = math.ceil(int(inputs.prompt_tokens[q]) * inputs.pd_us_per_token)
        duration = int(end - start)
        if inputs.pd_layers == 0 or start > prefill_end:
            # serial, or the decode replica had no room when the prefill ended: nothing overlaps
            assert duration == x + inputs.pd_base_us
        else:
            # layer by layer: only what outlasts the prefill shows, and at least one layer's share
            assert math.ceil(x / inputs.pd_layers) + inputs.pd_base_us <= duration <= x + inputs.pd_base_us


@given(engine_inputs(max_requests=30, pd=True))
@settings(max_examples=60)
def test_numba_engine_matches_reference_with_prefill_decode(inputs):
    assert_same(inputs)


def test_decode_pool_full_holds_prefilled_kv_until_it_has_room():
    """One decode replica with room for one request at a time: the second prefilled request's KV
    waits on the prefill replica, then moves serially (no overlap) once the first one is done."""
    inputs = _pd_fleet([0, 0], [200, 200], [20, 20], kv_blocks=(64, 16),
                       pd={"pd_local_threshold": 0, "pd_us_per_token": 2.6, "pd_base_us": 1000, "pd_layers": 32})
    cols = _finish(inputs)
    assert (cols["state"] == FINISHED).all()
    assert (cols["kv_transfers"] == 1).all()
    waited = cols["kv_transfer_start_us"] - cols["prefill_end_us"]
    assert sorted(waited > 0) == [False, True], "one transfer had to wait for decode blocks"
    late = int(np.argmax(waited))
    assert cols["kv_transfer_start_us"][late] >= cols["finished_us"][1 - late], "room came when the first finished"
    assert cols["kv_transfer_end_us"][late] - cols["kv_transfer_start_us"][late] == math.ceil(200 * 2.6) + 1000
    assert_same(inputs)


def test_local_prefill_below_the_threshold():
    """The P/D decider: a short prompt is prefilled by its decode replica, a long one remotely."""
    inputs = _pd_fleet([0, 10], [30, 300], [5, 5],
                       pd={"pd_local_threshold": 100, "pd_us_per_token": 0.5, "pd_base_us": 0, "pd_layers": 0})
    cols = _finish(inputs)
    assert cols["prefill_replica"].tolist() == [-1, 0]
    assert cols["kv_transfers"].tolist() == [0, 1]
    assert_same(inputs)


def test_shared_prefixes_and_slow_link_on_two_replicas_per_pool():
    inputs = _pd_fleet([0, 0, 1000, 2000], [100, 250, 40, 390], [3, 9, 1, 12], families=[0, 0, 1, -1],
                       replicas=(2, 2), kv_blocks=(40, 30),
                       pd={"pd_local_threshold": 0, "pd_us_per_token": 41.9, "pd_base_us": 1000, "pd_layers": 4})
    for cls in (NumbaEngine, ReferenceEngine):
        engine = cls(inputs)
        run_to_end(engine)
        assert engine.done
    assert_same(inputs)
