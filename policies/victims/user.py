"""user: the pool's preemption victim is a user's policy (policies/user.py), called through its address.

Selected by a config's `preemption.victim: "module:function"` (or an installed entry point),
never by name. The link fills one request row per running request of the replica (its
running batch, in scheduling order) and calls the kernel with the row being scheduled; a row
out of range ends the run with an error naming the policy.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from policies._native import call_victim
from policies._userview import (
    F_VICTIM, bad_choice_nb, call_twin, called_nb, check_choice, fill_request_nb, read_only, request_row,
)
from policies.user import REQUEST_WIDTH
from policies.victims._view import VictimView

SPECS = ()


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def kernel(v, off, nrun, i):
    u = v.user
    p = v.pool
    rows = u.rows
    for k in range(nrun):
        fill_request_nb(rows[k], v.req, v.run[off + k], p, 0)
    called_nb(u.err, F_VICTIM, p)
    choice = call_victim(u.addr[p], rows[:nrun], i, u.params[p], u.state[p])
    if choice < 0 or choice >= nrun:
        bad_choice_nb(u.err, choice, nrun)
        return nrun - 1
    return choice


def reference(v: VictimView, off: int, nrun: int, i: int) -> int:
    u = v.user
    p = v.pool
    rows = np.zeros((nrun, REQUEST_WIDTH), np.int64)
    for k in range(nrun):
        rows[k] = request_row(v.req, v.run[off + k], p, 0)
    policy = u.addr[p]
    choice = call_twin(F_VICTIM, p, policy.reference, read_only(rows), int(i), read_only(u.params[p].copy()),
                       u.state[p])
    check_choice(F_VICTIM, p, choice, nrun)
    return int(choice)
