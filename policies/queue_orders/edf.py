"""edf: earliest TTFT deadline (arrival + the SLO's TTFT) first.

Earliest-deadline-first on each request's TTFT deadline (its arrival + the pool's TTFT
target), as SLO-aware LLM schedulers order their queues (QLM, Andes).
"""

from __future__ import annotations

from numba import njit

from policies.queue_orders._view import QueueView

READS_PREFIX = False
SPECS = (("edf", "earliest TTFT deadline (arrival + the SLO's TTFT) first",
          "earliest-deadline-first, as in SLO-aware schedulers (QLM, Andes)"),)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def head_kernel(nwait):
    return False


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def key_kernel(v, p, q, hits):
    return float(v.arrival[q] + v.ttft_budget[p])


def head(nwait: int) -> bool:
    return False


def key(v: QueueView, p: int, q: int, hits: int) -> float:
    return float(v.arrival[q] + v.ttft_budget[p])
