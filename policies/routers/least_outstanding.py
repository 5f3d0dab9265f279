"""least-outstanding: the replica with the fewest requests in flight, as the proxy counts them.

Upstream: Envoy's least-request load balancer (the Kubernetes Gateway default for LLM
routes): the proxy's own count of requests it has in flight on each endpoint, never stale.
Here that is the replica's waiting + running requests now. The lowest index wins ties.
"""

from __future__ import annotations

from numba import njit

from policies.routers._view import RouterView, active_replicas

Params = None
READS_VIEW = False
SPECS = (("least-outstanding", None,
          "the replica with the fewest waiting + running requests, as the proxy counts them (live)",
          "Envoy / Kubernetes gateway least-request load balancing"),)


def reads_prefix(prm) -> bool:
    return False


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def kernel(v, p, first, n, active, need, prm):
    # The engine keeps the pool's least loaded active replica (RouterView.least): a scan of every
    # replica here, at every arrival, was ~5% of a day's kernel (perf). `reference` is the scan.
    return v.least[p]


def reference(v: RouterView, p: int, first: int, n: int, active: int, need: int, prm) -> int:
    # min() keeps the first (lowest index) of equals
    return min(active_replicas(v, first, n), key=lambda r: v.live_wait[r] + v.live_run[r])
