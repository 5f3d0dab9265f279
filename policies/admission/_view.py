"""What an admission policy sees, the same in both engines, and its parameter row.

`AdmissionView` (numpy arrays in the numba engine, sequences in the reference engine):

    waiting, waiting_tokens, active   the pool's waiting requests, their tokens and its active
                replicas now (0 for a policy whose READS_POOL is false: not counted)
    wait_tokens per replica: tokens of the requests waiting there
    prompt, output, priority, tenant  per request
    bucket, bucket_at   per (pool, tenant) at p * tenants + tenant: a token bucket's level in
                millionths of a token and the time of its last refill; the policy owns them
    tenants     tenants in the trace
    ttft_budget per pool: the SLO's TTFT target, microseconds
    req         the request columns a user's rule reads (policies._userview.RequestColumns)
    user        the pool's user admission rule, if it has one (policies._userview.UserCall)

A kernel's signature: `kernel(v, p, r, q, t, a) -> int`, 1 to reject request q (routed to
replica r of pool p at time t), 0 to admit it; `a` is the pool's parameter row, indexed by
the A_* constants below (0 = that limit is off).
"""

from __future__ import annotations

from typing import Any, NamedTuple

# The engines' per-pool admission columns (EngineInputs.pool_<name>), in row order.
PARAM_COLUMNS = ("max_waiting", "max_waiting_tokens", "bucket_tokens", "bucket_refill_per_s",
                 "shed_waiting_per_replica", "shed_priority_from", "slo_multiple_milli", "prefill_tokens_per_s")
A_MAX_WAITING, A_MAX_WAITING_TOKENS, A_BUCKET, A_REFILL, A_SHED_AT, A_SHED_FROM, A_SLO_MILLI, A_PREFILL = range(
    len(PARAM_COLUMNS))


class AdmissionView(NamedTuple):
    waiting: Any
    waiting_tokens: Any
    active: Any
    wait_tokens: Any
    prompt: Any
    output: Any
    priority: Any
    tenant: Any
    bucket: Any
    bucket_at: Any
    tenants: Any
    ttft_budget: Any
    req: Any
    user: Any
