"""Runs every candidate's replica search at once: each search yields the fleets it wants replayed
(replay/plan/search.py) and the driver keeps the worker processes busy with them, so 24
candidates of ~8 replays each fill every core instead of waiting on one bisection at a time.

The answer does not depend on the worker count: each search is sequential and every replay is
deterministic; a fleet already replayed (same config hash) is not replayed again.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import multiprocessing
import os
from collections.abc import Callable

from common.errors import ConfigError, UserError
from replay.config import FleetConfig
from replay.plan.fleet import start_replicas, uniform
from replay.plan.search import search_replicas
from replay.plan.space import Candidate, PlanSpace
from traces import LoadedTrace


@dataclasses.dataclass(frozen=True)
class Trial:
    """One replay the search made."""

    candidate: Candidate | None  # None: a fleet mixing candidates per pool
    cfg: FleetConfig
    summary: dict


@dataclasses.dataclass
class Outcome:
    """A candidate's answer: each pool's fewest replicas (None: not even the max meets), or why
    the candidate could not run at all."""

    candidate: Candidate
    replicas: dict[str, int | None] | None = None
    problem: str | None = None


# --- the replays, in worker processes ------------------------------------------------------

_worker_trace: LoadedTrace | None = None


def _init_worker(trace: LoadedTrace, plugins: list[str], engine: str) -> None:
    from policies.plugins import load_plugins
    from replay.run import warm_up

    set_worker_trace(trace)
    load_plugins(plugins)
    warm_up(engine)  # numba's cache on disk: compiled once, loaded by each worker


def set_worker_trace(trace: LoadedTrace) -> None:
    """The trace this process's replays run (a Ray task hands it over with each replay)."""
    global _worker_trace
    _worker_trace = trace


def _replay_summary(cfg: FleetConfig, engine: str) -> dict:
    from replay.fleet.cluster import plan_pools
    from replay.run import replay_trace

    assert _worker_trace is not None
    return replay_trace(_worker_trace, cfg, engine=engine, plans=plan_pools(cfg)).summary


class _Inline(cf.Executor):
    """One worker: the replays run in this process, one at a time, as they are submitted."""

    def submit(self, fn, /, *args, **kwargs):
        future: cf.Future = cf.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the driver like a worker's
            future.set_exception(exc)
        return future


def executor(trace: LoadedTrace, workers: int, plugins: list[str], engine: str, backend: str = "local",
             address: str | None = None) -> cf.Executor:
    if backend == "ray":  # tasks on a Ray cluster (replay/plan/ray_pool.py)
        from replay.plan.ray_pool import RayPool

        return RayPool(trace, plugins, engine, address, workers)
    if workers == 1:
        _init_worker(trace, plugins, engine)
        return _Inline()
    # spawn: a fresh interpreter per worker (no forked numba or thread state)
    return cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                  initializer=_init_worker, initargs=(trace, plugins, engine))


def default_workers(candidates: int) -> int:
    return max(1, min(len(os.sched_getaffinity(0)), candidates))


# --- the searches --------------------------------------------------------------------------


def _fleet_problem(cfg: FleetConfig) -> str | None:
    """Why a fleet cannot be built (a model that does not fit the GPU at that TP, ...), or None."""
    from replay.fleet.cluster import plan_pools

    try:
        plan_pools(cfg, "plan")
    except ConfigError as exc:
        return str(exc).removeprefix("plan: ")
    return None


def run_searches(base: FleetConfig, space: PlanSpace, pool: cf.Executor, engine: str,
                 on_trial: Callable[[Trial], None] = lambda t: None) -> tuple[list[Outcome], list[Trial]]:
    start = start_replicas(base)
    outcomes = {c: Outcome(c) for c in space.candidates}
    searches = {c: search_replicas(start, space.attainment, space.max_replicas) for c in space.candidates}
    trials: list[Trial] = []
    seen: dict[str, dict] = {}
    pending: dict[cf.Future, tuple[Candidate, FleetConfig]] = {}

    def advance(cand: Candidate, summary: dict | None) -> None:
        while True:
            try:
                fleet = searches[cand].send(summary)
            except StopIteration as done:
                outcomes[cand].replicas = done.value
                return
            cfg = uniform(base, cand, fleet)
            if (problem := _fleet_problem(cfg)) is not None:
                outcomes[cand].problem = problem
                searches[cand].close()
                return
            if (summary := seen.get(cfg.sha256())) is None:
                pending[pool.submit(_replay_summary, cfg, engine)] = (cand, cfg)
                return

    for cand in space.candidates:
        advance(cand, None)
    while pending:
        done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
        for future in done:
            cand, cfg = pending.pop(future)
            try:
                summary = future.result()
            except UserError as exc:  # a user policy that broke mid-run: that candidate stops
                outcomes[cand].problem = str(exc)
                searches[cand].close()
                continue
            seen[cfg.sha256()] = summary
            trial = Trial(cand, cfg, summary)
            trials.append(trial)
            on_trial(trial)
            advance(cand, summary)
    return list(outcomes.values()), trials


def replay_one(pool: cf.Executor, cfg: FleetConfig, engine: str) -> dict:
    return pool.submit(_replay_summary, cfg, engine).result()
