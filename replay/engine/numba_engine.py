"""`NumbaEngine`: the host side of the numba engine. It lays out the state arrays (`state.py`),
runs the event loop (`loop.advance_nb`) tick by tick, drains its event buffer and applies
lifecycle changes. Its reference twin is `reference/engine.py`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import types

from replay.engine.common import (
    COUNTERS,
    NO_EVENT,
    R_ACTIVE,
    R_DRAINING,
    R_OFF,
    R_STARTING,
    REPLICA_STATE_NAMES,
    SNAPSHOT_COLUMNS,
    SPEC_CREDIT_SCALE,
    EngineInputs,
    rng_seed,
    InvariantViolation,
)
from replay.engine.kvblocks import Blocks, table_size
from replay.engine.lazy import sync_lazy_nb
from replay.engine.loop import advance_nb, enter_nb, reset_replica_nb, snapshot_nb
from replay.engine import prebuild
from replay.engine.routing import release_held_nb
from replay.engine.window import DEFAULT_CAPACITY, Window
from replay.engine.state import (
    C_FINISHED,
    QUIET_DURS,
    STATUS_EVENTS_FULL,
    STATUS_STUCK,
    STATUS_UNKNOWN_POLICY,
    UNKNOWN_ROUTER,
    UNKNOWN_VICTIM,
    UNKNOWN_QUEUE,
    UNKNOWN_ADMISSION,
    Events,
    Pools,
    Replicas,
)
from replay.engine.variants import features, specialise, variant_of
from policies._dispatch import UnknownPolicyId
from policies._userview import E_FAMILY, E_LIMIT, E_POOL, E_STATUS, E_VALUE, ERR_WIDTH, UserCall, choice_message
from policies.user import POOL_WIDTH, REPLICA_WIDTH, REQUEST_WIDTH
from policies.admission._view import PARAM_COLUMNS


def admission_params(inputs: EngineInputs) -> np.ndarray:
    """The admission parameters as one int64[P, 8] array, in policies/admission/_view.py's order."""
    return np.stack([inputs.per_pool(name, 0) for name in PARAM_COLUMNS], axis=1).astype(np.int64)


def _slot_in_pool(inputs: EngineInputs) -> np.ndarray:
    """Index of every replica within its pool (0, 1, ... per pool)."""
    return np.arange(int(inputs.pool_replicas.sum())) - np.repeat(inputs.pool_first_replica, inputs.pool_replicas)


def _leaves(pool_replicas: np.ndarray) -> np.ndarray:
    """Leaves of each pool's tree of its least loaded replica: a power of two, one per replica."""
    return np.array([1 << max(int(n) - 1, 0).bit_length() for n in pool_replicas], np.int64)


def _tree(nrep: int) -> np.ndarray:
    """An idle tournament tree: leaves hold replica ids (-1 pads), every node its left-most leaf."""
    leaves = 1
    while leaves < max(nrep, 1):
        leaves *= 2
    tree = np.full(2 * leaves, -1, np.int64)
    tree[leaves:leaves + nrep] = np.arange(nrep)
    for i in range(leaves - 1, 0, -1):
        tree[i] = tree[2 * i] if tree[2 * i] >= 0 else tree[2 * i + 1]
    return tree


def full(size, value, dtype=np.int64):
    return np.full(size, value, dtype=dtype)


class KvLayout(NamedTuple):
    """Where each replica's slice of the flat block, hash-table and running-list arrays starts."""

    blocks_per: np.ndarray
    block_off: np.ndarray
    tsize: np.ndarray
    htab_off: np.ndarray
    seqs_per: np.ndarray
    run_off: np.ndarray
    total_blocks: int
    lora_per: np.ndarray


def kv_layout(inputs: EngineInputs) -> KvLayout:
    rep_pool = inputs.replica_pool
    i64 = np.int64
    blocks_per = inputs.pool_kv_blocks[rep_pool].astype(i64)
    block_off = (np.cumsum(blocks_per) - blocks_per).astype(i64)
    tsize = np.array([table_size(int(b)) for b in blocks_per], dtype=i64)
    htab_off = (np.cumsum(tsize) - tsize).astype(i64)
    seqs_per = inputs.pool_max_num_seqs[rep_pool].astype(i64)
    run_off = (np.cumsum(seqs_per) - seqs_per).astype(i64)
    total_blocks = int(blocks_per.sum())
    lora_per = inputs.per_pool("lora_slots", 0)[rep_pool]
    return KvLayout(blocks_per, block_off, tsize, htab_off, seqs_per, run_off, total_blocks, lora_per)


def make_blocks(layout: KvLayout) -> Blocks:
    """The block arrays, zeroed (calloc's pages: a replica's cost nothing until it is used). A
    replica's blocks and hash table are laid out when it first serves (`reset_replica_nb`: at
    construction for those active from the start, at `start_replica` for the others), so a
    fleet that may scale to hundreds of replicas does not write every one of them up front."""
    hsize = int(layout.tsize.sum())
    # int32 block ids, links and counts: a walk of a request's blocks held by id reads 16 links a
    # cache line, a take or a free touches half the bytes (2**31 blocks would be tens of
    # terabytes of KV at the least)
    assert layout.total_blocks < 2**31
    return Blocks(
        ref=np.zeros(layout.total_blocks, np.int32),
        key=np.zeros(layout.total_blocks, np.uint64),
        fprev=np.zeros(layout.total_blocks, np.int32),
        fnext=np.zeros(layout.total_blocks, np.int32),
        gap=np.zeros(layout.total_blocks, np.int32),
        cprev=np.zeros(layout.total_blocks, np.int32),
        htab_key=np.zeros(hsize, np.uint64),
        htab_val=np.zeros(hsize, np.int32),
        utop=np.full(len(layout.blocks_per), -1, np.int64),
        fresh=layout.block_off.copy(),
        tgap=np.zeros(len(layout.blocks_per), np.int64),
    )


def make_replicas(inputs: EngineInputs, layout: KvLayout) -> Replicas:
    """Every replica idle and empty; those of `initial_replicas` active, the rest off."""
    rep_pool = inputs.replica_pool
    nrep = len(rep_pool)
    blocks_per, block_off, tsize, htab_off = layout.blocks_per, layout.block_off, layout.tsize, layout.htab_off
    seqs_per, run_off, lora_per = layout.seqs_per, layout.run_off, layout.lora_per
    i64 = np.int64
    return Replicas(
        pool=rep_pool.astype(i64),
        block_off=block_off,
        nblocks=blocks_per,
        free_head=block_off.copy(),
        free_tail=block_off + blocks_per - 1,
        nfree=blocks_per.copy(),
        htab_off=htab_off,
        htab_mask=tsize - 1,
        wait_head=full(nrep, -1),
        wait_tail=full(nrep, -1),
        nwait=full(nrep, 0),
        run_off=run_off,
        nrun=full(nrep, 0),
        run_list=full(int(seqs_per.sum()), -1),
        busy_until=full(nrep, -1),
        step_start=full(nrep, 0),
        wake=full(nrep, NO_EVENT),
        counters=np.zeros((nrep, len(COUNTERS)), dtype=i64),
        ekey=full(len(_tree(nrep)), NO_EVENT),
        tree=_tree(nrep),
        state=np.where(_slot_in_pool(inputs) < inputs.initial_replicas[rep_pool], R_ACTIVE, R_OFF).astype(i64),
        active_at=full(nrep, 0),
        view_wait=full(nrep, 0),
        view_run=full(nrep, 0),
        view_kv=full(nrep, 0),
        hits=full(nrep, 0),
        wait_tokens=full(nrep, 0),
        host_free=inputs.per_pool("host_blocks", 0)[rep_pool],
        reserved=full(nrep, 0),
        outgoing=full(nrep, 0),
        incoming=full(nrep, 0),
        pend_head=full(nrep, -1),
        pend_tail=full(nrep, -1),
        lora_off=np.concatenate(([0], np.cumsum(lora_per))).astype(i64),
        lora_id=full(int(lora_per.sum()), -1),
        lora_used=full(int(lora_per.sum()), -1),
        neager=full(nrep, 0),
        nlazy=full(nrep, 0),
        lz_steps=full(nrep, 0),
        lz_ctx=full(nrep, 0),
        lz_maxseq=full(nrep, -1),
        lz_cool=full(nrep, 0),
        seq_next=full(nrep, 0),
        fh_n=full(nrep, 0),
        fh_key=full(int(seqs_per.sum()), 0),
        fh_q=full(int(seqs_per.sum()), -1),
        ah_n=full(nrep, 0),
        ah_key=full(int(seqs_per.sum()), 0),
        ah_q=full(int(seqs_per.sum()), -1),
        lz_due=full(int(seqs_per.sum()), -1),
        qr_end=full(nrep, -1),
        qr_steps=full(nrep, 0),
        qr_from=full(nrep, 0),
        qr_dur=np.zeros((nrep, QUIET_DURS + 2), i64),
        ll_key=full(int(2 * _leaves(inputs.pool_replicas).sum()), NO_EVENT),  # built at each kernel entry
        ll_win=full(int(2 * _leaves(inputs.pool_replicas).sum()), -1),
    )


def lazy_pools(inputs: EngineInputs, lazy: bool) -> np.ndarray:
    """Per pool, 1 where steady decoders may be kept lazily (engine/lazy.py): each of their steps
    is then exactly one token and touches nothing but its blocks. Not with speculative decoding
    (a verify step's tokens vary) or LoRA (every step refreshes its adapters' LRU), nor with a
    user's policy (its view may read any request's progress)."""
    on = np.full(len(inputs.pool_replicas), int(lazy and inputs.user is None), np.int64)
    on[inputs.per_pool("spec_k", 0) > 0] = 0
    on[inputs.per_pool("lora_slots", 0) > 0] = 0
    on[inputs.spec_credits[:, 0] != SPEC_CREDIT_SCALE] = 0
    return on


def make_pools(inputs: EngineInputs, lazy: bool = True, slots: int | None = None) -> Pools:
    """Every pool's configuration, its policies' ids and parameters, and its counters at zero;
    its heaps of requests sized for `slots` (the request window's, default every request)."""
    n = inputs.num_requests if slots is None else slots
    npool = len(inputs.pool_replicas)
    i64 = np.int64
    return Pools(
        first_replica=inputs.pool_first_replica,
        num_replicas=inputs.pool_replicas.astype(i64),
        kv_blocks=inputs.pool_kv_blocks.astype(i64),
        block_size=inputs.pool_block_size.astype(i64),
        max_num_seqs=inputs.pool_max_num_seqs.astype(i64),
        max_batched=inputs.pool_max_num_batched_tokens.astype(i64),
        long_prefill=inputs.pool_long_prefill_token_threshold.astype(i64),
        prefix_caching=inputs.pool_enable_prefix_caching.astype(i64),
        max_model_len=inputs.pool_max_model_len.astype(i64),
        router=inputs.pool_router.astype(i64),
        router_params=inputs.router_params,
        route_hits=inputs.policy_reads("prefix"),
        rr_next=full(npool, 0),
        arrivals=full(npool, 0),
        arrived_tokens=np.zeros((npool, 2), dtype=i64),
        rejected=full(npool, 0),
        step=np.ascontiguousarray(inputs.pool_step_params, dtype=np.float64),
        refresh_us=inputs.refresh_us.astype(i64),
        next_refresh=np.where(inputs.policy_reads("view") != 0, 0, NO_EVENT).astype(i64),
        rng=np.array([rng_seed(int(x)) for x in inputs.seeds], dtype=np.uint64),
        queue=inputs.policy_ids("queue"),
        queue_hits=inputs.policy_reads("queue prefix"),
        victim=inputs.policy_ids("victim"),
        watermark_blocks=inputs.per_pool("watermark_blocks", 0),
        whole_prompt=inputs.per_pool("whole_prompt", 0),
        ttft_budget_us=inputs.per_pool("ttft_budget_us", 2_000_000),
        admission=inputs.policy_ids("admission"),
        adm=admission_params(inputs),
        adm_pool=inputs.policy_reads("admission pool"),
        adm_reason=inputs.policy_reads("admission reason"),
        bucket=np.repeat(inputs.per_pool("bucket_tokens", 0) * 1_000_000, inputs.num_tenants).astype(i64),
        bucket_at=full(npool * inputs.num_tenants, 0),
        swap=inputs.per_pool("swap", 0),
        swap_us_per_block=inputs.per_pool("swap_us_per_block", 0),
        pd=np.array([inputs.pd_prefill_pool, inputs.pd_decode_pool, inputs.pd_local_threshold,
                     inputs.pd_base_us, inputs.pd_layers, 0], dtype=i64),
        pd_us_per_token=np.array([inputs.pd_us_per_token], dtype=np.float64),
        xh_t=full(max(n, 1), 0),
        xh_q=full(max(n, 1), 0),
        lora_slots=inputs.per_pool("lora_slots", 0),
        lora_load_us=inputs.per_pool("lora_load_us", 0),
        spec_k=inputs.per_pool("spec_k", 0),
        spec_credit=inputs.spec_credits,
        hold=inputs.per_pool("hold", 0),
        held_head=full(npool, -1),
        held_tail=full(npool, -1),
        nheld=full(npool, 0),
        async_sched=inputs.per_pool("async_scheduling", 0),
        cl=np.array([int(inputs.closed_loop), 0], dtype=i64),
        rl_t=full(max(n, 1), 0),
        rl_q=full(max(n, 1), 0),
        lazy=lazy_pools(inputs, lazy),
        ll_off=np.concatenate(([0], np.cumsum(2 * _leaves(inputs.pool_replicas))[:-1])).astype(i64),
        ll_leaves=_leaves(inputs.pool_replicas),
        nactive=full(npool, 0),
        start_due=full(npool, NO_EVENT),
        least=full(npool, -1),
        **user_calls(inputs),
    )


def user_calls(inputs: EngineInputs) -> dict[str, UserCall]:
    """The engine's UserCall of each family (policies/_userview.py): each pool's compiled user
    policy (address 0: none), its parameters and state, and scratch for the views. The same
    dtypes and ranks with or without user policies, so the kernel compiles once for both."""
    i64 = np.int64
    npool = len(inputs.pool_replicas)
    table = inputs.user
    err = np.zeros(ERR_WIDTH, i64)  # one for every family: advance_nb checks it
    req = np.zeros(REQUEST_WIDTH, i64)
    rows = {"router": (int(max(1, inputs.pool_replicas.max(initial=1))), REPLICA_WIDTH), "queue order": (1, 1),
            "preemption victim": (int(max(1, inputs.pool_max_num_seqs.max(initial=1))), REQUEST_WIDTH),
            "admission": (1, POOL_WIDTH)}
    out = {}
    for field, family in (("u_router", "router"), ("u_queue", "queue order"), ("u_victim", "preemption victim"),
                          ("u_admission", "admission")):
        if table is None:
            addr, params, state = np.zeros(npool, i64), np.zeros((npool, 1)), np.zeros((npool, 1), i64)
        else:
            addr, params, state = table.addresses(family), table.params(family), table.state(family)
        out[field] = UserCall(addr, params, state, np.zeros(rows[family], i64), req, err, inputs.pool_first_replica)
    return out


def make_events(inputs: EngineInputs, event_capacity: int) -> Events:
    """The event buffer, with room for one step's events past the point where the kernel stops."""
    i64 = np.int64
    margin = 2 * int(inputs.pool_max_num_seqs.max()) + 8
    cap = max(event_capacity, 4 * margin)
    return Events(
        t=np.zeros(cap, i64),
        kind=np.zeros(cap, i64),
        replica=np.zeros(cap, i64),
        request=np.zeros(cap, i64),
        value=np.zeros(cap, i64),
        clock=np.array([0, 0, int(inputs.detailed_events), margin, -1, -1, 0], dtype=i64),
    )


_NEVER = np.iinfo(np.int64).max
_NO_EVENTS = {k: np.zeros(0, np.int64) for k in ("t_us", "kind", "replica", "request", "value")}
for _empty in _NO_EVENTS.values():
    _empty.flags.writeable = False


class NumbaEngine:
    """The `Engine` over the numba kernels."""

    def __init__(self, inputs: EngineInputs, event_capacity: int = 1 << 16, lazy: bool = True,
                 variant: str | None = None, window: int | None = DEFAULT_CAPACITY):
        """`lazy=False` advances every running request at every step (the engine before
        engine/lazy.py, kept for the differential test and the benchmarks): same outputs.
        `variant`: the kernels' (engine/variants.py); by default the least that has what the
        inputs use. `window`: request slots to start with (engine/window.py; they grow while
        in-flight requests fill them), None for one per request of the trace: same outputs."""
        self.inputs = inputs
        self.variant = variant or variant_of(features(inputs))
        layout = kv_layout(inputs)
        self.window = Window(inputs, window)
        self.rq = self.window.requests()
        self.window.fill(self.rq)
        self.blocks = make_blocks(layout)
        self.reps = make_replicas(inputs, layout)
        self.pools = make_pools(inputs, lazy, self.window.capacity)
        self.ev = make_events(inputs, event_capacity)
        self.tbs = np.int64(max(1, inputs.trace_block_tokens))
        # on a cold cache, a helper process starts compiling kernels now (engine/prebuild.py)
        prebuild.start(self.variant, (self.rq, self.blocks, self.reps, self.pools, self.ev, self.th, self.tbs))
        for r in np.flatnonzero(self.reps.state == R_ACTIVE):
            reset_replica_nb(self.blocks, self.reps, r)
        self._chunks: list[dict[str, np.ndarray]] = []
        self._entries: dict = {}
        self.now = 0
        # No replica starts before start_replica (routing may promote one first: then this is early)
        self._next_active_at = _NEVER

    @property
    def th(self) -> np.ndarray:
        """The prefix hashes the slots index (engine/window.py: the trace's, or the window's)."""
        return self.window.hashes

    def advance(self, until_us: int) -> None:
        self.now = until_us
        self._load(until_us)
        while True:
            status = self._kernel(advance_nb, self.rq, self.blocks, self.reps, self.pools, self.ev, self.th,
                                  self.tbs, np.int64(until_us))
            if status == STATUS_EVENTS_FULL:
                self._drain()
                continue
            if status == STATUS_STUCK:
                r, t = int(self.ev.clock[4]), int(self.ev.clock[5])
                raise InvariantViolation(f"replica {r} has {int(self.reps.nwait[r])} waiting requests but cannot "
                                         f"schedule any at t_us={t}")
            if status == STATUS_UNKNOWN_POLICY:
                self._check_policies()
            return

    def _entry(self, kernel, args):
        """The kernel's compiled entry, in the engine's variant (engine/variants.py), for these
        arguments' types, found once per engine: the state tuples never change type, and the
        dispatcher typing their ~200 arrays at every call cost ~30 us an advance (a third of the
        bundled trace's replay core at 1 s ticks), the entry itself ~4 us. `Dispatcher.compile` loads the kernel from numba's cache as a first
        call would."""
        entry = self._entries.get(kernel)
        if entry is None:
            own = specialise(kernel, self.variant)
            sig = tuple(own.typeof_pyval(a) for a in args)
            entry = self._entries[kernel] = self._enter(own, sig, args) if kernel is advance_nb else own.compile(sig)
        return entry

    def _enter(self, own, sig, args):
        """advance_nb's entry: loop.enter_nb, which calls the loop at its native address. On a
        cold cache, the loop's first compile has its callees, and enter_nb, compiled ahead on
        two cores (engine/prebuild.py)."""
        with prebuild.compile_ahead(self.variant, args):
            own.compile(sig)
        compiled = own.overloads[sig]
        address = compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name)
        return functools.partial(enter_nb.compile((types.int64, *sig)), np.int64(address))

    def _kernel(self, kernel, *args):
        """Enter a kernel that may call a user's policy: an exception it raises is the policy's
        (the engine's own kernels raise none), named by the last call its link recorded; an
        invalid choice it recorded ends the run the same way. Without user policies, a plain call."""
        entry = self._entry(kernel, args)
        if self.inputs.user is None:
            return entry(*args)
        err = self.pools.u_router.err
        try:
            result = entry(*args)
        except Exception as exc:  # noqa: BLE001 - the user's numba code raised
            raise self.inputs.user.error(int(err[E_FAMILY]), int(err[E_POOL]),
                                         f"raised {type(exc).__name__}: {exc}") from None
        if err[E_STATUS] != 0:
            raise self.inputs.user.error(int(err[E_FAMILY]), int(err[E_POOL]),
                                         choice_message(int(err[E_FAMILY]), int(err[E_VALUE]), int(err[E_LIMIT])))
        return result

    def _check_policies(self) -> None:
        """The kernel stopped at a pool whose policy id has no kernel: say which, never run a default."""
        family = int(self.ev.clock[6])
        if family != 0:
            p = int(self.ev.clock[4])
            name, ids = {UNKNOWN_ROUTER: ("router", self.pools.router),
                         UNKNOWN_VICTIM: ("preemption victim", self.pools.victim),
                         UNKNOWN_QUEUE: ("queue order", self.pools.queue),
                         UNKNOWN_ADMISSION: ("admission", self.pools.admission)}[family]
            raise UnknownPolicyId(f"pool {p}: {name} id {int(ids[p])} has no policy in policies.registry "
                                  f"(stopped at t_us={int(self.ev.clock[5])})")

    def _load(self, until_us: int) -> None:
        """Before advancing to until_us: while requests are left to load, the oldest ended
        requests leave once they are half the window; then requests are loaded (a step at a
        time, engine/window.py `Window.step`) past the first that the arrival walk stops at
        (where no slot is free, a slide of at least a quarter of the window makes room for them,
        else the window grows)."""
        w = self.window
        if w.end < w.total and w.ended_prefix(self.rq) >= w.capacity // 2:
            self._slide()
        while not w.walk_stops(self.rq, int(self.ev.clock[0]), until_us):
            if w.fill(self.rq):
                continue
            if w.ended_prefix(self.rq) < max(1, w.capacity // 4) or not self._slide():
                self.rq, self.pools = w.grow(self.rq, self.pools)

    def _slide(self) -> bool:
        k = self.window.ended
        if k == 0:
            return False
        self._drain()  # the buffer's request ids are slots of the window as it is
        self.window.slide(self.rq, self.reps, self.pools, self.ev.clock, k)
        self.window.fill(self.rq)
        return True

    def _drain(self) -> None:
        n = int(self.ev.clock[1])
        if n:
            request = self.ev.request[:n].copy()
            request[request >= 0] += self.window.base
            self._chunks.append(
                {
                    "t_us": self.ev.t[:n].copy(),
                    "kind": self.ev.kind[:n].copy(),
                    "replica": self.ev.replica[:n].copy(),
                    "request": request,
                    "value": self.ev.value[:n].copy(),
                }
            )
        self.ev.clock[1] = 0

    @property
    def done(self) -> bool:
        n = self.inputs.num_requests
        ended = int(self.reps.counters[:, C_FINISHED].sum()) + int(self.pools.rejected.sum())
        return bool(self.window.base + int(self.ev.clock[0]) == n and ended == n)

    def snapshot(self, t_us: int) -> np.ndarray:
        out = np.empty((len(self.reps.pool), len(SNAPSHOT_COLUMNS)), np.int64)
        self._entry(snapshot_nb, (self.reps, np.int64(t_us), out))(self.reps, np.int64(t_us), out)
        return out

    def replica_state(self) -> dict[str, np.ndarray]:
        return dict(zip(SNAPSHOT_COLUMNS, self.snapshot(self.now).T))

    def pool_counters(self) -> dict[str, np.ndarray]:
        return {"arrivals": self.pools.arrivals.copy(), "rejected": self.pools.rejected.copy(),
                "held": self.pools.nheld.copy(), "arrived_prompt_tokens": self.pools.arrived_tokens[:, 0].copy(),
                "arrived_output_tokens": self.pools.arrived_tokens[:, 1].copy()}

    def take_events(self) -> dict[str, np.ndarray]:
        self._drain()
        chunks, self._chunks = self._chunks, []
        if not chunks:  # most ticks': one read-only empty array per column, not five new ones
            return dict(_NO_EVENTS)
        if len(chunks) == 1:
            return chunks[0]
        return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}

    def replica_lifecycle(self) -> tuple[np.ndarray, np.ndarray]:
        # Promote replicas whose loading finished by now, as routing would; looked for only once
        # one may be due (most ticks' control plane calls this with none starting).
        if self.now >= self._next_active_at:
            starting = self.reps.state == R_STARTING
            due = starting & (self.reps.active_at <= self.now)
            self.reps.state[due] = R_ACTIVE
            later = self.reps.active_at[starting & ~due]
            self._next_active_at = int(later.min()) if len(later) else _NEVER
        return self.reps.state.copy(), self.reps.active_at.copy()

    def start_replica(self, r: int, active_at_us: int) -> None:
        if self.reps.state[r] != R_OFF:
            raise InvariantViolation(f"start_replica({r}): replica is {REPLICA_STATE_NAMES[self.reps.state[r]]}")
        reset_replica_nb(self.blocks, self.reps, r)
        self.reps.state[r] = R_STARTING
        self.reps.active_at[r] = active_at_us
        self._next_active_at = min(self._next_active_at, int(active_at_us))
        # The requests held at its pool now wait on it; each placement records at most one event,
        # so they go in batches that fit the event buffer.
        p = np.int64(self.reps.pool[r])
        left = int(self.pools.nheld[p])
        while left > 0:
            room = len(self.ev.t) - int(self.ev.clock[1])
            if room <= 0:
                self._drain()
                continue
            left -= int(self._kernel(release_held_nb, self.rq, self.blocks, self.reps, self.pools, self.ev,
                                     self.th, self.tbs, p, np.int64(self.now), np.int64(min(room, left))))
            self._check_policies()

    def drain_replica(self, r: int) -> None:
        state = self.reps.state[r]
        if (state == R_STARTING and self.reps.active_at[r] > self.now and self.reps.nwait[r] == 0
                and self.reps.incoming[r] == 0):
            self.reps.state[r] = R_OFF  # cancelled before it held anything
        elif state in (R_STARTING, R_ACTIVE):
            self.reps.state[r] = R_DRAINING

    def busy(self, r: int) -> bool:
        """Replica r is in the middle of a step."""
        return bool(self.reps.busy_until[r] >= 0)

    def idle(self, r: int) -> bool:
        reps = self.reps
        return bool(reps.nwait[r] == 0 and reps.nrun[r] == 0 and reps.busy_until[r] < 0
                    and reps.outgoing[r] == 0 and reps.incoming[r] == 0)

    def retire_replica(self, r: int) -> None:
        reps = self.reps
        if reps.state[r] != R_DRAINING or not self.idle(r):
            raise InvariantViolation(f"retire_replica({r}): replica still holds requests or is not draining")
        reps.state[r] = R_OFF

    def stream_rows(self, sink) -> None:
        """Hand every request's output columns to `sink(first_id, columns)` as requests leave
        the window (in id order), instead of keeping them for the whole trace; `flush_rows` at the
        end hands over the rest. `request_columns` then has nothing to give."""
        self.window.sink = sink

    def flush_rows(self) -> None:
        self._entry(sync_lazy_nb, (self.rq, self.reps))(self.rq, self.reps)
        self.window.flush_rows(self.rq)

    def request_columns(self) -> dict[str, np.ndarray]:
        """Every request's output columns, in id order (engine/window.py `columns_now`), lazy
        requests' computed/generated written as of now. The arrays are the engine's: a later
        advance writes on."""
        self._entry(sync_lazy_nb, (self.rq, self.reps))(self.rq, self.reps)
        return self.window.columns_now(self.rq)
