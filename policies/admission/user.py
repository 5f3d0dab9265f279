"""user: the pool's admission rule is a user's policy (policies/user.py), called through its address.

Selected by a config's `admission: {policy: "module:function"}` (or an installed entry point),
never by name. The link fills the pool's row (policies.user.POOL_COLUMNS: its queue totals,
the replica the request was routed to, the time) and the request's row; the kernel answers 1
to reject (reason `admission_policy`) or 0 to admit; anything else ends the run with an error
naming the policy.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from policies._native import call_admission
from policies._userview import (
    F_ADMISSION, bad_choice_nb, call_twin, called_nb, check_choice, fill_request_nb, read_only, request_row,
)
from policies.admission._view import AdmissionView
from policies.user import (
    P_ACTIVE_REPLICAS, P_NOW_US, P_REPLICA, P_REPLICA_WAITING_TOKENS, P_WAITING, P_WAITING_TOKENS, POOL_WIDTH,
)

READS_POOL = True
REASON = "admission_policy"
SPECS = ()
Params = None


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def kernel(v, p, r, q, t, a):
    u = v.user
    row = u.rows[0]
    row[P_WAITING] = v.waiting
    row[P_WAITING_TOKENS] = v.waiting_tokens
    row[P_ACTIVE_REPLICAS] = v.active
    row[P_REPLICA] = r - u.first[p]
    row[P_REPLICA_WAITING_TOKENS] = v.wait_tokens[r]
    row[P_NOW_US] = t
    fill_request_nb(u.req, v.req, q, p, 0)
    called_nb(u.err, F_ADMISSION, p)
    answer = call_admission(u.addr[p], row[:POOL_WIDTH], u.req, u.params[p], u.state[p])
    if answer != 0 and answer != 1:
        bad_choice_nb(u.err, answer, 2)
        return 0
    return answer


def reference(v: AdmissionView, p: int, r: int, q: int, t: int, a) -> int:
    u = v.user
    row = np.array([v.waiting, v.waiting_tokens, v.active, r - u.first[p], v.wait_tokens[r], t], np.int64)
    policy = u.addr[p]
    answer = call_twin(F_ADMISSION, p, policy.reference, read_only(row), request_row(v.req, q, p, 0),
                       read_only(u.params[p].copy()), u.state[p])
    check_choice(F_ADMISSION, p, answer, 2)
    return int(answer)
