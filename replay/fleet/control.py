"""The control plane between ticks: replica lifecycle, metrics scrapes and autoscaling decisions.

Each tick, after the engine has run up to t: replicas whose loading finished are logged active,
drained replicas that hold nothing are gone, and every autoscaled pool's policy sees a metrics
scrape (delayed by its scrape delay) and answers a replica count, which is applied by starting
replicas (pod start + weights / load bandwidth before they take requests) or draining them.
Cost accrues per GPU from a replica's start until it is gone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from policies.api import Decision, PoolMetrics, ReplicaModel, ScalingContext
from replay.engine.common import R_ACTIVE, R_DRAINING, R_OFF, R_STARTING, SNAPSHOT_COLUMNS, Engine
from replay.fleet.scrape import Scrape

COL = {name: k for k, name in enumerate(SNAPSHOT_COLUMNS)}

# decide(ctx) -> Decision; the guard wrapper and the policy's own state live inside the closure.
Decider = Callable[[ScalingContext], Decision]


@dataclass
class PoolControl:
    """One pool's replica slots and, when autoscaled, its policy."""

    index: int
    name: str
    slots: np.ndarray  # global replica ids of the pool
    gpus_per_replica: int
    startup_us: int  # pod start + weights / load bandwidth
    decide: Decider | None = None
    policy: str = "fixed"
    min_replicas: int = 0
    max_replicas: int = 0
    scrape_delay_ticks: int = 0
    slo_ttft_ms: float = 2000.0
    slo_tpot_ms: float = 100.0
    replica: ReplicaModel | None = None
    desired: int = 0
    scrapes: deque = field(default_factory=deque)


@dataclass
class ControlEvents:
    """Events the control plane records (the engine records its own)."""

    t_us: list[int] = field(default_factory=list)
    pool: list[str] = field(default_factory=list)
    replica: list[int | None] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    detail: list[str] = field(default_factory=list)

    def add(self, t_us: int, pool: str, replica: int | None, kind: str, detail: str) -> None:
        self.t_us.append(int(t_us))
        self.pool.append(pool)
        self.replica.append(None if replica is None else int(replica))
        self.kind.append(kind)
        self.detail.append(detail)


class FleetControl:
    """Lifecycle and autoscaling for every pool; called once per tick by the cluster loop."""

    def __init__(self, pools: list[PoolControl], num_replicas: int, tick_us: int,
                 arrivals: np.ndarray, prompt: np.ndarray, output: np.ndarray, pool_of: np.ndarray,
                 sees_arrivals_of: dict[int, int] | None = None, closed_loop: bool = False):
        self.pools = pools
        self.tick_us = tick_us
        self.events = ControlEvents()
        self.prev_state = np.full(num_replicas, R_OFF, np.int64)
        self.prev_snap: np.ndarray | None = None
        self.sums: np.ndarray | None = None  # the last tick's snapshot summed per pool
        self.prev_sums: np.ndarray | None = None  # prev_snap's
        # Per pool, its arrivals' times and prompt and output tokens, to report mean request sizes
        # (each tick sums its own; a pool that sees every request reads the inputs' arrays, not
        # copies: a day's would be 24 bytes a request). A prefill pool sees the arrivals of its
        # decode pool (`sees_arrivals_of`): every request arrives there, and a planner sizes both
        # pools from that one stream (as Dynamo's).
        self._seen = {}
        for pc in pools:
            mine = pool_of == (sees_arrivals_of or {}).get(pc.index, pc.index)
            every = bool(mine.all())
            self._seen[pc.index] = tuple(a if every else a[mine] for a in (arrivals, prompt, output))
        self.last_t = 0
        # Closed loop: a session's later turns arrive when the replay releases them, not at their
        # recorded times, so the arrivals an autoscaler reads come from the engine's own counters
        # (arrivals and their tokens per pool, cumulative), this tick's against the last one's.
        self.closed_loop = closed_loop
        self._sees = {pc.index: (sees_arrivals_of or {}).get(pc.index, pc.index) for pc in pools}
        self._arrived = self._arrived_prev = np.zeros((len(pools), 3), np.int64)
        # Replicas by (pool, state) in one bincount over `_code` (billed_gpus, after a tick's own calls).
        self._all = np.concatenate([pc.slots for pc in pools]) if pools else np.zeros(0, np.int64)
        self._code = np.repeat(np.arange(len(pools), dtype=np.int64) * 4, [len(pc.slots) for pc in pools])
        self._sizes = np.array([len(pc.slots) for pc in pools], np.int64)
        self._gpus = np.array([pc.gpus_per_replica for pc in pools], np.int64)
        self._scrape = Scrape([pc.slots for pc in pools], len(SNAPSHOT_COLUMNS))
        self._prev_counts: np.ndarray | None = None  # by_state(prev_state), when known
        # Per pool, where its arrivals up to `last_t` end (times[:cursor] <= last_t): each tick
        # searches only for its own end.
        self._cursor = {pc.index: (0, int(np.searchsorted(self._seen[pc.index][0], 0, side="right")))
                        for pc in pools}

    def start(self, eng: Engine) -> None:
        """Log the replicas that are active from t=0."""
        states, _ = eng.replica_lifecycle()
        for pc in self.pools:
            for r in pc.slots[states[pc.slots] == R_ACTIVE]:
                self.events.add(0, pc.name, r, "replica_active", "active from the start")
            pc.desired = int((states[pc.slots] != R_OFF).sum())
        self.prev_state = states

    def tick(self, t: int, eng: Engine, snap: np.ndarray, counters: dict[str, np.ndarray] | None = None
             ) -> np.ndarray:
        """Run the control plane at t; returns replicas by state per pool [pool, 4 states] as
        they were at t, before this tick's decisions (what a dashboard scraped at t shows).
        `counters`: the engine's pool counters at t (`Engine.pool_counters`; read here if not given):
        requests held at each pool on no replica yet, and in closed loop the arrivals so far.
        After it, `self.sums` is the snapshot summed over each pool's replicas [pool, column]."""
        c = eng.pool_counters() if counters is None else counters
        held = c["held"]
        if self.closed_loop:
            self._arrived = np.stack([c["arrivals"], c["arrived_prompt_tokens"], c["arrived_output_tokens"]], axis=1)
        states, active_at = eng.replica_lifecycle()
        # the pools' sums, replicas by state and scrape means, and the wake-ups, in one kernel call
        self.sums, counts, woke, draining = self._scrape.read(snap, self.prev_snap, states, self.prev_state,
                                                              t - self.last_t)
        if woke:
            woke_at = (states == R_ACTIVE) & (self.prev_state == R_STARTING)
            for pc in self.pools:
                for r in pc.slots[woke_at[pc.slots]]:
                    self.events.add(active_at[r], pc.name, r, "replica_active", "weights loaded; taking requests")
        logged = len(self.events.t_us)  # (logging a wake changes no state)
        for pc in self.pools:
            for r in pc.slots[states[pc.slots] == R_DRAINING] if draining else ():
                if eng.idle(int(r)):
                    eng.retire_replica(int(r))
                    self.events.add(t, pc.name, r, "replica_gone", "drained")
            if pc.decide is not None:
                self._scale(pc, t, eng, states, snap, int(held[pc.index]), counts[pc.index])
        # Only the control plane's own calls (each logged) change replica states after the first read.
        if len(self.events.t_us) == logged:
            self.prev_state, self._prev_counts = states, counts
        else:
            self.prev_state, self._prev_counts = eng.replica_lifecycle()[0], None
        self.prev_snap, self.prev_sums = snap, self.sums
        self._arrived_prev = self._arrived
        self.last_t = t
        return counts

    def by_state(self, states: np.ndarray) -> np.ndarray:
        """Replicas by state per pool [pool, 4 states]."""
        return np.bincount(self._code + states[self._all], minlength=4 * len(self.pools)).reshape(-1, 4)

    def billed_gpus(self) -> np.ndarray:
        """GPUs per pool that cost money from now until the next tick: every replica not OFF."""
        counts = self.by_state(self.prev_state) if self._prev_counts is None else self._prev_counts
        return (self._sizes - counts[:, R_OFF]) * self._gpus

    # --- autoscaling ---------------------------------------------------------------------------

    def _metrics(self, pc: PoolControl, t: int, held: int, counts: np.ndarray) -> PoolMetrics:
        """The pool's scrape at t. Sums come from the pool's rows (integers: exact in any order);
        the two means are over the pool's replicas in id order, as numpy's mean sums them (the
        same floats as gathering them by id: replay/fleet/scrape.py)."""
        dt_s = (t - self.last_t) / 1e6
        total = self.sums[pc.index]
        grew = total - self.prev_sums[pc.index] if self.prev_sums is not None else total
        n, prompt_tokens, output_tokens = self._arrivals_since_last(pc, t)
        return PoolMetrics(
            now_us=t,
            replicas_active=int(counts[R_ACTIVE]),
            replicas_starting=int(counts[R_STARTING]),
            replicas_draining=int(counts[R_DRAINING]),
            # Held requests count as waiting, as Knative's activator reports the requests it
            # buffers as the revision's concurrency and Ray Serve counts requests queued at its
            # handles in `total_num_requests`: they are what scales a pool up from zero.
            waiting=int(total[COL["waiting"]]) + held,
            running=int(total[COL["running"]]),
            kv_usage=float(self._scrape.means[2 * pc.index]),
            gpu_busy=float(self._scrape.means[2 * pc.index + 1]),
            arrivals_per_s=n / dt_s,
            prompt_tokens_per_s=float(grew[COL["prefill_tokens"]]) / dt_s,
            output_tokens_per_s=float(grew[COL["output_tokens"]]) / dt_s,
            mean_prompt_tokens=float(prompt_tokens) / n if n else 0.0,
            mean_output_tokens=float(output_tokens) / n if n else 0.0,
            held=held,
        )

    def _arrivals_since_last(self, pc: PoolControl, t: int) -> tuple[int, int, int]:
        """(requests, their prompt tokens, their output tokens) that arrived in (last tick, t]."""
        if self.closed_loop:
            seen = self._sees[pc.index]
            n, prompt, output = (int(x) for x in self._arrived[seen] - self._arrived_prev[seen])
            return n, prompt, output
        times, prompt, output = self._seen[pc.index]
        at, lo = self._cursor[pc.index]
        if at != self.last_t:  # not read at the last tick
            lo = int(times.searchsorted(self.last_t, side="right"))
        hi = int(times.searchsorted(t, side="right"))
        self._cursor[pc.index] = (t, hi)
        # (the ufunc's reduce and the method: numpy's Python wrappers of sum and searchsorted cost more)
        prompt_tokens = int(np.add.reduce(prompt[lo:hi], dtype=np.int64))
        return hi - lo, prompt_tokens, int(np.add.reduce(output[lo:hi], dtype=np.int64))

    def _scale(self, pc: PoolControl, t: int, eng: Engine, states: np.ndarray, snap: np.ndarray, held: int,
               counts: np.ndarray) -> None:
        pc.scrapes.append(self._metrics(pc, t, held, counts))
        while len(pc.scrapes) > pc.scrape_delay_ticks + 1:
            pc.scrapes.popleft()
        ctx = ScalingContext(
            now_us=t, pool=pc.name, metrics=pc.scrapes[0], desired=pc.desired,
            min_replicas=pc.min_replicas, max_replicas=pc.max_replicas,
            replica=pc.replica, slo_ttft_ms=pc.slo_ttft_ms, slo_tpot_ms=pc.slo_tpot_ms,
        )
        decision = pc.decide(ctx)
        target = int(min(max(decision.replicas, pc.min_replicas), pc.max_replicas))
        if target == pc.desired:
            return
        signals = ", ".join(f"{k}={_show(v)}" for k, v in decision.signals.items())
        self.events.add(t, pc.name, None, "scale_up" if target > pc.desired else "scale_down",
                        f"{pc.policy}: {pc.desired} -> {target} replicas ({signals})")
        states, _ = eng.replica_lifecycle()
        slots = pc.slots
        if target > pc.desired:
            free = slots[states[slots] == R_OFF]
            for r in free[: target - pc.desired]:
                eng.start_replica(int(r), t + pc.startup_us)
                self.events.add(t, pc.name, r, "replica_starting",
                                f"pod start + weights load: active at {(t + pc.startup_us) / 1e6:.1f} s")
        else:
            excess = pc.desired - target
            # Cancel replicas still starting first (newest first), then drain the least loaded.
            starting = slots[states[slots] == R_STARTING][::-1]
            active = slots[states[slots] == R_ACTIVE]
            load = snap[active, COL["waiting"]] + snap[active, COL["running"]]
            victims = list(starting[:excess]) + list(active[np.argsort(load, kind="stable")][: max(0, excess - len(starting))])
            for r in victims:
                eng.drain_replica(int(r))
                self.events.add(t, pc.name, r, "replica_draining", "scale-down: no new requests")
        pc.desired = target


def _show(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def make_decider(cfg, tick_us: int, key: str) -> tuple[Decider, int]:
    """The pool's policy behind the shared guards, as one `decide(ctx)` with its state inside;
    and the scrape delay in ticks. Parameters are validated against the policy's own dataclass."""
    from policies.autoscalers.guard import GuardParams
    from policies.registry import autoscaler_spec
    from common.configtools import from_dict

    spec = autoscaler_spec(cfg.policy, key=f"{key}.policy")
    params = spec.params_cls(cfg.params) if spec.raw_params else from_dict(spec.params_cls, cfg.params, f"{key}.params")
    guard = from_dict(GuardParams, cfg.guard, f"{key}.guard")
    state = spec.initial_state(params)

    def decide(ctx: ScalingContext) -> Decision:
        nonlocal state
        decision = spec.step(ctx, params, guard, state)
        state = decision.state
        return decision

    return decide, round(guard.scrape_delay_s * 1e6 / tick_us)
