"""The event buffer the kernels record into, and each replica's next event in a tournament tree.

Event order is (time_us, kind, replica): a step that ends at t is applied first, then arrivals
at t, then replicas that are free at t schedule their next step (`loop.advance_nb` walks them).
"""

from __future__ import annotations

import replay._numba_cache  # noqa: F401  (before any kernel is defined)

from numba import njit

from replay.engine.common import NO_EVENT


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
def update_event(reps, r):
    """Recompute replica r's next event after busy_until or wake changed; O(log R), and up the
    tree only as far as its winners change. A replica in a quiet run (engine/quiet.py) has the
    end of the run's last step."""
    if reps.qr_end[r] >= 0:
        reps.ekey[r] = reps.qr_end[r] * 4
    elif reps.busy_until[r] >= 0:
        reps.ekey[r] = reps.busy_until[r] * 4
    elif reps.wake[r] != NO_EVENT:
        reps.ekey[r] = reps.wake[r] * 4 + 3
    else:
        reps.ekey[r] = NO_EVENT
    leaves = reps.tree.shape[0] // 2
    i = (leaves + r) // 2
    while i >= 1:
        a = reps.tree[2 * i]
        b = reps.tree[2 * i + 1]
        # The lower replica index wins a tie: a is always left of b.
        w = a if b < 0 or (a >= 0 and reps.ekey[a] <= reps.ekey[b]) else b
        if w == reps.tree[i] and w != r:
            return  # the same winner with the same key: nothing above changes
        reps.tree[i] = w
        i //= 2


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def wake_idle(reps, r, t):
    """An idle replica that was given work schedules at t (a starting one once it is ready)."""
    if reps.busy_until[r] < 0 and reps.wake[r] == NO_EVENT:
        reps.wake[r] = max(t, reps.active_at[r])
        update_event(reps, r)

