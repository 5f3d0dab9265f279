"""Steady decoders kept lazily, so that a replica's step costs O(1 + what changes in it).

A running request in steady decode (its next token a decode, one token a step: no speculative
decoding, no LoRA, no user policy in its pool; `numba_engine.lazy_pools`) does the same thing at
every step until it finishes: it computes one token, emits one, and every `block_size` steps
needs one more KV block. Such a request leaves its replica's run_list and turns *lazy*
(`lazify`): its computed/generated are written as of the replica's lazy step count `lz_steps`
then (`rq.lz_join`) and read as that plus the steps made since (`unlazy`, `sync_lazy_nb`).
The replica keeps their count and the sum of their contexts, which the step model needs, and
two min-heaps of (step, seq) keys: when each will need its next block and when each finishes.
A step then touches only the lazy requests whose block or finish falls in it, and in the
order the step-by-step engine would (the running order is the order of `rq.seq`, which every
join to a running list takes from the replica's counter), so block ids, the free queue's LRU
order and the event log come out identical (`tests/differential/test_lazy.py`).

A step that cannot be shown to run as step-by-step (too few free blocks, so a victim would be
preempted; a token budget that would starve a lazy request) puts every lazy request back into
the run_list first (`materialise`) and runs the step-by-step code.

Prefix caching: a lazy request's blocks that fill up are not offered to the cache as they fill.
lazify only takes a request never preempted whose next blocks have keys private to it
(`kvblocks.block_key_nb`: past its hashed prompt), and those blocks are held as a count
(kvblocks.first_counted), offered only when the request is released unfinished (preempted, or
its KV handed to a decode replica: `free_request_blocks`' offer), as they are when it is not
lazy. No other request can look those keys up, and its blocks are held, so no allocation can
evict them: nothing observable depends on when it stops being lazy.
"""

from __future__ import annotations

import replay._numba_cache  # noqa: F401  (before any kernel is defined)

import numpy as np
from numba import njit

from replay.engine.common import EV_FINISH, FINISHED
from replay.engine.events import record
from replay.engine.kvblocks import add_blocks, free_request_blocks, grow_request
from replay.engine.queues import heap_pop, heap_push, heap_replace_top
from replay.engine.sessions import release_next
from replay.engine.state import C_FINISHED, C_OUTPUT
from replay.engine.variants import WITH_SESSIONS

# A heap key: the lazy step it falls at, then the running order (seq < 2**32 joins a replica).
SEQ_SPAN = 1 << 32
# Steps after a step-by-step fallback during which no request turns lazy, so a replica short of
# blocks does not turn its whole batch lazy and back at every step (speed only: the outputs are
# the same either way).
COOLDOWN_STEPS = 16


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def is_decoding(rq, q):
    """The request's next token is a decode: all but the newest token already have KV."""
    return rq.generated[q] > 0 and rq.computed[q] == rq.prompt[q] + rq.generated[q] - 1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def can_lazify(rq, reps, pools, p, r, q):
    """Request q, running on replica r after a step, may turn lazy."""
    if pools.lazy[p] == 0 or reps.lz_cool[r] > 0 or not is_decoding(rq, q):
        return False
    if pools.prefix_caching[p] != 0:  # its next blocks' keys must be its own (module docstring)
        if rq.preemptions[q] != 0:
            return False
        if rq.hash_len[q] > 0 and (rq.ncached[q] + 1) * pools.block_size[p] <= rq.hash_tokens[q]:
            return False
    return True


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def lazify(rq, reps, pools, p, r, q):
    """q leaves the run_list (the caller drops it) and advances with the replica's lazy steps."""
    s = reps.lz_steps[r]
    off = reps.run_off[r]
    rq.lz_join[q] = s
    finish = s + rq.output[q] - rq.generated[q]
    heap_push(reps.fh_key[off:], reps.fh_q[off:], reps.fh_n[r], finish * SEQ_SPAN + rq.seq[q], q)
    reps.fh_n[r] += 1
    # Its next block: when its computed tokens fill the blocks it holds. A block due at the
    # schedule of the step that finishes it is still taken (and freed at its end), as step by step.
    due = s + rq.nblocks[q] * pools.block_size[p] - rq.computed[q]
    if due < finish:
        heap_push(reps.ah_key[off:], reps.ah_q[off:], reps.ah_n[r], due * SEQ_SPAN + rq.seq[q], q)
        reps.ah_n[r] += 1
    reps.nlazy[r] += 1
    reps.lz_ctx[r] += rq.computed[q]
    if rq.seq[q] > reps.lz_maxseq[r]:
        reps.lz_maxseq[r] = rq.seq[q]


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def unlazy(rq, blocks, reps, th, tbs, bs, caching, r, q):
    """Write q's progress; q is no longer lazy. Its blocks already cover its computed tokens and
    those that filled meanwhile are held as a count (lazify's requests: see above), so
    grow_request only moves ncached on: they are offered if it is released unfinished."""
    d = reps.lz_steps[r] - rq.lz_join[q]
    rq.generated[q] += d
    rq.computed[q] += d
    rq.lz_join[q] = -1
    reps.nlazy[r] -= 1
    reps.lz_ctx[r] -= rq.computed[q]
    if caching:
        grow_request(rq, blocks, reps, th, tbs, bs, caching, r, q, rq.computed[q])


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def lazy_step_done(reps, r):
    """A step of replica r ended: every lazy request computed and emitted one token."""
    n = reps.nlazy[r]
    if n > 0:
        reps.lz_steps[r] += 1
        reps.lz_ctx[r] += n
        reps.counters[r, C_OUTPUT] += n


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def next_lazy_finish(rq, reps, r):
    """The lazy request that finishes at this step and comes first in the running order, -1 if none."""
    off = reps.run_off[r]
    if reps.fh_n[r] > 0 and reps.fh_key[off] // SEQ_SPAN <= reps.lz_steps[r]:
        return reps.fh_q[off]
    return -1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def finish_lazy(rq, blocks, reps, pools, ev, th, tbs, r, t):
    """The top of the finish heap emitted its last token in the step that ended at t."""
    p = reps.pool[r]
    off = reps.run_off[r]
    q = reps.fh_q[off]
    heap_pop(reps.fh_key[off:], reps.fh_q[off:], reps.fh_n[r])
    reps.fh_n[r] -= 1
    bs = pools.block_size[p]
    unlazy(rq, blocks, reps, th, tbs, bs, pools.prefix_caching[p] != 0, r, q)
    finish_request(rq, blocks, reps, pools, ev, th, tbs, bs, r, q, t)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def finish_request(rq, blocks, reps, pools, ev, th, tbs, bs, r, q, t):
    """Request q emitted its last token in the step that ended at t (a lazy one from the finish
    heap, any other from scheduling.finish_running): its blocks go back, its session goes on."""
    free_request_blocks(rq, blocks, reps, th, tbs, bs, r, q, False)
    rq.state[q] = FINISHED
    rq.finished[q] = t
    if WITH_SESSIONS:
        release_next(rq, pools, q, t)
    reps.counters[r, C_FINISHED] += 1
    if ev.clock[2] != 0:
        record(ev, t, np.int64(EV_FINISH), r, q, rq.generated[q])


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def eager_tokens(rq, pools, p, q):
    """Tokens a running request that is not lazy asks of this step (before the budget)."""
    new = rq.prompt[q] + rq.generated[q] - rq.computed[q]
    threshold = pools.long_prefill[p]
    if 0 < threshold < new:
        new = threshold
    return new


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def lazy_running(rq, blocks, reps, pools, th, tbs, r):
    """`scheduling.schedule_running` for a replica with lazy requests, when no request would be
    preempted or starved of tokens: returns the token budget left, or -1 (nothing changed but
    the block heap, which `materialise` then rebuilds) when the step must run step by step."""
    p = reps.pool[r]
    bs = pools.block_size[p]
    caching = pools.prefix_caching[p] != 0
    off = reps.run_off[r]
    n = reps.neager[r]
    s = reps.lz_steps[r]
    last = reps.lz_maxseq[r]
    # Every request before the last lazy one in the running order must get all it asks for.
    before = reps.nlazy[r]
    for i in range(n):
        q = reps.run_list[off + i]
        if rq.seq[q] < last:
            before += eager_tokens(rq, pools, p, q)
    budget = pools.max_batched[p] - before
    if budget < 0:
        return -1
    nd = 0  # the lazy requests that need a block in this step, in running order
    while reps.ah_n[r] > 0 and reps.ah_key[off] // SEQ_SPAN <= s:
        q = reps.ah_q[off]
        reps.lz_due[off + nd] = q
        nd += 1
        due = s + bs  # its next block, if it will need one: a pop and a push in one
        if due < rq.lz_join[q] + rq.output[q] - rq.generated[q]:
            heap_replace_top(reps.ah_key[off:], reps.ah_q[off:], reps.ah_n[r], due * SEQ_SPAN + rq.seq[q], q)
        else:
            heap_pop(reps.ah_key[off:], reps.ah_q[off:], reps.ah_n[r])
            reps.ah_n[r] -= 1
    # The requests after it share what is left in order, as step by step; -1: not scheduled.
    need = nd
    for i in range(n):
        q = reps.run_list[off + i]
        new = eager_tokens(rq, pools, p, q)
        if rq.seq[q] > last:
            if budget <= 0:
                new = -1
            else:
                new = min(new, budget)
                budget -= new
        if new >= 0:
            need += max(0, (rq.computed[q] + new + bs - 1) // bs - rq.nblocks[q])
        rq.sched_new[q] = new
    if need > reps.nfree[r]:  # a victim would be preempted
        for i in range(n):
            rq.sched_new[reps.run_list[off + i]] = 0
        return -1
    j = 0
    i = 0
    while i < n or j < nd:
        if j >= nd or (i < n and rq.seq[reps.run_list[off + i]] < rq.seq[reps.lz_due[off + j]]):
            q = reps.run_list[off + i]
            i += 1
            if rq.sched_new[q] < 0:
                rq.sched_new[q] = 0
            else:
                grow_request(rq, blocks, reps, th, tbs, bs, caching, r, q, rq.computed[q] + rq.sched_new[q])
            continue
        q = reps.lz_due[off + j]
        j += 1
        add_blocks(rq, blocks, reps, r, q, np.int64(1))  # its next block, due now (its full ones wait: docstring)
    return budget


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def sort_by_seq(rq, a, off, n):
    """Heapsort a[off:off + n] (request ids) by rq.seq, in place."""
    for k in range(n - 1, -1, -1):
        sift_down(rq, a, off, k, n)
    for end in range(n - 1, 0, -1):
        x = a[off]
        a[off] = a[off + end]
        a[off + end] = x
        sift_down(rq, a, off, np.int64(0), end)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def sift_down(rq, a, off, i, n):
    while True:
        c = 2 * i + 1
        if c >= n:
            return
        if c + 1 < n and rq.seq[a[off + c + 1]] > rq.seq[a[off + c]]:
            c += 1
        if rq.seq[a[off + c]] <= rq.seq[a[off + i]]:
            return
        x = a[off + i]
        a[off + i] = a[off + c]
        a[off + c] = x
        i = c


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def materialise(rq, blocks, reps, pools, th, tbs, r):
    """Every lazy request of replica r back into its run_list, in running order, progress written."""
    p = reps.pool[r]
    bs = pools.block_size[p]
    caching = pools.prefix_caching[p] != 0
    off = reps.run_off[r]
    nl = reps.fh_n[r]  # every lazy request is in the finish heap, once
    sort_by_seq(rq, reps.fh_q, off, nl)
    for k in range(nl):
        unlazy(rq, blocks, reps, th, tbs, bs, caching, r, reps.fh_q[off + k])
    # Merge the two ordered lists from the back, into the run_list.
    i = reps.neager[r] - 1
    j = nl - 1
    k = reps.neager[r] + nl - 1
    while j >= 0:
        if i >= 0 and rq.seq[reps.run_list[off + i]] > rq.seq[reps.fh_q[off + j]]:
            reps.run_list[off + k] = reps.run_list[off + i]
            i -= 1
        else:
            reps.run_list[off + k] = reps.fh_q[off + j]
            j -= 1
        k -= 1
    reps.neager[r] += nl
    reps.fh_n[r] = 0
    reps.ah_n[r] = 0
    reps.lz_maxseq[r] = -1
    reps.lz_cool[r] = COOLDOWN_STEPS


@njit(cache=True, _nrt=False, no_cfunc_wrapper=True)
def sync_lazy_nb(rq, reps):
    """Write every lazy request's computed/generated as of now; they stay lazy."""
    for r in range(reps.pool.shape[0]):
        off = reps.run_off[r]
        s = reps.lz_steps[r]
        for k in range(reps.fh_n[r]):
            q = reps.fh_q[off + k]
            d = s - rq.lz_join[q]
            rq.generated[q] += d
            rq.computed[q] += d
            rq.lz_join[q] = s
