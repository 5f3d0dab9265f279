"""power-of-two: two distinct random active replicas; the one with fewer requests as last seen.

Upstream: Mitzenmacher's power of two choices, as Ray Serve's default request router uses it,
on the scraped waiting + running of each candidate. The first candidate (lower index) wins ties.
"""

from __future__ import annotations

from numba import njit

from policies.routers._view import RouterView, active_replicas, nth_active_nb, rand_below, rand_below_nb

Params = None
READS_VIEW = True
SPECS = (("power-of-two", None, "two random active replicas, the one with fewer requests as last scraped",
          "Mitzenmacher's power of two choices; Ray Serve's default request router"),)


def reads_prefix(prm) -> bool:
    return False


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def kernel(v, p, first, n, active, need, prm):
    i = rand_below_nb(v.rng, p, active)
    if active == 1:
        return nth_active_nb(v, first, n, i)
    j = rand_below_nb(v.rng, p, active - 1)  # a second, distinct candidate
    if j >= i:
        j += 1
    a = nth_active_nb(v, first, n, min(i, j))
    b = nth_active_nb(v, first, n, max(i, j))
    if v.wait[b] + v.run[b] < v.wait[a] + v.run[a]:
        return b
    return a


def reference(v: RouterView, p: int, first: int, n: int, active: int, need: int, prm) -> int:
    candidates = active_replicas(v, first, n)
    i = rand_below(v.rng, p, active)
    if active == 1:
        return candidates[i]
    j = rand_below(v.rng, p, active - 1)
    j += j >= i
    a, b = candidates[min(i, j)], candidates[max(i, j)]
    return b if v.wait[b] + v.run[b] < v.wait[a] + v.run[a] else a
