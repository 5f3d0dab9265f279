"""Multi-LoRA: the adapters a step uses, and each replica's adapter slots (least recently used
slot loaded on a miss)."""

from __future__ import annotations

import replay._numba_cache  # noqa: F401  (before any kernel is defined)

from numba import njit


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def lora_of(rq, pools, p, q):
    """The request's adapter on pool p (-1: none, or the pool serves no LoRA)."""
    return rq.adapter[q] if pools.lora_slots[p] > 0 else -1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def lora_in_batch(rq, reps, pools, p, off, nrun, a):
    """Some request scheduled in this step uses adapter a."""
    for k in range(nrun):
        x = reps.run_list[off + k]
        if rq.sched_new[x] > 0 and lora_of(rq, pools, p, x) == a:
            return True
    return False


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def lora_activate(reps, pools, p, r, a, t):
    """Make adapter a resident on replica r for the step starting at t: 1 if it had to be loaded
    (into the least recently used slot no request of this step uses), else 0."""
    victim = -1
    for s in range(reps.lora_off[r], reps.lora_off[r + 1]):
        if reps.lora_id[s] == a:
            reps.lora_used[s] = t
            return 0
        if reps.lora_used[s] < t and (victim < 0 or reps.lora_used[s] < reps.lora_used[victim]):
            victim = s
    reps.lora_id[victim] = a
    reps.lora_used[victim] = t
    return 1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def loras_scheduled(rq, reps, pools, p, r):
    """Distinct adapters among the running requests scheduled so far in replica r's step."""
    off = reps.run_off[r]
    loras = 0
    if pools.lora_slots[p] > 0:
        for k in range(reps.neager[r]):  # a pool with LoRA keeps none lazy
            x = reps.run_list[off + k]
            a = lora_of(rq, pools, p, x)
            if a >= 0 and rq.sched_new[x] > 0 and not lora_in_batch(rq, reps, pools, p, off, k, a):
                loras += 1
    return loras
