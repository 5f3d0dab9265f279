"""Users' per-step policies (policies/user.py) through both engines: the numba kernel called by
address in one, its plain-Python twin in the other, with identical outputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings

from policies import examples
from policies._dispatch import UnknownPolicyId
from policies.registry import ADMISSION_MODULES, QUEUE_MODULES, ROUTER_MODULES, VICTIM_MODULES
from replay.engine.reference.engine import ReferenceEngine
from replay.engine.numba_engine import NumbaEngine
from tests.strategies import run_to_end
from common.errors import UserError
from replay.testing import check_in_engines, fleets, with_user_policies
from tests.differential.test_engines import _run
from tests.differential.test_policies import busy_inputs


@settings(max_examples=30, deadline=None)
@given(fleets(router=examples.least_waiting_tokens, queue_order=examples.shortest_job,
              victim=examples.fewest_blocks, admission=examples.cap_long_prompts))
def test_the_example_policies_match_their_twins_in_the_engines(inputs):
    check_in_engines(inputs)


def test_every_example_changes_the_replay_and_matches_its_twin():
    """On a busy scenario each example policy decides something (outputs differ from the
    built-in default) and both engines agree."""
    rng = np.random.default_rng(3)
    base = busy_inputs("least-outstanding", kv_blocks=(40,), priority=rng.integers(0, 3, 90))
    _, default, _, _ = _run(NumbaEngine, base)
    capped = dataclasses.replace(examples.cap_long_prompts, params={"max_prompt_tokens": 200.0, "max_waiting": 1.0})
    for policy in (examples.least_waiting_tokens, examples.shortest_job, examples.fewest_blocks, capped):
        inputs = with_user_policies(base, policy)
        _, requests, _, _ = _run(NumbaEngine, inputs)
        changed = any(not np.array_equal(requests[k], default[k]) for k in default)
        assert changed, f"{policy.name} changed nothing"
        check_in_engines(inputs)


def test_a_user_router_with_built_in_logic_replays_as_the_built_in():
    """examples.least_outstanding is the built-in least-outstanding written as a user's: the
    same choices, so the same replay, event for event."""
    base = busy_inputs("least-outstanding")
    built_in = _run(NumbaEngine, base)
    user = _run(NumbaEngine, with_user_policies(base, examples.least_outstanding))
    for a, b in zip(built_in[:2], user[:2]):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_a_policy_state_is_its_own_and_persists():
    """least_waiting_tokens counts the requests it routed in its state row."""
    inputs = with_user_policies(busy_inputs("least-outstanding"), examples.least_waiting_tokens)
    engine = NumbaEngine(inputs)
    engine.advance(10**10)
    assert int(engine.pools.u_router.state[0, 0]) == len(inputs.arrival_us)


def _bad_policies():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "fixtures" / "plugins" / "bad_policies.py"
    spec = importlib.util.spec_from_file_location("bad_policies_engine_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("cls", [NumbaEngine, ReferenceEngine])
def test_a_victim_out_of_range_stops_the_run_naming_the_policy(cls):
    rng = np.random.default_rng(3)
    inputs = with_user_policies(busy_inputs("least-outstanding", kv_blocks=(40,), priority=rng.integers(0, 3, 90)),
                                _bad_policies().minus_one)
    with pytest.raises(UserError, match=r"^pools\[0\]\.preemption\.victim: the preemption victim 'minus_one' "
                                        r"returned -1, expected a row of the running batch \(0 \.\. \d+\)$"):
        run_to_end(cls(inputs))


@pytest.mark.parametrize("cls", [NumbaEngine, ReferenceEngine])
@pytest.mark.parametrize("column, modules", [("pool_router", ROUTER_MODULES), ("pool_queue", QUEUE_MODULES),
                                             ("pool_victim", VICTIM_MODULES), ("pool_admission", ADMISSION_MODULES)])
def test_the_user_link_without_a_user_policy_is_an_unknown_id(cls, column, modules):
    """The id of a family's user link with no compiled policy behind it never calls address 0."""
    inputs = dataclasses.replace(busy_inputs("round-robin"), **{column: np.array([len(modules) - 1])})
    with pytest.raises(UnknownPolicyId, match=f"id {len(modules) - 1} has no policy"):
        run_to_end(cls(inputs))
