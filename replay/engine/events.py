"""The event buffer the kernels record into; each replica's next event, and each pool's least
loaded replica, in tournament trees.

Event order is (time_us, kind, replica): a step that ends at t is applied first, then arrivals
at t, then replicas that are free at t schedule their next step (`loop.advance_nb` walks them).
"""

from __future__ import annotations

import replay._numba_cache  # noqa: F401  (before any kernel is defined)

from numba import njit

from replay.engine.common import NO_EVENT, R_ACTIVE, R_STARTING


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def record(ev, t, kind, replica, request, value):
    n = ev.clock[1]
    ev.t[n] = t
    ev.kind[n] = kind
    ev.replica[n] = replica
    ev.request[n] = request
    ev.value[n] = value
    ev.clock[1] = n + 1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def tree_set(keys, wins, base, leaves, slot, key):
    """Leaf `slot` of the tournament tree whose node j is keys/wins[base + j] (1 the root, leaves
    at leaves .. 2 * leaves - 1, each holding its own id, -1 pads with NO_EVENT) now has `key`:
    every node holds its subtree's least key and whose it is, the left one on ties (the lower
    id). Up the tree only as far as a node changes; nothing at all when the key did not (a
    node's key beside its winner: a level reads two adjacent keys, not two ids then their keys,
    and stops as soon as a node's (key, winner) comes out as it was). Which child wins is an
    add, not a branch: the branch was mispredicted about half the time, at every level (a
    microbenchmark of a fleet's step ends: 23-40 -> 18 ns an update)."""
    i = leaves + slot
    if keys[base + i] == key:
        return
    keys[base + i] = key
    i //= 2
    while i >= 1:
        a = base + 2 * i
        a += keys[a + 1] < keys[a]  # the right child only when strictly less
        k = keys[a]
        w = wins[a]
        node = base + i
        if k == keys[node] and w == wins[node]:
            return
        keys[node] = k
        wins[node] = w
        i //= 2


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def update_event(reps, r):
    """Recompute replica r's next event after busy_until or wake changed, in the tree of every
    replica's (reps.ekey, reps.tree: its root, node 1, is the earliest event; O(log R)). Its
    key is time * 4 + kind (0 a step end, 3 a wake-up), NO_EVENT for none. A replica in a quiet
    run (engine/quiet.py) has the end of the run's last step."""
    if reps.qr_end[r] >= 0:
        key = reps.qr_end[r] * 4
    elif reps.busy_until[r] >= 0:
        key = reps.busy_until[r] * 4
    elif reps.wake[r] != NO_EVENT:
        key = reps.wake[r] * 4 + 3
    else:
        key = NO_EVENT
    tree_set(reps.ekey, reps.tree, 0, reps.tree.shape[0] // 2, r, key)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def wake_idle(reps, r, t):
    """An idle replica that was given work schedules at t (a starting one once it is ready)."""
    if reps.busy_until[r] < 0 and reps.wake[r] == NO_EVENT:
        reps.wake[r] = max(t, reps.active_at[r])
        update_event(reps, r)


# --- each pool's least loaded active replica, for the routers (RouterView.least) -------------
# Perf showed the per-arrival scans over every replica of a pool (up to max_replicas, most of
# them off) at ~9% of a day's kernel: least-outstanding's, and the engine's own to promote the
# starting replicas and count the active ones. The pool's tree (Replicas.ll_key/ll_win, at
# Pools.ll_off) keys each replica by its live waiting + running requests, NO_EVENT when it is
# not active; `least_set` keeps a replica's leaf current after whatever may change its counts
# (a request queued on it, one of its steps scheduled or ended, a KV transfer to it), and the
# host's changes between kernel calls (replicas started, drained, stopped, reset) are taken in
# by `least_rebuild` at each kernel entry. Starting replicas become active at the first route
# after their loading ends, as before (`promote_due`, only when one is due).


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def least_set(reps, pools, r):
    """Replica r's leaf in its pool's tree, after its waiting/running counts or state changed."""
    p = reps.pool[r]
    key = reps.nwait[r] + reps.nrun[r] if reps.state[r] == R_ACTIVE else NO_EVENT
    tree_set(reps.ll_key, reps.ll_win, pools.ll_off[p], pools.ll_leaves[p], r - pools.first_replica[p], key)


@njit(cache=True, _nrt=False, forceinline=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def least_rebuild(reps, pools):
    """Every pool's tree, active count and next starting replica's ready time, from scratch: at a
    kernel's entry, after the host may have changed replicas' states or counts. O(replicas)."""
    for p in range(pools.first_replica.shape[0]):
        first = pools.first_replica[p]
        n = pools.num_replicas[p]
        base = pools.ll_off[p]
        leaves = pools.ll_leaves[p]
        active = 0
        due = NO_EVENT
        for k in range(leaves):
            i = base + leaves + k
            reps.ll_key[i] = NO_EVENT
            reps.ll_win[i] = -1
            if k < n:
                r = first + k
                reps.ll_win[i] = r
                if reps.state[r] == R_ACTIVE:
                    reps.ll_key[i] = reps.nwait[r] + reps.nrun[r]
                    active += 1
                elif reps.state[r] == R_STARTING:
                    due = min(due, reps.active_at[r])
        for j in range(leaves - 1, 0, -1):
            a = base + 2 * j
            if reps.ll_key[a + 1] < reps.ll_key[a]:
                a += 1
            reps.ll_key[base + j] = reps.ll_key[a]
            reps.ll_win[base + j] = reps.ll_win[a]
        pools.nactive[p] = active
        pools.start_due[p] = due


@njit(cache=True, _nrt=False, forceinline=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def promote_now(reps, pools, p, t):
    """Every starting replica of pool p whose loading has finished by t becomes active."""
    due = NO_EVENT
    for r in range(pools.first_replica[p], pools.first_replica[p] + pools.num_replicas[p]):
        if reps.state[r] == R_STARTING:
            if reps.active_at[r] <= t:
                reps.state[r] = R_ACTIVE
                pools.nactive[p] += 1
                least_set(reps, pools, r)
            else:
                due = min(due, reps.active_at[r])
    pools.start_due[p] = due


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def promote_due(reps, pools, p, t):
    """Before a route at t: the starting replicas of pool p that are ready by then are active."""
    if pools.start_due[p] <= t:
        promote_now(reps, pools, p, t)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def least_of(reps, pools, p):
    """Pool p's active replica with the fewest waiting + running requests now (the lowest index
    on ties), -1 if none is active."""
    root = pools.ll_off[p] + 1
    return reps.ll_win[root] if reps.ll_key[root] != NO_EVENT else -1
