"""Property-test a user's per-step policy with Hypothesis (needs `pip install 'llm-replay[test]'`).

    from hypothesis import given
    from policies.testing import check_choice, views
    from mypolicies import fewest_in_flight

    @given(views(fewest_in_flight))
    def test_fewest_in_flight(args):
        check_choice(fewest_in_flight, args)

`views(policy)` draws what the engine hands the policy: views whose values keep the engine's
own invariants (a replica's KV use within its blocks, a running request's blocks within the
replica's, row counts within the batch limits), the policy's default parameters and a state
row. `check_choice` calls the numba kernel and the plain-Python twin on copies of the same
arguments and fails unless both return the same valid choice (a row of the view, a key that
is not NaN, 0 or 1) and leave the same state. replay.testing.check_in_engines runs a policy
through both engines on generated traces.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from policies._native import compile_policy
from policies.user import (
    P_ACTIVE_REPLICAS, P_NOW_US, P_REPLICA, P_REPLICA_WAITING_TOKENS, P_WAITING, P_WAITING_TOKENS, POOL_WIDTH,
    Q_ARRIVAL_US, Q_GENERATED, Q_KV_BLOCKS, Q_OUTPUT_TOKENS, Q_PREFIX_HITS, Q_PRIORITY, Q_PROMPT_TOKENS, Q_TENANT,
    Q_TTFT_BUDGET_US, R_KV_BLOCKS, R_KV_USED, R_LIVE_RUNNING, R_LIVE_WAITING, R_PREFIX_HITS, R_REPLICA, R_RUNNING,
    R_WAITING, R_WAITING_TOKENS, REPLICA_WIDTH, REQUEST_WIDTH, UserPolicy,
)

_BLOCK = 16


@st.composite
def request_rows(draw, reads_prefix: bool = False) -> np.ndarray:
    row = np.zeros(REQUEST_WIDTH, np.int64)
    prompt = draw(st.integers(1, 32_768))
    row[Q_PROMPT_TOKENS] = prompt
    row[Q_OUTPUT_TOKENS] = output = draw(st.integers(1, 4_096))
    row[Q_PRIORITY] = draw(st.integers(0, 3))
    row[Q_TENANT] = draw(st.integers(0, 7))
    row[Q_ARRIVAL_US] = draw(st.integers(0, 10**11))
    row[Q_GENERATED] = generated = draw(st.integers(0, output - 1))
    row[Q_KV_BLOCKS] = draw(st.integers(0, -(-(prompt + generated) // _BLOCK)))
    row[Q_PREFIX_HITS] = draw(st.integers(0, (prompt - 1) // _BLOCK)) if reads_prefix else 0
    row[Q_TTFT_BUDGET_US] = draw(st.sampled_from([500_000, 2_000_000, 10_000_000]))
    return row


@st.composite
def replica_rows(draw, reads_prefix: bool = False, max_rows: int = 16) -> np.ndarray:
    n = draw(st.integers(1, max_rows))
    rows = np.zeros((n, REPLICA_WIDTH), np.int64)
    picked = sorted(draw(st.lists(st.integers(0, 63), min_size=n, max_size=n, unique=True)))
    for k in range(n):
        blocks = draw(st.integers(16, 100_000))
        rows[k, R_REPLICA] = picked[k]
        rows[k, R_KV_BLOCKS] = blocks
        rows[k, R_KV_USED] = draw(st.integers(0, blocks))
        rows[k, R_WAITING], rows[k, R_LIVE_WAITING] = draw(st.integers(0, 500)), draw(st.integers(0, 500))
        rows[k, R_RUNNING], rows[k, R_LIVE_RUNNING] = draw(st.integers(0, 256)), draw(st.integers(0, 256))
        rows[k, R_WAITING_TOKENS] = rows[k, R_LIVE_WAITING] * draw(st.integers(1, 8_192))
        rows[k, R_PREFIX_HITS] = draw(st.integers(0, 2_048)) if reads_prefix else 0
    return rows


@st.composite
def pool_rows(draw) -> np.ndarray:
    row = np.zeros(POOL_WIDTH, np.int64)
    row[P_ACTIVE_REPLICAS] = active = draw(st.integers(1, 64))
    row[P_WAITING] = waiting = draw(st.integers(0, 10_000))
    row[P_WAITING_TOKENS] = waiting * draw(st.integers(0, 8_192))
    row[P_REPLICA] = draw(st.integers(0, active - 1))
    row[P_REPLICA_WAITING_TOKENS] = draw(st.integers(0, int(row[P_WAITING_TOKENS])))
    row[P_NOW_US] = draw(st.integers(0, 10**11))
    return row


def views(policy: UserPolicy, max_rows: int = 16) -> st.SearchStrategy[tuple]:
    """The arguments the engine calls `policy` with, drawn within the engine's invariants."""
    params = np.array(list(policy.params.values()) or [0.0], np.float64)
    state = st.just(np.zeros(max(1, policy.state), np.int64))
    if policy.family == "router":
        return st.tuples(replica_rows(policy.reads_prefix, max_rows), request_rows(), st.just(params), state)
    if policy.family == "queue order":
        return st.tuples(request_rows(policy.reads_prefix), st.just(params), state)
    if policy.family == "preemption victim":
        batch = st.integers(1, max_rows).flatmap(
            lambda n: st.tuples(st.lists(request_rows(), min_size=n, max_size=n).map(np.stack), st.integers(0, n - 1)))
        return st.tuples(batch, st.just(params), state).map(lambda t: (t[0][0], t[0][1], t[1], t[2]))
    return st.tuples(pool_rows(), request_rows(), st.just(params), state)


def _frozen(args: tuple) -> tuple:
    out = []
    for i, a in enumerate(args):
        if isinstance(a, np.ndarray):
            a = a.copy()
            if i < len(args) - 1:  # every array but the state is read-only to the policy
                a.flags.writeable = False
        out.append(a)
    return tuple(out)


def check_choice(policy: UserPolicy, args: tuple) -> Any:
    """Run the kernel and the twin on copies of `args`; fail unless both return the same valid
    choice and leave the same state. Returns the choice."""
    compile_policy(policy)  # a kernel that does not compile for its signature fails here, clearly
    kernel_args, twin_args = _frozen(args), _frozen(args)
    got = policy.kernel(*kernel_args)
    want = policy.reference(*twin_args)
    if policy.family == "queue order":
        assert not np.isnan(got), f"{policy.name}: the kernel returned NaN"
        assert np.isclose(float(got), float(want), rtol=1e-12, atol=0), \
            f"{policy.name}: kernel {got!r} != twin {want!r}"
    else:
        assert int(got) == int(want), f"{policy.name}: kernel {got!r} != twin {want!r}"
        limit = 2 if policy.family == "admission" else args[0].shape[0]
        assert 0 <= int(got) < limit, f"{policy.name}: returned {got}, expected 0 .. {limit - 1}"
    assert np.array_equal(kernel_args[-1], twin_args[-1]), \
        f"{policy.name}: the kernel left state {kernel_args[-1]}, the twin {twin_args[-1]}"
    return got
