"""Closed-loop sessions: a session's next turn is released when the engine ends the previous one
(finished or rejected), plus that turn's gap, through a min-heap of releases by (time, request).

The host (replay/fleet/sessions.py) gives every later turn of a session its gap (the client's
think time, plus the serving terms around it) and every turn its successor. With no session in
closed loop, `Pools.cl[0]` is 0 and none of this runs: the loop walks `Requests.arrival` in
index order as before. The reference engine's twin is reference/sessions.py.
"""

from __future__ import annotations

import replay._numba_cache  # noqa: F401  (before any kernel is defined)

from numba import njit

from replay.engine.common import NO_EVENT
from replay.engine.queues import heap_pop, heap_push
from replay.engine.variants import WITH_SESSIONS

# Pools.cl: [0] 1 in closed-loop runs, [1] releases in the heap.
CL_ON, CL_SIZE = 0, 1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def rheap_push(pools, t, q):
    heap_push(pools.rl_t, pools.rl_q, pools.cl[CL_SIZE], t, q)
    pools.cl[CL_SIZE] += 1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def rheap_pop(pools):
    """Remove the earliest release; the caller read it at rl_t[0], rl_q[0]."""
    heap_pop(pools.rl_t, pools.rl_q, pools.cl[CL_SIZE])
    pools.cl[CL_SIZE] -= 1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def release_next(rq, pools, q, t):
    """Request q ended at t: its session's next turn arrives after its gap. A rejected turn
    continues its session too, as a chat client shows the error and its user goes on."""
    s = rq.next_turn[q]
    if s >= 0:
        rq.arrival[s] = t + rq.gap[s]
        rheap_push(pools, rq.arrival[s], s)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def skip_released(rq, pools, a):
    """The next request index the arrival walk takes: later turns of sessions arrive through the
    release heap, not at their recorded time."""
    if WITH_SESSIONS and pools.cl[CL_ON] != 0:
        n = rq.arrival.shape[0]
        while a < n and rq.gap[a] >= 0:
            a += 1
    return a


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def next_arrival(rq, pools, a):
    """(time, request) of the next arrival: request a of the walk, or the release heap's first
    when it is earlier (a tie goes to the lower request index, as the reference's event heap)."""
    t = rq.arrival[a] if a < rq.arrival.shape[0] else NO_EVENT
    if WITH_SESSIONS and pools.cl[CL_SIZE] > 0 and (pools.rl_t[0] < t or (pools.rl_t[0] == t and pools.rl_q[0] < a)):
        return pools.rl_t[0], pools.rl_q[0]
    return t, a
