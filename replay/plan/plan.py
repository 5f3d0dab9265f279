"""`llm-replay plan`'s answer: the cheapest fleet that meets the attainment on the trace.

1. Every candidate (GPU, TP, precision) gets its replica search (replay/plan/driver.py), all
   pools at once.
2. Each candidate's answer is replayed as one fleet (most already were, during the search), which
   prices every pool on it.
3. Pools share nothing, so each pool takes its cheapest candidate; where pools pick different
   ones, that mixed fleet is replayed to check it, and the cheapest single-candidate fleet
   stands in should it miss.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
from collections.abc import Callable

from replay.config import FleetConfig
from replay.plan.driver import Outcome, Trial, replay_one, run_searches
from replay.plan.fleet import candidate_fleet, uniform
from replay.plan.search import pool_meets
from replay.plan.space import Candidate, PlanSpace


@dataclasses.dataclass(frozen=True)
class Fleet:
    """A priced fleet: each pool's candidate and replica count, and its replay's summary."""

    choice: dict[str, tuple[Candidate, int]]
    cfg: FleetConfig
    summary: dict

    @property
    def label(self) -> str:
        labels = {c.label for c, _ in self.choice.values()}
        return labels.pop() if len(labels) == 1 else "mixed"

    def meets(self, attainment: float) -> bool:
        return all(pool_meets(self.summary, p, attainment) for p in self.choice)


@dataclasses.dataclass(frozen=True)
class Plan:
    winner: Fleet | None  # None: nothing in the space meets the attainment
    ranked: list[Fleet]  # every candidate's own fleet that meets, cheapest first (winner's included)
    best_found: Fleet | None  # the highest attainment seen, when nothing meets
    outcomes: list[Outcome]
    trials: list[Trial]  # every replay, in the order they finished
    frontier: list[Trial]  # cost against attainment: no cheaper trial attains as much

    @property
    def replays(self) -> int:
        return len(self.trials)


def make_plan(base: FleetConfig, space: PlanSpace, pool: cf.Executor, engine: str,
              on_trial: Callable[[Trial], None] = lambda t: None) -> Plan:
    outcomes, trials = run_searches(base, space, pool, engine, on_trial)
    by_sha = {t.cfg.sha256(): t.summary for t in trials}

    def replayed(cfg: FleetConfig, cand: Candidate | None) -> dict:
        if (summary := by_sha.get(cfg.sha256())) is None:
            summary = by_sha[cfg.sha256()] = replay_one(pool, cfg, engine)
            trials.append(Trial(cand, cfg, summary))
            on_trial(trials[-1])
        return summary

    # each candidate's answer as one fleet; a pool no count served stays at the max tried
    answers: dict[Candidate, Fleet] = {}
    for out in outcomes:
        if out.replicas is None:
            continue
        counts = {p: n if n is not None else space.max_replicas for p, n in out.replicas.items()}
        cfg = uniform(base, out.candidate, counts)
        answers[out.candidate] = Fleet({p: (out.candidate, n) for p, n in counts.items()}, cfg,
                                       replayed(cfg, out.candidate))
    ranked = sorted((f for f in answers.values() if f.meets(space.attainment)), key=_cost_key)
    winner = _mixed(base, space, outcomes, answers, replayed) or (ranked[0] if ranked else None)
    if winner is not None and ranked and _cost_key(ranked[0]) < _cost_key(winner):
        winner = ranked[0]
    best = None if winner else max(answers.values(), key=lambda f: (f.summary["slo_attainment"] or 0,
                                                                     -f.summary["cost_usd"]), default=None)
    return Plan(winner, ranked, best, outcomes, trials, frontier(trials))


def _cost_key(fleet: Fleet) -> tuple:
    return fleet.summary["cost_usd"], fleet.cfg.sha256()


def _mixed(base, space, outcomes, answers, replayed) -> Fleet | None:
    """Each pool on its cheapest candidate, replayed; None when one pool has no answer, when
    every pool picked the same candidate (its own fleet is the answer) or when the mix misses."""
    choice: dict[str, tuple[Candidate, int]] = {}
    for name in (p.name for p in base.pools):
        options = [(answers[o.candidate].summary["pools"][name]["cost_usd"], i, o.candidate, o.replicas[name])
                   for i, o in enumerate(outcomes)
                   if o.candidate in answers and o.replicas.get(name) is not None]
        if not options:
            return None
        _, _, cand, n = min(options)
        choice[name] = (cand, n)
    if len({c for c, _ in choice.values()}) == 1:
        return None
    cfg = candidate_fleet(base, choice)
    fleet = Fleet(choice, cfg, replayed(cfg, None))
    return fleet if fleet.meets(space.attainment) else None


def frontier(trials: list[Trial]) -> list[Trial]:
    """The trials no cheaper trial beats on attainment (ties: the lower TTFT p99), cheapest first."""
    def key(t: Trial):
        return t.summary["cost_usd"], -(t.summary["slo_attainment"] or 0), t.summary["ttft_p99_ms"] or 0

    out: list[Trial] = []
    for trial in sorted(trials, key=key):
        if not out or (trial.summary["slo_attainment"] or 0) > (out[-1].summary["slo_attainment"] or 0):
            out.append(trial)
    return out
