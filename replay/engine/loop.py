"""The event loop: `advance_nb` runs every event of the fleet in (time, kind, replica) order up to
a time, then hands back to the host (`numba_engine.py`, which enters it through `enter_nb`);
`snapshot_nb` and `reset_replica_nb` are the host's other entries.

Kernels are compiled with `_nrt=False`: they never allocate, and without numba's reference
counting every array read out of the state tuples would cost two atomic operations; measured,
that was 95% of a decode step (355 ns -> 16 ns per request per step). Everything but the
top-level loop is inlined into it: a call passes each state tuple as hundreds of scalar
arguments, and inlining took the bundled trace on 4 replicas from 0.52 s to 0.33 s. The inlining
is LLVM's (`forceinline=True`: each function is typed and lowered once, not again at every call
site as numba's `inline="always"` did), and an inner kernel has no Python or C entry
(`no_cpython_wrapper`, `no_cfunc_wrapper`: the wrappers that unbox the state tuples were most of
each function's compile). That cut the cold compile of a fresh install from ~140 to ~52 CPU
seconds at the same replay speed (bench/bench_compile.py); only the host's entries below, and
`release_held_nb`, have wrappers. advance_nb's own is `enter_nb`, a kernel apart that calls it at
its native address: the wrapper of the state's ~200 arrays was a quarter of advance_nb's compile,
which comes after every other kernel's, and compiled apart it is done meanwhile, in a cold
compile's helper process (engine/prebuild.py).
"""

from __future__ import annotations

import replay._numba_cache  # noqa: F401  (before any kernel is defined)

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from replay.engine.common import NO_EVENT, R_ACTIVE, R_DRAINING, R_STARTING
from replay.engine.events import least_rebuild, least_set, update_event
from replay.engine.quiet import quiet_begin, quiet_catch_up, quiet_extend, quiet_land
from replay.engine.kvblocks import clear_table
from replay.engine.routing import arrive, check_policy_ids, refresh_views
from replay.engine.scheduling import finish_step, schedule
from replay.engine.sessions import next_arrival, rheap_pop, skip_released
from replay.engine.state import (
    C_BUSY,
    C_STEPS,
    PD_INFLIGHT,
    STATUS_EVENTS_FULL,
    STATUS_OK,
    STATUS_STUCK,
    STATUS_UNKNOWN_POLICY,
    STATUS_USER_POLICY,
)
from replay.engine.transfer import finish_transfer
from replay.engine.variants import WITH_PD, WITH_POLICIES, WITH_SESSIONS, WITH_USER
from policies._native import _codegen as native_call  # the call by address users' policies use
from policies._userview import E_STATUS


# No wrapper: the host enters it through `enter_nb` (below).
@njit(cache=True, _nrt=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def advance_nb(rq, blocks, reps, pools, ev, th, tbs, until):
    """Process every event with time <= until, in (time, kind, replica) order (then `synced`)."""
    n = rq.arrival.shape[0]
    cap = ev.t.shape[0]
    if ev.clock[6] != 0 or not check_policy_ids(pools, ev):
        return STATUS_UNKNOWN_POLICY
    least_rebuild(reps, pools)  # the host may have started, drained, stopped or reset replicas
    while True:
        if WITH_USER and pools.u_router.err[E_STATUS] != 0:  # a user's policy chose wrong (its link says how)
            return STATUS_USER_POLICY
        if ev.clock[1] + ev.clock[3] > cap:
            return STATUS_EVENTS_FULL
        # Earliest replica event: a step end (kind 0; a quiet run's last priced) or a wake-up (kind 3).
        key = reps.ekey[1]  # the tree's root
        best_r = reps.tree[1] if key != NO_EVENT else -1
        best_t, best_kind = (key // 4, key % 4) if key != NO_EVENT else (NO_EVENT, 4)
        a = skip_released(rq, pools, ev.clock[0])
        ev.clock[0] = a
        t_arr, q_arr = next_arrival(rq, pools, a)  # request a, or a session's released turn
        # Routers' view refreshes (kind 1): after the step ends at that time, before kinds 2 and 3.
        ref_p = np.int64(-1)  # typed: a literal -1 would type refresh_views for it first, a second compile
        for p in range(pools.next_refresh.shape[0]):
            if pools.next_refresh[p] != NO_EVENT and (ref_p < 0 or pools.next_refresh[p] < pools.next_refresh[ref_p]):
                ref_p = p
        t_ref = pools.next_refresh[ref_p] if ref_p >= 0 else NO_EVENT
        # KV transfers that complete: after the steps that end at the same time, before the rest.
        if WITH_PD and pools.pd[PD_INFLIGHT] > 0:
            t_x = pools.xh_t[0]
            if (t_x < best_t or (t_x == best_t and best_kind > 0)) and t_x <= t_ref and t_x <= t_arr:
                if t_x > until:
                    return synced(rq, blocks, reps, pools, th, tbs, until)
                transfer_done(rq, blocks, reps, pools, ev, th, tbs, t_x)
                continue
        if WITH_POLICIES and ref_p >= 0:  # only the other built-in routers read a scraped view
            if (t_ref < best_t or (t_ref == best_t and best_kind > 1)) and t_ref <= t_arr:
                if t_ref > until:
                    return synced(rq, blocks, reps, pools, th, tbs, until)
                refresh_views(rq, blocks, reps, pools, th, tbs, ref_p, t_ref)
                continue
        if q_arr < n and (t_arr < best_t or (t_arr == best_t and best_kind > 2)):
            if t_arr > until:
                return synced(rq, blocks, reps, pools, th, tbs, until)
            if WITH_SESSIONS and q_arr != a:
                rheap_pop(pools)  # before arriving: a rejection releases the session's next turn
            arrive(rq, blocks, reps, pools, ev, th, tbs, q_arr, t_arr)
            if q_arr == a:
                ev.clock[0] = a + 1
            if ev.clock[6] != 0:
                return STATUS_UNKNOWN_POLICY
            continue
        if best_r < 0 or best_t > until:
            return synced(rq, blocks, reps, pools, th, tbs, until)
        r = best_r
        if best_kind == 0:
            if not quiet_extend(reps, pools, r):  # else r's quiet run goes on, its next steps priced
                quiet_land(rq, blocks, reps, pools, th, tbs, r)
                finish_step(rq, blocks, reps, pools, ev, th, tbs, r, best_t)
                least_set(reps, pools, r)  # its finished requests left it
            continue
        reps.wake[r] = NO_EVENT
        dur, preempted = schedule(rq, blocks, reps, pools, ev, th, tbs, r, best_t)
        least_set(reps, pools, r)  # after each of r's events (admitting or preempting keeps its count: O(1))
        if dur > 0:
            reps.step_start[r] = best_t
            reps.busy_until[r] = best_t + dur
            reps.counters[r, C_STEPS] += 1
            quiet_begin(reps, pools, r)
        elif preempted:
            # A victim policy other than FCFS can preempt the request it was making room for and
            # leave nothing to run; as vLLM, schedule again (the queue is admitted then).
            reps.wake[r] = best_t
        elif reps.nwait[r] > 0 and reps.outgoing[r] == 0 and reps.reserved[r] == 0:
            # Cannot happen: a request too big for an empty replica is rejected at arrival, and
            # blocks held for KV transfers come back when a transfer completes (which wakes
            # the replica). Report it, do not spin.
            ev.clock[4] = r
            ev.clock[5] = best_t
            return STATUS_STUCK
        update_event(reps, r)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def transfer_done(rq, blocks, reps, pools, ev, th, tbs, t):
    """The earliest KV transfer in flight completes at t: its request joins its decode replica's queue."""
    d = rq.dreplica[pools.xh_q[0]]
    finish_transfer(rq, blocks, reps, pools, ev, th, tbs, t)
    least_set(reps, pools, d)


@intrinsic
def _call_at(typingctx, addr, rq, blocks, reps, pools, ev, th, tbs, until):
    """advance_nb as compiled at the native address addr, for these arguments' types, in numba's
    calling convention (policies/_native.py: an exception a user's policy raises propagates)."""
    sig = types.int64(rq, blocks, reps, pools, ev, th, tbs, until)
    return types.int64(addr, *sig.args), native_call(sig)


# The host's entry: its CPython wrapper unboxes the state (a C wrapper too, for the state tuples'
# ~1,200 fields, was ~0.9 s of a cold compile). It types nothing of advance_nb's, so compiles
# alone; numba_engine.py hands it advance_nb's address, compiled for the same types.
@njit(cache=True, _nrt=False, no_cfunc_wrapper=True)
def enter_nb(advance, rq, blocks, reps, pools, ev, th, tbs, until):
    return _call_at(advance, rq, blocks, reps, pools, ev, th, tbs, until)


@njit(cache=True, _nrt=False, forceinline=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def synced(rq, blocks, reps, pools, th, tbs, until):
    """advance_nb reached until: every replica in a quiet run is caught up (engine/quiet.py), so
    the host reads it as of until. A call, not inlined at advance_nb's returns (compile time)."""
    for r in range(reps.pool.shape[0]):
        quiet_catch_up(rq, blocks, reps, pools, th, tbs, r, until, np.bool_(True))
    return STATUS_OK


@njit(cache=True, _nrt=False, no_cfunc_wrapper=True)
def snapshot_nb(reps, t, out):
    for r in range(reps.pool.shape[0]):
        serving = reps.state[r] == R_ACTIVE or reps.state[r] == R_DRAINING or (
            reps.state[r] == R_STARTING and reps.active_at[r] <= t)
        out[r, 0] = reps.nwait[r]
        out[r, 1] = reps.nrun[r]
        out[r, 2] = reps.nblocks[r] - reps.nfree[r]
        out[r, 3] = reps.nblocks[r] if serving else 0  # KV usage is over replicas that serve
        for k in range(reps.counters.shape[1]):
            out[r, 4 + k] = reps.counters[r, k]
        if reps.busy_until[r] >= 0:
            out[r, 4 + C_BUSY] += t - reps.step_start[r]


@njit(cache=True, _nrt=False, no_cfunc_wrapper=True)
def reset_replica_nb(blocks, reps, r):
    """A new pod: every block free in id order, an empty prefix cache, no queues."""
    n = reps.nblocks[r]
    blocks.utop[r] = -1  # every block uncached and never taken: none is written (kvblocks.py)
    blocks.fresh[r] = reps.block_off[r]
    blocks.tgap[r] = n
    reps.free_head[r] = -1
    reps.free_tail[r] = -1
    reps.nfree[r] = n
    clear_table(blocks, reps.htab_off[r], reps.htab_mask[r] + 1)
    reps.wait_head[r] = -1
    reps.wait_tail[r] = -1
    reps.nwait[r] = 0
    reps.nrun[r] = 0
    reps.neager[r] = 0
    reps.nlazy[r] = 0  # an idle replica has none: what follows is for a clean slate
    reps.lz_ctx[r] = 0
    reps.lz_maxseq[r] = -1
    reps.lz_cool[r] = 0
    reps.fh_n[r] = 0
    reps.ah_n[r] = 0
    reps.qr_end[r] = -1
    reps.busy_until[r] = -1
    reps.wake[r] = NO_EVENT
    reps.reserved[r] = 0
    reps.outgoing[r] = 0
    reps.incoming[r] = 0
    reps.pend_head[r] = -1
    reps.pend_tail[r] = -1
    for s in range(reps.lora_off[r], reps.lora_off[r + 1]):
        reps.lora_id[s] = -1
        reps.lora_used[s] = -1
    update_event(reps, r)
