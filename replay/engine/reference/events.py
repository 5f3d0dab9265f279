"""The reference engine's event heap: wake-ups to schedule, and the events it records (the twin
of engine/events.py)."""

from __future__ import annotations

import heapq

from replay.engine.reference.state import WAKE, Replica


class EventsMixin:
    """ReferenceEngine's methods that queue a wake-up or record an event."""

    def _wake(self, rep: Replica, t: int) -> None:
        if not self.wake_pending[rep.index]:
            self.wake_pending[rep.index] = True
            heapq.heappush(self.heap, (t, WAKE, rep.index))

    def _record(self, t, kind, replica, request, value) -> None:
        self.events.append((t, kind, replica, request, value))

    def _wake_idle(self, rep: Replica, t: int) -> None:
        """An idle replica that was given work schedules at t (a starting one once it is ready)."""
        if rep.busy_until < 0:
            self._wake(rep, max(t, rep.active_at))
