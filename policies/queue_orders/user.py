"""user: the pool's queue order is a user's sort key (policies/user.py), called through its address.

Selected by a config's `scheduling_policy: "module:function"` (or an installed entry point),
never by name. Every pick sorts the waiting requests by the user's key (lower first; ties to
the earlier arrival, as the built-in orders), so `head_kernel` is always false. A NaN key ends
the run with an error naming the policy.
"""

from __future__ import annotations

import math

from numba import njit

from policies._native import call_queue_key
from policies._userview import (
    E_NAN, F_QUEUE, bad_choice_nb, call_twin, called_nb, check_choice, fill_request_nb, read_only, request_row,
)
from policies.queue_orders._view import QueueView

READS_PREFIX = False  # per pool: the user policy's `reads_prefix` (EngineInputs.policy_reads)
SPECS = ()


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def head_kernel(nwait):
    return False


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def key_kernel(v, p, q, hits):
    u = v.user
    fill_request_nb(u.req, v.req, q, p, hits)
    called_nb(u.err, F_QUEUE, p)
    key = call_queue_key(u.addr[p], u.req, u.params[p], u.state[p])
    if math.isnan(key):
        bad_choice_nb(u.err, E_NAN, 0)
        return 0.0
    return key


def head(nwait: int) -> bool:
    return False


def key(v: QueueView, p: int, q: int, hits: int) -> float:
    u = v.user
    policy = u.addr[p]
    value = call_twin(F_QUEUE, p, policy.reference, request_row(v.req, q, p, hits),
                      read_only(u.params[p].copy()), u.state[p])
    check_choice(F_QUEUE, p, value, 0)
    return float(value)
