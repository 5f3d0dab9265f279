"""The fast engine: every replica of the fleet stepped by one numba event loop.

State is NamedTuples of preallocated numpy arrays. Event order is (time_us, kind, replica):
a step that ends at t is applied first, then arrivals at t, then replicas that are free at t
schedule their next step, so a step that starts at t sees every request that arrived by t.
The scheduler reproduces vLLM V1 (`vllm/v1/core/sched/scheduler.py`, `Scheduler.schedule`);
`engine_ref.py` is the same algorithm written for reading.

Kernels are compiled with `_nrt=False`: they never allocate, and without numba's reference
counting every array read out of the state tuples would cost two atomic operations; measured,
that was 95% of a decode step (355 ns -> 16 ns per request per step). Everything but the
top-level loop is inlined into it: a call passes each state tuple as hundreds of scalar
arguments, and inlining took the bundled trace on 4 replicas from 0.52 s to 0.33 s.
"""

from __future__ import annotations

import replay._numba_cache  # noqa: F401  (before any kernel is defined)

from typing import NamedTuple

import numpy as np
from numba import njit

from replay.engine_common import (
    COUNTERS,
    EV_ARRIVE,
    EV_FINISH,
    EV_FIRST_TOKEN,
    EV_PREEMPT,
    EV_REJECT,
    EV_SCHEDULE,
    EV_SWAP_OUT,
    FINISHED,
    NO_EVENT,
    REJECT_CONTEXT,
    REJECT_KV,
    REJECT_NO_REPLICA,
    REJECTED,
    TRANSFERRING,
    RUNNING,
    SPEC_CREDIT_SCALE,
    WAITING,
    R_ACTIVE,
    R_DRAINING,
    R_STARTING,
)
from replay.kvblocks import (
    U64,
    alloc_block,
    block_key_nb,
    cache_block,
    ht_find,
    release_block,
    touch_block,
)
from replay.model.stepmodel import step_time_us_nb
from policies._userview import E_STATUS, RequestColumns, UserCall
from policies.admission._view import AdmissionView
from policies.registry import ADMISSION_MODULES, QUEUE_MODULES, ROUTER_MODULES, VICTIM_MODULES
from policies.queue_orders._view import QueueView
from policies._dispatch import build_dispatch
from policies.routers._view import RouterView
from policies.victims._view import VictimView

# Every registered router kernel behind one dispatch; -2: the pool's id has no router.
ROUTE_UNKNOWN = -2
route_dispatch = build_dispatch([m.kernel for m in ROUTER_MODULES], ROUTE_UNKNOWN)
victim_dispatch = build_dispatch([m.kernel for m in VICTIM_MODULES], -1)
admission_dispatch = build_dispatch([m.kernel for m in ADMISSION_MODULES], 0)
queue_head_dispatch = build_dispatch([m.head_kernel for m in QUEUE_MODULES], True)
queue_key_dispatch = build_dispatch([m.key_kernel for m in QUEUE_MODULES], 0.0)
# Constants frozen into the kernels. check_policy_ids stops a run whose ids are out of range
# before any event, so the dispatches' markers for an unknown id (-1, True, 0.0) are never used.
NUM_ROUTERS, NUM_VICTIMS, NUM_QUEUES = len(ROUTER_MODULES), len(VICTIM_MODULES), len(QUEUE_MODULES)
NUM_ADMISSIONS = len(ADMISSION_MODULES)


class Requests(NamedTuple):
    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    priority: np.ndarray
    tenant: np.ndarray
    pool: np.ndarray
    hash_off: np.ndarray
    hash_len: np.ndarray
    replica: np.ndarray  # -1 until routed
    state: np.ndarray
    computed: np.ndarray  # tokens whose KV is computed
    generated: np.ndarray  # output tokens emitted
    sched_new: np.ndarray  # tokens scheduled in the replica's current step
    first_sched: np.ndarray
    first_token: np.ndarray
    finished: np.ndarray
    preemptions: np.ndarray
    cached: np.ndarray  # prefix-cache hit tokens at first admission
    reject: np.ndarray
    qprev: np.ndarray  # waiting-queue links
    qnext: np.ndarray
    tail: np.ndarray  # last of the request's own blocks (-1 = none)
    nhit: np.ndarray  # leading blocks taken from the prefix cache
    nblocks: np.ndarray  # blocks held: nhit hits, then own blocks
    ncached: np.ndarray  # leading blocks already offered to the cache
    swapped: np.ndarray  # tokens of KV swapped out to host memory (0: none)
    # Prefill/decode disaggregation (-1 = none): the decode replica chosen at arrival, the
    # prefill replica, when the prefill was (last) admitted and ended, and the KV transfer.
    dreplica: np.ndarray
    preplica: np.ndarray
    pf_start: np.ndarray
    pf_end: np.ndarray
    xfer_start: np.ndarray
    xfer_done: np.ndarray
    xfers: np.ndarray  # KV transfers started (a property test holds it to one per remote prefill)
    adapter: np.ndarray  # LoRA adapter id, -1 = the base model
    spec_credit: np.ndarray  # speculative decoding: fractional tokens carried, in SPEC_CREDIT_SCALE units
    skip_next: np.ndarray  # links of the requests a step skipped for want of a LoRA slot
    queued: np.ndarray  # when it last joined its replica's waiting queue (async scheduling's cutoff)


class Replicas(NamedTuple):
    pool: np.ndarray
    block_off: np.ndarray
    nblocks: np.ndarray
    free_head: np.ndarray
    free_tail: np.ndarray
    nfree: np.ndarray
    htab_off: np.ndarray
    htab_mask: np.ndarray
    wait_head: np.ndarray
    wait_tail: np.ndarray
    nwait: np.ndarray
    run_off: np.ndarray
    nrun: np.ndarray
    run_list: np.ndarray  # running requests in order, a slice of max_num_seqs per replica
    busy_until: np.ndarray  # end of the current step, -1 when idle
    step_start: np.ndarray
    wake: np.ndarray  # time the replica should try to schedule, NO_EVENT when none
    counters: np.ndarray  # int64[R, len(COUNTERS)]
    # Tournament tree over the replicas' next events, so the loop finds the earliest in O(log R):
    # ekey[r] = time * 4 + kind (0 step end, 3 wake-up), NO_EVENT when none; tree[1] is the winner.
    # (Kinds 1 and 2 are the routers' view refreshes and arrivals, which are not per replica.)
    ekey: np.ndarray
    tree: np.ndarray
    state: np.ndarray  # R_OFF / R_STARTING / R_ACTIVE / R_DRAINING
    active_at: np.ndarray  # when a STARTING replica becomes routable
    # What routers see: the replica's metrics as of its pool's last view refresh.
    view_wait: np.ndarray
    view_run: np.ndarray
    view_kv: np.ndarray  # used KV blocks
    hits: np.ndarray  # prefix-cache hit blocks of the request being routed (routers that read them)
    wait_tokens: np.ndarray  # tokens of the requests waiting (for slo-aware admission)
    host_free: np.ndarray  # blocks of CPU swap space left
    # Prefill/decode: blocks set aside for KV on its way in (already out of nfree), requests
    # whose KV this replica holds until it is sent, requests routed here that are still being
    # prefilled or transferred, and the FIFO of prefilled requests waiting for room (linked by
    # Requests.qnext).
    reserved: np.ndarray
    outgoing: np.ndarray
    incoming: np.ndarray
    pend_head: np.ndarray
    pend_tail: np.ndarray
    # Multi-LoRA: replica r's adapter slots are lora_off[r] .. lora_off[r + 1] (its pool's
    # max_loras): the adapter each holds (-1 = empty) and when a step last used it (LRU).
    lora_off: np.ndarray
    lora_id: np.ndarray
    lora_used: np.ndarray


class Pools(NamedTuple):
    first_replica: np.ndarray
    num_replicas: np.ndarray
    kv_blocks: np.ndarray
    block_size: np.ndarray
    max_num_seqs: np.ndarray
    max_batched: np.ndarray
    long_prefill: np.ndarray
    prefix_caching: np.ndarray
    max_model_len: np.ndarray
    router: np.ndarray  # router kernel id (policies.registry.ROUTER_MODULES)
    router_params: np.ndarray  # float64[P, W]: the router's parameter row
    route_hits: np.ndarray  # 1: the router reads each replica's prefix-cache hits of the request
    rr_next: np.ndarray
    arrivals: np.ndarray
    rejected: np.ndarray
    step: np.ndarray  # float64[P, NUM_PARAMS]
    refresh_us: np.ndarray  # routers' view refresh interval, 0 = routers that read no view
    next_refresh: np.ndarray  # NO_EVENT when the pool's router reads no view
    rng: np.ndarray  # uint64 xorshift state per pool (random and power-of-two routers)
    queue: np.ndarray  # queue-order policy id
    queue_hits: np.ndarray  # 1: the queue order reads each waiting request's prefix-cache hits
    victim: np.ndarray  # preemption-victim policy id
    watermark_blocks: np.ndarray  # blocks admission leaves free
    whole_prompt: np.ndarray  # 1: admit only when every remaining prompt token fits
    ttft_budget_us: np.ndarray  # TTFT target, for earliest-deadline-first
    admission: np.ndarray  # admission policy id
    adm: np.ndarray  # int64[P, 8]: the admission parameters (policies/admission/_view.py PARAM_COLUMNS)
    adm_pool: np.ndarray  # 1: the admission policy reads the pool's queue totals
    adm_reason: np.ndarray  # the reject reason its policy records (REJECT_*)
    bucket: np.ndarray  # int64[P * tenants] token bucket level, in millionths of a token
    bucket_at: np.ndarray  # int64[P * tenants] time of the last refill
    swap: np.ndarray  # 1: preempt by swapping to host memory while swap space lasts
    swap_us_per_block: np.ndarray  # time to copy one block over the host link
    pd: np.ndarray  # int64[6], PD_* below; PD_PREFILL < 0: no prefill/decode disaggregation
    pd_us_per_token: np.ndarray  # float64[1]: link time of one token's KV
    xh_t: np.ndarray  # min-heap of KV transfers in flight, by (done time, request)
    xh_q: np.ndarray
    lora_slots: np.ndarray  # max_loras (0 = LoRA off: adapters are ignored)
    lora_load_us: np.ndarray  # loading one adapter into a slot over the host link
    spec_k: np.ndarray  # num_speculative_tokens (0 = off)
    spec_credit: np.ndarray  # int64[P, K + 1]: expected tokens of a verify step with d drafts, scaled
    # Requests held at the pool while it has no replica active or starting (`hold` 1): a FIFO
    # linked through Requests.qnext (a held request is in no replica's queue).
    hold: np.ndarray
    held_head: np.ndarray
    held_tail: np.ndarray
    nheld: np.ndarray
    async_sched: np.ndarray  # 1: vLLM's async scheduling (step k + 1 is scheduled as step k starts)
    # The pools' user-written policies, one UserCall per family (policies/_userview.py); every
    # family's shares one err array, which advance_nb checks after each event.
    u_router: UserCall
    u_queue: UserCall
    u_victim: UserCall
    u_admission: UserCall


class Events(NamedTuple):
    t: np.ndarray
    kind: np.ndarray
    replica: np.ndarray
    request: np.ndarray
    value: np.ndarray
    # clock[0] next arrival index, [1] events recorded, [2] detailed flag, [3] margin,
    # [4] and [5] the replica and time of a STATUS_STUCK (the pool and time of a
    # STATUS_UNKNOWN_POLICY), [6] the family of a STATUS_UNKNOWN_POLICY (UNKNOWN_* below)
    clock: np.ndarray


# Column of each counter in Replicas.counters, named after engine_common.COUNTERS.
C_BUSY, C_PREFILL, C_OUTPUT, C_ADMITTED, C_FINISHED, C_PREEMPT, C_STEPS, C_HIT, C_QUERY = (
    COUNTERS.index(name) for name in (
        "busy_us", "prefill_tokens", "output_tokens", "admitted", "finished", "preemptions", "steps",
        "hit_tokens", "query_tokens",
    )
)

STATUS_OK, STATUS_EVENTS_FULL, STATUS_STUCK, STATUS_UNKNOWN_POLICY, STATUS_USER_POLICY = 0, 1, 2, 3, 4
# Events.clock[6] of a STATUS_UNKNOWN_POLICY: the family whose id has no policy.
UNKNOWN_ROUTER, UNKNOWN_VICTIM, UNKNOWN_QUEUE, UNKNOWN_ADMISSION = 1, 2, 3, 4
PD_PREFILL, PD_DECODE, PD_THRESHOLD, PD_BASE_US, PD_LAYERS, PD_INFLIGHT = range(6)


@njit(cache=True, _nrt=False, inline="always")
def record(ev, t, kind, replica, request, value):
    n = ev.clock[1]
    ev.t[n] = t
    ev.kind[n] = kind
    ev.replica[n] = replica
    ev.request[n] = request
    ev.value[n] = value
    ev.clock[1] = n + 1


# --- waiting queue (doubly linked over requests) ----------------------------------------------


@njit(cache=True, _nrt=False, inline="always")
def wq_push_back(rq, reps, r, q):
    reps.wait_tokens[r] += rq.prompt[q] + rq.generated[q]
    tail = reps.wait_tail[r]
    rq.qprev[q] = tail
    rq.qnext[q] = -1
    if tail >= 0:
        rq.qnext[tail] = q
    else:
        reps.wait_head[r] = q
    reps.wait_tail[r] = q
    reps.nwait[r] += 1


@njit(cache=True, _nrt=False, inline="always")
def wq_push_front(rq, reps, r, q):
    reps.wait_tokens[r] += rq.prompt[q] + rq.generated[q]
    head = reps.wait_head[r]
    rq.qnext[q] = head
    rq.qprev[q] = -1
    if head >= 0:
        rq.qprev[head] = q
    else:
        reps.wait_tail[r] = q
    reps.wait_head[r] = q
    reps.nwait[r] += 1


@njit(cache=True, _nrt=False, inline="always")
def wq_remove(rq, reps, r, q):
    reps.wait_tokens[r] -= rq.prompt[q] + rq.generated[q]
    p = rq.qprev[q]
    n = rq.qnext[q]
    if p >= 0:
        rq.qnext[p] = n
    else:
        reps.wait_head[r] = n
    if n >= 0:
        rq.qprev[n] = p
    else:
        reps.wait_tail[r] = p
    rq.qprev[q] = -1
    rq.qnext[q] = -1
    reps.nwait[r] -= 1


# --- per-request KV ----------------------------------------------------------------------------


@njit(cache=True, _nrt=False, inline="always")
def request_key(rq, th, tbs, q, j, bs):
    return block_key_nb(th, rq.hash_off[q], rq.hash_len[q], tbs, rq.prompt[q], q, j, bs)


@njit(cache=True, _nrt=False, inline="always")
def free_request_blocks(rq, blocks, reps, th, tbs, bs, r, q):
    """Release a request's blocks tail first (vLLM frees in reverse so tails are evicted first)."""
    b = rq.tail[q]
    for _ in range(rq.nblocks[q] - rq.nhit[q]):
        prev = blocks.cprev[b]
        release_block(blocks, reps, r, b)
        b = prev
    off = reps.htab_off[r]
    mask = reps.htab_mask[r]
    for j in range(rq.nhit[q] - 1, -1, -1):
        # A held hit block cannot be evicted, so its hash still maps to it.
        release_block(blocks, reps, r, ht_find(blocks, off, mask, request_key(rq, th, tbs, q, j, bs)))
    rq.tail[q] = -1
    rq.nhit[q] = 0
    rq.nblocks[q] = 0
    rq.ncached[q] = 0


@njit(cache=True, _nrt=False, inline="always")
def grow_request(rq, blocks, reps, th, tbs, bs, caching, r, q, num_tokens):
    """Allocate blocks so the request holds `num_tokens` tokens of KV, and offer the blocks that
    become full to the prefix cache. The caller checked that enough blocks are free."""
    need = (num_tokens + bs - 1) // bs - rq.nblocks[q]
    for _ in range(need):
        b = alloc_block(blocks, reps, r)
        blocks.cprev[b] = rq.tail[q]
        rq.tail[q] = b
        rq.nblocks[q] += 1
    if caching:
        full = num_tokens // bs
        if full > rq.ncached[q]:
            # The blocks to cache are the newest ones: walk back from the tail.
            b = rq.tail[q]
            for j in range(rq.nblocks[q] - 1, rq.ncached[q] - 1, -1):
                if j < full:
                    cache_block(blocks, reps, r, b, request_key(rq, th, tbs, q, j, bs))
                b = blocks.cprev[b]
            rq.ncached[q] = full


# --- the replicas' next events ---------------------------------------------------------------


@njit(cache=True, _nrt=False, inline="always")
def update_event(reps, r):
    """Recompute replica r's next event after busy_until or wake changed; O(log R)."""
    if reps.busy_until[r] >= 0:
        reps.ekey[r] = reps.busy_until[r] * 4
    elif reps.wake[r] != NO_EVENT:
        reps.ekey[r] = reps.wake[r] * 4 + 3
    else:
        reps.ekey[r] = NO_EVENT
    leaves = reps.tree.shape[0] // 2
    i = (leaves + r) // 2
    while i >= 1:
        a = reps.tree[2 * i]
        b = reps.tree[2 * i + 1]
        # The lower replica index wins a tie: a is always left of b.
        if b < 0 or (a >= 0 and reps.ekey[a] <= reps.ekey[b]):
            reps.tree[i] = a
        else:
            reps.tree[i] = b
        i //= 2


# --- routing and arrival ---------------------------------------------------------------------


@njit(cache=True, _nrt=False, inline="always")
def routable(reps, r, t):
    """Active at t; a starting replica whose loading has finished by t becomes active here."""
    if reps.state[r] == R_STARTING and reps.active_at[r] <= t:
        reps.state[r] = R_ACTIVE
    return reps.state[r] == R_ACTIVE


@njit(cache=True, _nrt=False)
def refresh_views(reps, pools, p, t):
    """The pool's routers see each replica as it is now, until the next refresh."""
    for r in range(pools.first_replica[p], pools.first_replica[p] + pools.num_replicas[p]):
        reps.view_wait[r] = reps.nwait[r]
        reps.view_run[r] = reps.nrun[r]
        reps.view_kv[r] = reps.nblocks[r] - reps.nfree[r]
    pools.next_refresh[p] = t + pools.refresh_us[p]


@njit(cache=True, _nrt=False)
def prefix_hit_blocks(rq, blocks, reps, th, tbs, bs, r, q):
    """Leading prompt blocks of request q already in replica r's prefix cache."""
    off = reps.htab_off[r]
    mask = reps.htab_mask[r]
    hits = 0
    for j in range((rq.prompt[q] - 1) // bs):
        if ht_find(blocks, off, mask, request_key(rq, th, tbs, q, j, bs)) < 0:
            break
        hits += 1
    return hits


@njit(cache=True, _nrt=False, inline="always")
def request_columns(rq, pools):
    """The request columns a user's policy reads (policies/_userview.py)."""
    return RequestColumns(rq.prompt, rq.output, rq.priority, rq.tenant, rq.arrival, rq.generated, rq.nblocks,
                          pools.ttft_budget_us)


@njit(cache=True, _nrt=False)
def route(rq, blocks, reps, pools, th, tbs, p, q, t):
    """Pick an active replica of pool p for request q, -1 if none, ROUTE_UNKNOWN if the pool's
    router id has no kernel. The router (policies/routers/) sees a RouterView; the engine first
    promotes the starting replicas whose loading has finished and, for a router that reads
    them, finds the request's prefix-cache hits on each active replica."""
    first = pools.first_replica[p]
    n = pools.num_replicas[p]
    bs = pools.block_size[p]
    hits = pools.route_hits[p] != 0
    active = 0
    for r in range(first, first + n):
        if routable(reps, r, t):
            active += 1
            if hits:
                reps.hits[r] = prefix_hit_blocks(rq, blocks, reps, th, tbs, bs, r, q)
    if active == 0:
        return -1
    view = RouterView(reps.state, reps.view_wait, reps.view_run, reps.view_kv, reps.nblocks, reps.nwait, reps.nrun,
                      reps.wait_tokens, reps.hits, pools.rng, pools.rr_next, request_columns(rq, pools), q, pools.u_router)
    need = (rq.prompt[q] + bs - 1) // bs
    return route_dispatch(pools.router[p], view, p, first, n, active, need, pools.router_params[p])


@njit(cache=True, _nrt=False)
def route_starting(pools, reps, p):
    """No active replica: the starting replica of pool p that is ready first (lowest index on
    ties) holds the request until it is, as Knative's activator does; -1 if none is starting."""
    best = -1
    for r in range(pools.first_replica[p], pools.first_replica[p] + pools.num_replicas[p]):
        if reps.state[r] == R_STARTING and (best < 0 or reps.active_at[r] < reps.active_at[best]):
            best = r
    return best


@njit(cache=True, _nrt=False)
def admit(rq, reps, pools, p, r, q, t):
    """The pool's admission policy (policies/admission/) on request q routed to replica r: 0 or
    the policy's reject reason. The pool's queue totals are counted for a policy that reads them."""
    waiting = 0
    waiting_tokens = 0
    active = 0
    if pools.adm_pool[p] != 0:
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


@njit(cache=True, _nrt=False)
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


@njit(cache=True, _nrt=False, inline="always")
def reject(rq, pools, ev, q, reason, t):
    """Request q is rejected; its home pool (requests.parquet's `pool`) counts it."""
    rq.state[q] = REJECTED
    rq.reject[q] = reason
    pools.rejected[rq.pool[q]] += 1
    record(ev, t, EV_REJECT, -1, q, reason)


@njit(cache=True, _nrt=False)
def arrive(rq, blocks, reps, pools, ev, th, tbs, q, t):
    p = rq.pool[q]
    pools.arrivals[p] += 1  # counted at its home pool, as requests.parquet's `pool` column
    total = rq.prompt[q] + rq.output[q]
    if total > pools.max_model_len[p]:
        reject(rq, pools, ev, q, REJECT_CONTEXT, t)
    elif (total - 1 + pools.block_size[p] - 1) // pools.block_size[p] > pools.kv_blocks[p] - pools.watermark_blocks[p]:
        # The request could never hold all its tokens, even alone on a replica (above the watermark).
        reject(rq, pools, ev, q, REJECT_KV, t)
    else:
        place(rq, blocks, reps, pools, ev, th, tbs, q, t)


@njit(cache=True, _nrt=False)
def unknown_policy(ev, family, p, t):
    """A pool's policy id has no kernel: stop the run (advance_nb returns STATUS_UNKNOWN_POLICY)."""
    ev.clock[4] = p
    ev.clock[5] = t
    ev.clock[6] = family


@njit(cache=True, _nrt=False)
def check_policy_ids(pools, ev):
    """Every pool's per-step policy ids name a registered kernel; else record the first pool
    that has none (its family in ev.clock[6]) and return False: the run stops with an error."""
    for p in range(pools.router.shape[0]):
        # The last id of each family is its user link: it needs the pool's compiled policy.
        if not 0 <= pools.router[p] < NUM_ROUTERS or (
                pools.router[p] == NUM_ROUTERS - 1 and pools.u_router.addr[p] == 0):
            unknown_policy(ev, UNKNOWN_ROUTER, p, 0)
            return False
        if not 0 <= pools.victim[p] < NUM_VICTIMS or (
                pools.victim[p] == NUM_VICTIMS - 1 and pools.u_victim.addr[p] == 0):
            unknown_policy(ev, UNKNOWN_VICTIM, p, 0)
            return False
        if not 0 <= pools.queue[p] < NUM_QUEUES or (pools.queue[p] == NUM_QUEUES - 1 and pools.u_queue.addr[p] == 0):
            unknown_policy(ev, UNKNOWN_QUEUE, p, 0)
            return False
        if not 0 <= pools.admission[p] < NUM_ADMISSIONS or (
                pools.admission[p] == NUM_ADMISSIONS - 1 and pools.u_admission.addr[p] == 0):
            unknown_policy(ev, UNKNOWN_ADMISSION, p, 0)
            return False
    return True


@njit(cache=True, _nrt=False, inline="always")
def place(rq, blocks, reps, pools, ev, th, tbs, q, t):
    """Route request q (arriving, or held at its pool until now) to a replica and admit it there.
    With no replica active or starting, a pool that holds (an autoscaled pool that may scale up)
    keeps it in its FIFO; any other rejects it as no_replica."""
    p = rq.pool[q]
    r = route(rq, blocks, reps, pools, th, tbs, p, q, t)
    if r == ROUTE_UNKNOWN:
        unknown_policy(ev, UNKNOWN_ROUTER, p, t)
        return
    if r < 0:
        r = route_starting(pools, reps, p)
    if r < 0:
        if pools.hold[p] != 0:
            held_push(rq, pools, p, q)
        else:
            reject(rq, pools, ev, q, REJECT_NO_REPLICA, t)
        return
    d = -1
    if remote_prefill(rq, blocks, reps, pools, th, tbs, p, r, q):
        pp = pools.pd[PD_PREFILL]
        rp = route(rq, blocks, reps, pools, th, tbs, pp, q, t)
        if rp == ROUTE_UNKNOWN:
            unknown_policy(ev, UNKNOWN_ROUTER, pp, t)
            return
        if rp < 0:
            rp = route_starting(pools, reps, pp)
        if rp >= 0:  # else no prefill replica at all: the decode replica prefills it itself
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
        record(ev, t, EV_ARRIVE, r, q, 0)
    rq.queued[q] = t
    wq_push_back(rq, reps, r, q)
    wake_idle(reps, r, t)


@njit(cache=True, _nrt=False, inline="always")
def held_push(rq, pools, p, q):
    rq.qnext[q] = -1
    tail = pools.held_tail[p]
    if tail >= 0:
        rq.qnext[tail] = q
    else:
        pools.held_head[p] = q
    pools.held_tail[p] = q
    pools.nheld[p] += 1


@njit(cache=True, _nrt=False)
def release_held_nb(rq, blocks, reps, pools, ev, th, tbs, p, t, limit):
    """Place up to `limit` of the requests held at pool p, oldest first, at t (a replica of p has
    just started; each records at most one event). Returns how many were placed."""
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


@njit(cache=True, _nrt=False, inline="always")
def wake_idle(reps, r, t):
    """An idle replica that was given work schedules at t (a starting one once it is ready)."""
    if reps.busy_until[r] < 0 and reps.wake[r] == NO_EVENT:
        reps.wake[r] = max(t, reps.active_at[r])
        update_event(reps, r)


# --- prefill/decode disaggregation: the KV transfer --------------------------------------------
# After its prefill the request leaves the prefill replica's batch but keeps its blocks there
# until its KV has been read (vLLM's NixlConnector delays freeing them). The decode replica takes
# it only once it has free blocks for the whole prompt (blocks are set aside then, as vLLM's
# scheduler allocates them for WAITING_FOR_REMOTE_KVS); until then it waits in that replica's
# FIFO. The transfer takes ceil(prompt * us_per_token) + base; overlapped layer by layer, only the
# part that outlasts the prefill shows, and at least one layer's share (a transfer that starts
# after the prefill ended, because the decode replica was full, overlaps nothing). Then the prefill
# replica frees its copy and the request joins the decode replica's queue (it goes first: see
# `pick_waiting`) with every prompt token but the last computed (vLLM recomputes the last one for its logits,
# `Scheduler._update_waiting_for_remote_kv`).


@njit(cache=True, _nrt=False, inline="always")
def transfer_blocks(rq, pools, q):
    bs = pools.block_size[pools.pd[PD_DECODE]]
    return (rq.prompt[q] + bs - 1) // bs


@njit(cache=True, _nrt=False, inline="always")
def transfer_us(rq, pools, q, t):
    x = np.int64(np.ceil(rq.prompt[q] * pools.pd_us_per_token[0]))
    layers = pools.pd[PD_LAYERS]
    if layers > 0 and t == rq.pf_end[q]:
        x = max((x + layers - 1) // layers, x - (rq.pf_end[q] - rq.pf_start[q]))
    return x + pools.pd[PD_BASE_US]


@njit(cache=True, _nrt=False, inline="always")
def xheap_push(pools, t, q):
    i = pools.pd[PD_INFLIGHT]
    pools.pd[PD_INFLIGHT] = i + 1
    while i > 0:
        up = (i - 1) // 2
        if pools.xh_t[up] < t or (pools.xh_t[up] == t and pools.xh_q[up] < q):
            break
        pools.xh_t[i] = pools.xh_t[up]
        pools.xh_q[i] = pools.xh_q[up]
        i = up
    pools.xh_t[i] = t
    pools.xh_q[i] = q


@njit(cache=True, _nrt=False, inline="always")
def xheap_pop(pools):
    """Remove the transfer that completes first; returns its request."""
    top = pools.xh_q[0]
    n = pools.pd[PD_INFLIGHT] - 1
    pools.pd[PD_INFLIGHT] = n
    t = pools.xh_t[n]
    q = pools.xh_q[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (pools.xh_t[c + 1] < pools.xh_t[c] or (
                pools.xh_t[c + 1] == pools.xh_t[c] and pools.xh_q[c + 1] < pools.xh_q[c])):
            c += 1
        if pools.xh_t[c] > t or (pools.xh_t[c] == t and pools.xh_q[c] > q):
            break
        pools.xh_t[i] = pools.xh_t[c]
        pools.xh_q[i] = pools.xh_q[c]
        i = c
    pools.xh_t[i] = t
    pools.xh_q[i] = q
    return top


@njit(cache=True, _nrt=False, inline="always")
def start_transfer(rq, reps, pools, q, d, t):
    need = transfer_blocks(rq, pools, q)
    reps.nfree[d] -= need
    reps.reserved[d] += need
    rq.xfer_start[q] = t
    rq.xfer_done[q] = t + transfer_us(rq, pools, q, t)
    rq.xfers[q] += 1
    xheap_push(pools, rq.xfer_done[q], q)


@njit(cache=True, _nrt=False, inline="always")
def accept_pending(rq, reps, pools, d, t):
    """Start the transfers of the decode replica's FIFO while their blocks fit, in order."""
    room = reps.nfree[d] - pools.watermark_blocks[pools.pd[PD_DECODE]]
    q = reps.pend_head[d]
    while q >= 0 and transfer_blocks(rq, pools, q) <= room:
        nxt = rq.qnext[q]
        rq.qnext[q] = -1
        start_transfer(rq, reps, pools, q, d, t)
        room = reps.nfree[d] - pools.watermark_blocks[pools.pd[PD_DECODE]]
        q = nxt
    reps.pend_head[d] = q
    if q < 0:
        reps.pend_tail[d] = -1


@njit(cache=True, _nrt=False, inline="always")
def hand_off(rq, reps, pools, q, r, t):
    """Request q finished its prefill on replica r: its KV goes to its decode replica."""
    d = rq.dreplica[q]
    rq.state[q] = TRANSFERRING
    rq.preplica[q] = r
    rq.pf_end[q] = t
    reps.outgoing[r] += 1
    rq.qnext[q] = -1
    if reps.pend_tail[d] >= 0:
        rq.qnext[reps.pend_tail[d]] = q
    else:
        reps.pend_head[d] = q
    reps.pend_tail[d] = q
    accept_pending(rq, reps, pools, d, t)


@njit(cache=True, _nrt=False)
def finish_transfer(rq, blocks, reps, pools, ev, th, tbs, t):
    q = xheap_pop(pools)
    r = rq.preplica[q]
    d = rq.dreplica[q]
    free_request_blocks(rq, blocks, reps, th, tbs, pools.block_size[reps.pool[r]], r, q)
    reps.outgoing[r] -= 1
    if reps.nwait[r] > 0:
        wake_idle(reps, r, t)
    need = transfer_blocks(rq, pools, q)
    reps.nfree[d] += need
    reps.reserved[d] -= need
    p = reps.pool[d]
    grow_request(rq, blocks, reps, th, tbs, pools.block_size[p], pools.prefix_caching[p] != 0, d, q, rq.prompt[q])
    rq.computed[q] = rq.prompt[q] - 1
    rq.replica[q] = d
    rq.state[q] = WAITING
    reps.incoming[d] -= 1
    rq.queued[q] = t
    wq_push_back(rq, reps, d, q)
    if ev.clock[2] != 0:
        record(ev, t, EV_ARRIVE, d, q, r + 1)  # value: 1 + the prefill replica (0: from the router)
    wake_idle(reps, d, t)


# --- one scheduler step ----------------------------------------------------------------------


@njit(cache=True, _nrt=False, inline="always")
def preempt(rq, blocks, reps, pools, ev, th, tbs, bs, r, q, t):
    """Free the request's blocks and put it back at the head of the queue. Swap mode copies its KV
    to host memory while the swap space lasts (progress kept; returns the blocks copied, which
    the step pays for); otherwise recompute (progress forgotten; returns 0)."""
    held = rq.nblocks[q]
    swapped = pools.swap[reps.pool[r]] != 0 and held <= reps.host_free[r]
    free_request_blocks(rq, blocks, reps, th, tbs, bs, r, q)
    if swapped:
        reps.host_free[r] -= held
        rq.swapped[q] = rq.computed[q]
    rq.computed[q] = 0
    rq.state[q] = WAITING
    rq.preemptions[q] += 1
    reps.counters[r, C_PREEMPT] += 1
    rq.queued[q] = t
    wq_push_front(rq, reps, r, q)
    record(ev, t, EV_SWAP_OUT if swapped else EV_PREEMPT, r, q, rq.generated[q])
    return held if swapped else 0


@njit(cache=True, _nrt=False, inline="always")
def is_decoding(rq, q):
    """The request's next token is a decode: all but the newest token already have KV."""
    return rq.generated[q] > 0 and rq.computed[q] == rq.prompt[q] + rq.generated[q] - 1


@njit(cache=True, _nrt=False, inline="always")
def pick_victim(rq, reps, pools, p, off, nrun, i):
    """Index in the running list of the request to preempt while scheduling index i: the pool's
    victim policy (policies/victims/) over a VictimView (ids are checked by check_policy_ids)."""
    view = VictimView(reps.run_list, rq.priority, rq.arrival, rq.generated, rq.nblocks, request_columns(rq, pools), p,
                      pools.u_victim)
    return victim_dispatch(pools.victim[p], view, off, nrun, i)


@njit(cache=True, _nrt=False, inline="always")
def prompt_hits(rq, blocks, reps, th, tbs, bs, r, q):
    """Prefix-cache hits of a waiting request: leading full blocks, capped at num_tokens - 1."""
    off = reps.htab_off[r]
    mask = reps.htab_mask[r]
    hits = 0
    for j in range((rq.prompt[q] + rq.generated[q] - 1) // bs):
        if ht_find(blocks, off, mask, request_key(rq, th, tbs, q, j, bs)) < 0:
            break
        hits += 1
    return hits


@njit(cache=True, _nrt=False, inline="always")
def pick_waiting(rq, blocks, reps, pools, th, tbs, p, r, cutoff):
    """The waiting request to admit next under the pool's queue order (policies/queue_orders/),
    among those queued by `cutoff` (-1: none is). Ties go to the earlier arrival, then the lower
    index. On a decode replica, a request whose KV has arrived goes first, the earliest arrived
    first: it holds its blocks already, and a request that cannot fit must not keep it waiting."""
    policy = pools.queue[p]
    if p == pools.pd[PD_DECODE]:
        q = reps.wait_head[r]
        while q >= 0:
            if rq.nblocks[q] > 0 and rq.queued[q] <= cutoff:
                return q
            q = rq.qnext[q]
    q = reps.wait_head[r]
    if queue_head_dispatch(policy, reps.nwait[r]):  # the queue's own order (FCFS)
        while q >= 0 and rq.queued[q] > cutoff:
            q = rq.qnext[q]
        return q
    bs = pools.block_size[p]
    reads_prefix = pools.queue_hits[p] != 0
    view = QueueView(rq.priority, rq.prompt, rq.arrival, pools.ttft_budget_us, request_columns(rq, pools),
                     pools.u_queue)
    best = -1
    best_key = 0.0
    while q >= 0:
        if rq.queued[q] > cutoff:
            q = rq.qnext[q]
            continue
        hits = prompt_hits(rq, blocks, reps, th, tbs, bs, r, q) if reads_prefix else 0
        key = queue_key_dispatch(policy, view, p, q, hits)
        if best < 0 or key < best_key or (key == best_key and (
                rq.arrival[q] < rq.arrival[best] or (rq.arrival[q] == rq.arrival[best] and q < best))):
            best = q
            best_key = key
        q = rq.qnext[q]
    return best


@njit(cache=True, _nrt=False, inline="always")
def lora_of(rq, pools, p, q):
    """The request's adapter on pool p (-1: none, or the pool serves no LoRA)."""
    return rq.adapter[q] if pools.lora_slots[p] > 0 else -1


@njit(cache=True, _nrt=False, inline="always")
def lora_in_batch(rq, reps, pools, p, off, nrun, a):
    """Some request scheduled in this step uses adapter a."""
    for k in range(nrun):
        x = reps.run_list[off + k]
        if rq.sched_new[x] > 0 and lora_of(rq, pools, p, x) == a:
            return True
    return False


@njit(cache=True, _nrt=False, inline="always")
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


@njit(cache=True, _nrt=False, inline="always")
def schedule(rq, blocks, reps, pools, ev, th, tbs, r, t):
    """Build the step that starts at t on replica r; returns its duration (0 = nothing to run)."""
    p = reps.pool[r]
    bs = pools.block_size[p]
    caching = pools.prefix_caching[p] != 0
    threshold = pools.long_prefill[p]
    budget = pools.max_batched[p]
    off = reps.run_off[r]
    detailed = ev.clock[2] != 0
    preempted = False
    swap_blocks = 0  # copied to or from host memory in this step
    # Async scheduling (vLLM V1's default, `EngineCore.step_with_batch_queue`): while requests run,
    # this step was scheduled as the previous one started, so only requests queued by then join
    # it; an engine with nothing running schedules at once.
    cutoff = reps.step_start[r] if pools.async_sched[p] != 0 and reps.nrun[r] > 0 else t

    # 1. Running requests first, in order; make room by preempting the policy's victim.
    i = 0
    while i < reps.nrun[r] and budget > 0:
        q = reps.run_list[off + i]
        new = rq.prompt[q] + rq.generated[q] - rq.computed[q]
        if pools.spec_k[p] > 0 and is_decoding(rq, q):
            # A verify step: the token plus up to k drafts, none past the last output token.
            new = 1 + min(pools.spec_k[p], rq.output[q] - rq.generated[q] - 1)
        if 0 < threshold < new:
            new = threshold
        if new > budget:
            new = budget
        target = rq.computed[q] + new
        scheduled = True
        while (target + bs - 1) // bs - rq.nblocks[q] > reps.nfree[r]:
            vi = pick_victim(rq, reps, pools, p, off, reps.nrun[r], i)
            victim = reps.run_list[off + vi]
            for k in range(vi, reps.nrun[r] - 1):
                reps.run_list[off + k] = reps.run_list[off + k + 1]
            reps.nrun[r] -= 1
            budget += rq.sched_new[victim]  # a victim scheduled earlier in this step gives its tokens back
            rq.sched_new[victim] = 0
            swap_blocks += preempt(rq, blocks, reps, pools, ev, th, tbs, bs, r, victim, t)
            preempted = True
            if victim == q:
                scheduled = False
                break
            if vi < i:
                i -= 1
        if not scheduled:
            break
        grow_request(rq, blocks, reps, th, tbs, bs, caching, r, q, target)
        rq.sched_new[q] = new
        budget -= new
        i += 1

    # 2. Waiting requests, only if nothing was preempted; admission never preempts.
    if not preempted:
        hoff = reps.htab_off[r]
        hmask = reps.htab_mask[r]
        # Multi-LoRA: a step holds at most max_loras distinct adapters; a waiting request that
        # would need one more is skipped and keeps its place (vLLM V1 `Scheduler.schedule`).
        loras = 0
        if pools.lora_slots[p] > 0:
            for k in range(reps.nrun[r]):
                x = reps.run_list[off + k]
                a = lora_of(rq, pools, p, x)
                if a >= 0 and rq.sched_new[x] > 0 and not lora_in_batch(rq, reps, pools, p, off, k, a):
                    loras += 1
        skipped = -1
        while reps.nwait[r] > 0 and budget > 0 and reps.nrun[r] < pools.max_num_seqs[p]:
            q = pick_waiting(rq, blocks, reps, pools, th, tbs, p, r, cutoff)
            if q < 0:
                break  # the rest joined the queue after this step was scheduled
            a = lora_of(rq, pools, p, q)
            new_lora = a >= 0 and not lora_in_batch(rq, reps, pools, p, off, reps.nrun[r], a)
            if new_lora and loras >= pools.lora_slots[p]:
                wq_remove(rq, reps, r, q)
                rq.skip_next[q] = skipped
                skipped = q
                continue
            num_tokens = rq.prompt[q] + rq.generated[q]
            received = rq.nblocks[q]  # blocks it holds already: KV received from a prefill replica
            resumed = rq.swapped[q]  # KV tokens coming back from host memory
            nhit = prompt_hits(rq, blocks, reps, th, tbs, bs, r, q) if caching and resumed == 0 and received == 0 else 0
            evictable = 0
            for j in range(nhit):
                if blocks.ref[ht_find(blocks, hoff, hmask, request_key(rq, th, tbs, q, j, bs))] == 0:
                    evictable += 1
            computed = rq.computed[q] if received > 0 else (nhit * bs if resumed == 0 else resumed)
            new = num_tokens - computed
            if 0 < threshold < new:
                new = threshold
            if new > budget:
                new = budget
            # The chunk must fit; with the whole-prompt gate, everything still to compute must;
            # the watermark keeps some blocks free for running requests to grow into.
            upto = num_tokens if pools.whole_prompt[p] != 0 else computed + new
            need = (upto + bs - 1) // bs - nhit - received
            if need > 0 and need + evictable > reps.nfree[r] - pools.watermark_blocks[p]:
                break
            if received == 0:
                for j in range(nhit):
                    touch_block(blocks, reps, r, ht_find(blocks, hoff, hmask, request_key(rq, th, tbs, q, j, bs)))
                rq.nhit[q] = nhit
                rq.nblocks[q] = nhit
                rq.ncached[q] = nhit
                rq.computed[q] = computed
            grow_request(rq, blocks, reps, th, tbs, bs, caching, r, q, computed + new)
            if resumed > 0:  # swap in: the host copy is released
                back = (resumed + bs - 1) // bs
                reps.host_free[r] += back
                swap_blocks += back
                rq.swapped[q] = 0
            wq_remove(rq, reps, r, q)
            reps.run_list[off + reps.nrun[r]] = q
            reps.nrun[r] += 1
            rq.state[q] = RUNNING
            rq.sched_new[q] = new
            rq.pf_start[q] = t
            if rq.first_sched[q] < 0:
                rq.first_sched[q] = t
                rq.cached[q] = computed
                reps.counters[r, C_HIT] += computed
                reps.counters[r, C_QUERY] += rq.prompt[q]
            reps.counters[r, C_ADMITTED] += 1
            if detailed:
                record(ev, t, EV_SCHEDULE, r, q, computed)
            budget -= new
            if new_lora:
                loras += 1
        while skipped >= 0:  # back to the head of the queue, in their order
            q = skipped
            skipped = rq.skip_next[q]
            wq_push_front(rq, reps, r, q)

    # 3. What the step computes, for the step model.
    prefill_tokens = 0
    prefill_pairs = 0.0
    prefill_ctx = 0
    decode_seqs = 0
    decode_ctx = 0
    num_seqs = 0
    spec_tokens = 0
    lora_adapters = 0
    lora_loads = 0
    for k in range(reps.nrun[r]):
        q = reps.run_list[off + k]
        new = rq.sched_new[q]
        if new == 0:
            continue
        num_seqs += 1
        a = lora_of(rq, pools, p, q)
        if a >= 0 and not lora_in_batch(rq, reps, pools, p, off, k, a):
            lora_adapters += 1
            lora_loads += lora_activate(reps, pools, p, r, a, t)
        if is_decoding(rq, q):
            decode_seqs += 1
            decode_ctx += rq.computed[q] + 1
            spec_tokens += new - 1
        else:
            prefill_tokens += new
            prefill_pairs += new * rq.computed[q] + new * (new + 1) / 2.0
            prefill_ctx += rq.computed[q]
    if num_seqs == 0:
        return np.int64(0), preempted
    dur = step_time_us_nb(pools.step[p], prefill_tokens, prefill_pairs, prefill_ctx, decode_seqs, decode_ctx,
                          num_seqs, spec_tokens, lora_adapters) + swap_blocks * pools.swap_us_per_block[p]
    dur += lora_loads * pools.lora_load_us[p]
    return dur, preempted


@njit(cache=True, _nrt=False, inline="always")
def finish_step(rq, blocks, reps, pools, ev, th, tbs, r, t):
    """Apply the step that ended at t: tokens are emitted at the end of the step."""
    p = reps.pool[r]
    bs = pools.block_size[p]
    off = reps.run_off[r]
    detailed = ev.clock[2] != 0
    kept = 0
    for i in range(reps.nrun[r]):
        q = reps.run_list[off + i]
        new = rq.sched_new[q]
        if new > 0:
            rq.sched_new[q] = 0
            num_tokens = rq.prompt[q] + rq.generated[q]
            if not is_decoding(rq, q):
                reps.counters[r, C_PREFILL] += new
            else:
                # The tokens a decode (or verify) step yields: its expected value, with the
                # fraction carried to the request's next step. Without speculation, exactly 1.
                credit = rq.spec_credit[q] + pools.spec_credit[p, new - 1]
                new = credit // SPEC_CREDIT_SCALE
                rq.spec_credit[q] = credit - new * SPEC_CREDIT_SCALE
            rq.computed[q] += new
            if rq.computed[q] >= num_tokens and rq.dreplica[q] >= 0 and rq.generated[q] == 0 and r != rq.dreplica[q]:
                hand_off(rq, reps, pools, q, r, t)  # prefilled: its KV goes to the decode replica
                continue
            if rq.computed[q] >= num_tokens:
                emitted = rq.computed[q] - num_tokens + 1
                rq.generated[q] += emitted
                reps.counters[r, C_OUTPUT] += emitted
                if rq.first_token[q] < 0:
                    rq.first_token[q] = t
                    if detailed:
                        record(ev, t, EV_FIRST_TOKEN, r, q, 0)
                if rq.generated[q] >= rq.output[q]:
                    free_request_blocks(rq, blocks, reps, th, tbs, bs, r, q)
                    rq.state[q] = FINISHED
                    rq.finished[q] = t
                    reps.counters[r, C_FINISHED] += 1
                    if detailed:
                        record(ev, t, EV_FINISH, r, q, rq.generated[q])
                    continue
        reps.run_list[off + kept] = q
        kept += 1
    reps.nrun[r] = kept
    if reps.pend_head[r] >= 0:
        accept_pending(rq, reps, pools, r, t)  # blocks may have been freed
    reps.counters[r, C_BUSY] += t - reps.step_start[r]
    reps.busy_until[r] = -1
    reps.wake[r] = t
    update_event(reps, r)


@njit(cache=True, _nrt=False)
def advance_nb(rq, blocks, reps, pools, ev, th, tbs, until):
    """Process every event with time <= until, in (time, kind, replica) order."""
    n = rq.arrival.shape[0]
    cap = ev.t.shape[0]
    if ev.clock[6] != 0 or not check_policy_ids(pools, ev):
        return STATUS_UNKNOWN_POLICY
    while True:
        if pools.u_router.err[E_STATUS] != 0:  # a user's policy made an invalid choice (its link says which)
            return STATUS_USER_POLICY
        if ev.clock[1] + ev.clock[3] > cap:
            return STATUS_EVENTS_FULL
        # Earliest replica event: a step end (kind 0) or a wake-up to schedule (kind 3).
        best_r = reps.tree[1]
        best_t = NO_EVENT
        best_kind = 4
        if best_r >= 0 and reps.ekey[best_r] != NO_EVENT:
            best_t = reps.ekey[best_r] // 4
            best_kind = reps.ekey[best_r] % 4
        else:
            best_r = -1
        a = ev.clock[0]
        t_arr = rq.arrival[a] if a < n else NO_EVENT
        # Routers' view refreshes (kind 1): after the steps that end at the same time, before the
        # arrivals (kind 2) and wake-ups (kind 3).
        ref_p = -1
        for p in range(pools.next_refresh.shape[0]):
            if pools.next_refresh[p] != NO_EVENT and (ref_p < 0 or pools.next_refresh[p] < pools.next_refresh[ref_p]):
                ref_p = p
        t_ref = pools.next_refresh[ref_p] if ref_p >= 0 else NO_EVENT
        # KV transfers that complete: after the steps that end at the same time, before the rest.
        if pools.pd[PD_INFLIGHT] > 0:
            t_x = pools.xh_t[0]
            if (t_x < best_t or (t_x == best_t and best_kind > 0)) and t_x <= t_ref and t_x <= t_arr:
                if t_x > until:
                    return STATUS_OK
                finish_transfer(rq, blocks, reps, pools, ev, th, tbs, t_x)
                continue
        if ref_p >= 0:
            if (t_ref < best_t or (t_ref == best_t and best_kind > 1)) and t_ref <= t_arr:
                if t_ref > until:
                    return STATUS_OK
                refresh_views(reps, pools, ref_p, t_ref)
                continue
        if a < n and (t_arr < best_t or (t_arr == best_t and best_kind > 2)):
            if t_arr > until:
                return STATUS_OK
            arrive(rq, blocks, reps, pools, ev, th, tbs, a, t_arr)
            ev.clock[0] = a + 1
            if ev.clock[6] != 0:
                return STATUS_UNKNOWN_POLICY
            continue
        if best_r < 0 or best_t > until:
            return STATUS_OK
        r = best_r
        if best_kind == 0:
            finish_step(rq, blocks, reps, pools, ev, th, tbs, r, best_t)
            continue
        reps.wake[r] = NO_EVENT
        dur, preempted = schedule(rq, blocks, reps, pools, ev, th, tbs, r, best_t)
        if dur > 0:
            reps.step_start[r] = best_t
            reps.busy_until[r] = best_t + dur
            reps.counters[r, C_STEPS] += 1
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


@njit(cache=True, _nrt=False)
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


@njit(cache=True, _nrt=False)
def reset_replica_nb(blocks, reps, r):
    """A new pod: every block free in id order, an empty prefix cache, no queues."""
    off = reps.block_off[r]
    n = reps.nblocks[r]
    for i in range(n):
        b = off + i
        blocks.ref[b] = 0
        blocks.key[b] = U64(0)
        blocks.cprev[b] = -1
        blocks.fprev[b] = b - 1 if i > 0 else -1
        blocks.fnext[b] = b + 1 if i < n - 1 else -1
    reps.free_head[r] = off
    reps.free_tail[r] = off + n - 1
    reps.nfree[r] = n
    hoff = reps.htab_off[r]
    for i in range(reps.htab_mask[r] + 1):
        blocks.htab_key[hoff + i] = U64(0)
        blocks.htab_val[hoff + i] = -1
    reps.wait_head[r] = -1
    reps.wait_tail[r] = -1
    reps.nwait[r] = 0
    reps.nrun[r] = 0
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
