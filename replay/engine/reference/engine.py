"""`ReferenceEngine`: vLLM V1 scheduling written to be read, not to be fast.

It is the twin of the numba engine (`engine/numba_engine.py` and its kernels: same inputs, same
event order, same outputs) and exists so a differential test can hold the fast engine to it.
Its parts are mixins, one per module, named as the numba engine's modules: `loop`,
`scheduling`, `transfer`, `routing`, `lora`, `kvblocks`, `events`; the state is in `state`.
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from replay.engine.common import (
    R_ACTIVE,
    R_DRAINING,
    R_OFF,
    R_STARTING,
    REPLICA_STATE_NAMES,
    SNAPSHOT_COLUMNS,
    EngineInputs,
    InvariantViolation,
    rng_seed,
)
from replay.engine.kvblocks import block_key_ref
from replay.engine.reference.events import EventsMixin
from replay.engine.reference.kvblocks import BlockPool, KvMixin
from replay.engine.reference.lora import LoraMixin
from replay.engine.reference.loop import LoopMixin
from replay.engine.reference.routing import RoutingMixin
from replay.engine.reference.scheduling import SchedulingMixin
from replay.engine.reference.sessions import SessionsMixin
from replay.engine.reference.state import ARRIVAL, REFRESH, Column, Replica, Request
from replay.engine.reference.transfer import TransferMixin
from replay.engine.reference.user import USER_FAMILIES, request_columns, user_call, user_code
from policies.admission._view import PARAM_COLUMNS, AdmissionView
from policies.queue_orders._view import QueueView
from policies.victims._view import VictimView


class ReferenceEngine(LoopMixin, SchedulingMixin, TransferMixin, RoutingMixin, LoraMixin, KvMixin, EventsMixin,
                      SessionsMixin):
    """The `Engine` in plain Python: a heap of (time, kind, seq) events, one scheduler per replica."""

    def __init__(self, inputs: EngineInputs):
        self.inp = inputs
        self.spec_credit = inputs.spec_credits
        self.spec_k = [int(k) for k in inputs.per_pool("spec_k", 0)]
        self.lora_slots = [int(n) for n in inputs.per_pool("lora_slots", 0)]
        self.hashed = inputs.hashed_tokens  # tokens each request's trace hashes cover
        self.requests = [self._make_request(i) for i in range(inputs.num_requests)]
        self.replicas = [
            Replica(r, int(p), BlockPool(int(inputs.pool_kv_blocks[p])))
            for r, p in enumerate(inputs.replica_pool)
        ]
        self.pool_members = [list(range(int(f), int(f + n)))
                             for f, n in zip(inputs.pool_first_replica, inputs.pool_replicas)]
        for rep in self.replicas:
            rep.host_free = int(inputs.per_pool("host_blocks", 0)[rep.pool])
            self._empty_lora_slots(rep)
        for members, initial in zip(self.pool_members, inputs.initial_replicas):
            for r in members[int(initial):]:
                self.replicas[r].state = R_OFF
        self.rr_next = [0] * len(self.pool_members)
        self.rng = [rng_seed(int(x)) for x in inputs.seeds]
        # Token buckets per (pool, tenant), at pool * tenants + tenant: level (millionths of a
        # token) and last refill, owned by the admission policy.
        self.buckets = [int(x) * 1_000_000 for x in inputs.per_pool("bucket_tokens", 0)
                        for _ in range(inputs.num_tenants)]
        self.buckets_at = [0] * len(self.buckets)
        self.arrivals = [0] * len(self.pool_members)
        self.arrived_tokens = [[0, 0] for _ in self.pool_members]  # prompt, output
        self.rejected = [0] * len(self.pool_members)
        self.events: list[tuple[int, int, int, int, int]] = []
        self.heap: list[tuple[int, int, int]] = []  # (time, kind, replica or request)
        # Closed loop: a session's later turns join the heap when the turn before them ends.
        self.next_turn = inputs.session_column("next_turn")
        self.turn_gap = inputs.session_column("turn_gap_us")
        for i, r in enumerate(self.requests):
            if self.turn_gap[i] < 0:
                heapq.heappush(self.heap, (r.arrival_us, ARRIVAL, i))
        self.router_params = [list(row) for row in inputs.router_params]
        self.victims = inputs.policy_ids("victim")
        reqs = self.requests
        self.user_columns = request_columns(reqs, inputs)
        self.user = {family: user_call(inputs, family) for family in USER_FAMILIES}
        self.victim_view = VictimView(run=[], priority=Column(reqs, lambda r: r.priority),
                                      arrival=Column(reqs, lambda r: r.arrival_us),
                                      generated=Column(reqs, lambda r: r.generated),
                                      blocks=Column(reqs, lambda r: len(r.blocks)), req=self.user_columns,
                                      pool=-1, user=self.user["preemption victim"])
        self.admissions = inputs.policy_ids("admission")
        self.adm_pool = inputs.policy_reads("admission pool")
        self.adm_reason = inputs.policy_reads("admission reason")
        self.adm_rows = [[int(inputs.per_pool(name, 0)[p]) for name in PARAM_COLUMNS]
                         for p in range(len(self.pool_members))]
        tenants = inputs.tenants
        self.admission_view = AdmissionView(
            waiting=0, waiting_tokens=0, active=0,
            wait_tokens=Column(self.replicas, lambda rep: sum(x.num_tokens for x in rep.waiting)),
            prompt=Column(reqs, lambda r: r.prompt_tokens), output=Column(reqs, lambda r: r.output_tokens),
            priority=Column(reqs, lambda r: r.priority), tenant=Column(reqs, lambda r: int(tenants[r.index])),
            bucket=self.buckets, bucket_at=self.buckets_at, tenants=inputs.num_tenants,
            ttft_budget=self.user_columns.ttft_budget, req=self.user_columns, user=self.user["admission"])
        self.queues = inputs.policy_ids("queue")
        self.queue_hits = [bool(x) for x in inputs.policy_reads("queue prefix")]
        self.queue_view = QueueView(priority=Column(reqs, lambda r: r.priority),
                                    prompt=Column(reqs, lambda r: r.prompt_tokens),
                                    arrival=Column(reqs, lambda r: r.arrival_us),
                                    ttft_budget=self.user_columns.ttft_budget, req=self.user_columns,
                                    user=self.user["queue order"])
        self.route_hits = [bool(x) for x in inputs.policy_reads("prefix")]
        for p, reads_view in enumerate(inputs.policy_reads("view")):
            if reads_view:
                heapq.heappush(self.heap, (0, REFRESH, p))
        self.caching = [bool(c) for c in inputs.pool_enable_prefix_caching]
        self.async_scheduling = [bool(a) for a in inputs.per_pool("async_scheduling", 0)]
        self.wake_pending = [False] * len(self.replicas)
        self.ended = 0  # requests finished or rejected
        # Requests held at a pool with no replica active or starting, while `hold` says its
        # autoscaler may still start one (see EngineInputs.pool_hold).
        self.hold = [bool(h) for h in inputs.per_pool("hold", 0)]
        self.held: list[deque] = [deque() for _ in self.pool_members]
        self.now = 0

    def _make_request(self, i: int) -> Request:
        inp = self.inp
        prompt, output = int(inp.prompt_tokens[i]), int(inp.output_tokens[i])
        pool = int(inp.pool[i])
        bs = int(inp.pool_block_size[pool])  # the prefill pool of a P/D pair has the same block size
        max_blocks = (prompt + output) // bs
        hashed = int(self.hashed[i])
        visits = [pool] + ([inp.pd_prefill_pool] if pool == inp.pd_decode_pool else [])
        keys = [
            block_key_ref(inp.trace_hashes, int(inp.hash_off[i]), int(inp.hash_len[i]),
                          max(1, inp.trace_block_tokens), hashed, i, j, bs)
            for j in range(max_blocks)
        ] if any(inp.pool_enable_prefix_caching[p] for p in visits) else []
        return Request(i, int(inp.arrival_us[i]), prompt, output, keys, int(inp.priority[i]),
                       adapter=int(inp.adapters[i]))

    # --- what the cluster loop reads --------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.ended == len(self.requests)

    def replica_state(self) -> dict[str, np.ndarray]:
        return dict(zip(SNAPSHOT_COLUMNS, self.snapshot(self.now).T))

    def pool_counters(self) -> dict[str, np.ndarray]:
        return {"arrivals": np.array(self.arrivals, np.int64), "rejected": np.array(self.rejected, np.int64),
                "held": np.array([len(h) for h in self.held], np.int64),
                "arrived_prompt_tokens": np.array([a[0] for a in self.arrived_tokens], np.int64),
                "arrived_output_tokens": np.array([a[1] for a in self.arrived_tokens], np.int64)}

    def take_events(self) -> dict[str, np.ndarray]:
        events, self.events = self.events, []
        cols = list(zip(*events)) if events else [(), (), (), (), ()]
        names = ("t_us", "kind", "replica", "request", "value")
        return {n: np.array(c, dtype=np.int64) for n, c in zip(names, cols)}

    def replica_lifecycle(self) -> tuple[np.ndarray, np.ndarray]:
        for rep in self.replicas:
            if rep.state == R_STARTING and rep.active_at <= self.now:
                rep.state = R_ACTIVE
        return (np.array([r.state for r in self.replicas], np.int64),
                np.array([r.active_at for r in self.replicas], np.int64))
    def start_replica(self, r: int, active_at_us: int) -> None:
        rep = self.replicas[r]
        if rep.state != R_OFF:
            raise InvariantViolation(f"start_replica({r}): replica is {REPLICA_STATE_NAMES[rep.state]}")
        self._reset_replica(rep)
        rep.state, rep.active_at = R_STARTING, active_at_us
        held = self.held[rep.pool]
        with user_code(self.inp):
            for req in [held.popleft() for _ in range(len(held))]:  # oldest first: they wait on it now
                self._place(req, self.now)

    def drain_replica(self, r: int) -> None:
        rep = self.replicas[r]
        if rep.state == R_STARTING and rep.active_at > self.now and not rep.waiting and not rep.incoming:
            rep.state = R_OFF  # cancelled before it held anything
        elif rep.state in (R_STARTING, R_ACTIVE):
            rep.state = R_DRAINING

    def busy(self, r: int) -> bool:
        """Replica r is in the middle of a step."""
        return self.replicas[r].busy_until >= 0

    def idle(self, r: int) -> bool:
        rep = self.replicas[r]
        return not (rep.waiting or rep.running or rep.busy_until >= 0 or rep.outgoing or rep.incoming)

    def retire_replica(self, r: int) -> None:
        rep = self.replicas[r]
        if rep.state != R_DRAINING or not self.idle(r):
            raise InvariantViolation(f"retire_replica({r}): replica still holds requests or is not draining")
        rep.state = R_OFF

    def request_columns(self) -> dict[str, np.ndarray]:
        reqs = self.requests

        def col(attr, dtype=np.int64):
            return np.array([getattr(r, attr) for r in reqs], dtype=dtype)

        return {
            "replica": col("replica"),
            "state": col("state", np.int8),
            "computed": col("computed"),
            "generated": col("generated"),
            "first_scheduled_us": col("first_scheduled_us"),
            "first_token_us": col("first_token_us"),
            "finished_us": col("finished_us"),
            "preemptions": col("preemptions"),
            "cached_tokens": col("cached_tokens"),
            "reject": col("reject", np.int8),
            "prefill_replica": col("prefill_replica"),
            "prefill_end_us": col("prefill_end_us"),
            "kv_transfer_start_us": col("kv_transfer_start_us"),
            "kv_transfer_end_us": col("kv_transfer_end_us"),
            "kv_transfers": col("kv_transfers"),
            **({"arrival_us": col("arrival_us")} if self.inp.closed_loop else {}),
        }
