"""The reference engine's closed-loop sessions (the twin of engine/sessions.py): when a turn ends,
finished or rejected, its session's next turn joins the event heap at the end plus its gap."""

from __future__ import annotations

import heapq

from replay.engine.reference.state import ARRIVAL, Request


class SessionsMixin:
    """ReferenceEngine's release of a session's next turn."""

    def _release_next(self, req: Request, t: int) -> None:
        # A rejected turn continues its session as a finished one does: a chat client shows the
        # error, and its user sends the next message after thinking.
        s = int(self.next_turn[req.index])
        if s >= 0:
            turn = self.requests[s]
            turn.arrival_us = t + int(self.turn_gap[s])
            heapq.heappush(self.heap, (turn.arrival_us, ARRIVAL, s))
