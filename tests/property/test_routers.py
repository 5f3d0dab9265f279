"""Every router returns an active replica of the request's pool, never a starting, draining or
stopped one, and -1 only when the pool has no active replica."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from numba import njit

from replay.engine import events, routing
from replay.engine.common import R_ACTIVE, R_DRAINING, R_OFF, R_STARTING
from replay.engine.numba_engine import NumbaEngine
from tests.strategies import make_inputs, routers

# The engine's inner kernels have no Python entry (no_cpython_wrapper, see replay/engine/loop.py):
# the test calls a copy of `route` that has one.
route = njit(_nrt=False)(routing.route.py_func)
least_rebuild = njit(_nrt=False)(events.least_rebuild.py_func)
STATES = st.sampled_from([R_OFF, R_STARTING, R_ACTIVE, R_DRAINING])


@given(
    router=routers(),
    pools=st.integers(1, 3),
    data=st.data(),
)
def test_routers_pick_an_active_replica_of_the_pool(router, pools, data):
    replicas = tuple(data.draw(st.integers(1, 5)) for _ in range(pools))
    per_pool = {key: (value,) * pools for key, value in dict(
        kv_blocks=64, block_size=16, max_num_seqs=8, max_batched=256, long_prefill=0, prefix_caching=1,
        max_model_len=4096, router=router).items()}
    inputs = make_inputs([0], [data.draw(st.integers(1, 300))], [5], families=[0], replicas=replicas, **per_pool)
    engine = NumbaEngine(inputs)
    reps, pools_nt = engine.reps, engine.pools
    nrep = len(reps.state)
    now = 1_000_000
    for r in range(nrep):
        reps.state[r] = data.draw(STATES)
        reps.active_at[r] = data.draw(st.sampled_from([0, now, now + 1]))
        reps.nwait[r] = reps.view_wait[r] = data.draw(st.integers(0, 50))
        reps.nrun[r] = data.draw(st.integers(0, 8))
        reps.view_run[r] = data.draw(st.integers(0, 50))
        reps.view_kv[r] = data.draw(st.integers(0, 64))
    least_rebuild(reps, pools_nt)  # as at a kernel's entry, after the host set the states
    before = reps.state.copy()
    ready = (before == R_ACTIVE) | ((before == R_STARTING) & (reps.active_at <= now))
    for p in range(pools):
        lo = pools_nt.first_replica[p]
        hi = lo + pools_nt.num_replicas[p]
        r = route(engine.rq, engine.blocks, reps, pools_nt, engine.th, engine.tbs, p, 0, now)
        if not ready[lo:hi].any():
            assert r == -1
        else:
            assert lo <= r < hi, (r, lo, hi)
            assert ready[r] and reps.state[r] == R_ACTIVE
            if router == "least-outstanding":  # the engine's tree (events.py) gives the scan's pick
                load = reps.nwait + reps.nrun
                assert r == min(np.flatnonzero(ready[lo:hi]) + lo, key=lambda x: load[x])
    # Nothing else changed state: only starting replicas whose loading is done became active.
    changed = before != reps.state
    assert np.all(before[changed] == R_STARTING) and np.all(reps.state[changed] == R_ACTIVE)
