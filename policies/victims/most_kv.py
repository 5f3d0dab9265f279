"""most-kv: among the requests not yet scheduled in this step, the one holding the most KV
blocks; the newest (latest in the running list) on ties.

Upstream: largest-first eviction, which frees the most memory per preemption (no serving
engine ships it as its default; it bounds how few preemptions a step can need).
"""

from __future__ import annotations

from numba import njit

from policies.victims._view import VictimView

SPECS = (("most-kv", "the running request holding the most KV blocks",
          "frees the most memory per preemption (largest-first eviction)"),)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def kernel(v, off, nrun, i):
    best = i
    for k in range(i + 1, nrun):
        if v.blocks[v.run[off + k]] >= v.blocks[v.run[off + best]]:
            best = k
    return best


def reference(v: VictimView, off: int, nrun: int, i: int) -> int:
    return max(range(i, nrun), key=lambda k: (v.blocks[v.run[off + k]], k))
