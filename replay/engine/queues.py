"""The waiting queues: each replica's doubly linked list of waiting requests, and each pool's FIFO
of requests held while it has no replica (both linked through Requests.qprev/qnext)."""

from __future__ import annotations

import replay._numba_cache  # noqa: F401  (before any kernel is defined)

from numba import njit


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
