"""Property-test a user's per-step policy inside both engines (needs `pip install 'llm-replay[test]'`).

    from hypothesis import given, settings
    from replay.testing import check_in_engines, fleets
    from mypolicies import fewest_in_flight

    @settings(max_examples=25, deadline=None)
    @given(fleets(router=fewest_in_flight))
    def test_fewest_in_flight_in_the_engines(inputs):
        check_in_engines(inputs)

`fleets(...)` draws small fleets under pressure (few KV blocks and batch slots, bursts,
shared prefixes, priorities and tenants) with the given user policies on every pool;
`check_in_engines` replays one through the numba engine and the reference engine (the
policy's kernel in one, its twin in the other) and fails unless their event logs, request
rows and counters are identical and every request ended: finished, or rejected with a reason.
A policy that raises or makes an invalid choice fails with the error a run would give.
policies.testing checks one call at a time.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from hypothesis import strategies as st

from policies.registry import ADMISSION_MODULES, QUEUE_MODULES, ROUTER_MODULES, VICTIM_MODULES, router_columns
from policies.user import UserPolicy
from policies.user_config import UserChoice, UserTable
from replay.engine.common import EngineInputs
from replay.engine.reference.engine import ReferenceEngine
from replay.model.stepmodel import StepShape, step_params
from replay.engine.numba_engine import NumbaEngine

# A llama-3.1-8b-like replica on one H100: steps take realistic time.
_STEP = step_params(StepShape(8.0e9, 32, 32, 128, 4096, 1, 16.0e9, 131072.0, 989e12, 3.35e12, 450e9))
_COLUMNS = {"router": ("pool_router", ROUTER_MODULES), "queue order": ("pool_queue", QUEUE_MODULES),
            "preemption victim": ("pool_victim", VICTIM_MODULES), "admission": ("pool_admission", ADMISSION_MODULES)}
_KEYS = {"router": "router", "queue order": "engine.scheduling_policy", "preemption victim": "preemption.victim",
         "admission": "admission.policy"}


def with_user_policies(inputs: EngineInputs, *policies: UserPolicy | UserChoice) -> EngineInputs:
    """`inputs` with every pool running the given user policies (one per family; a UserPolicy
    runs with its default parameters)."""
    npool = len(inputs.pool_replicas)
    choices: dict[str, tuple[UserChoice | None, ...]] = {f: (None,) * npool for f in _COLUMNS}
    changes: dict[str, Any] = {}
    for policy in policies:
        choice = policy if isinstance(policy, UserChoice) else UserChoice(
            dataclasses.replace(policy, name=policy.name or "policy"), tuple(policy.params.values()))
        family = choice.policy.family
        column, modules = _COLUMNS[family]
        choices[family] = (choice,) * npool
        changes[column] = np.full(npool, len(modules) - 1, np.int64)  # the family's `user` link
        if family == "router":
            rows = np.zeros_like(inputs.router_params)
            rows[:, 0] = choice.row()[0]
            changes["pool_router_params"] = rows
    keys = {f: tuple(f"pools[{p}].{_KEYS[f]}" for p in range(npool)) for f in _COLUMNS}
    return dataclasses.replace(inputs, user=UserTable(choices, keys), **changes)


@st.composite
def fleets(draw, *, router: Any = None, queue_order: Any = None, victim: Any = None, admission: Any = None,
           max_requests: int = 40) -> EngineInputs:
    """A small pool under pressure running the given user policies (built-ins elsewhere)."""
    n = draw(st.integers(1, max_requests))
    ints = lambda lo, hi: draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))  # noqa: E731
    prompt = np.array(ints(1, 400), np.int64)
    families = ints(-1, 2)
    hash_len = np.array([-(-int(p) // 32) if f >= 0 else 0 for p, f in zip(prompt, families)], np.int64)
    hashes = [f * 1000 + k if k < 3 else 10**6 + i * 1000 + k
              for i, f in enumerate(families) for k in range(int(hash_len[i]))]
    replicas = draw(st.integers(1, 3))
    tenant = np.array(ints(0, 2), np.int64)
    router_ids, router_rows = router_columns(["least-outstanding"])
    inputs = EngineInputs(
        arrival_us=np.cumsum(ints(0, 60_000)).astype(np.int64), prompt_tokens=prompt,
        output_tokens=np.array(ints(1, 40), np.int64), priority=np.array(ints(0, 2), np.int64),
        pool=np.zeros(n, np.int64), hash_off=(np.cumsum(hash_len) - hash_len).astype(np.int64), hash_len=hash_len,
        trace_hashes=np.array(hashes, np.uint64), trace_block_tokens=32,
        pool_replicas=np.array([replicas]), pool_kv_blocks=np.array([draw(st.integers(30, 80))]),
        pool_block_size=np.array([16]), pool_max_num_seqs=np.array([draw(st.integers(1, 8))]),
        pool_max_num_batched_tokens=np.array([draw(st.integers(64, 512))]),
        pool_long_prefill_token_threshold=np.array([0]), pool_enable_prefix_caching=np.array([1]),
        pool_max_model_len=np.array([4096]), pool_router=router_ids, pool_router_params=router_rows,
        pool_step_params=np.stack([_STEP]), detailed_events=True, tenant=tenant, num_tenants=3,
    )
    return with_user_policies(inputs, *(p for p in (router, queue_order, victim, admission) if p is not None))


def _replay(cls: type, inputs: EngineInputs) -> tuple[dict, dict, dict]:
    engine = cls(inputs)
    t = 0
    while not engine.done and t < 10**10:
        t += 1_000_000
        engine.advance(t)
    assert engine.done, f"{cls.__name__}: requests left unfinished after {t / 1e6:.0f} s of simulated time"
    return engine.take_events(), engine.request_columns(), engine.pool_counters()


def check_in_engines(inputs: EngineInputs) -> None:
    """Replay `inputs` through both engines; fail unless their outputs are identical and every
    request finished or was rejected with a reason."""
    got, want = _replay(NumbaEngine, inputs), _replay(ReferenceEngine, inputs)
    for what, a, b in zip(("event", "request", "pool"), got, want):
        for name in b:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"{what} column {name}: numba vs reference")
    requests = got[1]
    ended = (requests["finished_us"] >= 0) | (requests["reject"] > 0)
    assert ended.all(), f"{int((~ended).sum())} requests neither finished nor rejected"
