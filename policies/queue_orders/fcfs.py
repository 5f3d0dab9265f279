"""fcfs: arrival order; a preempted request goes back to the head.

vLLM v1's FCFSRequestQueue (vllm/v1/core/sched/request_queue.py) is a deque: new requests
join the back, a preempted one is put back at the front (`prepend_request`), and the
scheduler takes from the front. The key is never read.
"""

from __future__ import annotations

from numba import njit

from policies.queue_orders._view import QueueView

READS_PREFIX = False
SPECS = (("fcfs", "arrival order; a preempted request goes back to the head",
          "vLLM scheduling_policy=fcfs (vllm/v1/core/sched/request_queue.py FCFSRequestQueue)"),)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def head_kernel(nwait):
    return True


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def key_kernel(v, p, q, hits):
    return 0.0


def head(nwait: int) -> bool:
    return True


def key(v: QueueView, p: int, q: int, hits: int) -> float:
    return 0.0
