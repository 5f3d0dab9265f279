"""An arriving request: rejected if it can never fit, else routed to a replica of its pool (or,
with prefill/decode disaggregation, of the prefill pool), put through the pool's admission
policy and queued there; or held at its pool while it has no replica.

The router, admission policy and their parameters are policies/ plug-ins, reached through one
dispatch per family built from policies/registry.py; `check_policy_ids` stops a run whose ids
name no policy before any event.
"""

from __future__ import annotations

import replay._numba_cache  # noqa: F401  (before any kernel is defined)

import numpy as np
from numba import njit

from replay.engine.common import (
    EV_ARRIVE,
    EV_REJECT,
    REJECT_CONTEXT,
    REJECT_KV,
    REJECT_NO_REPLICA,
    REJECTED,
    R_ACTIVE,
    R_STARTING,
    WAITING,
)
from replay.engine.events import least_of, least_rebuild, least_set, promote_due, record, wake_idle
from replay.engine.kvblocks import prefix_hit_blocks
from replay.engine.queues import held_push, wq_push_back
from replay.engine.quiet import quiet_cancel, quiet_catch_up_pool
from replay.engine.sessions import release_next
from replay.engine.variants import WITH_PD, WITH_POLICIES, WITH_SESSIONS, policy_gates
from replay.engine.state import (
    PD_DECODE,
    PD_PREFILL,
    PD_THRESHOLD,
    UNKNOWN_ADMISSION,
    UNKNOWN_QUEUE,
    UNKNOWN_ROUTER,
    UNKNOWN_VICTIM,
)
from policies._userview import RequestColumns
from policies.admission._view import AdmissionView
from policies.registry import ADMISSION_MODULES, QUEUE_MODULES, ROUTER_MODULES, VICTIM_MODULES
from policies._dispatch import build_dispatch
from policies.routers._view import RouterView

# Every registered router kernel behind one dispatch; -2: the pool's id has no router.
ROUTE_UNKNOWN = -2
route_dispatch = build_dispatch([m.kernel for m in ROUTER_MODULES], ROUTE_UNKNOWN, policy_gates(ROUTER_MODULES))
admission_dispatch = build_dispatch([m.kernel for m in ADMISSION_MODULES], 0, policy_gates(ADMISSION_MODULES))
# Constants frozen into the kernels. check_policy_ids stops a run whose ids are out of range
# before any event, so the dispatches' markers for an unknown id are never used.
NUM_ROUTERS, NUM_VICTIMS, NUM_QUEUES = len(ROUTER_MODULES), len(VICTIM_MODULES), len(QUEUE_MODULES)
NUM_ADMISSIONS = len(ADMISSION_MODULES)


@njit(cache=True, _nrt=False, forceinline=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def refresh_views(rq, blocks, reps, pools, th, tbs, p, t):
    """The pool's routers see each replica as it is now (after its quiet steps that end by t),
    until the next refresh."""
    quiet_catch_up_pool(rq, blocks, reps, pools, th, tbs, p, t)
    for r in range(pools.first_replica[p], pools.first_replica[p] + pools.num_replicas[p]):
        reps.view_wait[r] = reps.nwait[r]
        reps.view_run[r] = reps.nrun[r]
        reps.view_kv[r] = reps.nblocks[r] - reps.nfree[r]
    pools.next_refresh[p] = t + pools.refresh_us[p]


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def request_columns(rq, pools):
    """The request columns a user's policy reads (policies/_userview.py)."""
    return RequestColumns(rq.prompt, rq.output, rq.priority, rq.tenant, rq.arrival, rq.generated, rq.nblocks,
                          pools.ttft_budget_us)


@njit(cache=True, _nrt=False, forceinline=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def route(rq, blocks, reps, pools, th, tbs, p, q, t):
    """Pick an active replica of pool p for request q, -1 if none, ROUTE_UNKNOWN if the pool's
    router id has no kernel. The router (policies/routers/) sees a RouterView; the engine first
    promotes the starting replicas whose loading has finished and, for a router that reads
    them, finds the request's prefix-cache hits on each active replica. Its active replicas
    are counted and its least loaded one known without a scan (events.py)."""
    first = pools.first_replica[p]
    n = pools.num_replicas[p]
    bs = pools.block_size[p]
    promote_due(reps, pools, p, t)
    active = pools.nactive[p]
    if active == 0:
        return -1
    if WITH_POLICIES and pools.route_hits[p] != 0:
        for r in range(first, first + n):
            if reps.state[r] == R_ACTIVE:
                reps.hits[r] = prefix_hit_blocks(rq, blocks, reps, th, tbs, bs, r, q)
    pools.least[p] = least_of(reps, pools, p)
    view = RouterView(reps.state, reps.view_wait, reps.view_run, reps.view_kv, reps.nblocks, reps.nwait, reps.nrun,
                      reps.wait_tokens, reps.hits, pools.rng, pools.rr_next, request_columns(rq, pools), q,
                      pools.u_router, pools.least)
    need = (rq.prompt[q] + bs - 1) // bs
    return route_dispatch(pools.router[p], view, p, first, n, active, need, pools.router_params[p])


@njit(cache=True, _nrt=False, forceinline=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def route_starting(pools, reps, p):
    """No active replica: the starting replica of pool p that is ready first (lowest index on
    ties) holds the request until it is, as Knative's activator does; -1 if none is starting."""
    best = -1
    for r in range(pools.first_replica[p], pools.first_replica[p] + pools.num_replicas[p]):
        if reps.state[r] == R_STARTING and (best < 0 or reps.active_at[r] < reps.active_at[best]):
            best = r
    return best


@njit(cache=True, _nrt=False, forceinline=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def admit(rq, reps, pools, p, r, q, t):
    """The pool's admission policy (policies/admission/) on request q routed to replica r: 0 or
    the policy's reject reason. The pool's queue totals are counted for a policy that reads them."""
    waiting = 0
    waiting_tokens = 0
    active = 0
    if WITH_POLICIES and pools.adm_pool[p] != 0:
        first = pools.first_replica[p]
        for x in range(first, first + pools.num_replicas[p]):
            waiting += reps.nwait[x]
            waiting_tokens += reps.wait_tokens[x]
            if reps.state[x] == R_ACTIVE:
                active += 1
    view = AdmissionView(waiting, waiting_tokens, active, reps.wait_tokens, rq.prompt, rq.output, rq.priority,
                         rq.tenant, pools.bucket, pools.bucket_at, pools.bucket.shape[0] // pools.admission.shape[0],
                         pools.ttft_budget_us, request_columns(rq, pools), pools.u_admission)
    if admission_dispatch(pools.admission[p], view, p, r, q, t, pools.adm[p]) != 0:
        return pools.adm_reason[p]
    return 0


@njit(cache=True, _nrt=False, forceinline=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def remote_prefill(rq, blocks, reps, pools, th, tbs, p, r, q):
    """The P/D decider, for request q routed to decode replica r: prefill it on the prefill pool
    unless its uncached prompt is below the threshold (as Dynamo's `max_local_prefill_length`
    and llm-d's P/D threshold) or it could never fit a prefill replica."""
    pp = pools.pd[PD_PREFILL]
    if pp < 0 or p != pools.pd[PD_DECODE]:
        return False
    bsp = pools.block_size[pp]
    if (rq.prompt[q] + bsp - 1) // bsp > pools.kv_blocks[pp] - pools.watermark_blocks[pp]:
        return False
    threshold = pools.pd[PD_THRESHOLD]
    if threshold <= 0:
        return True
    bs = pools.block_size[p]
    hits = prefix_hit_blocks(rq, blocks, reps, th, tbs, bs, r, q) if pools.prefix_caching[p] != 0 else 0
    return rq.prompt[q] - hits * bs >= threshold


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def reject(rq, pools, ev, q, reason, t):
    """Request q is rejected; its home pool (requests.parquet's `pool`) counts it."""
    rq.state[q] = REJECTED
    rq.reject[q] = reason
    pools.rejected[rq.pool[q]] += 1
    record(ev, t, np.int64(EV_REJECT), np.int64(-1), q, reason)
    if WITH_SESSIONS:
        release_next(rq, pools, q, t)


@njit(cache=True, _nrt=False, forceinline=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def arrive(rq, blocks, reps, pools, ev, th, tbs, q, t):
    p = rq.pool[q]
    pools.arrivals[p] += 1  # counted at its home pool, as requests.parquet's `pool` column
    pools.arrived_tokens[p, 0] += rq.prompt[q]  # what an autoscaler reads of the arrivals (closed loop)
    pools.arrived_tokens[p, 1] += rq.output[q]
    total = rq.prompt[q] + rq.output[q]
    if total > pools.max_model_len[p]:
        reject(rq, pools, ev, q, np.int64(REJECT_CONTEXT), t)
    elif (total - 1 + pools.block_size[p] - 1) // pools.block_size[p] > pools.kv_blocks[p] - pools.watermark_blocks[p]:
        # The request could never hold all its tokens, even alone on a replica (above the watermark).
        reject(rq, pools, ev, q, np.int64(REJECT_KV), t)
    else:
        place(rq, blocks, reps, pools, ev, th, tbs, q, t)


@njit(cache=True, _nrt=False, forceinline=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def unknown_policy(ev, family, p, t):
    """A pool's policy id has no kernel: stop the run (advance_nb returns STATUS_UNKNOWN_POLICY)."""
    ev.clock[4] = p
    ev.clock[5] = t
    ev.clock[6] = family


@njit(cache=True, _nrt=False, forceinline=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def check_policy_ids(pools, ev):
    """Every pool's per-step policy ids name a registered kernel; else record the first pool
    that has none (its family in ev.clock[6]) and return False: the run stops with an error."""
    for p in range(pools.router.shape[0]):
        # The last id of each family is its user link: it needs the pool's compiled policy.
        if not 0 <= pools.router[p] < NUM_ROUTERS or (
                pools.router[p] == NUM_ROUTERS - 1 and pools.u_router.addr[p] == 0):
            unknown_policy(ev, np.int64(UNKNOWN_ROUTER), p, np.int64(0))
            return False
        if not 0 <= pools.victim[p] < NUM_VICTIMS or (
                pools.victim[p] == NUM_VICTIMS - 1 and pools.u_victim.addr[p] == 0):
            unknown_policy(ev, np.int64(UNKNOWN_VICTIM), p, np.int64(0))
            return False
        if not 0 <= pools.queue[p] < NUM_QUEUES or (pools.queue[p] == NUM_QUEUES - 1 and pools.u_queue.addr[p] == 0):
            unknown_policy(ev, np.int64(UNKNOWN_QUEUE), p, np.int64(0))
            return False
        if not 0 <= pools.admission[p] < NUM_ADMISSIONS or (
                pools.admission[p] == NUM_ADMISSIONS - 1 and pools.u_admission.addr[p] == 0):
            unknown_policy(ev, np.int64(UNKNOWN_ADMISSION), p, np.int64(0))
            return False
    return True


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def place(rq, blocks, reps, pools, ev, th, tbs, q, t):
    """Route request q (arriving, or held at its pool until now) to a replica and admit it there.
    With no replica active or starting, a pool that holds (an autoscaled pool that may scale up)
    keeps it in its FIFO; any other rejects it as no_replica."""
    p = rq.pool[q]
    if WITH_POLICIES and pools.route_hits[p] != 0:  # quiet runs' allocations may have evicted cached blocks
        quiet_catch_up_pool(rq, blocks, reps, pools, th, tbs, p, t)
    r = route(rq, blocks, reps, pools, th, tbs, p, q, t)
    if r == ROUTE_UNKNOWN:
        unknown_policy(ev, np.int64(UNKNOWN_ROUTER), p, t)
        return
    if r < 0:
        r = route_starting(pools, reps, p)
    if r < 0:
        if pools.hold[p] != 0:
            held_push(rq, pools, p, q)
        else:
            reject(rq, pools, ev, q, np.int64(REJECT_NO_REPLICA), t)
        return
    quiet_cancel(rq, blocks, reps, pools, th, tbs, r, t)  # r is read (its prefix hits) and then given work
    d = -1
    if WITH_PD and remote_prefill(rq, blocks, reps, pools, th, tbs, p, r, q):
        pp = pools.pd[PD_PREFILL]
        if pools.route_hits[pp] != 0:
            quiet_catch_up_pool(rq, blocks, reps, pools, th, tbs, pp, t)
        rp = route(rq, blocks, reps, pools, th, tbs, pp, q, t)
        if rp == ROUTE_UNKNOWN:
            unknown_policy(ev, np.int64(UNKNOWN_ROUTER), pp, t)
            return
        if rp < 0:
            rp = route_starting(pools, reps, pp)
        if rp >= 0:  # else no prefill replica at all: the decode replica prefills it itself
            quiet_cancel(rq, blocks, reps, pools, th, tbs, rp, t)
            d = r
            r = rp
            p = pp
    reason = admit(rq, reps, pools, p, r, q, t)
    if reason != 0:
        reject(rq, pools, ev, q, reason, t)
        return
    if d >= 0:
        rq.dreplica[q] = d
        reps.incoming[d] += 1
    rq.replica[q] = r
    rq.state[q] = WAITING
    if ev.clock[2] != 0:
        record(ev, t, np.int64(EV_ARRIVE), r, q, np.int64(0))
    rq.queued[q] = t
    wq_push_back(rq, reps, r, q)
    least_set(reps, pools, r)
    wake_idle(reps, r, t)


@njit(cache=True, _nrt=False, no_cfunc_wrapper=True)
def release_held_nb(rq, blocks, reps, pools, ev, th, tbs, p, t, limit):
    """Place up to `limit` of the requests held at pool p, oldest first, at t (a replica of p has
    just started; each records at most one event). Returns how many were placed."""
    least_rebuild(reps, pools)  # a kernel's entry: the host has changed replicas since the last
    n = min(limit, pools.nheld[p])
    for _ in range(n):
        q = pools.held_head[p]
        pools.held_head[p] = rq.qnext[q]
        if rq.qnext[q] < 0:
            pools.held_tail[p] = -1
        rq.qnext[q] = -1
        pools.nheld[p] -= 1
        place(rq, blocks, reps, pools, ev, th, tbs, q, t)
    return n
