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

    def start(self, eng: Engine) -> None:
        """Log the replicas that are active from t=0."""
        states, _ = eng.replica_lifecycle()
        for pc in self.pools:
            for r in pc.slots[states[pc.slots] == R_ACTIVE]:
                self.events.add(0, pc.name, r, "replica_active", "active from the start")
            pc.desired = int((states[pc.slots] != R_OFF).sum())
        self.prev_state = states

    def tick(self, t: int, eng: Engine, snap: np.ndarray, counters: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """Run the control plane at t; returns replicas by state per pool [pool, 4 states] as
        they were at t, before this tick's decisions (what a dashboard scraped at t shows).
        `counters`: the engine's pool counters at t (`Engine.pool_counters`; read here if not given):
        requests held at each pool on no replica yet, and in closed loop the arrivals so far."""
        c = eng.pool_counters() if counters is None else counters
        held = c["held"]
        if self.closed_loop:
            self._arrived = np.stack([c["arrivals"], c["arrived_prompt_tokens"], c["arrived_output_tokens"]], axis=1)
        states, active_at = eng.replica_lifecycle()
        for pc in self.pools:
            for r in pc.slots[(states[pc.slots] == R_ACTIVE) & (self.prev_state[pc.slots] == R_STARTING)]:
                self.events.add(active_at[r], pc.name, r, "replica_active", "weights loaded; taking requests")
        counts = np.zeros((len(self.pools), 4), np.int64)
        for pc in self.pools:
            counts[pc.index] = np.bincount(states[pc.slots], minlength=4)[:4]
        for pc in self.pools:
            draining = pc.slots[states[pc.slots] == R_DRAINING]
            for r in draining:
                if eng.idle(int(r)):
                    eng.retire_replica(int(r))
                    self.events.add(t, pc.name, r, "replica_gone", "drained")
            if pc.decide is not None:
                self._scale(pc, t, eng, states, snap, int(held[pc.index]))
        self.prev_state, _ = eng.replica_lifecycle()
        self.prev_snap = snap
        self._arrived_prev = self._arrived
        self.last_t = t
        return counts

    def billed_gpus(self) -> np.ndarray:
        """GPUs per pool that cost money from now until the next tick: every replica not OFF."""
        return np.array([int((self.prev_state[pc.slots] != R_OFF).sum()) * pc.gpus_per_replica for pc in self.pools])

    # --- autoscaling ---------------------------------------------------------------------------

    def _metrics(self, pc: PoolControl, t: int, states: np.ndarray, snap: np.ndarray, held: int = 0) -> PoolMetrics:
        slots = pc.slots
        active = slots[states[slots] == R_ACTIVE]
        serving = slots[(states[slots] == R_ACTIVE) | (states[slots] == R_DRAINING)]
        prev = self.prev_snap if self.prev_snap is not None else np.zeros_like(snap)
        dt_s = (t - self.last_t) / 1e6

        def rate(col: str) -> float:
            return float((snap[slots, COL[col]] - prev[slots, COL[col]]).sum()) / dt_s

        kv = snap[active, COL["kv_used_blocks"]] / np.maximum(snap[active, COL["kv_total_blocks"]], 1)
        busy = (snap[serving, COL["busy_us"]] - prev[serving, COL["busy_us"]]) / (t - self.last_t)
        n, prompt_tokens, output_tokens = self._arrivals_since_last(pc, t)
        return PoolMetrics(
            now_us=t,
            replicas_active=len(active),
            replicas_starting=int((states[slots] == R_STARTING).sum()),
            replicas_draining=int((states[slots] == R_DRAINING).sum()),
            # Held requests count as waiting, as Knative's activator reports the requests it
            # buffers as the revision's concurrency and Ray Serve counts requests queued at its
            # handles in `total_num_requests`: they are what scales a pool up from zero.
            waiting=int(snap[slots, COL["waiting"]].sum()) + held,
            running=int(snap[slots, COL["running"]].sum()),
            kv_usage=float(kv.mean()) if len(kv) else 0.0,
            gpu_busy=float(np.clip(busy, 0.0, 1.0).mean()) if len(busy) else 0.0,
            arrivals_per_s=n / dt_s,
            prompt_tokens_per_s=rate("prefill_tokens"),
            output_tokens_per_s=rate("output_tokens"),
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
        lo, hi = np.searchsorted(times, [self.last_t, t], side="right")
        return int(hi - lo), int(prompt[lo:hi].sum(dtype=np.int64)), int(output[lo:hi].sum(dtype=np.int64))

    def _scale(self, pc: PoolControl, t: int, eng: Engine, states: np.ndarray, snap: np.ndarray, held: int) -> None:
        pc.scrapes.append(self._metrics(pc, t, states, snap, held))
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
