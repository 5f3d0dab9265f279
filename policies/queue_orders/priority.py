"""priority: lower priority value first, then arrival.

vLLM v1's PriorityRequestQueue (vllm/v1/core/sched/request_queue.py) is a heap ordered by
(priority, arrival_time): the lowest priority value first, then the earliest arrival.
"""

from __future__ import annotations

from numba import njit

from policies.queue_orders._view import QueueView

READS_PREFIX = False
SPECS = (("priority", "lower priority value first, then arrival",
          "vLLM scheduling_policy=priority (PriorityRequestQueue)"),)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def head_kernel(nwait):
    return False


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def key_kernel(v, p, q, hits):
    return float(v.priority[q])


def head(nwait: int) -> bool:
    return False


def key(v: QueueView, p: int, q: int, hits: int) -> float:
    return float(v.priority[q])
