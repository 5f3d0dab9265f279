"""What a queue order sees, the same in both engines.

`QueueView` holds per-request columns (numpy arrays in the numba engine, sequences indexed by
request id in the reference engine) and one per-pool column:

    priority    lower value = more important, as vLLM
    prompt      prompt tokens
    arrival     arrival time, microseconds
    ttft_budget per pool: the SLO's TTFT target, microseconds
    req         the request columns a user's key reads (policies._userview.RequestColumns)
    user        the pool's user queue order, if it has one (policies._userview.UserCall)

Signatures: `key_kernel(v, p, q, hits) -> float`, request q's sort key on pool p (lower is
admitted first), where `hits` is its leading prompt blocks in the replica's prefix cache
(computed only for a policy whose READS_PREFIX is true, else 0); `head_kernel(nwait) -> bool`,
true to admit in the queue's own order instead, given the replica's waiting count.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class QueueView(NamedTuple):
    priority: Any
    prompt: Any
    arrival: Any
    ttft_budget: Any
    req: Any
    user: Any
