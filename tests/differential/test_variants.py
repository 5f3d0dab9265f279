"""Kernel variants (replay/engine/variants.py): a run is given the least variant that has what it
uses, the plain variant replays exactly as the full one, and code behind a False flag is not
compiled at all."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from numba import njit

from replay.engine.numba_engine import NumbaEngine
from replay.engine.variants import WITH_PD, Features, at_least, features, specialise, variant_of
from tests.differential.test_closed_loop import session_trace
from tests.strategies import engine_inputs, make_inputs, run_to_end, tiny_inputs


def plain(inputs):
    """The inputs with every feature the plain variant lacks turned off."""
    zeros = np.zeros(len(inputs.pool_replicas), np.int64)
    return dataclasses.replace(inputs, pool_router=zeros, pool_queue=None, pool_victim=None, pool_admission=None,
                               adapter=None, pool_lora_slots=None, pool_lora_load_us=None, pool_spec_k=None,
                               pool_spec_credit=None, pd_prefill_pool=-1, pd_decode_pool=-1)


def _run(inputs, variant=None, lazy=True):
    engine = NumbaEngine(inputs, lazy=lazy, variant=variant)
    run_to_end(engine, tick_us=50_000, limit_us=10**11)
    return engine, (engine.take_events(), engine.request_columns(), engine.replica_state(), engine.pool_counters())


@settings(max_examples=25)
@given(engine_inputs(pd=False))
def test_the_plain_variant_replays_as_the_full_one(inputs):
    inputs = plain(inputs)
    for lazy in (True, False):
        engine, got = _run(inputs, lazy=lazy)
        assert engine.variant == "plain"
        _, want = _run(inputs, "full", lazy=lazy)
        for what, a, b in zip(("event", "request", "replica", "pool"), got, want):
            for name in b:
                np.testing.assert_array_equal(a[name], b[name], err_msg=f"{what} column {name}: plain vs full")


def _with(inputs, **changes):
    return dataclasses.replace(inputs, **changes)


def test_a_run_gets_the_variant_that_has_what_it_uses():
    base = tiny_inputs()
    one = np.ones(1, np.int64)
    assert features(base) == Features() and NumbaEngine(base).variant == "plain"
    used = {
        "pd": make_inputs([0], [40], [3], replicas=(1, 1), kv_blocks=(64, 64), block_size=(16, 16),
                          max_num_seqs=(8, 8), max_batched=(256, 256), long_prefill=(0, 0), prefix_caching=(1, 1),
                          max_model_len=(4096, 4096), router=("least-outstanding",) * 2, pool=[1],
                          pd={"pd_prefill_pool": 0, "pd_decode_pool": 1}),
        "lora": _with(base, pool_lora_slots=one, adapter=np.zeros(4, np.int64)),
        "spec": make_inputs([0], [40], [3], spec=[(2, 0.7)]),
        "sessions": session_trace([(0, [(20, 4), (30, 4)])], 1000)[1],
        "policies": make_inputs([0], [40], [3], router=("round-robin",)),
    }
    for feature, inputs in used.items():
        assert features(inputs) == Features(**{feature: True}), feature
        assert NumbaEngine(inputs).variant == "full", feature
    # a verify step's credit other than exactly one token is speculative decoding too
    credit = np.array([[900_000]], np.int64)
    assert features(_with(base, pool_spec_credit=credit)).spec
    # LoRA slots of 0 and a speculative k of 0 are off: the plain variant replays them
    assert features(_with(base, pool_lora_slots=np.zeros(1, np.int64), adapter=np.zeros(4, np.int64))) == Features()
    for name in ("queue", "victim", "admission"):
        assert features(_with(base, **{f"pool_{name}": one})).policies, name


def test_user_policies_run_the_full_variant():
    from policies import examples
    from replay.testing import with_user_policies

    inputs = with_user_policies(tiny_inputs(), examples.least_outstanding)
    assert features(inputs).user and NumbaEngine(inputs).variant == "full"


def test_at_least_raises_the_floor():
    assert variant_of(Features()) == "plain"
    with at_least("full"):
        assert variant_of(Features()) == "full"
        assert NumbaEngine(tiny_inputs()).variant == "full"
    assert variant_of(Features()) == "plain"
    with pytest.raises(ValueError, match="unknown kernel variant 'tiny'"):
        with at_least("tiny"):
            pass


@njit
def _transfer(x):
    return x + 1


@njit
def _gated(x):
    if WITH_PD and x > 0:
        return _transfer(x)
    return x


@njit
def _entry(x):
    return _gated(x) * 10


def test_code_behind_a_false_flag_is_never_compiled():
    own = specialise(_entry, "plain")
    assert own is not _entry and specialise(_entry, "full") is _entry
    assert specialise(_transfer, "plain") is _transfer  # reaches no flag: shared by every variant
    assert own(3) == 30
    assert _transfer.signatures == []  # pruned before typing
    assert _entry(3) == 40 and len(_transfer.signatures) == 1
    assert specialise(_entry, "plain") is own  # one copy per process
