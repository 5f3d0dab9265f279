"""One scheduler step of one replica, as vLLM V1 builds it (`vllm/v1/core/sched/scheduler.py`,
`Scheduler.schedule`): running requests first (preempting the victim policy's pick to make
room), then waiting ones in the queue order's pick, then the step model prices the batch;
`finish_step` applies the step when it ends.
"""

from __future__ import annotations

import replay._numba_cache  # noqa: F401  (before any kernel is defined)

import numpy as np
from numba import njit

from replay.engine.common import (
    EV_FIRST_TOKEN,
    EV_PREEMPT,
    EV_SCHEDULE,
    EV_SWAP_OUT,
    RUNNING,
    SPEC_CREDIT_SCALE,
    WAITING,
)
from replay.engine.events import record, update_event
from replay.engine.kvblocks import (
    free_request_blocks,
    grow_request,
    ht_find,
    prompt_hits,
    request_key,
    touch_block,
)
from replay.engine.lazy import (
    can_lazify,
    finish_lazy,
    finish_request,
    is_decoding,
    lazify,
    lazy_running,
    lazy_step_done,
    materialise,
    next_lazy_finish,
)
from replay.engine.lora import lora_activate, lora_in_batch, lora_of, loras_scheduled
from replay.engine.queues import wq_push_front, wq_remove
from replay.engine.routing import request_columns
from replay.engine.state import (
    C_ADMITTED,
    C_BUSY,
    C_HIT,
    C_OUTPUT,
    C_PREEMPT,
    C_PREFILL,
    C_QUERY,
    PD_DECODE,
)
from replay.engine.transfer import accept_pending, hand_off
from replay.engine.variants import WITH_LORA, WITH_PD, WITH_POLICIES, WITH_SPEC, policy_gates
from replay.model.stepmodel import step_time_us_nb
from policies.queue_orders._view import QueueView
from policies.registry import QUEUE_MODULES, VICTIM_MODULES
from policies._dispatch import build_dispatch
from policies.victims._view import VictimView

victim_dispatch = build_dispatch([m.kernel for m in VICTIM_MODULES], -1, policy_gates(VICTIM_MODULES))
queue_head_dispatch = build_dispatch([m.head_kernel for m in QUEUE_MODULES], True, policy_gates(QUEUE_MODULES))
queue_key_dispatch = build_dispatch([m.key_kernel for m in QUEUE_MODULES], 0.0, policy_gates(QUEUE_MODULES))
# routing.check_policy_ids stops a run whose ids are out of range before any event, so the
# dispatches' markers for an unknown id (-1, True, 0.0) are never used.


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def schedule(rq, blocks, reps, pools, ev, th, tbs, r, t):
    """Build the step that starts at t on replica r; returns its duration (0 = nothing to run)
    and whether it preempted."""
    p = reps.pool[r]
    # Async scheduling (vLLM V1's default, `EngineCore.step_with_batch_queue`): while requests run,
    # this step was scheduled as the previous one started, so only requests queued by then join
    # it; an engine with nothing running schedules at once.
    cutoff = reps.step_start[r] if pools.async_sched[p] != 0 and reps.nrun[r] > 0 else t
    budget, preempted, swap_blocks = schedule_running(rq, blocks, reps, pools, ev, th, tbs, r, t)
    if not preempted:  # admission never preempts
        swap_blocks += schedule_waiting(rq, blocks, reps, pools, ev, th, tbs, r, t, budget, cutoff)
    return step_duration(rq, reps, pools, r, t, swap_blocks), preempted


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def schedule_running(rq, blocks, reps, pools, ev, th, tbs, r, t):
    """Step 1: running requests first, in order; make room by preempting the policy's victim.
    Returns the token budget left, whether it preempted, and the blocks swapped out. Lazy
    requests (engine/lazy.py) take the lazy path, unless the step must run step by step."""
    if reps.nlazy[r] > 0:
        left = lazy_running(rq, blocks, reps, pools, th, tbs, r)
        if left >= 0:
            return left, False, 0
        materialise(rq, blocks, reps, pools, th, tbs, r)
    p = reps.pool[r]
    bs = pools.block_size[p]
    caching = pools.prefix_caching[p] != 0
    threshold = pools.long_prefill[p]
    budget = pools.max_batched[p]
    off = reps.run_off[r]
    preempted = False
    swap_blocks = 0  # copied to or from host memory in this step
    i = np.int64(0)  # typed: the victim policy is typed once, not first for a literal 0
    while i < reps.neager[r] and budget > 0:
        q = reps.run_list[off + i]
        new = rq.prompt[q] + rq.generated[q] - rq.computed[q]
        if WITH_SPEC and pools.spec_k[p] > 0 and is_decoding(rq, q):
            # A verify step: the token plus up to k drafts, none past the last output token.
            new = 1 + min(pools.spec_k[p], rq.output[q] - rq.generated[q] - 1)
        if 0 < threshold < new:
            new = threshold
        if new > budget:
            new = budget
        target = rq.computed[q] + new
        scheduled = True
        while (target + bs - 1) // bs - rq.nblocks[q] > reps.nfree[r]:
            vi = pick_victim(rq, reps, pools, p, off, reps.neager[r], i)
            victim = reps.run_list[off + vi]
            for k in range(vi, reps.neager[r] - 1):
                reps.run_list[off + k] = reps.run_list[off + k + 1]
            reps.neager[r] -= 1
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
    return budget, preempted, swap_blocks


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def schedule_waiting(rq, blocks, reps, pools, ev, th, tbs, r, t, budget, cutoff):
    """Step 2: waiting requests, in the queue order's pick, while the budget, the batch and the
    free blocks last. Multi-LoRA: a step holds at most max_loras distinct adapters; a waiting
    request that would need one more is skipped and keeps its place (vLLM V1
    `Scheduler.schedule`). Returns the blocks swapped back in."""
    p = reps.pool[r]
    off = reps.run_off[r]
    swap_blocks = 0
    loras = loras_scheduled(rq, reps, pools, p, r) if WITH_LORA else 0
    skipped = np.int64(-1)  # typed, as `i` in schedule_running
    while reps.nwait[r] > 0 and budget > 0 and reps.nrun[r] < pools.max_num_seqs[p]:
        q = pick_waiting(rq, blocks, reps, pools, th, tbs, p, r, cutoff)
        if q < 0:
            break  # the rest joined the queue after this step was scheduled
        new_lora = False
        if WITH_LORA:
            a = lora_of(rq, pools, p, q)
            new_lora = a >= 0 and not lora_in_batch(rq, reps, pools, p, off, reps.neager[r], a)
        if new_lora and loras >= pools.lora_slots[p]:
            wq_remove(rq, reps, r, q)
            rq.skip_next[q] = skipped
            skipped = q
            continue
        computed, new, nhit = fit_waiting(rq, blocks, reps, pools, th, tbs, r, q, budget)
        if new < 0:
            break  # its chunk does not fit
        swap_blocks += join_batch(rq, blocks, reps, pools, ev, th, tbs, r, q, t, computed, new, nhit)
        budget -= new
        if new_lora:
            loras += 1
    while skipped >= 0:  # back to the head of the queue, in their order
        q = skipped
        skipped = rq.skip_next[q]
        wq_push_front(rq, reps, r, q)
    return swap_blocks


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def fit_waiting(rq, blocks, reps, pools, th, tbs, r, q, budget):
    """Where waiting request q would start and how many tokens it would compute in this step:
    (computed, new, prefix-cache hit blocks), with new = -1 when its chunk does not fit."""
    p = reps.pool[r]
    bs = pools.block_size[p]
    caching = pools.prefix_caching[p] != 0
    threshold = pools.long_prefill[p]
    hoff = reps.htab_off[r]
    hmask = reps.htab_mask[r]
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
        new = -1
    return computed, new, nhit


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def join_batch(rq, blocks, reps, pools, ev, th, tbs, r, q, t, computed, new, nhit):
    """Waiting request q joins the step with `new` tokens from `computed` (its prefix-cache hits
    taken first); returns the blocks swapped back in from host memory."""
    p = reps.pool[r]
    bs = pools.block_size[p]
    caching = pools.prefix_caching[p] != 0
    hoff = reps.htab_off[r]
    hmask = reps.htab_mask[r]
    off = reps.run_off[r]
    swap_blocks = 0
    resumed = rq.swapped[q]
    if rq.nblocks[q] == 0:  # received no KV from a prefill replica
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
    reps.run_list[off + reps.neager[r]] = q
    reps.neager[r] += 1
    reps.nrun[r] += 1
    rq.seq[q] = reps.seq_next[r]  # joins at the end of the running order
    reps.seq_next[r] += 1
    rq.state[q] = RUNNING
    rq.sched_new[q] = new
    rq.pf_start[q] = t
    if rq.first_sched[q] < 0:
        rq.first_sched[q] = t
        rq.cached[q] = computed
        reps.counters[r, C_HIT] += computed
        reps.counters[r, C_QUERY] += rq.prompt[q]
    reps.counters[r, C_ADMITTED] += 1
    if ev.clock[2] != 0:
        record(ev, t, np.int64(EV_SCHEDULE), r, q, computed)
    return swap_blocks


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def step_duration(rq, reps, pools, r, t, swap_blocks):
    """Step 3: what the step computes, for the step model; its adapters are made resident.
    Returns its duration (0: nothing was scheduled)."""
    p = reps.pool[r]
    off = reps.run_off[r]
    # Typed zeros: with literal ones numba types the step model for them first, a second compile
    # (and in a variant without LoRA, lora_adapters stays one).
    prefill_tokens = prefill_ctx = decode_seqs = decode_ctx = num_seqs = spec_tokens = np.int64(0)
    prefill_pairs = 0.0
    lora_adapters = lora_loads = np.int64(0)
    for k in range(reps.neager[r]):
        q = reps.run_list[off + k]
        new = rq.sched_new[q]
        if new == 0:
            continue
        num_seqs += 1
        if WITH_LORA:
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
    # The lazy requests: one decode token each, all in the step (integers: the order is free).
    num_seqs += reps.nlazy[r]
    decode_seqs += reps.nlazy[r]
    decode_ctx += reps.lz_ctx[r] + reps.nlazy[r]
    if num_seqs == 0:
        return np.int64(0)
    dur = step_time_us_nb(pools.step[p], prefill_tokens, prefill_pairs, prefill_ctx, decode_seqs, decode_ctx,
                          num_seqs, spec_tokens, lora_adapters) + swap_blocks * pools.swap_us_per_block[p]
    dur += lora_loads * pools.lora_load_us[p]
    return dur


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def preempt(rq, blocks, reps, pools, ev, th, tbs, bs, r, q, t):
    """Free the request's blocks and put it back at the head of the queue. Swap mode copies its KV
    to host memory while the swap space lasts (progress kept; returns the blocks copied, which
    the step pays for); otherwise recompute (progress forgotten; returns 0)."""
    held = rq.nblocks[q]
    swapped = pools.swap[reps.pool[r]] != 0 and held <= reps.host_free[r]
    free_request_blocks(rq, blocks, reps, th, tbs, bs, r, q, pools.prefix_caching[reps.pool[r]] != 0)
    if swapped:
        reps.host_free[r] -= held
        rq.swapped[q] = rq.computed[q]
    rq.computed[q] = 0
    rq.state[q] = WAITING
    rq.preemptions[q] += 1
    reps.counters[r, C_PREEMPT] += 1
    rq.queued[q] = t
    wq_push_front(rq, reps, r, q)
    record(ev, t, np.int64(EV_SWAP_OUT if swapped else EV_PREEMPT), r, q, rq.generated[q])
    return held if swapped else 0


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def pick_victim(rq, reps, pools, p, off, nrun, i):
    """Index in the running list of the request to preempt while scheduling index i: the pool's
    victim policy (policies/victims/) over a VictimView (ids are checked by check_policy_ids)."""
    view = VictimView(reps.run_list, rq.priority, rq.arrival, rq.generated, rq.nblocks, request_columns(rq, pools), p,
                      pools.u_victim)
    return victim_dispatch(pools.victim[p], view, off, nrun, i)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def pick_waiting(rq, blocks, reps, pools, th, tbs, p, r, cutoff):
    """The waiting request to admit next under the pool's queue order (policies/queue_orders/),
    among those queued by `cutoff` (-1: none is). Ties go to the earlier arrival, then the lower
    index. On a decode replica, a request whose KV has arrived goes first, the earliest arrived
    first: it holds its blocks already, and a request that cannot fit must not keep it waiting."""
    policy = pools.queue[p]
    if WITH_PD and p == pools.pd[PD_DECODE]:
        q = reps.wait_head[r]
        while q >= 0:
            if rq.nblocks[q] > 0 and rq.queued[q] <= cutoff:
                return q
            q = rq.qnext[q]
    q = reps.wait_head[r]
    if not WITH_POLICIES or queue_head_dispatch(policy, reps.nwait[r]):  # the queue's own order (FCFS)
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


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def finish_step(rq, blocks, reps, pools, ev, th, tbs, r, t):
    """Apply the step that ended at t: tokens are emitted at the end of the step. The running
    requests are taken in order, the lazy ones that finish in it merged in by seq; one that is
    now in steady decode turns lazy (engine/lazy.py)."""
    p = reps.pool[r]
    off = reps.run_off[r]
    lazy_step_done(reps, r)
    n = reps.neager[r]
    kept = 0
    i = 0
    while True:
        z = next_lazy_finish(rq, reps, r)
        if i < n and (z < 0 or rq.seq[reps.run_list[off + i]] < rq.seq[z]):
            q = reps.run_list[off + i]
            i += 1
            if finish_running(rq, blocks, reps, pools, ev, th, tbs, r, q, t):
                if can_lazify(rq, reps, pools, p, r, q):
                    lazify(rq, reps, pools, p, r, q)
                else:
                    reps.run_list[off + kept] = q
                    kept += 1
        elif z >= 0:
            finish_lazy(rq, blocks, reps, pools, ev, th, tbs, r, t)
        else:
            break
    reps.neager[r] = kept
    reps.nrun[r] = kept + reps.nlazy[r]
    if reps.lz_cool[r] > 0:
        reps.lz_cool[r] -= 1
    if WITH_PD and reps.pend_head[r] >= 0:
        accept_pending(rq, reps, pools, r, t)  # blocks may have been freed
    reps.counters[r, C_BUSY] += t - reps.step_start[r]
    reps.busy_until[r] = -1
    reps.wake[r] = t
    update_event(reps, r)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def finish_running(rq, blocks, reps, pools, ev, th, tbs, r, q, t):
    """Apply the step to running request q (not lazy); returns whether it is still running."""
    p = reps.pool[r]
    new = rq.sched_new[q]
    if new == 0:
        return True
    rq.sched_new[q] = 0
    num_tokens = rq.prompt[q] + rq.generated[q]
    if not is_decoding(rq, q):
        reps.counters[r, C_PREFILL] += new
    elif WITH_SPEC:
        # The tokens a decode (or verify) step yields: its expected value, with the
        # fraction carried to the request's next step. Without speculation, exactly 1 (`new`).
        credit = rq.spec_credit[q] + pools.spec_credit[p, new - 1]
        new = credit // SPEC_CREDIT_SCALE
        rq.spec_credit[q] = credit - new * SPEC_CREDIT_SCALE
    rq.computed[q] += new
    prefilled = rq.computed[q] >= num_tokens and rq.dreplica[q] >= 0 and rq.generated[q] == 0
    if WITH_PD and prefilled and r != rq.dreplica[q]:
        hand_off(rq, reps, pools, q, r, t)  # prefilled: its KV goes to the decode replica
        return False
    if rq.computed[q] >= num_tokens:
        emitted = rq.computed[q] - num_tokens + 1
        rq.generated[q] += emitted
        reps.counters[r, C_OUTPUT] += emitted
        if rq.first_token[q] < 0:
            rq.first_token[q] = t
            if ev.clock[2] != 0:
                record(ev, t, np.int64(EV_FIRST_TOKEN), r, q, np.int64(0))
        if rq.generated[q] >= rq.output[q]:
            finish_request(rq, blocks, reps, pools, ev, th, tbs, pools.block_size[p], r, q, t)
            return False
    return True
