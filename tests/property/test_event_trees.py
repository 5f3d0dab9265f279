"""The engine's tournament trees (replay/engine/events.py) against brute force: after any
sequence of leaf updates every node holds its subtree's least key and the lowest leaf that has
it; and each pool's least loaded replica, kept through the changes a replay makes (requests
queued and finishing, replicas started, promoted, drained), is the one a scan of the pool finds.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from numba import njit

from replay.engine import events
from replay.engine.common import NO_EVENT, R_ACTIVE, R_DRAINING, R_OFF, R_STARTING
from replay.engine.numba_engine import NumbaEngine
from tests.strategies import make_inputs

# The engine's inner kernels have no Python entry (no_cpython_wrapper, see replay/engine/loop.py):
# the test calls copies of the same functions that have one.
tree_set, least_set, least_rebuild, promote_due, least_of = (
    njit(_nrt=False)(f.py_func) for f in (events.tree_set, events.least_set, events.least_rebuild,
                                          events.promote_due, events.least_of))
KEYS = st.one_of(st.integers(0, 6), st.just(NO_EVENT))  # few distinct keys: many ties


def check_tree(keys, wins, base, leaves, n, first=0):
    """Every node of the tree is the (least key, lowest leaf with it) of the leaves under it
    (leaf k holds id first + k)."""
    for j in range(1, 2 * leaves):
        lo, width = j, 1
        while lo < leaves:
            lo, width = 2 * lo, 2 * width
        under = [(keys[base + i], i - leaves) for i in range(lo, lo + width)]
        key, slot = min(under)
        assert keys[base + j] == key, (j, under)
        if key != NO_EVENT or slot < n:  # no key at all: the left-most leaf's, a real one if any is
            assert wins[base + j] == first + slot, (j, under)


@given(n=st.integers(1, 20), base=st.integers(0, 3), updates=st.lists(st.tuples(st.integers(0, 19), KEYS), max_size=60))
def test_tree_set_keeps_every_node_the_least_of_its_leaves(n, base, updates):
    leaves = 1 << max(n - 1, 0).bit_length()
    keys = np.full(base + 2 * leaves, NO_EVENT, np.int64)
    wins = np.full(base + 2 * leaves, -1, np.int64)
    wins[base + leaves:base + leaves + n] = np.arange(n)
    for j in range(leaves - 1, 0, -1):
        wins[base + j] = wins[base + 2 * j]
    for slot, key in updates:
        tree_set(keys, wins, base, leaves, slot % n, key)
        check_tree(keys, wins, base, leaves, n)


def scan_least(reps, first, n):
    """least-outstanding's reference: the active replica with the fewest waiting + running."""
    active = [r for r in range(first, first + n) if reps.state[r] == R_ACTIVE]
    return min(active, key=lambda r: reps.nwait[r] + reps.nrun[r]) if active else -1


CHANGES = st.tuples(st.sampled_from(["wait", "run", "state", "promote", "rebuild"]), st.integers(0, 99),
                    st.integers(-2, 3), st.sampled_from([R_OFF, R_STARTING, R_ACTIVE, R_DRAINING]))


@given(replicas=st.lists(st.integers(1, 9), min_size=1, max_size=3), changes=st.lists(CHANGES, max_size=50))
def test_each_pools_least_loaded_replica_is_the_scans(replicas, changes):
    pools = len(replicas)
    engine = NumbaEngine(make_inputs([0], [10], [5], replicas=tuple(replicas), **{
        key: (value,) * pools for key, value in dict(kv_blocks=64, block_size=16, max_num_seqs=8, max_batched=256,
                                                    long_prefill=0, prefix_caching=1, max_model_len=4096,
                                                    router="least-outstanding").items()}))
    reps, pl = engine.reps, engine.pools
    nrep = len(reps.state)
    least_rebuild(reps, pl)
    now = 0
    for what, r, delta, state in changes:
        r %= nrep
        now += 1
        if what == "wait":  # a request queued or admitted: the engine refreshes r's leaf after it
            reps.nwait[r] = max(0, reps.nwait[r] + delta)
            least_set(reps, pl, r)
        elif what == "run":
            reps.nrun[r] = max(0, reps.nrun[r] + delta)
            least_set(reps, pl, r)
        elif what == "promote":  # a route at `now`: starting replicas ready by then are active
            promote_due(reps, pl, reps.pool[r], now)
        else:  # the host changes a replica between kernel calls; the next call's entry rebuilds
            if what == "state":
                reps.state[r] = state
                reps.active_at[r] = now + delta
            least_rebuild(reps, pl)
        for p in range(pools):
            first, n = pl.first_replica[p], pl.num_replicas[p]
            check_tree(reps.ll_key, reps.ll_win, pl.ll_off[p], pl.ll_leaves[p], n, first)
            assert pl.nactive[p] == sum(reps.state[x] == R_ACTIVE for x in range(first, first + n))
            starting = [reps.active_at[x] for x in range(first, first + n) if reps.state[x] == R_STARTING]
            assert pl.start_due[p] == min(starting, default=NO_EVENT)
            assert least_of(reps, pl, p) == scan_least(reps, first, n), (p, what)
