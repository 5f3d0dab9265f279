"""random: a uniformly random active replica, from the pool's seeded xorshift64* stream.

Upstream: a Kubernetes Service in kube-proxy's iptables mode picks a random endpoint
(`-m statistic --mode random` rules, pkg/proxy/iptables/proxier.go).
"""

from __future__ import annotations

from numba import njit

from policies.routers._view import RouterView, active_replicas, nth_active_nb, rand_below, rand_below_nb

Params = None
READS_VIEW = False
SPECS = (("random", None, "a uniformly random active replica (seeded by the fleet seed)",
          "Kubernetes Service (kube-proxy iptables mode) random endpoint choice"),)


def reads_prefix(prm) -> bool:
    return False


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def kernel(v, p, first, n, active, need, prm):
    return nth_active_nb(v, first, n, rand_below_nb(v.rng, p, active))


def reference(v: RouterView, p: int, first: int, n: int, active: int, need: int, prm) -> int:
    return active_replicas(v, first, n)[rand_below(v.rng, p, active)]
