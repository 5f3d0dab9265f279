"""The replica search of one candidate (GPU, TP, precision): the fewest replicas per pool that
meet the attainment, found by bisection, since attainment grows with replicas.

Pools that serve disjoint workloads share nothing, so all of them are searched in the same
replays: each replay tries every unresolved pool at its own probe and each pool reads its own
attainment from the summary. A candidate costs about 2 log2(n) replays whatever the pool count.

The search is a generator: it yields the replica counts to try and is sent back the summary
(None: that fleet could not run), so a driver can run many candidates' replays at once
(replay/plan/driver.py) and the search stays a plain loop here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator


@dataclasses.dataclass
class Bracket:
    """What is known of one pool: `lo` replicas fail (0 always does), `hi` meet (None: none seen yet)."""

    probe: int
    lo: int = 0
    hi: int | None = None
    failed_at_max: bool = False

    @property
    def resolved(self) -> bool:
        return self.failed_at_max or (self.hi is not None and self.hi - self.lo <= 1)

    def update(self, ok: bool, max_replicas: int) -> None:
        if ok:
            self.hi = self.probe
        else:
            self.lo = self.probe
        if self.hi is None:
            if self.probe >= max_replicas:
                self.failed_at_max = True
            else:
                self.probe = min(2 * self.probe, max_replicas)
        elif not self.resolved:
            self.probe = (self.lo + self.hi) // 2


def pool_meets(summary: dict, pool: str, attainment: float) -> bool:
    got = summary["pools"][pool]["slo_attainment"]
    return got is None or got >= attainment  # a pool the trace sends nothing meets any SLO


def search_replicas(
    start: dict[str, int], attainment: float, max_replicas: int,
) -> Generator[dict[str, int], dict | None, dict[str, int | None] | None]:
    """Yield {pool: replicas} fleets to replay, receive each one's summary; return each pool's
    fewest replicas that meet `attainment` (None: not even `max_replicas` do), or None when a
    fleet of the candidate could not run at all. A pool's answer n > 1 always comes with a replay
    of n - 1 that failed (bisection ends with lo = hi - 1)."""
    brackets = {pool: Bracket(probe=max(1, min(n, max_replicas))) for pool, n in start.items()}
    while not all(b.resolved for b in brackets.values()):
        # a resolved pool stays at its answer (or its largest try) while the others are probed
        fleet = {p: b.probe if not b.resolved else (b.hi or b.probe) for p, b in brackets.items()}
        summary = yield fleet
        if summary is None:
            return None
        for pool, b in brackets.items():
            if not b.resolved:
                b.update(pool_meets(summary, pool, attainment), max_replicas)
    return {p: None if b.failed_at_max else b.hi for p, b in brackets.items()}
