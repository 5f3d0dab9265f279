"""The cluster's tick loop: advance an engine to each tick, read its snapshot, run the control
plane, keep one row per pool. `simulate` (cluster.py) runs it over the whole fleet; a pool worker
(parallel.py) runs the same loop over its own pools' engine.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

import numpy as np

from replay.engine.common import SNAPSHOT_COLUMNS, Engine
from replay.fleet.control import FleetControl
from replay.fleet.ticks import check_drain, tick_arrays

EVENT_KEYS = ("t_us", "kind", "replica", "request", "value")
WAITING = SNAPSHOT_COLUMNS.index("waiting")


class TickLoop:
    """The rows and events of the ticks so far; `tick()` runs one more.

    `host_events`: also take the events the control plane made the engine record after the
    engine's own (requests held at a pool placed on a replica it started), one batch per tick,
    so that a pool worker can say where they fall among another worker's (parallel.py)."""

    def __init__(self, eng: Engine, control: FleetControl, replica_pool: np.ndarray, num_pools: int, tick_us: int,
                 last_arrival_us: int, limit_us: int, *, progress: Callable[[int, int], None] | None = None,
                 on_tick: Callable[..., None] | None = None, host_events: bool = False):
        self.eng, self.control = eng, control
        self.tick_us, self.last_arrival_us, self.limit_us = tick_us, last_arrival_us, limit_us
        self.num_pools = num_pools  # of the whole fleet: the drain bound counts its rows
        self.progress, self.on_tick = progress, on_tick
        # one-hot [replica, pool]: turns a per-replica snapshot into per-pool sums in one product
        membership = np.zeros((len(replica_pool), len(control.pools)), np.int64)
        membership[np.arange(len(replica_pool)), replica_pool] = 1
        self.membership_t = np.ascontiguousarray(membership.T)  # [pool, replica]
        self.snapshots: list[np.ndarray] = []
        self.pool_counts: list[np.ndarray] = []
        self.by_state: list[np.ndarray] = []
        self.billed: list[np.ndarray] = []
        self.events: list[dict[str, np.ndarray]] = []
        self.host: list[dict[str, np.ndarray]] | None = [] if host_events else None
        self.control_marks = [len(control.events.t_us)]  # control events logged by the start, then by each tick
        self.t = 0

    def tick(self) -> bool:
        """Advance one tick; True when the run may end here: every request done after the last
        arrival, or the drain allowance spent."""
        eng, control = self.eng, self.control
        self.billed.append(control.billed_gpus())  # what the interval (t, t + tick] costs
        self.t += self.tick_us
        t = self.t
        eng.advance(t)
        snap = eng.snapshot(t)
        sums = self.membership_t @ snap  # [pool, column]
        pc = eng.pool_counters()
        # Requests held at a pool (no replica to wait on yet) are waiting too: the pool's
        # `waiting` counts them, and `held` says how many of them are.
        self.snapshots.append(sums.copy())
        self.snapshots[-1][:, WAITING] += pc["held"]
        # np.stack(..., axis=1)'s rows, in a tenth of its time
        self.pool_counts.append(np.array([pc["arrivals"], pc["rejected"], pc["held"]]).T)
        self.events.append(eng.take_events())
        self.by_state.append(control.tick(t, eng, snap, pc, sums))
        self.control_marks.append(len(control.events.t_us))
        if self.host is not None:
            self.host.append(eng.take_events())
        if self.progress is not None:
            self.progress(t, self.last_arrival_us)  # past the last arrival: the fleet drains
        if self.on_tick is not None:
            self.on_tick(t_us=t, end_us=self.last_arrival_us, pools=self.snapshots[-1], counts=self.pool_counts[-1],
                         states=self.by_state[-1], gpus=self.billed[-1], events=self.events[-1],
                         control_events=control.events, request_columns=eng.request_columns)
        return (t >= self.last_arrival_us and eng.done) or t >= self.limit_us

    def run(self) -> None:
        """Tick until the run ends; a drain past the tick-row bound is a ConfigError.

        What exists when the ticks start (the trace, the engine's arrays, numba's and polars'
        objects) is frozen out of the garbage collector meanwhile: the few containers each tick
        makes trigger collections, and those of the oldest generation traversed all of it
        (gc_collect_main: ~3% of a million-request replay, perf)."""
        gc.freeze()
        try:
            while not self.tick():
                self.check_drain()
        finally:
            gc.unfreeze()

    def check_drain(self) -> None:
        check_drain(len(self.snapshots), self.num_pools, self.tick_us, self.last_arrival_us)

    def tick_arrays(self) -> dict[str, np.ndarray]:
        return tick_arrays(self.snapshots, self.pool_counts, self.by_state, self.billed, self.tick_us)

    def engine_events(self) -> dict[str, np.ndarray]:
        return concat_events(self.events)


def concat_events(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if not batches:
        return {k: np.zeros(0, np.int64) for k in EVENT_KEYS}
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
