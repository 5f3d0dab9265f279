"""What a preemption-victim policy sees, the same in both engines.

`VictimView` holds the replica's running list and per-request columns (numpy arrays in the
numba engine, read-only sequences indexed by request in the reference engine):

    run         request ids; the replica's running list is run[off .. off + nrun - 1], in
                scheduling order (the head was admitted first)
    priority    the request's priority (lower value = more important, as vLLM)
    arrival     arrival time, microseconds
    generated   output tokens generated so far
    blocks      KV blocks it holds
    req         the request columns a user's victim reads (policies._userview.RequestColumns)
    pool        the replica's pool
    user        the pool's user victim policy, if it has one (policies._userview.UserCall)

A kernel's signature: `kernel(v, off, nrun, i) -> k`, the index in the running list (0 <= k <
nrun) of the request to preempt while the step schedules running index i. A policy that
chooses among the requests from i on (those not yet scheduled in this step, as vLLM's FCFS
tail is) keeps the head of running making progress, so two large requests cannot preempt
each other forever.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class VictimView(NamedTuple):
    run: Any
    priority: Any
    arrival: Any
    generated: Any
    blocks: Any
    req: Any
    pool: Any
    user: Any
