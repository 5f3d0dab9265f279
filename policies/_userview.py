"""What the engines hand the user-policy links (policies/*/user.py), the same in both engines.

`UserCall`, one per family, per pool p:

    addr[p]     the native address of the pool's user policy (0: the pool has none)
    params[p]   float64 row of its parameters
    state[p]    int64 row the policy owns (zeros at the start)
    rows        int64 scratch the link fills with the view (replicas, or the running batch)
    req         int64[REQUEST_WIDTH] scratch for the request row
    err         int64[ERR_WIDTH]: who was called last and what went wrong (below)
    first       per pool, the index of its first replica

`RequestColumns` are the engine's per-request columns (and the pools' TTFT budgets) a request
row is filled from. In the reference engine the same names hold lists and a UserCall holds
the UserPolicy objects instead of addresses (policies/*/user.py `reference`).

err: [E_STATUS] 0, or E_BAD_CHOICE once a policy returned an invalid choice ([E_VALUE]: it, as
an int; a NaN key reads as E_NAN; [E_LIMIT]: the rows it chose from); [E_FAMILY] and [E_POOL]: the family (F_*) and pool of the
last call, so an exception the policy raised can be put down to it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numba import njit

from policies.user import (
    Q_ARRIVAL_US, Q_GENERATED, Q_KV_BLOCKS, Q_OUTPUT_TOKENS, Q_PREFIX_HITS, Q_PRIORITY, Q_PROMPT_TOKENS, Q_TENANT,
    Q_TTFT_BUDGET_US, REQUEST_WIDTH,
)

E_STATUS, E_FAMILY, E_POOL, E_VALUE, E_LIMIT = range(5)
ERR_WIDTH = 5
E_BAD_CHOICE = 1
E_NAN = -(1 << 62)
# Families, as err[E_FAMILY] records them (0: no user policy was called yet).
F_ROUTER, F_QUEUE, F_VICTIM, F_ADMISSION = 1, 2, 3, 4
FAMILY_OF = {F_ROUTER: "router", F_QUEUE: "queue order", F_VICTIM: "preemption victim", F_ADMISSION: "admission"}


class UserCall(NamedTuple):
    addr: Any
    params: Any
    state: Any
    rows: Any
    req: Any
    err: Any
    first: Any


class RequestColumns(NamedTuple):
    prompt: Any
    output: Any
    priority: Any
    tenant: Any
    arrival: Any
    generated: Any
    nblocks: Any
    ttft_budget: Any  # per pool


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def fill_request_nb(out, c, q, p, hits):
    """Request q's row (policies.user.REQUEST_COLUMNS) into `out`, for pool p."""
    out[Q_PROMPT_TOKENS] = c.prompt[q]
    out[Q_OUTPUT_TOKENS] = c.output[q]
    out[Q_PRIORITY] = c.priority[q]
    out[Q_TENANT] = c.tenant[q]
    out[Q_ARRIVAL_US] = c.arrival[q]
    out[Q_GENERATED] = c.generated[q]
    out[Q_KV_BLOCKS] = c.nblocks[q]
    out[Q_PREFIX_HITS] = hits
    out[Q_TTFT_BUDGET_US] = c.ttft_budget[p]


def request_row(c: RequestColumns, q: int, p: int, hits: int) -> np.ndarray:
    """`fill_request_nb` as a new read-only array, for the reference engine."""
    row = np.array([c.prompt[q], c.output[q], c.priority[q], c.tenant[q], c.arrival[q], c.generated[q],
                    c.nblocks[q], hits, c.ttft_budget[p]], np.int64)
    assert row.shape[0] == REQUEST_WIDTH
    return read_only(row)


def read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def called_nb(err, family, p):
    err[E_FAMILY] = family
    err[E_POOL] = p


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def bad_choice_nb(err, value, limit):
    """Record an invalid choice (the first one): the engine stops at its next event."""
    if err[E_STATUS] == 0:
        err[E_STATUS] = E_BAD_CHOICE
        err[E_VALUE] = value
        err[E_LIMIT] = limit


def choice_message(family: int, value: Any, limit: int) -> str:
    """What an invalid choice was and what was expected, the same from both engines."""
    if isinstance(value, (int, np.integer)) and value == E_NAN:
        value = float("nan")
    if family == F_ROUTER:
        return f"returned {value}, expected a row of its replicas view (0 .. {limit - 1})"
    if family == F_QUEUE:
        return f"returned {value}, expected a sort key (a float that is not NaN)"
    if family == F_VICTIM:
        return f"returned {value}, expected a row of the running batch (0 .. {limit - 1})"
    return f"returned {value}, expected 0 (admit) or 1 (reject)"


def call_twin(family: int, p: int, twin, *args):
    """The reference engine's call of a policy's twin: an exception it raises is the policy's."""
    try:
        return twin(*args)
    except Exception as exc:  # noqa: BLE001 - the user's code failed; the wrapper names the policy
        raise UserPolicyFailed(family, p, f"raised {type(exc).__name__}: {exc}") from exc


class UserPolicyFailed(Exception):
    """A user policy raised or returned an invalid choice; the engine wrapper turns it into the
    user's error naming the config key and the policy (replay's UserPolicyError)."""

    def __init__(self, family: int, pool: int, message: str):
        super().__init__(message)
        self.family = family
        self.pool = pool


def check_choice(family: int, p: int, choice: Any, limit: int) -> None:
    """The reference engine's check of a twin's answer, as the links check the kernel's."""
    number = isinstance(choice, (int, float, np.integer, np.floating)) and not isinstance(choice, (bool, np.bool_))
    if family == F_QUEUE:
        ok = number and not np.isnan(choice)
    elif family == F_ADMISSION:
        ok = isinstance(choice, (int, np.integer, bool, np.bool_)) and int(choice) in (0, 1)
    else:
        ok = isinstance(choice, (int, np.integer)) and not isinstance(choice, (bool, np.bool_)) \
            and 0 <= int(choice) < limit
    if not ok:
        raise UserPolicyFailed(family, p, choice_message(family, choice, limit))
