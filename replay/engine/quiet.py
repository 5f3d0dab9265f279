"""Quiet runs: a replica whose batch cannot change for a while is advanced in a tight loop,
not one event per step.

A step of replica r is *quiet* when every running request is lazy (engine/lazy.py), nothing
waits, no KV transfer touches r, and no lazy request finishes in it: the step then only makes
one token per lazy request and takes the blocks that fall due, and its duration is the step
model's for `nlazy` decodes over a context that grows by `nlazy` a step. Once r schedules such a
step (`quiet_begin`), the steps up to the one in which its first lazy request finishes are all
quiet unless something from outside touches r, so their durations are summed here, in the same
integer-microsecond step-model calls as step by step (and kept, so that applying a step does not
price it a second time; a run has at most QUIET_DURS steps), and r's event in the tournament tree
becomes the end of the last step priced (`reps.qr_end`): a few steps are priced at first, then as
many again each time the run reaches the last priced (`quiet_extend`), so that a run has one event
for every few steps instead of two a step, and a run cut short costs few steps priced for nothing.
The run is cut short where the free blocks might not cover every block due in it, so no step of
it can preempt.

Everything that reads r before the run's end first *catches it up* (`quiet_catch_up`): the
steps that end by then are applied as step by step would apply them (counters, lazy step count,
the due blocks taken in the same order, so block ids, the free queue's LRU order and the prefix
cache stay identical), respecting the event order at equal times (a step end before a view
refresh or an arrival, a wake-up after them). What must: an arrival queued on r or whose decode
replica is r (`quiet_cancel`: the run ends, r steps one event at a time again), a router that
reads the pool's prefix-cache hits (allocations evict cached blocks), a routers' view refresh
(it reads the used blocks), and the host (`advance_nb` catches every replica up to `until`
before it returns, so snapshots, request rows and lifecycle changes see the state as of then).
Quiet steps record no event. The reference engine stays step by step; the differential tests
hold the two (and `lazy=False`) to identical outputs.
"""

from __future__ import annotations

import replay._numba_cache  # noqa: F401  (before any kernel is defined)

import numpy as np
from numba import njit

from replay.engine.events import update_event
from replay.engine.kvblocks import add_blocks
from replay.engine.lazy import SEQ_SPAN, lazy_step_done
from replay.engine.queues import heap_pop, heap_replace_top
from replay.engine.state import C_BUSY, C_OUTPUT, C_STEPS, QR_PRICED, QR_STEPS, QUIET_DURS
from replay.model.stepmodel import step_time_us_nb

# Steps of a quiet run priced when it begins; each time it reaches the last one priced, as many
# again (quiet_extend).
QUIET_FIRST = 4


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def quiet_duration(reps, pools, p, r, ahead):
    """`scheduling.step_duration` of a quiet step `ahead` steps after the lazy step count now."""
    n = reps.nlazy[r]
    z = np.int64(0)  # typed zeros: literal ones would compile the step model a second time
    return step_time_us_nb(pools.step[p], z, np.float64(0.0), z, n, reps.lz_ctx[r] + n + ahead * n, n, z, z)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def quiet_begin(reps, pools, r):
    """Replica r has just scheduled a step: if its batch is all lazy and nothing can reach it
    but from outside, make its event the end of the last quiet step after this one (of those
    priced so far: `quiet_extend`)."""
    if (reps.nlazy[r] == 0 or reps.neager[r] != 0 or reps.nwait[r] != 0 or reps.pend_head[r] >= 0
            or reps.outgoing[r] != 0 or reps.incoming[r] != 0 or reps.reserved[r] != 0):
        return
    p = reps.pool[r]
    n = reps.nlazy[r]
    # The step with lazy count k ends with k + 1 tokens made: the first finish ends step f - 1.
    steps = reps.fh_key[reps.run_off[r]] // SEQ_SPAN - 1 - reps.lz_steps[r]
    # A lazy request takes at most one block every block_size steps: the free ones must cover them.
    steps = min(steps, reps.nfree[r] // n * pools.block_size[p])
    # At most QUIET_DURS (the durations kept); a run that reaches its end is followed by the next.
    steps = min(steps, QUIET_DURS)
    if steps <= 0:
        return
    reps.qr_from[r] = reps.lz_steps[r]
    reps.qr_dur[r, QR_STEPS] = steps
    reps.qr_dur[r, QR_PRICED] = 0
    reps.qr_end[r] = reps.busy_until[r]
    quiet_price(reps, pools, r, min(steps, QUIET_FIRST))


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def quiet_price(reps, pools, r, k):
    """Price the next k steps of r's run (for quiet_steps, which then need not price them
    again); the run's event moves to the end of the last."""
    p = reps.pool[r]
    done = reps.qr_dur[r, QR_PRICED]
    # a step's `ahead` from the lazy step count now: a catch-up may have applied some already
    behind = reps.lz_steps[r] - reps.qr_from[r]
    end = reps.qr_end[r]
    for ahead in range(done + 1, done + k + 1):
        dur = quiet_duration(reps, pools, p, r, ahead - behind)
        reps.qr_dur[r, ahead - 1] = dur
        end += dur
    reps.qr_dur[r, QR_PRICED] = done + k
    reps.qr_end[r] = end


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def quiet_extend(reps, pools, r):
    """r's event is due: the end of the last step of its run priced so far. If the run has more,
    price as many again (up to all it has) and return True: the run goes on, nothing applied.
    Runs are priced a few steps at a time because most are cut short by an arrival, and each
    step priced past that was priced for nothing (the step model was ~18% of a million-request
    replay with every run priced whole at its start, perf)."""
    if reps.qr_end[r] < 0:
        return False
    done = reps.qr_dur[r, QR_PRICED]
    left = reps.qr_dur[r, QR_STEPS] - done
    if left <= 0:
        return False
    quiet_price(reps, pools, r, min(left, done))
    update_event(reps, r)
    return True


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def quiet_steps(rq, blocks, reps, pools, r, t, inclusive):
    """The quiet steps of r that end before t (by t when `inclusive`), each ended
    (`scheduling.finish_step` with nothing finishing) and the next scheduled at once
    (`lazy.lazy_running` with no eager request), applied together: the counters as their sums,
    then the blocks due in them, in (step, running order) as step by step takes them (nothing
    between two quiet steps reads r)."""
    end = reps.qr_end[r]
    s0 = reps.lz_steps[r]
    start = reps.step_start[r]
    busy = reps.busy_until[r]
    k = 0
    while busy < end and (busy < t or (inclusive != 0 and busy == t)):
        k += 1
        start = busy
        busy = start + reps.qr_dur[r, s0 + k - reps.qr_from[r] - 1]  # quiet_begin's `ahead` s0 + k - qr_from
    if k == 0:
        return
    n = reps.nlazy[r]
    s = s0 + k
    reps.lz_steps[r] = s  # lazy_step_done k times
    reps.lz_ctx[r] += k * n
    reps.counters[r, C_OUTPUT] += k * n
    reps.lz_cool[r] = max(reps.lz_cool[r] - k, 0)
    reps.counters[r, C_BUSY] += start - reps.step_start[r]
    reps.counters[r, C_STEPS] += k
    reps.qr_steps[r] += k
    reps.step_start[r] = start
    reps.busy_until[r] = busy
    bs = pools.block_size[reps.pool[r]]
    off = reps.run_off[r]
    while reps.ah_n[r] > 0 and reps.ah_key[off] // SEQ_SPAN <= s:
        q = reps.ah_q[off]
        add_blocks(rq, blocks, reps, r, q, np.int64(1))  # its next block, due at that step
        due = reps.ah_key[off] // SEQ_SPAN + bs  # and the one after, if it will need one
        if due < rq.lz_join[q] + rq.output[q] - rq.generated[q]:
            heap_replace_top(reps.ah_key[off:], reps.ah_q[off:], reps.ah_n[r], due * SEQ_SPAN + rq.seq[q], q)
        else:
            heap_pop(reps.ah_key[off:], reps.ah_q[off:], reps.ah_n[r])
            reps.ah_n[r] -= 1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def quiet_catch_up(rq, blocks, reps, pools, th, tbs, r, t, inclusive):
    """Apply r's quiet steps as of time t: those that end before t (by t when `inclusive`: the
    host's `until`, after every event at t) and the schedule of the next. An event at t of kind 1
    or 2 comes after a step that ends at t and before r schedules the next: r is then left as
    step by step leaves it, its step ended and a wake-up at t, and the run is over."""
    if reps.qr_end[r] >= 0 and (reps.busy_until[r] < t or (reps.busy_until[r] == t and t < reps.qr_end[r])):
        catch_up_steps(rq, blocks, reps, pools, th, tbs, r, t, np.int64(inclusive))


@njit(cache=True, _nrt=False, forceinline=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def catch_up_steps(rq, blocks, reps, pools, th, tbs, r, t, inclusive):
    """quiet_catch_up's work, compiled once rather than inlined at each of its callers (it runs
    once per catch-up, not per event: the call's cost is small, the copies' compile was not)."""
    quiet_steps(rq, blocks, reps, pools, r, t, inclusive)
    if reps.busy_until[r] == t and t < reps.qr_end[r]:
        lazy_step_done(reps, r)
        if reps.lz_cool[r] > 0:
            reps.lz_cool[r] -= 1
        reps.counters[r, C_BUSY] += t - reps.step_start[r]
        reps.busy_until[r] = -1
        reps.wake[r] = t
        reps.qr_end[r] = -1
        update_event(reps, r)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def quiet_cancel(rq, blocks, reps, pools, th, tbs, r, t):
    """Something from outside reaches r at t (before r's wake-ups at t): catch it up and end its
    run, so that it steps one event at a time from its current step on."""
    if reps.qr_end[r] < 0:
        return
    quiet_catch_up(rq, blocks, reps, pools, th, tbs, r, t, np.bool_(False))
    if reps.qr_end[r] >= 0:
        reps.qr_end[r] = -1
        update_event(reps, r)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def quiet_land(rq, blocks, reps, pools, th, tbs, r):
    """r's run reached its last step, which ends now: r is caught up to that step's start and
    steps one event at a time again (the caller applies the step's end)."""
    if reps.qr_end[r] >= 0:
        quiet_catch_up(rq, blocks, reps, pools, th, tbs, r, reps.qr_end[r], np.bool_(False))
        reps.qr_end[r] = -1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def quiet_catch_up_pool(rq, blocks, reps, pools, th, tbs, p, t):
    """Every replica of pool p caught up as of an event at t (before the wake-ups at t)."""
    for r in range(pools.first_replica[p], pools.first_replica[p] + pools.num_replicas[p]):
        quiet_catch_up(rq, blocks, reps, pools, th, tbs, r, t, np.bool_(False))
