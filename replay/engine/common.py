"""What both engines share: the inputs they are built from, state codes, event kinds, reasons.

Both engines (the numba kernels of this package behind `numba_engine.NumbaEngine`, and the
pure-Python `reference.engine.ReferenceEngine`) take an `EngineInputs` and expose the
same `Engine` methods, so the cluster loop and the differential test do not care which runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

# Request states. TRANSFERRING: prefilled on a prefill replica, its KV on the way to (or waiting
# for room on) its decode replica (prefill/decode disaggregation).
PENDING, WAITING, RUNNING, FINISHED, REJECTED, TRANSFERRING = 0, 1, 2, 3, 4, 5

# Replica lifecycle states. STARTING covers provisioning and loading: the replica becomes ACTIVE
# (routable) at its `active_at` time; a DRAINING replica takes no new requests and finishes its
# own; OFF replicas (never started, or gone) hold nothing.
R_OFF, R_STARTING, R_ACTIVE, R_DRAINING = 0, 1, 2, 3
REPLICA_STATE_NAMES = ("off", "starting", "active", "draining")

# Event kinds. REJECT, PREEMPT and SWAP_OUT are always recorded; the others only with detailed
# events. (A request's KV transfer is in its row of requests.parquet; with detailed events, its
# landing on the decode replica is an ARRIVE there whose value is 1 + the prefill replica.)
EV_ARRIVE, EV_REJECT, EV_SCHEDULE, EV_PREEMPT, EV_FIRST_TOKEN, EV_FINISH, EV_SWAP_OUT = 0, 1, 2, 3, 4, 5, 6
EVENT_NAMES = ("arrive", "reject", "schedule", "preempt", "first_token", "finish", "preempt_swap")

# Why a request was rejected at arrival (REJECT_NONE = it was not).
REJECT_NONE, REJECT_CONTEXT, REJECT_KV, REJECT_NO_REPLICA = 0, 1, 2, 3
REJECT_QUEUE_LIMIT, REJECT_RATE_LIMIT, REJECT_SHED, REJECT_SLO = 4, 5, 6, 7
REJECT_ADMISSION_POLICY = 8  # a user's admission rule (policies/admission/user.py)
REJECT_NAMES = ("", "context_length", "exceeds_kv_capacity", "no_replica", "queue_limit", "rate_limit",
                "shed_low_priority", "predicted_ttft_over_slo", "admission_policy")


# Routers, queue orders and preemption victims are policies/ plug-ins, chosen by ids that are
# their kernels' positions in policies/registry.py.

NO_EVENT = np.iinfo(np.int64).max

# Speculative decoding's expected tokens per verify step, in millionths of a token: the engines
# carry each request's fractional remainder in these integer units, identically in both.
SPEC_CREDIT_SCALE = 1_000_000

# Per-replica cumulative counters, read at every tick (same names in both engines).
COUNTERS = (
    "busy_us",
    "prefill_tokens",
    "output_tokens",
    "admitted",
    "finished",
    "preemptions",
    "steps",
    "hit_tokens",
    "query_tokens",
)

# Columns of `Engine.snapshot`: per replica, what it holds now, then cumulative counters.
SNAPSHOT_COLUMNS = ("waiting", "running", "kv_used_blocks", "kv_total_blocks", *COUNTERS)


@dataclass(frozen=True)
class EngineInputs:
    """Column arrays of the trace (in arrival order) and the fleet, as the engines consume them."""

    arrival_us: np.ndarray  # int64[N], non-decreasing
    prompt_tokens: np.ndarray  # int64[N]
    output_tokens: np.ndarray  # int64[N]
    priority: np.ndarray  # int64[N]
    pool: np.ndarray  # int64[N] pool index chosen by the pool split
    hash_off: np.ndarray  # int64[N] offset of the request's prefix hashes in trace_hashes
    hash_len: np.ndarray  # int64[N]
    trace_hashes: np.ndarray  # uint64[H]
    trace_block_tokens: int  # tokens per trace hash block (1 when the trace has none)
    # One entry per pool.
    pool_replicas: np.ndarray  # int64[P] replica slots (the most the pool may ever have)
    pool_kv_blocks: np.ndarray  # int64[P] KV blocks per replica
    pool_block_size: np.ndarray  # int64[P]
    pool_max_num_seqs: np.ndarray  # int64[P]
    pool_max_num_batched_tokens: np.ndarray  # int64[P]
    pool_long_prefill_token_threshold: np.ndarray  # int64[P]
    pool_enable_prefix_caching: np.ndarray  # int64[P] 0 or 1
    pool_max_model_len: np.ndarray  # int64[P]
    pool_router: np.ndarray  # int64[P] router kernel ids (policies.registry.router_columns)
    pool_step_params: np.ndarray  # float64[P, stepmodel.NUM_PARAMS]
    detailed_events: bool = False
    pool_refresh_us: np.ndarray | None = None  # int64[P] routers' view refresh (default 50 ms)
    pool_seed: np.ndarray | None = None  # int64[P] seeds of the random routers
    # float64[P, W] each router's parameters (`Params.row()`; default zeros: no parameters)
    pool_router_params: np.ndarray | None = None
    pool_queue: np.ndarray | None = None  # int64[P] queue-order ids (policy_ids: default FCFS)
    pool_victim: np.ndarray | None = None  # int64[P] preemption-victim ids (default vLLM FCFS)
    pool_watermark_blocks: np.ndarray | None = None  # int64[P] (default 0)
    pool_whole_prompt: np.ndarray | None = None  # int64[P] 0/1 (default 0)
    pool_ttft_budget_us: np.ndarray | None = None  # int64[P] (default 2 s)
    tenant: np.ndarray | None = None  # int64[N] tenant index (default 0)
    num_tenants: int = 1
    pool_admission: np.ndarray | None = None  # int64[P] admission ids (policy_ids: default always)
    # Admission parameters per pool (0 = that limit is off): queue-limit's caps, the token bucket
    # (capacity in tokens, refill in tokens/s), priority-shed's saturation point and first shed
    # priority, slo-aware's multiple of the TTFT target (in thousandths) and prefill tokens/s.
    pool_max_waiting: np.ndarray | None = None
    pool_max_waiting_tokens: np.ndarray | None = None
    pool_bucket_tokens: np.ndarray | None = None
    pool_bucket_refill_per_s: np.ndarray | None = None
    pool_shed_waiting_per_replica: np.ndarray | None = None
    pool_shed_priority_from: np.ndarray | None = None
    pool_slo_multiple_milli: np.ndarray | None = None
    pool_prefill_tokens_per_s: np.ndarray | None = None
    pool_swap: np.ndarray | None = None  # int64[P] 1: swap preemption (default recompute)
    pool_host_blocks: np.ndarray | None = None  # int64[P] CPU swap space per replica, in blocks
    pool_swap_us_per_block: np.ndarray | None = None  # int64[P] host-link copy time of one block
    # Prefill/decode disaggregation (off when pd_prefill_pool < 0). Every request arrives at the
    # decode pool (`pool` is the decode pool); one whose uncached prompt is at least
    # `pd_local_threshold` tokens is prefilled on the prefill pool, then its KV moves over a link
    # in ceil(prompt * pd_us_per_token) + pd_base_us, overlapped with the prefill layer by layer
    # over `pd_layers` layers (0 = serial).
    pd_prefill_pool: int = -1
    pd_decode_pool: int = -1
    pd_local_threshold: int = 0
    pd_us_per_token: float = 0.0
    pd_base_us: int = 0
    pd_layers: int = 0
    # Multi-LoRA: each request's adapter (-1: the base model), each pool's adapter slots per
    # replica (max_loras; 0 = LoRA off, adapters ignored) and the time to load one on a miss.
    adapter: np.ndarray | None = None  # int64[N]
    pool_lora_slots: np.ndarray | None = None  # int64[P]
    pool_lora_load_us: np.ndarray | None = None  # int64[P]
    # Speculative decoding: drafts per verify step (0 = off) and, per pool, the expected tokens of
    # a verify step with d = 0..K drafts in SPEC_CREDIT_SCALE units (column 0: exactly one).
    pool_spec_k: np.ndarray | None = None  # int64[P]
    pool_spec_credit: np.ndarray | None = None  # int64[P, K + 1]
    # The pools' user-written per-step policies (policies.user_config.UserTable; None: none).
    user: Any = None

    def per_pool(self, name: str, default: int) -> np.ndarray:
        """An optional per-pool column, or its default for every pool."""
        value = getattr(self, f"pool_{name}")
        return np.full(len(self.pool_replicas), default, np.int64) if value is None else value.astype(np.int64)
    # Replicas active from t=0 per pool (default: every slot); the rest start OFF.
    pool_initial_replicas: np.ndarray | None = None
    # int64[P] 1: a request that finds no replica active or starting is held at the pool (as
    # Knative's activator or a Ray Serve handle holds it) until `start_replica` starts one of
    # its replicas, instead of being rejected as no_replica (default 0: rejected).
    pool_hold: np.ndarray | None = None
    # int64[P] 1: vLLM V1's async scheduling (default 0 here; the fleet config's default is on):
    # while a replica has requests running, the step that starts at the end of step k was
    # scheduled when step k started, so a request queued after that waits for the one after.
    pool_async_scheduling: np.ndarray | None = None
    # Closed-loop sessions (replay/fleet/sessions.py; None: open loop): each request's next turn
    # (-1: none) and, for a later turn, its delay after the previous turn ends (-1: a first turn
    # or no session, which arrives at arrival_us); and the prompt tokens its prefix hashes cover
    # (None: the prompt), which for a turn with a successor covers its answer too.
    next_turn: np.ndarray | None = None
    turn_gap_us: np.ndarray | None = None
    hash_tokens: np.ndarray | None = None
    # A trace read in batches (replay/fleet/streamed.py StreamedRequests): the requests' fields come
    # from its `read(lo, hi)` as the numba engine's window loads them, and the per-request arrays
    # above hold none; `total` is the number of requests.
    requests: Any = None

    @property
    def closed_loop(self) -> bool:
        return self.next_turn is not None

    @property
    def hashed_tokens(self) -> np.ndarray:
        return self.prompt_tokens.astype(np.int64) if self.hash_tokens is None else self.hash_tokens.astype(np.int64)

    def session_column(self, name: str) -> np.ndarray:
        """`next_turn` or `turn_gap_us`, -1 for every request in an open-loop run."""
        value = getattr(self, name)
        return np.full(self.num_requests, -1, np.int64) if value is None else value.astype(np.int64)

    @property
    def adapters(self) -> np.ndarray:
        return np.full(self.num_requests, -1, np.int64) if self.adapter is None else self.adapter.astype(np.int64)

    @property
    def spec_credits(self) -> np.ndarray:
        if self.pool_spec_credit is None:
            return np.full((len(self.pool_replicas), 1), SPEC_CREDIT_SCALE, np.int64)
        return np.ascontiguousarray(self.pool_spec_credit, dtype=np.int64)

    @property
    def num_requests(self) -> int:
        return int(self.arrival_us.shape[0]) if self.requests is None else int(self.requests.total)

    @property
    def tenants(self) -> np.ndarray:
        return np.zeros(self.num_requests, np.int64) if self.tenant is None else self.tenant.astype(np.int64)

    @property
    def refresh_us(self) -> np.ndarray:
        if self.pool_refresh_us is None:
            return np.full(len(self.pool_replicas), 50_000, np.int64)
        return self.pool_refresh_us

    @property
    def router_params(self) -> np.ndarray:
        if self.pool_router_params is None:
            from policies.registry import ROUTER_PARAMS_WIDTH

            return np.zeros((len(self.pool_replicas), ROUTER_PARAMS_WIDTH), np.float64)
        return np.ascontiguousarray(self.pool_router_params, dtype=np.float64)

    def policy_ids(self, family: str) -> np.ndarray:
        """Per pool, the id of its queue order, preemption victim or admission policy ("queue",
        "victim", "admission"); a column left out is vLLM's default (fcfs, vllm-fcfs, always)."""
        from policies.registry import ADMISSIONS, QUEUE_ORDERS, VICTIMS

        default = {"queue": QUEUE_ORDERS["fcfs"], "victim": VICTIMS["vllm-fcfs"], "admission": ADMISSIONS["always"]}
        return self.per_pool(family, default[family].numba_id)

    def policy_reads(self, what: str) -> np.ndarray:
        """Per pool, whether its router reads the scraped view ("view") or the request's
        prefix-cache hits on each replica ("prefix"), its queue order each waiting request's
        ("queue prefix"), its admission policy the pool's queue totals ("admission pool"); or the
        reject reason of its admission policy ("admission reason"). 0 for an id with no policy
        (the engine then stops with an error)."""
        from policies.registry import ADMISSION_MODULES, QUEUE_MODULES, ROUTER_MODULES

        out = np.zeros(len(self.pool_replicas), np.int64)
        if what in ("admission pool", "admission reason"):  # it reads the pool's queue totals; its reason
            for p, aid in enumerate(self.policy_ids("admission")):
                if 0 <= aid < len(ADMISSION_MODULES):
                    module = ADMISSION_MODULES[aid]
                    out[p] = module.READS_POOL if what == "admission pool" else REJECT_NAMES.index(module.REASON)
            return out
        if what == "queue prefix":  # the queue order reads each waiting request's cache hits
            for p, qid in enumerate(self.policy_ids("queue")):
                out[p] = 0 <= qid < len(QUEUE_MODULES) and QUEUE_MODULES[qid].READS_PREFIX
                if self.user is not None and qid == len(QUEUE_MODULES) - 1:  # a user's: its own flag
                    out[p] = self.user.reads_prefix("queue order", p)
            return out
        for p, rid in enumerate(self.pool_router):
            if 0 <= rid < len(ROUTER_MODULES):
                module = ROUTER_MODULES[rid]
                out[p] = module.READS_VIEW if what == "view" else module.reads_prefix(self.router_params[p])
        return out

    @property
    def seeds(self) -> np.ndarray:
        return np.arange(len(self.pool_replicas), dtype=np.int64) if self.pool_seed is None else self.pool_seed

    @property
    def initial_replicas(self) -> np.ndarray:
        return self.pool_replicas if self.pool_initial_replicas is None else self.pool_initial_replicas

    @property
    def pool_first_replica(self) -> np.ndarray:
        """Index of every pool's first replica (a pool's replicas are contiguous)."""
        return (np.cumsum(self.pool_replicas) - self.pool_replicas).astype(np.int64)

    @property
    def replica_pool(self) -> np.ndarray:
        """Pool index of every replica; a pool's replicas are contiguous."""
        return np.repeat(np.arange(len(self.pool_replicas), dtype=np.int64), self.pool_replicas)


def rng_seed(seed: int) -> int:
    """A pool's xorshift64* state from the run's seed: never 0 (xorshift would stay at 0)."""
    from replay.engine.kvblocks import mix64_ref

    return mix64_ref(seed, 0x5EED)


class InvariantViolation(RuntimeError):
    """An engine found its own accounting broken: a bug in the tool, not in the input."""


class Engine(Protocol):
    """What the cluster loop needs from an engine."""

    def advance(self, until_us: int) -> None:
        """Run every arrival, step and completion with time <= until_us."""

    @property
    def done(self) -> bool:
        """Every request has arrived and finished or been rejected."""

    def snapshot(self, t_us: int) -> np.ndarray:
        """int64[replicas, SNAPSHOT_COLUMNS] at t_us (the time of the last `advance`); busy_us
        counts the part of a running step up to t_us."""

    def replica_state(self) -> dict[str, np.ndarray]:
        """`snapshot` as a dict of columns, at the time of the last `advance`."""

    def pool_counters(self) -> dict[str, np.ndarray]:
        """Per pool, cumulative: arrivals, rejected; and now: held (requests held at the pool,
        on no replica yet)."""

    def take_events(self) -> dict[str, np.ndarray]:
        """Events recorded since the last call: t_us, kind, replica, request, value."""

    def replica_lifecycle(self) -> tuple[np.ndarray, np.ndarray]:
        """Per replica: state (R_*) and active_at (when a STARTING replica becomes routable)."""

    def start_replica(self, r: int, active_at_us: int) -> None:
        """An OFF replica starts, with an empty KV cache, and takes requests from active_at_us.
        Requests held at its pool are placed now, oldest first, as if they arrived now (routing
        and admission), so they wait on it (TTFT counts from their arrival)."""

    def drain_replica(self, r: int) -> None:
        """Stop routing to r; it finishes what it holds. A STARTING replica goes straight OFF."""

    def busy(self, r: int) -> bool:
        """Replica r is in the middle of a step."""

    def idle(self, r: int) -> bool:
        """Replica r holds nothing: no request waiting, running or in a step, no KV being sent
        from it, no request on its way to it (prefill/decode)."""

    def retire_replica(self, r: int) -> None:
        """A DRAINING replica that holds nothing is gone (OFF)."""

    def request_columns(self) -> dict[str, np.ndarray]:
        """Per request: replica, state, computed and generated tokens, first_scheduled_us,
        first_token_us, finished_us, preemptions, cached_tokens, reject, and for prefill/decode
        prefill_replica, prefill_end_us, kv_transfer_start_us, kv_transfer_end_us (-1: none),
        kv_transfers (how many were started)."""
