"""The reference engine's event loop: a heap of (time, kind, who) events, popped in order up to a
time (the twin of engine/loop.py, with its snapshot and a replica's reset)."""

from __future__ import annotations

import heapq

import numpy as np

from replay.engine.common import COUNTERS, R_ACTIVE, R_DRAINING, R_STARTING, SNAPSHOT_COLUMNS
from replay.engine.reference.kvblocks import BlockPool
from replay.engine.reference.state import ARRIVAL, REFRESH, STEP_END, TRANSFER_DONE, Replica
from replay.engine.reference.user import user_code


class LoopMixin:
    """ReferenceEngine's event loop, its snapshot of the replicas, and a replica's reset."""

    def advance(self, until_us: int) -> None:
        self.now = until_us
        self._check_policy_ids()
        with user_code(self.inp):
            self._advance(until_us)

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

    def _reset_replica(self, rep: Replica) -> None:
        """A new pod: empty KV cache and queues; the cumulative counters carry on."""
        rep.kv = BlockPool(rep.kv.num_blocks)
        rep.waiting.clear()
        rep.running = []
        rep.pending.clear()
        rep.reserved = rep.outgoing = rep.incoming = 0
        self._empty_lora_slots(rep)
        rep.busy_until = -1
