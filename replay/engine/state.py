"""The numba engine's state: NamedTuples of preallocated numpy arrays, and the codes the kernels
return and index by.

`numba_engine.py` allocates these arrays (one slice per replica or pool, concatenated); every
kernel of the package reads and writes them in place. The reference engine's twin of this
module is `reference/state.py` (dataclasses per request and replica).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from replay.engine.common import COUNTERS
from policies._userview import UserCall


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
    tail: np.ndarray  # last of the request's own blocks held by id (-1 = none)
    counted_from: np.ndarray  # its blocks from this one on are held as a count (kvblocks.first_counted)
    nhit: np.ndarray  # leading blocks taken from the prefix cache
    nblocks: np.ndarray  # blocks held: nhit hits, then own blocks
    ncached: np.ndarray  # leading full blocks counted as offered (held as a count: offered when released unfinished)
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
    # Prompt tokens the trace's prefix hashes cover (the prompt; a closed-loop turn's answer too),
    # and closed-loop sessions (engine/sessions.py): the next turn (-1: none), and a later turn's
    # delay after the previous one ends (-1: it arrives at its recorded time).
    hash_tokens: np.ndarray
    next_turn: np.ndarray
    gap: np.ndarray
    # Steady decoders kept lazily (engine/lazy.py): the request's place in its replica's running
    # order (a number that grows with every join), and the replica's lazy step count when its
    # computed/generated were last written (-1: not lazy, the fields are current).
    seq: np.ndarray
    lz_join: np.ndarray
    # int64[1]: the trace's id of slot 0. The arrays hold a window of the trace's requests
    # (engine/window.py): every request index above is a slot, its id in the trace base[0] + slot.
    base: np.ndarray



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
    # Tournament tree over the replicas' next events, so the loop finds the earliest in O(log R)
    # (events.tree_set): node i's winner tree[i] and its key ekey[i] = time * 4 + kind (0 step end,
    # 3 wake-up), NO_EVENT when none; node 1 the root, replica r's leaf len(tree) // 2 + r.
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
    # Steady decoders kept lazily (engine/lazy.py). nrun counts every running request; the
    # run_list slice holds the neager others, in order; the nlazy lazy ones are in two min-heaps
    # of (step, seq) keys (lazy_key), a slice of max_num_seqs per replica at run_off: when each
    # finishes (fh_*) and when it next needs a block (ah_*); lz_due is scratch for one step's.
    neager: np.ndarray
    nlazy: np.ndarray
    lz_steps: np.ndarray  # steps the lazy requests have made (each made one token per step)
    lz_ctx: np.ndarray  # sum of the lazy requests' computed tokens
    lz_maxseq: np.ndarray  # no lazy request has a larger seq (-1: none since the last fallback)
    lz_cool: np.ndarray  # steps left before requests may turn lazy again after a fallback step
    seq_next: np.ndarray
    fh_n: np.ndarray
    fh_key: np.ndarray
    fh_q: np.ndarray
    ah_n: np.ndarray
    ah_key: np.ndarray
    ah_q: np.ndarray
    lz_due: np.ndarray
    # Quiet runs (engine/quiet.py): the end of the run's last step (-1: not in a run), and the
    # steps made in runs (a diagnostic for the benchmarks); the lazy step count the run began at
    # and the durations of its steps after that one (int64[R, QUIET_DURS + 2]: see QR_STEPS below).
    qr_end: np.ndarray
    qr_steps: np.ndarray
    qr_from: np.ndarray
    qr_dur: np.ndarray
    # Each pool's least loaded active replica (events.least_set): a tournament tree per pool at
    # Pools.ll_off, keyed by live waiting + running requests (NO_EVENT: not active).
    ll_key: np.ndarray
    ll_win: np.ndarray



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
    arrived_tokens: np.ndarray  # int64[P, 2]: prompt and output tokens of the arrivals, per home pool
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
    # Closed-loop sessions (engine/sessions.py): [on, heap size], and the min-heap of the next
    # turns released, by (arrival, request).
    cl: np.ndarray
    rl_t: np.ndarray
    rl_q: np.ndarray
    lazy: np.ndarray  # 1: the pool's steady decoders may be kept lazily (engine/lazy.py)
    # Each pool's tree of its least loaded replica (Replicas.ll_key/ll_win: node j at ll_off + j,
    # ll_leaves leaves), its active replicas, the earliest ready time of its starting ones
    # (NO_EVENT: none), all as of the kernel's entry and kept since (events.py); and the least
    # loaded one, as the routers read it (RouterView.least).
    ll_off: np.ndarray
    ll_leaves: np.ndarray
    nactive: np.ndarray
    start_due: np.ndarray
    least: np.ndarray
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



# The most steps a quiet run has (engine/quiet.py), whose durations it keeps (Replicas.qr_dur),
# then in the two columns after them the steps the run may have and how many are priced so far.
QUIET_DURS = 64
QR_STEPS, QR_PRICED = QUIET_DURS, QUIET_DURS + 1

# Column of each counter in Replicas.counters, named after common.COUNTERS.
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
