"""Per-step policies that users write: a router, a queue order, a preemption victim or an admission rule.

A user policy is a numba function with the family's signature below, over a narrow read-only
view (the pool's active replicas, one request, the replica's running batch) plus a state array
it owns, and its plain-Python twin with the same arguments (numpy arrays) for `--engine
reference`. Wrap the pair with the family's decorator and name it in a config, from a module
allowed with `--plugin` or an installed `llm_replay.policies` entry point:

    from numba import njit
    from policies.user import R_LIVE_RUNNING, R_LIVE_WAITING, ROUTER_SIG, router

    def fewest_in_flight_py(replicas, request, params, state):
        return int((replicas[:, R_LIVE_WAITING] + replicas[:, R_LIVE_RUNNING]).argmin())

    @router(reference=fewest_in_flight_py)
    @njit(ROUTER_SIG, cache=True)
    def fewest_in_flight(replicas, request, params, state):
        ...

    # fleet.yaml:  pools: [{name: chat, router: "mypolicies:fewest_in_flight"}]

Signatures (every array C-contiguous; `params` and the views are read-only, `state` is the
policy's own int64 array per pool, zeros at the start of the run, `state=` entries long):

    ROUTER_SIG     route(replicas int64[n, REPLICA_WIDTH], request int64[REQUEST_WIDTH], params, state)
                   -> the row (0 .. n - 1) of the replica to send the request to; one row per
                   replica of the pool that may take it, in replica order
    QUEUE_SIG      key(request int64[REQUEST_WIDTH], params, state) -> float64, lower is admitted
                   first (ties: the earlier arrival, as the built-in orders)
    VICTIM_SIG     victim(running int64[n, REQUEST_WIDTH], scheduled int64, params, state)
                   -> the row (0 .. n - 1) of the running request to preempt; rows are the
                   replica's running batch in scheduling order, `scheduled` the row being
                   scheduled when KV blocks ran out (vLLM's FCFS picks the last row)
    ADMISSION_SIG  admit(pool int64[POOL_WIDTH], request int64[REQUEST_WIDTH], params, state)
                   -> 1 to reject the request (reason `admission_policy`), 0 to admit it

`params` is float64[k]: the policy's `params` in their declared order, with the values a config
gives (`router: {policy: "mod:fn", slack: 2}`, `admission: {policy: ..., params: {...}}`).
The engine checks every choice: a row out of range, a key that is NaN or an admission answer
other than 0 or 1 ends the run with an error naming the policy, as does an exception the
policy raises. tests/property/ shows how to property-test a policy (`policies.testing`).

Compile cost: the engine calls the policy through its native address, so the engine itself is
compiled and cached once for every user policy (no recompile per policy or per process), and
`@njit(SIG, cache=True)` caches the policy next to its module.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from numba import types

# The view columns. Replica rows (routers):
REPLICA_COLUMNS = ("replica", "waiting", "running", "kv_used", "kv_blocks", "live_waiting", "live_running",
                   "waiting_tokens", "prefix_hits")
(R_REPLICA,  # the replica's index in its pool
 R_WAITING, R_RUNNING, R_KV_USED,  # as of the pool's last scrape (router_refresh_ms stale), as vLLM exports them
 R_KV_BLOCKS,  # KV blocks of the replica
 R_LIVE_WAITING, R_LIVE_RUNNING,  # the proxy's own count now
 R_WAITING_TOKENS,  # tokens of the requests waiting there now
 R_PREFIX_HITS,  # leading prompt blocks of this request in its prefix cache (reads_prefix=True, else 0)
 ) = range(len(REPLICA_COLUMNS))
# Request rows (every family):
REQUEST_COLUMNS = ("prompt_tokens", "output_tokens", "priority", "tenant", "arrival_us", "generated",
                   "kv_blocks", "prefix_hits", "ttft_budget_us")
(Q_PROMPT_TOKENS, Q_OUTPUT_TOKENS,  # the trace's token counts
 Q_PRIORITY,  # lower value = more important, as vLLM
 Q_TENANT,  # 0 .. tenants - 1, the trace's tenants in sorted order
 Q_ARRIVAL_US, Q_GENERATED,  # output tokens generated so far (a preempted request keeps them)
 Q_KV_BLOCKS,  # KV blocks the request holds now
 Q_PREFIX_HITS,  # queue orders with reads_prefix=True: leading blocks cached on the replica, else 0
 Q_TTFT_BUDGET_US,  # the pool's TTFT target
 ) = range(len(REQUEST_COLUMNS))
# The pool row (admission):
POOL_COLUMNS = ("waiting", "waiting_tokens", "active_replicas", "replica", "replica_waiting_tokens", "now_us")
P_WAITING, P_WAITING_TOKENS, P_ACTIVE_REPLICAS, P_REPLICA, P_REPLICA_WAITING_TOKENS, P_NOW_US = range(
    len(POOL_COLUMNS))
REPLICA_WIDTH, REQUEST_WIDTH, POOL_WIDTH = len(REPLICA_COLUMNS), len(REQUEST_COLUMNS), len(POOL_COLUMNS)

_VIEW_2D = types.Array(types.int64, 2, "C", readonly=True)
_VIEW_1D = types.Array(types.int64, 1, "C", readonly=True)
_PARAMS = types.Array(types.float64, 1, "C", readonly=True)
_STATE = types.Array(types.int64, 1, "C")
ROUTER_SIG = types.int64(_VIEW_2D, _VIEW_1D, _PARAMS, _STATE)
QUEUE_SIG = types.float64(_VIEW_1D, _PARAMS, _STATE)
VICTIM_SIG = types.int64(_VIEW_2D, types.int64, _PARAMS, _STATE)
ADMISSION_SIG = types.int64(_VIEW_1D, _VIEW_1D, _PARAMS, _STATE)

# family -> (its signature, the names of its arguments, what a config key calls it)
FAMILIES: dict[str, tuple[Any, tuple[str, ...], str]] = {
    "router": (ROUTER_SIG, ("replicas", "request", "params", "state"), "router"),
    "queue order": (QUEUE_SIG, ("request", "params", "state"), "scheduling_policy"),
    "preemption victim": (VICTIM_SIG, ("running", "scheduled", "params", "state"), "preemption.victim"),
    "admission": (ADMISSION_SIG, ("pool", "request", "params", "state"), "admission.policy"),
}
MAX_STATE = 1 << 16  # int64 entries per pool
MAX_PARAMS = 64


@dataclass(frozen=True)
class UserPolicy:
    """A user's per-step policy: its numba kernel, its plain-Python twin and what it needs."""

    family: str
    kernel: Any  # a numba dispatcher compiled (or compilable) for FAMILIES[family]'s signature
    reference: Callable[..., Any]
    params: dict[str, float] = field(default_factory=dict)
    state: int = 1
    reads_prefix: bool = False
    name: str = ""

    @property
    def summary(self) -> str:
        doc = inspect.getdoc(getattr(self.kernel, "py_func", None)) or inspect.getdoc(self.reference) or ""
        return " ".join(doc.split("\n\n")[0].split()) if doc else f"a user's {self.family}"


def _decorator(family: str) -> Callable[..., Callable[[Any], UserPolicy]]:
    def decorate(*, reference: Callable[..., Any], params: dict[str, float] | None = None, state: int = 1,
                 reads_prefix: bool = False) -> Callable[[Any], UserPolicy]:
        def wrap(kernel: Any) -> UserPolicy:
            return UserPolicy(family, kernel, reference, dict(params or {}), state, reads_prefix,
                              getattr(kernel, "__name__", ""))
        return wrap
    decorate.__doc__ = (f"Wrap a numba {family} kernel with its plain-Python twin (`reference=`), its parameters "
                        "(name -> default float, in the order the kernel reads them), its state size (int64 "
                        "entries per pool) and whether it reads prefix-cache hits.")
    return decorate


router = _decorator("router")
queue_order = _decorator("queue order")
victim = _decorator("preemption victim")
admission = _decorator("admission")
