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

    def __init__(self, eng: Engine, control: FleetControl, num_pools: int, tick_us: int,
                 last_arrival_us: int, limit_us: int, *, progress: Callable[[int, int], None] | None = None,
                 on_tick: Callable[..., None] | None = None, host_events: bool = False):
        self.eng, self.control = eng, control
        self.tick_us, self.last_arrival_us, self.limit_us = tick_us, last_arrival_us, limit_us
        self.num_pools = num_pools  # of the whole fleet: the drain bound counts its rows
        self.progress, self.on_tick = progress, on_tick
        self.rows = TickRows(len(control.pools))
        self.events: list[dict[str, np.ndarray]] = []
        self.host: list[dict[str, np.ndarray]] | None = [] if host_events else None
        self.control_marks = [len(control.events.t_us)]  # control events logged by the start, then by each tick
        self.t = 0

    def tick(self) -> bool:
        """Advance one tick; True when the run may end here: every request done after the last
        arrival, or the drain allowance spent."""
        eng, control = self.eng, self.control
        gpus = control.billed_gpus()  # what the interval (t, t + tick] costs
        self.t += self.tick_us
        t = self.t
        eng.advance(t)
        snap = eng.snapshot(t)
        pc = eng.pool_counters()
        self.events.append(eng.take_events())
        states = control.tick(t, eng, snap, pc)
        self.rows.add(control.sums, pc, states, gpus)
        self.control_marks.append(len(control.events.t_us))
        if self.host is not None:
            self.host.append(eng.take_events())
        if self.progress is not None:
            self.progress(t, self.last_arrival_us)  # past the last arrival: the fleet drains
        if self.on_tick is not None:
            rows = self.rows
            self.on_tick(t_us=t, end_us=self.last_arrival_us, pools=rows.pools[-1].copy(),
                         counts=rows.counts[-1].copy(), states=states, gpus=gpus, events=self.events[-1],
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
        check_drain(self.rows.n, self.num_pools, self.tick_us, self.last_arrival_us)

    def tick_arrays(self) -> dict[str, np.ndarray]:
        rows = self.rows
        return tick_arrays(rows.pools, rows.counts, rows.states, rows.gpus, self.tick_us)

    def engine_events(self) -> dict[str, np.ndarray]:
        return concat_events(self.events)


class TickRows:
    """Each tick's rows per pool, in arrays that double when full (a day's 86,400 ticks kept as
    lists of small arrays cost an allocation or four each, and a stack at the end): `pools`
    [tick, pool, snapshot column] (the pool's sums; `waiting` counts the requests held at it,
    on no replica yet, too), `counts` [tick, pool, (arrivals, rejected, held)], `states` [tick,
    pool, replica state], `gpus` [tick, pool]: views of the ticks so far."""

    def __init__(self, num_pools: int, capacity: int = 1024):
        self.n = 0
        self._pools = np.zeros((capacity, num_pools, len(SNAPSHOT_COLUMNS)), np.int64)
        self._counts = np.zeros((capacity, num_pools, 3), np.int64)
        self._states = np.zeros((capacity, num_pools, 4), np.int64)
        self._gpus = np.zeros((capacity, num_pools), np.int64)

    def add(self, sums: np.ndarray, counters: dict[str, np.ndarray], states: np.ndarray, gpus: np.ndarray) -> None:
        if self.n == len(self._gpus):
            self._pools, self._counts, self._states, self._gpus = (
                np.concatenate((a, np.zeros_like(a))) for a in (self._pools, self._counts, self._states, self._gpus))
        k = self.n
        row = self._pools[k]
        row[...] = sums
        row[:, WAITING] += counters["held"]
        counts = self._counts[k]
        counts[:, 0], counts[:, 1], counts[:, 2] = counters["arrivals"], counters["rejected"], counters["held"]
        self._states[k] = states
        self._gpus[k] = gpus
        self.n = k + 1

    @property
    def pools(self) -> np.ndarray:
        return self._pools[: self.n]

    @property
    def counts(self) -> np.ndarray:
        return self._counts[: self.n]

    @property
    def states(self) -> np.ndarray:
        return self._states[: self.n]

    @property
    def gpus(self) -> np.ndarray:
        return self._gpus[: self.n]


def concat_events(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if not batches:
        return {k: np.zeros(0, np.int64) for k in EVENT_KEYS}
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
