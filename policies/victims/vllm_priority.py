"""vllm-priority: the running request with the largest (priority, arrival), among all of them.

Upstream: vLLM v1 `Scheduler.schedule` (vllm/v1/core/sched/scheduler.py) under
scheduling_policy=priority preempts `max(self.running, key=lambda r: (r.priority,
r.arrival_time))`. The request id is the last tie-break here, so the choice never flips
between two equals.
"""

from __future__ import annotations

from numba import njit

from policies.victims._view import VictimView

SPECS = (("vllm-priority", "the running request with max (priority, arrival)",
          "vLLM v1 scheduler.py: max(self.running, key=(priority, arrival_time))"),)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def kernel(v, off, nrun, i):
    best = 0
    for k in range(1, nrun):
        q = v.run[off + k]
        b = v.run[off + best]
        if v.priority[q] > v.priority[b] or (v.priority[q] == v.priority[b] and (
                v.arrival[q] > v.arrival[b] or (v.arrival[q] == v.arrival[b] and q > b))):
            best = k
    return best


def reference(v: VictimView, off: int, nrun: int, i: int) -> int:
    def key(k: int) -> tuple[int, int, int]:
        q = v.run[off + k]
        return v.priority[q], v.arrival[q], q

    return max(range(nrun), key=key)
