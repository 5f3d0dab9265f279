"""user: the pool's router is a user's policy (policies/user.py), called through its address.

Not a name a config gives: a config's `router: "module:function"` (or an installed entry
point) selects it. The link fills the view the user's kernel reads, one row per replica that
may take the request (policies.user.REPLICA_COLUMNS) and the request's row, calls the kernel
and checks its choice: a row out of range ends the run with an error naming the policy.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from policies._native import call_router
from policies._userview import (
    F_ROUTER, bad_choice_nb, call_twin, called_nb, check_choice, fill_request_nb, read_only, request_row,
)
from policies.routers._view import R_ACTIVE, RouterView, active_replicas, nth_active_nb
from policies.user import (
    R_KV_BLOCKS, R_KV_USED, R_LIVE_RUNNING, R_LIVE_WAITING, R_PREFIX_HITS, R_REPLICA, R_RUNNING, R_WAITING,
    R_WAITING_TOKENS, REPLICA_WIDTH,
)

Params = None
READS_VIEW = True  # a user's router may read the scraped columns
SPECS = ()  # selected by a "module:function" router, never by name


def reads_prefix(prm) -> bool:
    """The engines' router-parameter row of a user router holds one flag: it reads prefix hits."""
    return bool(prm[0])


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def kernel(v, p, first, n, active, need, prm):
    u = v.user
    rows = u.rows
    hits = prm[0] != 0
    k = 0
    for r in range(first, first + n):
        if v.state[r] == R_ACTIVE:
            rows[k, R_REPLICA] = r - first
            rows[k, R_WAITING] = v.wait[r]
            rows[k, R_RUNNING] = v.run[r]
            rows[k, R_KV_USED] = v.kv[r]
            rows[k, R_KV_BLOCKS] = v.blocks[r]
            rows[k, R_LIVE_WAITING] = v.live_wait[r]
            rows[k, R_LIVE_RUNNING] = v.live_run[r]
            rows[k, R_WAITING_TOKENS] = v.wait_tokens[r]
            rows[k, R_PREFIX_HITS] = v.hits[r] if hits else 0
            k += 1
    fill_request_nb(u.req, v.req, v.q, p, 0)
    called_nb(u.err, F_ROUTER, p)
    choice = call_router(u.addr[p], rows[:k], u.req, u.params[p], u.state[p])
    if choice < 0 or choice >= k:
        bad_choice_nb(u.err, choice, k)
        return -1
    return nth_active_nb(v, first, n, choice)


def reference(v: RouterView, p: int, first: int, n: int, active: int, need: int, prm) -> int:
    u = v.user
    replicas = active_replicas(v, first, n)
    rows = np.zeros((len(replicas), REPLICA_WIDTH), np.int64)
    for k, r in enumerate(replicas):
        rows[k] = (r - first, v.wait[r], v.run[r], v.kv[r], v.blocks[r], v.live_wait[r], v.live_run[r],
                   v.wait_tokens[r], v.hits[r] if prm[0] else 0)
    policy = u.addr[p]
    choice = call_twin(F_ROUTER, p, policy.reference, read_only(rows), request_row(v.req, v.q, p, 0),
                       read_only(u.params[p].copy()), u.state[p])
    check_choice(F_ROUTER, p, choice, len(replicas))
    return replicas[int(choice)]
