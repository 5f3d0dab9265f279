"""What the reference engine hands the user-policy links' twins (policies/*/user.py `reference`):
per family a UserCall whose `addr` holds each pool's UserPolicy (None: none), and the request
columns a request row is filled from (the twin of engine/numba_engine.user_calls)."""

from __future__ import annotations

import contextlib

import numpy as np

from replay.engine.common import EngineInputs
from replay.engine.reference.state import Column
from policies._userview import RequestColumns, UserCall, UserPolicyFailed

USER_FAMILIES = ("router", "queue order", "preemption victim", "admission")


def user_call(inputs: EngineInputs, family: str) -> UserCall:
    table = inputs.user
    npool = len(inputs.pool_replicas)
    first = [int(x) for x in inputs.pool_first_replica]
    if table is None:
        return UserCall([None] * npool, np.zeros((npool, 1)), np.zeros((npool, 1), np.int64), None, None, None, first)
    return UserCall(table.policies(family), table.params(family), table.state(family), None, None, None, first)


def request_columns(reqs: list, inputs: EngineInputs) -> RequestColumns:
    tenants = inputs.tenants
    return RequestColumns(
        prompt=Column(reqs, lambda r: r.prompt_tokens), output=Column(reqs, lambda r: r.output_tokens),
        priority=Column(reqs, lambda r: r.priority), tenant=Column(reqs, lambda r: int(tenants[r.index])),
        arrival=Column(reqs, lambda r: r.arrival_us), generated=Column(reqs, lambda r: r.generated),
        nblocks=Column(reqs, lambda r: len(r.blocks)),
        ttft_budget=[int(x) for x in inputs.per_pool("ttft_budget_us", 2_000_000)])


@contextlib.contextmanager
def user_code(inputs: EngineInputs):
    """A user's policy that raised or chose badly ends the run with an error naming it."""
    try:
        yield
    except UserPolicyFailed as exc:
        raise inputs.user.error(exc.family, exc.pool, str(exc)) from None
