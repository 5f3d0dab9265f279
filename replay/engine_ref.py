"""The reference engine: vLLM V1 scheduling written to be read, not to be fast.

It is the twin of `engine_nb.py` (same inputs, same event order, same outputs) and exists so a
differential test can hold the fast engine to it. Scheduling follows
`vllm/v1/core/sched/scheduler.py` (`Scheduler.schedule`); the KV cache follows
`vllm/v1/core/block_pool.py` (LRU free queue, chained block hashes, free tail first).
"""

from __future__ import annotations

import contextlib
import heapq
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from replay.engine_common import (
    COUNTERS,
    EV_ARRIVE,
    EV_FINISH,
    EV_FIRST_TOKEN,
    EV_PREEMPT,
    EV_REJECT,
    EV_SCHEDULE,
    EV_SWAP_OUT,
    FINISHED,
    PENDING,
    REJECT_CONTEXT,
    REJECT_KV,
    REJECT_NO_REPLICA,
    REJECTED,
    TRANSFERRING,
    rng_seed,
    RUNNING,
    SNAPSHOT_COLUMNS,
    SPEC_CREDIT_SCALE,
    WAITING,
    R_ACTIVE,
    R_DRAINING,
    R_OFF,
    R_STARTING,
    REPLICA_STATE_NAMES,
    EngineInputs,
    InvariantViolation,
)
from replay.kvblocks import block_key_ref
from replay.model.stepmodel import step_time_us_nb
from policies._dispatch import UnknownPolicyId, build_reference
from policies._userview import RequestColumns, UserCall, UserPolicyFailed
from policies.admission._view import PARAM_COLUMNS, AdmissionView
from policies.queue_orders._view import QueueView
from policies.registry import ADMISSION_MODULES, QUEUE_MODULES, ROUTER_MODULES, VICTIM_MODULES
from policies.routers._view import RouterView
from policies.victims._view import VictimView

# The policies' plain-Python twins, by the same ids as the numba engine's kernels.
FAMILIES = {"router": ROUTER_MODULES, "preemption victim": VICTIM_MODULES, "queue order": QUEUE_MODULES,
            "admission": ADMISSION_MODULES}
route_reference = build_reference([m.reference for m in ROUTER_MODULES], "router")
victim_reference = build_reference([m.reference for m in VICTIM_MODULES], "preemption victim")
admission_reference = build_reference([m.reference for m in ADMISSION_MODULES], "admission")
queue_head_reference = build_reference([m.head for m in QUEUE_MODULES], "queue order")
queue_key_reference = build_reference([m.key for m in QUEUE_MODULES], "queue order")


USER_FAMILIES = ("router", "queue order", "preemption victim", "admission")


def user_call(inputs: EngineInputs, family: str) -> UserCall:
    """A family's UserCall for the twins (policies/*/user.py `reference`): per pool its
    UserPolicy (None: none), parameters and state (numpy, as the numba engine's)."""
    table = inputs.user
    npool = len(inputs.pool_replicas)
    first = [int(x) for x in inputs.pool_first_replica]
    if table is None:
        return UserCall([None] * npool, np.zeros((npool, 1)), np.zeros((npool, 1), np.int64), None, None, None, first)
    return UserCall(table.policies(family), table.params(family), table.state(family), None, None, None, first)


class Column:
    """A per-request attribute read by request id, as a policy's view reads a numpy column."""

    def __init__(self, requests: list, get) -> None:
        self.requests, self.get = requests, get

    def __getitem__(self, q: int):
        return self.get(self.requests[q])

# Event kinds in tie-break order at equal times: a step ends, a KV transfer completes, routers
# refresh their view of the replicas, requests arrive, idle replicas wake up to schedule.
STEP_END, TRANSFER_DONE, REFRESH, ARRIVAL, WAKE = 0, 1, 2, 3, 4


@dataclass(eq=False)
class Request:
    index: int
    arrival_us: int
    prompt_tokens: int
    output_tokens: int
    keys: list[int]  # hash of every block the request can ever fill
    priority: int = 0
    swapped: int = 0  # tokens of KV in host memory after a swap preemption
    state: int = PENDING
    replica: int = -1
    computed: int = 0
    generated: int = 0
    scheduled: int = 0
    blocks: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0
    first_scheduled_us: int = -1
    first_token_us: int = -1
    finished_us: int = -1
    preemptions: int = 0
    cached_tokens: int = 0
    reject: int = 0
    # Prefill/decode disaggregation (-1 = none): the decode replica chosen at arrival, the
    # prefill replica, when the prefill was (last) admitted and ended, and the KV transfer.
    decode_replica: int = -1
    prefill_replica: int = -1
    prefill_start_us: int = -1
    prefill_end_us: int = -1
    kv_transfer_start_us: int = -1
    kv_transfer_end_us: int = -1
    kv_transfers: int = 0
    adapter: int = -1  # LoRA adapter id, -1 = the base model
    spec_credit: int = 0  # speculative decoding: fractional tokens carried, in SPEC_CREDIT_SCALE units
    queued_us: int = -1  # when it last joined its replica's waiting queue (async scheduling's cutoff)

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def is_decoding(self) -> bool:
        return self.generated > 0 and self.computed == self.num_tokens - 1


class BlockPool:
    """One replica's KV blocks: reference counts, an LRU free queue and a hash -> block map."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.ref = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.cached: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        return len(self.free)

    def lookup(self, key: int) -> int | None:
        return self.cached.get(key)

    def allocate(self) -> int:
        block, _ = self.free.popitem(last=False)
        if self.hash_of[block] is not None:  # evict its cached prefix
            del self.cached[self.hash_of[block]]
            self.hash_of[block] = None
        self.ref[block] = 1
        return block

    def touch(self, block: int) -> None:
        if self.ref[block] == 0:
            del self.free[block]
        self.ref[block] += 1

    def release(self, block: int) -> None:
        self.ref[block] -= 1
        if self.ref[block] == 0:
            self.free[block] = None

    def cache(self, block: int, key: int) -> None:
        if key not in self.cached:  # one block per hash (see kvblocks.py)
            self.cached[key] = block
            self.hash_of[block] = key


@dataclass(eq=False)
class Replica:
    index: int
    pool: int
    kv: BlockPool
    state: int = R_ACTIVE
    active_at: int = 0
    view: tuple[int, int, int] = (0, 0, 0)  # (waiting, running, KV blocks used) at the last refresh
    host_free: int = 0  # blocks of CPU swap space left
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    busy_until: int = -1
    step_start: int = 0
    counters: dict = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    # Prefill/decode: blocks set aside for KV on its way in, requests whose KV this replica holds
    # until it is sent, requests routed here still being prefilled or transferred, and the
    # prefilled requests waiting for room here, in order.
    reserved: int = 0
    outgoing: int = 0
    incoming: int = 0
    pending: deque = field(default_factory=deque)
    # Multi-LoRA: the adapter in each of the pool's max_loras slots (-1 = empty) and when a step
    # last used it (LRU).
    lora_id: list = field(default_factory=list)
    lora_used: list = field(default_factory=list)

    @property
    def num_free(self) -> int:
        """Free blocks, less those set aside for KV transfers on their way in."""
        return self.kv.num_free - self.reserved


class ReferenceEngine:
    """The `Engine` in plain Python: a heap of (time, kind, seq) events, one scheduler per replica."""

    def __init__(self, inputs: EngineInputs):
        self.inp = inputs
        self.spec_credit = inputs.spec_credits
        self.spec_k = [int(k) for k in inputs.per_pool("spec_k", 0)]
        self.lora_slots = [int(n) for n in inputs.per_pool("lora_slots", 0)]
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
        self.rejected = [0] * len(self.pool_members)
        self.events: list[tuple[int, int, int, int, int]] = []
        self.heap: list[tuple[int, int, int]] = []  # (time, kind, replica or request)
        for i, r in enumerate(self.requests):
            heapq.heappush(self.heap, (r.arrival_us, ARRIVAL, i))
        self.router_params = [list(row) for row in inputs.router_params]
        self.victims = inputs.policy_ids("victim")
        reqs = self.requests
        tenants = inputs.tenants
        budgets = [int(x) for x in inputs.per_pool("ttft_budget_us", 2_000_000)]
        self.user_columns = RequestColumns(
            prompt=Column(reqs, lambda r: r.prompt_tokens), output=Column(reqs, lambda r: r.output_tokens),
            priority=Column(reqs, lambda r: r.priority), tenant=Column(reqs, lambda r: int(tenants[r.index])),
            arrival=Column(reqs, lambda r: r.arrival_us), generated=Column(reqs, lambda r: r.generated),
            nblocks=Column(reqs, lambda r: len(r.blocks)), ttft_budget=budgets)
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
        self.admission_view = AdmissionView(
            waiting=0, waiting_tokens=0, active=0,
            wait_tokens=Column(self.replicas, lambda rep: sum(x.num_tokens for x in rep.waiting)),
            prompt=Column(reqs, lambda r: r.prompt_tokens), output=Column(reqs, lambda r: r.output_tokens),
            priority=Column(reqs, lambda r: r.priority), tenant=Column(reqs, lambda r: int(tenants[r.index])),
            bucket=self.buckets, bucket_at=self.buckets_at, tenants=inputs.num_tenants,
            ttft_budget=budgets, req=self.user_columns, user=self.user["admission"])
        self.queues = inputs.policy_ids("queue")
        self.queue_hits = [bool(x) for x in inputs.policy_reads("queue prefix")]
        self.queue_view = QueueView(priority=Column(reqs, lambda r: r.priority),
                                    prompt=Column(reqs, lambda r: r.prompt_tokens),
                                    arrival=Column(reqs, lambda r: r.arrival_us),
                                    ttft_budget=budgets, req=self.user_columns, user=self.user["queue order"])
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
        visits = [pool] + ([inp.pd_prefill_pool] if pool == inp.pd_decode_pool else [])
        keys = [
            block_key_ref(inp.trace_hashes, int(inp.hash_off[i]), int(inp.hash_len[i]),
                          max(1, inp.trace_block_tokens), prompt, i, j, bs)
            for j in range(max_blocks)
        ] if any(inp.pool_enable_prefix_caching[p] for p in visits) else []
        return Request(i, int(inp.arrival_us[i]), prompt, output, keys, int(inp.priority[i]),
                       adapter=int(inp.adapters[i]))

    # --- the event loop ---------------------------------------------------------------------

    def advance(self, until_us: int) -> None:
        self.now = until_us
        self._check_policy_ids()
        with self._user_code():
            self._advance(until_us)

    @contextlib.contextmanager
    def _user_code(self):
        """A user's policy that raised or chose badly ends the run with an error naming it."""
        try:
            yield
        except UserPolicyFailed as exc:
            raise self.inp.user.error(exc.family, exc.pool, str(exc)) from None

    def _advance(self, until_us: int) -> None:
        while self.heap and self.heap[0][0] <= until_us:
            t, kind, who = heapq.heappop(self.heap)
            if kind == REFRESH:
                self._refresh(who, t)
            elif kind == ARRIVAL:
                self._arrive(self.requests[who], t)
            elif kind == STEP_END:
                self._finish_step(self.replicas[who], t)
            elif kind == TRANSFER_DONE:
                self._finish_transfer(self.requests[who], t)
            else:
                self.wake_pending[who] = False
                self._start_step(self.replicas[who], t)

    def _check_policy_ids(self) -> None:
        """As engine_nb.check_policy_ids: an id without a policy stops the run, before any event."""
        columns = {"router": self.inp.pool_router, "preemption victim": self.victims, "queue order": self.queues,
                   "admission": self.admissions}
        for family, ids in columns.items():
            for p, pid in enumerate(ids):
                user_link = pid == len(FAMILIES[family]) - 1  # needs the pool's user policy
                if not 0 <= pid < len(FAMILIES[family]) or (user_link and self.user[family].addr[p] is None):
                    raise UnknownPolicyId(f"pool {p}: {family} id {int(pid)} has no policy in policies.registry "
                                          f"(stopped at t_us={self.now})")

    def _wake(self, rep: Replica, t: int) -> None:
        if not self.wake_pending[rep.index]:
            self.wake_pending[rep.index] = True
            heapq.heappush(self.heap, (t, WAKE, rep.index))

    def _record(self, t, kind, replica, request, value) -> None:
        self.events.append((t, kind, replica, request, value))

    # --- arrival and routing ----------------------------------------------------------------

    def _arrive(self, req: Request, t: int) -> None:
        p = int(self.inp.pool[req.index])
        self.arrivals[p] += 1  # counted at its home pool, as requests.parquet's `pool` column
        total = req.prompt_tokens + req.output_tokens
        bs = int(self.inp.pool_block_size[p])
        if total > self.inp.pool_max_model_len[p]:
            self._reject(req, REJECT_CONTEXT, t)
        elif math.ceil((total - 1) / bs) > self.inp.pool_kv_blocks[p] - self.inp.per_pool("watermark_blocks", 0)[p]:
            self._reject(req, REJECT_KV, t)
        else:
            self._place(req, t)

    def _reject(self, req: Request, reason: int, t: int) -> None:
        req.state, req.reject = REJECTED, reason
        self.rejected[int(self.inp.pool[req.index])] += 1
        self.ended += 1
        self._record(t, EV_REJECT, -1, req.index, reason)

    def _place(self, req: Request, t: int) -> None:
        """Route a request (arriving, or held at its pool until now) and admit it. With no replica
        active or starting, a pool that holds keeps it (`held`); any other rejects it."""
        p = int(self.inp.pool[req.index])
        r = self._route(p, req, t)
        if r is None:
            r = self._route_starting(p)
        if r is None:
            if self.hold[p]:
                self.held[p].append(req)
            else:
                self._reject(req, REJECT_NO_REPLICA, t)
            return
        decode = None
        if self._remote_prefill(p, self.replicas[r], req):
            pp = self.inp.pd_prefill_pool
            rp = self._route(pp, req, t)
            if rp is None:
                rp = self._route_starting(pp)
            if rp is not None:  # else no prefill replica at all: the decode replica prefills it
                decode, r, p = self.replicas[r], rp, pp
        reason = self._admit(p, self.replicas[r], req, t)
        if reason:
            self._reject(req, reason, t)
            return
        if decode is not None:
            req.decode_replica = decode.index
            decode.incoming += 1
        rep = self.replicas[r]
        req.replica, req.state = rep.index, WAITING
        if self.inp.detailed_events:
            self._record(t, EV_ARRIVE, rep.index, req.index, 0)
        req.queued_us = t
        rep.waiting.append(req)
        self._wake_idle(rep, t)

    def _wake_idle(self, rep: Replica, t: int) -> None:
        """An idle replica that was given work schedules at t (a starting one once it is ready)."""
        if rep.busy_until < 0:
            self._wake(rep, max(t, rep.active_at))

    def _remote_prefill(self, p: int, decode: Replica, req: Request) -> bool:
        """The P/D decider (see engine_nb.remote_prefill): prefill on the prefill pool unless the
        uncached prompt is below the threshold or could never fit a prefill replica."""
        inp = self.inp
        pp = inp.pd_prefill_pool
        if pp < 0 or p != inp.pd_decode_pool:
            return False
        if math.ceil(req.prompt_tokens / int(inp.pool_block_size[pp])) > (
                inp.pool_kv_blocks[pp] - inp.per_pool("watermark_blocks", 0)[pp]):
            return False
        if inp.pd_local_threshold <= 0:
            return True
        bs = int(inp.pool_block_size[p])
        hits = self._prefix_hits(decode, req, bs) if self.caching[p] else 0
        return req.prompt_tokens - hits * bs >= inp.pd_local_threshold

    # --- prefill/decode: the KV transfer (semantics in engine_nb, above `transfer_blocks`) -----

    def _transfer_blocks(self, req: Request) -> int:
        return math.ceil(req.prompt_tokens / int(self.inp.pool_block_size[self.inp.pd_decode_pool]))

    def _transfer_us(self, req: Request, t: int) -> int:
        inp = self.inp
        x = math.ceil(req.prompt_tokens * inp.pd_us_per_token)
        if inp.pd_layers > 0 and t == req.prefill_end_us:  # overlapped with the prefill, layer by layer
            x = max(math.ceil(x / inp.pd_layers), x - (req.prefill_end_us - req.prefill_start_us))
        return x + inp.pd_base_us

    def _hand_off(self, rep: Replica, req: Request, t: int) -> None:
        req.state, req.prefill_replica, req.prefill_end_us = TRANSFERRING, rep.index, t
        rep.outgoing += 1
        decode = self.replicas[req.decode_replica]
        decode.pending.append(req)
        self._accept_pending(decode, t)

    def _accept_pending(self, decode: Replica, t: int) -> None:
        """Start the transfers of the decode replica's queue while their blocks fit, in order."""
        watermark = int(self.inp.per_pool("watermark_blocks", 0)[decode.pool])
        while decode.pending and self._transfer_blocks(decode.pending[0]) <= decode.num_free - watermark:
            req = decode.pending.popleft()
            decode.reserved += self._transfer_blocks(req)
            req.kv_transfer_start_us = t
            req.kv_transfer_end_us = t + self._transfer_us(req, t)
            req.kv_transfers += 1
            heapq.heappush(self.heap, (req.kv_transfer_end_us, TRANSFER_DONE, req.index))

    def _finish_transfer(self, req: Request, t: int) -> None:
        prefill, decode = self.replicas[req.prefill_replica], self.replicas[req.decode_replica]
        self._free(prefill, req)
        prefill.outgoing -= 1
        if prefill.waiting:
            self._wake_idle(prefill, t)
        decode.reserved -= self._transfer_blocks(req)
        req.computed = 0
        self._grow(decode, req, req.prompt_tokens, int(self.inp.pool_block_size[decode.pool]))
        req.computed = req.prompt_tokens - 1  # vLLM recomputes the last prompt token for its logits
        req.replica, req.state = decode.index, WAITING
        decode.incoming -= 1
        req.queued_us = t
        decode.waiting.append(req)
        if self.inp.detailed_events:
            self._record(t, EV_ARRIVE, decode.index, req.index, prefill.index + 1)
        self._wake_idle(decode, t)

    def _admit(self, p: int, rep: Replica, req: Request, t: int) -> int:
        """The pool's admission policy's twin (policies/admission/) on a request routed to `rep`:
        0 or its reject reason."""
        waiting = waiting_tokens = active = 0
        if self.adm_pool[p]:
            members = [self.replicas[x] for x in self.pool_members[p]]
            waiting = sum(len(m.waiting) for m in members)
            waiting_tokens = sum(x.num_tokens for m in members for x in m.waiting)
            active = sum(m.state == R_ACTIVE for m in members)
        view = self.admission_view._replace(waiting=waiting, waiting_tokens=waiting_tokens, active=active)
        if admission_reference(int(self.admissions[p]), view, p, rep.index, req.index, t, self.adm_rows[p]):
            return int(self.adm_reason[p])
        return 0

    def _routable(self, rep: Replica, t: int) -> bool:
        if rep.state == R_STARTING and rep.active_at <= t:
            rep.state = R_ACTIVE  # loading finished
        return rep.state == R_ACTIVE

    def _route_starting(self, p: int) -> int | None:
        """No active replica: the starting one that is ready first holds the request meanwhile."""
        starting = [r for r in self.pool_members[p] if self.replicas[r].state == R_STARTING]
        return min(starting, key=lambda r: self.replicas[r].active_at) if starting else None

    def _refresh(self, p: int, t: int) -> None:
        for r in self.pool_members[p]:
            rep = self.replicas[r]
            rep.view = (len(rep.waiting), len(rep.running), rep.kv.num_blocks - rep.num_free)
        heapq.heappush(self.heap, (t + int(self.inp.refresh_us[p]), REFRESH, p))

    def _prefix_hits(self, rep: Replica, req: Request, bs: int) -> int:
        hits = 0
        for key in req.keys[: (req.prompt_tokens - 1) // bs]:
            if rep.kv.lookup(key) is None:
                break
            hits += 1
        return hits

    def _route(self, p: int, req: Request, t: int) -> int | None:
        """The pool's router (policies/routers/, the twin of its numba kernel) over a RouterView;
        starting replicas whose loading has finished become active first, as in engine_nb.route."""
        members = self.pool_members[p]
        active = [r for r in members if self._routable(self.replicas[r], t)]
        if not active:
            return None
        bs = int(self.inp.pool_block_size[p])
        hits = [0] * len(self.replicas)
        if self.route_hits[p]:
            for r in active:
                hits[r] = self._prefix_hits(self.replicas[r], req, bs)
        reps = self.replicas
        view = RouterView(
            state=[rep.state for rep in reps], wait=[rep.view[0] for rep in reps], run=[rep.view[1] for rep in reps],
            kv=[rep.view[2] for rep in reps], blocks=[rep.kv.num_blocks for rep in reps],
            live_wait=[len(rep.waiting) for rep in reps], live_run=[len(rep.running) for rep in reps],
            wait_tokens=[sum(x.num_tokens for x in rep.waiting) for rep in reps], hits=hits, rng=self.rng, rr=self.rr_next, req=self.user_columns, q=req.index, user=self.user["router"],
        )
        r = route_reference(int(self.inp.pool_router[p]), view, p, members[0], len(members), len(active),
                            -(-req.prompt_tokens // bs), self.router_params[p])
        return None if r < 0 else r

    # --- one scheduler step -----------------------------------------------------------------

    def _start_step(self, rep: Replica, t: int) -> None:
        inp, p = self.inp, rep.pool
        bs = int(inp.pool_block_size[p])
        threshold = int(inp.pool_long_prefill_token_threshold[p])
        budget = int(inp.pool_max_num_batched_tokens[p])
        preempted = False
        swap_blocks = 0  # copied to or from host memory in this step
        # Async scheduling (vLLM V1's default, `EngineCore.step_with_batch_queue`): while requests
        # run, this step was scheduled as the previous one started (rep.step_start), so only the
        # requests queued by then can join it; an engine with nothing running schedules at once.
        cutoff = rep.step_start if self.async_scheduling[p] and rep.running else t

        def chunk(new: int) -> int:
            if 0 < threshold < new:
                new = threshold
            return min(new, budget)

        # 1. Running requests first, in order; make room by preempting the policy's victim.
        i = 0
        while i < len(rep.running) and budget > 0:
            req = rep.running[i]
            new = chunk(self._wanted(req))
            while self._blocks_needed(req, req.computed + new, bs) > rep.num_free:
                vi = self._victim(rep, i)
                victim = rep.running.pop(vi)
                budget += victim.scheduled  # a victim scheduled earlier in this step gives its tokens back
                victim.scheduled = 0
                swap_blocks += self._preempt(rep, victim, t)
                preempted = True
                if victim is req:
                    break
                i -= vi < i
            else:
                self._grow(rep, req, req.computed + new, bs)
                req.scheduled = new
                budget -= new
                i += 1
                continue
            break

        # 2. Waiting requests, unless this step preempted; admission never preempts. A step holds
        # at most max_loras distinct adapters: a request that would need one more is skipped and
        # keeps its place at the head of the queue (vLLM V1 `Scheduler.schedule`).
        max_loras = self.lora_slots[p]
        skipped = []
        while not preempted and rep.waiting and budget > 0 and len(rep.running) < inp.pool_max_num_seqs[p]:
            req = self._next_waiting(rep, bs, cutoff)
            if req is None:
                break  # the rest joined the queue after this step was scheduled
            loras = {self._lora(x) for x in rep.running if x.scheduled} - {-1}
            if self._lora(req) >= 0 and self._lora(req) not in loras and len(loras) >= max_loras:
                rep.waiting.remove(req)
                skipped.append(req)
                continue
            received = len(req.blocks)  # blocks it holds already: KV received from a prefill replica
            resumed = req.swapped  # KV tokens coming back from host memory
            hits = [] if resumed or received else self._cached_prefix(rep, req, bs)
            computed = req.computed if received else (resumed or len(hits) * bs)
            new = chunk(req.num_tokens - computed)
            evictable = sum(1 for b in hits if rep.kv.ref[b] == 0)
            # The chunk must fit; with the whole-prompt gate, everything still to compute must; the
            # watermark keeps blocks free for running requests to grow into.
            upto = req.num_tokens if inp.per_pool("whole_prompt", 0)[p] else computed + new
            watermark = int(inp.per_pool("watermark_blocks", 0)[p])
            need = math.ceil(upto / bs) - len(hits) - received
            if need > 0 and need + evictable > rep.num_free - watermark:
                break
            if not received:
                for block in hits:
                    rep.kv.touch(block)
                req.blocks = hits
                req.num_cached_blocks = len(hits)
                req.computed = computed
            self._grow(rep, req, computed + new, bs)
            if resumed:  # swap in: the host copy is released
                back = math.ceil(resumed / bs)
                rep.host_free += back
                swap_blocks += back
                req.swapped = 0
            rep.waiting.remove(req)
            rep.running.append(req)
            req.state = RUNNING
            req.scheduled = new
            req.prefill_start_us = t
            if req.first_scheduled_us < 0:
                req.first_scheduled_us, req.cached_tokens = t, computed
                rep.counters["hit_tokens"] += computed
                rep.counters["query_tokens"] += req.prompt_tokens
            rep.counters["admitted"] += 1
            if inp.detailed_events:
                self._record(t, EV_SCHEDULE, rep.index, req.index, computed)
            budget -= new
        rep.waiting.extendleft(reversed(skipped))

        # 3. What the step computes, for the step model; adapters not in a slot are loaded.
        batch = [req for req in rep.running if req.scheduled]
        if not batch:
            if preempted:  # the victim was the request itself: schedule again, as vLLM
                self._wake(rep, t)
            elif rep.waiting and not rep.outgoing and not rep.reserved:  # impossible: see engine_nb.advance_nb
                raise InvariantViolation(f"replica {rep.index} has {len(rep.waiting)} waiting requests but cannot "
                                         f"schedule any at t_us={t}")
            return
        prefill = [(req.scheduled, req.computed) for req in batch if not req.is_decoding]
        decodes = [(req.scheduled, req.computed) for req in batch if req.is_decoding]
        adapters = []  # distinct, in batch order
        for req in batch:
            if self._lora(req) >= 0 and self._lora(req) not in adapters:
                adapters.append(self._lora(req))
        loads = sum(self._activate_lora(rep, a, t) for a in adapters)
        duration = int(step_time_us_nb(
            inp.pool_step_params[p],
            sum(new for new, _ in prefill),
            sum(new * before + new * (new + 1) / 2.0 for new, before in prefill),
            sum(before for _, before in prefill),
            len(decodes),
            sum(before + 1 for _, before in decodes),
            len(batch),
            sum(new - 1 for new, _ in decodes),  # draft tokens verified
            len(adapters),
        )) + swap_blocks * int(inp.per_pool("swap_us_per_block", 0)[p])
        duration += loads * int(inp.per_pool("lora_load_us", 0)[p])
        rep.step_start, rep.busy_until = t, t + duration
        rep.counters["steps"] += 1
        heapq.heappush(self.heap, (rep.busy_until, STEP_END, rep.index))

    def _wanted(self, req: Request) -> int:
        """Tokens a running request computes next: the rest of its prompt, one decode token, or
        under speculative decoding a verify step of the token plus up to k drafts (none past its
        last output token)."""
        k = self.spec_k[self.replicas[req.replica].pool]
        if k and req.is_decoding:
            return 1 + min(k, req.output_tokens - req.generated - 1)
        return req.num_tokens - req.computed

    def _lora(self, req: Request) -> int:
        """The request's adapter where it runs (-1: none, or the pool serves no LoRA)."""
        pool = self.replicas[req.replica].pool
        return req.adapter if self.lora_slots[pool] > 0 else -1

    def _activate_lora(self, rep: Replica, adapter: int, t: int) -> int:
        """Adapter resident for the step at t: 1 if it was loaded into the least recently used
        slot that no request of this step uses (the lowest such slot on ties), else 0."""
        if adapter in rep.lora_id:
            rep.lora_used[rep.lora_id.index(adapter)] = t
            return 0
        free = [s for s in range(len(rep.lora_id)) if rep.lora_used[s] < t]
        slot = min(free, key=lambda s: (rep.lora_used[s], s))
        rep.lora_id[slot], rep.lora_used[slot] = adapter, t
        return 1

    def _empty_lora_slots(self, rep: Replica) -> None:
        slots = self.lora_slots[rep.pool]
        rep.lora_id, rep.lora_used = [-1] * slots, [-1] * slots

    def _victim(self, rep: Replica, i: int) -> int:
        """Index in the running list of the request to preempt while scheduling index i: the
        pool's victim policy's twin (policies/victims/) over a VictimView."""
        view = self.victim_view._replace(run=[req.index for req in rep.running], pool=rep.pool)
        return victim_reference(int(self.victims[rep.pool]), view, 0, len(rep.running), i)

    def _cached_prefix(self, rep: Replica, req: Request, bs: int) -> list[int]:
        """Blocks of the request's leading full blocks found in the cache, capped at num_tokens - 1."""
        hits = []
        for key in req.keys[: (req.num_tokens - 1) // bs]:
            block = rep.kv.lookup(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def _next_waiting(self, rep: Replica, bs: int, cutoff: int) -> Request | None:
        """The queue order's pick among the requests queued by `cutoff` (None: no such request);
        ties go to the earlier arrival, then the lower index."""
        policy, p = int(self.queues[rep.pool]), rep.pool
        eligible = [req for req in rep.waiting if req.queued_us <= cutoff]
        received = [req for req in eligible if req.blocks]  # KV arrived: goes first (see engine_nb)
        if received:
            return received[0]
        if not eligible:
            return None
        if queue_head_reference(policy, len(rep.waiting)):
            return eligible[0]  # the queue's own order (FCFS)

        def key(req: Request) -> tuple:
            hits = len(self._cached_prefix(rep, req, bs)) if self.queue_hits[p] else 0
            return (queue_key_reference(policy, self.queue_view, p, req.index, hits), req.arrival_us, req.index)

        return min(eligible, key=key)

    def _blocks_needed(self, req: Request, num_tokens: int, bs: int) -> int:
        return math.ceil(num_tokens / bs) - len(req.blocks)

    def _grow(self, rep: Replica, req: Request, num_tokens: int, bs: int) -> None:
        """Hold `num_tokens` tokens of KV; full blocks join the prefix cache as vLLM does at scheduling."""
        for _ in range(self._blocks_needed(req, num_tokens, bs)):
            req.blocks.append(rep.kv.allocate())
        if req.keys and self.caching[rep.pool]:
            full = num_tokens // bs
            for j in range(req.num_cached_blocks, full):
                rep.kv.cache(req.blocks[j], req.keys[j])
            req.num_cached_blocks = max(req.num_cached_blocks, full)

    def _free(self, rep: Replica, req: Request) -> None:
        for block in reversed(req.blocks):  # tail first: evicted first
            rep.kv.release(block)
        req.blocks = []
        req.num_cached_blocks = 0

    def _preempt(self, rep: Replica, req: Request, t: int) -> int:
        """Back to the head of the queue; swap mode keeps the KV in host memory while the swap
        space lasts (returns the blocks copied, which the step pays for), else recompute."""
        held = len(req.blocks)
        swap = self.inp.per_pool("swap", 0)[rep.pool] and held <= rep.host_free
        self._free(rep, req)
        if swap:
            rep.host_free -= held
            req.swapped = req.computed
        req.computed = 0
        req.state = WAITING
        req.preemptions += 1
        rep.counters["preemptions"] += 1
        req.queued_us = t
        rep.waiting.appendleft(req)
        self._record(t, EV_SWAP_OUT if swap else EV_PREEMPT, rep.index, req.index, req.generated)
        return held if swap else 0

    def _finish_step(self, rep: Replica, t: int) -> None:
        still_running = []
        for req in rep.running:
            new, req.scheduled = req.scheduled, 0
            if new:
                if not req.is_decoding:
                    rep.counters["prefill_tokens"] += new
                else:  # the expected tokens of the step, the fraction carried (1 without speculation)
                    credit = req.spec_credit + int(self.spec_credit[rep.pool, new - 1])
                    new, req.spec_credit = divmod(credit, SPEC_CREDIT_SCALE)
                req.computed += new
                if req.computed >= req.num_tokens and req.decode_replica >= 0 and not req.generated \
                        and rep.index != req.decode_replica:
                    self._hand_off(rep, req, t)  # prefilled: its KV goes to the decode replica
                    continue
                if req.computed >= req.num_tokens:
                    emitted = req.computed - req.num_tokens + 1
                    req.generated += emitted
                    rep.counters["output_tokens"] += emitted
                    if req.first_token_us < 0:
                        req.first_token_us = t
                        if self.inp.detailed_events:
                            self._record(t, EV_FIRST_TOKEN, rep.index, req.index, 0)
                    if req.generated >= req.output_tokens:
                        self._free(rep, req)
                        req.state, req.finished_us = FINISHED, t
                        rep.counters["finished"] += 1
                        self.ended += 1
                        if self.inp.detailed_events:
                            self._record(t, EV_FINISH, rep.index, req.index, req.generated)
                        continue
            still_running.append(req)
        rep.running = still_running
        if rep.pending:
            self._accept_pending(rep, t)  # blocks may have been freed
        rep.counters["busy_us"] += t - rep.step_start
        rep.busy_until = -1
        self._wake(rep, t)

    # --- what the cluster loop reads --------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.ended == len(self.requests)

    def snapshot(self, t_us: int) -> np.ndarray:
        rows = []
        for r in self.replicas:
            counters = dict(r.counters)
            if r.busy_until >= 0:
                counters["busy_us"] += t_us - r.step_start
            serving = r.state in (R_ACTIVE, R_DRAINING) or (r.state == R_STARTING and r.active_at <= t_us)
            rows.append([len(r.waiting), len(r.running), r.kv.num_blocks - r.num_free,
                         r.kv.num_blocks if serving else 0, *(counters[name] for name in COUNTERS)])
        return np.array(rows, np.int64).reshape(len(self.replicas), len(SNAPSHOT_COLUMNS))

    def replica_state(self) -> dict[str, np.ndarray]:
        return dict(zip(SNAPSHOT_COLUMNS, self.snapshot(self.now).T))

    def pool_counters(self) -> dict[str, np.ndarray]:
        return {"arrivals": np.array(self.arrivals, np.int64), "rejected": np.array(self.rejected, np.int64),
                "held": np.array([len(h) for h in self.held], np.int64)}

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
        # A new pod: empty KV cache and queues; the cumulative counters carry on.
        rep.kv = BlockPool(rep.kv.num_blocks)
        rep.waiting.clear()
        rep.running = []
        rep.pending.clear()
        rep.reserved = rep.outgoing = rep.incoming = 0
        self._empty_lora_slots(rep)
        rep.busy_until = -1
        rep.state, rep.active_at = R_STARTING, active_at_us
        held = self.held[rep.pool]
        with self._user_code():
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
        }
