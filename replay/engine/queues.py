"""The waiting queues: each replica's doubly linked list of waiting requests, and each pool's FIFO
of requests held while it has no replica (both linked through Requests.qprev/qnext); and the
binary min-heap of (time, request) that orders KV transfers and closed-loop releases."""

from __future__ import annotations

import replay._numba_cache  # noqa: F401  (before any kernel is defined)

from numba import njit


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
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



@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
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



@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
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



@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def held_push(rq, pools, p, q):
    rq.qnext[q] = -1
    tail = pools.held_tail[p]
    if tail >= 0:
        rq.qnext[tail] = q
    else:
        pools.held_head[p] = q
    pools.held_tail[p] = q
    pools.nheld[p] += 1


# --- a min-heap of (time, request) in two parallel arrays; ties go to the lower request -------


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def heap_push(ts, qs, n, t, q):
    """Add (t, q) to the heap of the first `n` entries of ts/qs (the caller counts it as n + 1)."""
    i = n
    while i > 0:
        up = (i - 1) // 2
        if ts[up] < t or (ts[up] == t and qs[up] < q):
            break
        ts[i] = ts[up]
        qs[i] = qs[up]
        i = up
    ts[i] = t
    qs[i] = q


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def heap_pop(ts, qs, n):
    """Remove the top of the heap of the first `n` entries (the caller counts n - 1 after)."""
    heap_replace_top(ts, qs, n - 1, ts[n - 1], qs[n - 1])


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def heap_replace_top(ts, qs, n, t, q):
    """Remove the top of the heap of the first `n` entries and add (t, q): a pop and a push in
    one sift down from the top (the count stays n)."""
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (ts[c + 1] < ts[c] or (ts[c + 1] == ts[c] and qs[c + 1] < qs[c])):
            c += 1
        if ts[c] > t or (ts[c] == t and qs[c] > q):
            break
        ts[i] = ts[c]
        qs[i] = qs[c]
        i = c
    ts[i] = t
    qs[i] = q
