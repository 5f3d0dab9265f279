"""Prefill/decode disaggregation: a prefilled request's KV moves from its prefill replica to its
decode replica, through a min-heap of the transfers in flight.
"""

from __future__ import annotations

import replay._numba_cache  # noqa: F401  (before any kernel is defined)

import numpy as np
from numba import njit

from replay.engine.common import EV_ARRIVE, TRANSFERRING, WAITING
from replay.engine.events import record, wake_idle
from replay.engine.kvblocks import free_request_blocks, grow_request
from replay.engine.queues import heap_pop, heap_push, wq_push_back
from replay.engine.state import PD_BASE_US, PD_DECODE, PD_INFLIGHT, PD_LAYERS

# After its prefill the request leaves the prefill replica's batch but keeps its blocks there
# until its KV has been read (vLLM's NixlConnector delays freeing them). The decode replica takes
# it only once it has free blocks for the whole prompt (blocks are set aside then, as vLLM's
# scheduler allocates them for WAITING_FOR_REMOTE_KVS); until then it waits in that replica's
# FIFO. The transfer takes ceil(prompt * us_per_token) + base; overlapped layer by layer, only the
# part that outlasts the prefill shows, and at least one layer's share (a transfer that starts
# after the prefill ended, because the decode replica was full, overlaps nothing). Then the prefill
# replica frees its copy and the request joins the decode replica's queue (it goes first: see
# `scheduling.pick_waiting`) with every prompt token but the last computed (vLLM recomputes the last one for its logits,
# `Scheduler._update_waiting_for_remote_kv`).


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def transfer_blocks(rq, pools, q):
    bs = pools.block_size[pools.pd[PD_DECODE]]
    return (rq.prompt[q] + bs - 1) // bs


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def transfer_us(rq, pools, q, t):
    x = np.int64(np.ceil(rq.prompt[q] * pools.pd_us_per_token[0]))
    layers = pools.pd[PD_LAYERS]
    if layers > 0 and t == rq.pf_end[q]:
        x = max((x + layers - 1) // layers, x - (rq.pf_end[q] - rq.pf_start[q]))
    return x + pools.pd[PD_BASE_US]


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def xheap_push(pools, t, q):
    heap_push(pools.xh_t, pools.xh_q, pools.pd[PD_INFLIGHT], t, q)
    pools.pd[PD_INFLIGHT] += 1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def xheap_pop(pools):
    """Remove the transfer that completes first; returns its request."""
    top = pools.xh_q[0]
    heap_pop(pools.xh_t, pools.xh_q, pools.pd[PD_INFLIGHT])
    pools.pd[PD_INFLIGHT] -= 1
    return top


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def start_transfer(rq, reps, pools, q, d, t):
    need = transfer_blocks(rq, pools, q)
    reps.nfree[d] -= need
    reps.reserved[d] += need
    rq.xfer_start[q] = t
    rq.xfer_done[q] = t + transfer_us(rq, pools, q, t)
    rq.xfers[q] += 1
    xheap_push(pools, rq.xfer_done[q], q)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
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


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
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


@njit(cache=True, _nrt=False, forceinline=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def finish_transfer(rq, blocks, reps, pools, ev, th, tbs, t):
    q = xheap_pop(pools)
    r = rq.preplica[q]
    d = rq.dreplica[q]
    free_request_blocks(rq, blocks, reps, th, tbs, pools.block_size[reps.pool[r]], r, q,
                        pools.prefix_caching[reps.pool[r]] != 0)
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
        record(ev, t, np.int64(EV_ARRIVE), d, q, r + 1)  # value: 1 + the prefill replica (0: from the router)
    wake_idle(reps, d, t)
