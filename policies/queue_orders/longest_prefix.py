"""longest-prefix: most prompt blocks already in the replica's prefix cache first; in queue
order (FCFS) while more than 128 requests wait.

Upstream: SGLang's `lpm` schedule policy (python/sglang/srt/managers/schedule_policy.py):
waiting requests sorted by their longest prefix match in the radix cache, and
`_determine_active_policy` switching to FCFS above 128 waiting requests, a hard-coded limit
that spares the scheduler the matching on long queues.
"""

from __future__ import annotations

from numba import njit

from policies.queue_orders._view import QueueView

MAX_QUEUE = 128  # SGLang: FCFS above this many waiting requests (not configurable upstream)
READS_PREFIX = True
SPECS = (("longest-prefix", "most prompt blocks already in the prefix cache first; FCFS above 128 waiting",
          "SGLang schedule_policy.py lpm (longest prefix match)"),)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def head_kernel(nwait):
    return nwait > MAX_QUEUE


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def key_kernel(v, p, q, hits):
    return -float(hits)


def head(nwait: int) -> bool:
    return nwait > MAX_QUEUE


def key(v: QueueView, p: int, q: int, hits: int) -> float:
    return -float(hits)
