"""least-progress: among the requests not yet scheduled in this step, the one with the fewest
tokens generated; the newest (latest in the running list) on ties.

Upstream: least-attained-service preemption, the intuition of FastServe's skip-join MLFQ
(Wu et al., 2023): the request that has received the least service loses the least work.
"""

from __future__ import annotations

from numba import njit

from policies.victims._view import VictimView

SPECS = (("least-progress", "the running request with the fewest tokens generated",
          "least-attained-service preemption (FastServe's MLFQ intuition)"),)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def kernel(v, off, nrun, i):
    best = i
    for k in range(i + 1, nrun):
        if v.generated[v.run[off + k]] <= v.generated[v.run[off + best]]:
            best = k
    return best


def reference(v: VictimView, off: int, nrun: int, i: int) -> int:
    return min(range(i, nrun), key=lambda k: (v.generated[v.run[off + k]], -k))
