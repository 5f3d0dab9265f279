"""vllm-fcfs: the last request of the running list.

Upstream: vLLM v1 `Scheduler.schedule` (vllm/v1/core/sched/scheduler.py) under
scheduling_policy=fcfs preempts `self.running.pop()`, the most recently admitted request.
"""

from __future__ import annotations

from numba import njit

from policies.victims._view import VictimView

SPECS = (("vllm-fcfs", "the last request of the running list", "vLLM v1 scheduler.py: self.running.pop() under fcfs"),)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def kernel(v, off, nrun, i):
    return nrun - 1


def reference(v: VictimView, off: int, nrun: int, i: int) -> int:
    return nrun - 1
