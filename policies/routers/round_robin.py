"""round-robin: the pool's replicas in turn, skipping those that cannot take a request.

Upstream: the vLLM production-stack router's default routing logic (roundrobin): one
counter per pool, advanced once per replica tried.
"""

from __future__ import annotations

from numba import njit

from policies.routers._view import R_ACTIVE, RouterView

Params = None
READS_VIEW = False
SPECS = (("round-robin", None, "replicas in turn, one counter per pool",
          "vLLM production-stack router default (roundrobin)"),)


def reads_prefix(prm) -> bool:
    return False


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def kernel(v, p, first, n, active, need, prm):
    for _ in range(n):
        k = v.rr[p]
        v.rr[p] = (k + 1) % n
        if v.state[first + k] == R_ACTIVE:
            return first + k
    return -1


def reference(v: RouterView, p: int, first: int, n: int, active: int, need: int, prm) -> int:
    for _ in range(n):
        k = v.rr[p]
        v.rr[p] = (k + 1) % n
        if v.state[first + k] == R_ACTIVE:
            return first + k
    return -1
