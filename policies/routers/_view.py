"""What a router sees, the same in both engines, and the helpers routers share.

`RouterView` holds per-replica columns of the whole fleet (the pool's replicas are
first .. first + n - 1), numpy arrays in the numba engine and lists in the reference engine:

    state       R_ACTIVE (2) for a replica that may take the request (the engine has already
                promoted a starting replica whose loading finished)
    wait, run   waiting / running requests as of the pool's last view refresh (stale)
    kv          KV blocks in use as of that refresh
    blocks      KV blocks of the replica
    live_wait, live_run   waiting / running requests now (the proxy's own count)
    wait_tokens tokens of the requests waiting now
    hits        leading prompt blocks of this request in the replica's prefix cache (filled for
                active replicas only when the router's `reads_prefix(params)` says so)
    rng         per-pool xorshift64* state (seeded by the fleet seed); a router may advance it
    rr          per-pool counter a router may keep (round-robin's next replica)
    req, q      the request's columns (policies._userview.RequestColumns) and its index
    user        the pool's user router, if it has one (policies._userview.UserCall)
    least       per pool, its active replica with the fewest live waiting + running requests
                (the lowest index on ties), which the numba engine keeps as they change rather
                than scan every replica at every arrival (replay/engine/events.py); None in the
                reference engine, whose routers scan

A kernel's signature: `kernel(v, p, first, n, active, need, prm)`: pool p, its `active`
routable replicas, `need` = prompt blocks of the request, and `prm` the float64 row of the
router's parameters (`Params.row()`). It must return an active replica of the pool or -1.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numba import njit

U64 = np.uint64

R_ACTIVE = 2  # replay.engine.common.R_ACTIVE (policies sit below replay; a test checks they agree)
MASK64 = (1 << 64) - 1


class RouterView(NamedTuple):
    state: Any
    wait: Any
    run: Any
    kv: Any
    blocks: Any
    live_wait: Any
    live_run: Any
    wait_tokens: Any
    hits: Any
    rng: Any
    rr: Any
    req: Any
    q: Any
    user: Any
    least: Any = None


@njit(cache=True, _nrt=False, forceinline=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def rand_below_nb(rng, p, n):
    """A uniform integer in [0, n) from the pool's xorshift64* stream (seeded, reproducible)."""
    x = rng[p]
    x ^= x >> U64(12)
    x ^= x << U64(25)
    x ^= x >> U64(27)
    rng[p] = x
    return np.int64((x * U64(0x2545F4914F6CDD1D)) >> U64(33)) % n


def rand_below(rng: list[int], p: int, n: int) -> int:
    """`rand_below_nb` on Python ints."""
    x = rng[p]
    x ^= x >> 12
    x ^= (x << 25) & MASK64
    x ^= x >> 27
    rng[p] = x
    return (((x * 0x2545F4914F6CDD1D) & MASK64) >> 33) % n


@njit(cache=True, _nrt=False, forceinline=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def nth_active_nb(v, first, n, k):
    """The k-th active replica of the pool's range, -1 if there are fewer."""
    for r in range(first, first + n):
        if v.state[r] == R_ACTIVE:
            if k == 0:
                return r
            k -= 1
    return -1


def active_replicas(v: RouterView, first: int, n: int) -> list[int]:
    return [r for r in range(first, first + n) if v.state[r] == R_ACTIVE]
