"""Pools that share nothing, replayed in parallel: one engine per group of pools, each in a
process forked from this one, merged into the run the whole fleet's engine would have made.

Why the merged run is the serial run. The split fixes each request's pool before the replay
(split.split_requests; the tokeniser's in-order hand-off, serving.engine_arrivals, is applied
to the whole trace first), and with no prefill/decode split nothing in an engine reads another
pool: routers, queues, KV caches, admission buckets and the seeded xorshift streams are per pool
(each keeps the seed of its pool index, `seed * 1000 + index`), and the control plane's
scrapes, decisions and costs are per pool. A group's engine therefore makes, for its pools,
exactly the steps the fleet's engine makes, and the outputs only need merging:

- tick rows are per pool: the groups' columns side by side;
- request rows: scattered back by request index, replica ids back to the fleet's;
- the engine's events: the fleet's engine runs every event in (time, kind, replica) order
  (engine/loop.py; arrivals at equal times by request index), and every event it logs belongs
  to one such item: a finish or first token to a step end (kind 0) on its replica, an arrival
  or rejection to an arrival (kind 2) of its request, an admission or preemption to a replica's
  scheduling (kind 3). Within each tick's batch the groups' events are merged by that key. A
  group whose own events are not in key order (an engine that orders otherwise) is not merged:
  the fleet is replayed serially instead, and says why.
- requests held at a pool and placed when its autoscaler starts a replica are logged by the
  control plane's tick, pool by pool, at the head of the next tick's batch; the control plane's
  own events go pool by pool, activations first, as FleetControl.tick adds them.
- the run ends at the first tick at which every group has ended (each group stops at its own
  end, then runs on, idle but for its control plane, to the last group's).

Requests keep their order and replicas theirs within a group, so every tie the engine breaks by
index breaks the same way. One thing is renumbered: the hash of a block that is a request's own
(past the trace's prefix hashes) mixes in the request's index (kvblocks.block_key_nb), the
group's index here. Block hashes are only compared for equality, and a request's own blocks
match no other request's, so no output changes, unless two 64-bit hashes collide, which the
fleet's engine risks as much.

Processes, not threads: the kernels hold the GIL (and the control plane is Python). A fork
inherits the compiled kernels and the trace's arrays without copying them; the workers use no
polars. Anything that couples pools, or code that might (a user's policy may keep state across
pools), keeps the fleet in one engine: `serial_reason` says why.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import sys
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

import numpy as np

from replay.config import FleetConfig
from replay.engine.common import EngineInputs
from replay.fleet.control import FleetControl
from replay.fleet.tickloop import TickLoop, concat_events

UNMERGEABLE = "a pool group's events were not in the engine's (time, kind, replica) order, so they could not be merged"

# Requests per row of EngineInputs; every other array field is per pool ("pool_*") or the trace's
# prefix hashes (kept whole: hash_off indexes them).
REQUEST_FIELDS = ("arrival_us", "prompt_tokens", "output_tokens", "priority", "pool", "hash_off", "hash_len",
                  "tenant", "adapter", "next_turn", "turn_gap_us", "hash_tokens")
WHOLE_FIELDS = ("trace_hashes",)

# When it pays. A request costs the lazy numba engine about WORK_S of CPU (its arrival, admission,
# steps and end), plus about as much again for every TOKENS_PER_WORK output tokens (measured:
# 28,185 bundled conv + code requests, 0.7-0.9 s; 200,000 Poisson conv-length requests on 4 x 16
# replicas, 7.75 s; bench/bench_pools.py). Every tick costs each worker about TICK_S of Python
# (the snapshot and the control plane; 76 us for one pool, 89 us for two, measured on a tick-only
# run), so each worker past the first repeats the fleet's ticks; forking a worker and sending its
# rows back costs about WORKER_S. A fleet is split when the work taken off the busiest worker
# is worth at least PAYS_OFF times what the extra workers cost.
WORK_S = 30e-6
TOKENS_PER_WORK = 1000
TICK_S = 75e-6
WORKER_S = 0.02
PAYS_OFF = 2.0


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def auto_jobs() -> tuple[int, str | None]:
    """`run`'s default: the cores this process may use, less those the machine is busy with (the
    load average over a minute, this process counted in it), and why it is one when it is. A
    worker gets a core only if one is idle: Linux shares the CPUs between sessions, not between
    processes (sched_autogroup), so on a busy machine more workers only split this run's share."""
    cores = default_jobs()
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average here
        return cores, None
    free = int(cores - max(0.0, load - 1.0))
    if cores > 1 and free < 2:
        return 1, (f"the machine is busy: a load average of {load:.1f} on {cores} cores leaves no core for a "
                   "second worker (--jobs N to use N anyway)")
    return max(1, min(cores, free)), None


def serial_reason(cfg: FleetConfig, plans: list, inputs: EngineInputs, engine: str, jobs: int,
                  on_tick: Callable | None = None) -> str | None:
    """Why this fleet is replayed in one engine; None when its pools can go to `jobs` workers."""
    from replay.fleet.cluster import ENGINES

    if len(plans) < 2:
        return "one pool"
    if jobs <= 1:
        return "one job (--jobs 1, or one core)"
    if engine not in ENGINES:
        return f"unknown engine {engine!r}"
    if on_tick is not None:
        return "a live run (--tui) watches one engine tick by tick"
    if "fork" not in multiprocessing.get_all_start_methods() or sys.platform != "linux":
        return f"pool workers are forked processes, which {sys.platform} does not run safely"
    return coupling(cfg, plans, inputs) or _too_little_work(inputs, jobs, max(1, round(cfg.tick_s * 1e6)))


def coupling(cfg: FleetConfig, plans: list, inputs: EngineInputs) -> str | None:
    """What ties the pools together, if anything does."""
    from policies.registry import AUTOSCALERS

    if inputs.pd_prefill_pool >= 0 or cfg.split.policy == "prefill-decode":
        return "prefill/decode disaggregation: the decode pool sends its prefills to the prefill pool"
    if inputs.user is not None:
        family, key = next((f, inputs.user.keys[f][p]) for f, row in inputs.user.choices.items()
                           for p, c in enumerate(row) if c is not None)
        return f"{key} is a user-written {family} policy, whose code may keep state across pools"
    for plan in plans:
        scaler = plan.config.autoscaler
        if scaler is not None and scaler.policy not in AUTOSCALERS:
            return (f"pools[{plan.index}].autoscaler.policy is a user-written autoscaler ({scaler.policy}), whose "
                    "code may keep state across pools")
    if inputs.next_turn is not None:
        q = np.nonzero(inputs.next_turn >= 0)[0]
        across = q[inputs.pool[q] != inputs.pool[inputs.next_turn[q]]]
        if across.size:
            i = int(across[0])
            a, b = plans[int(inputs.pool[i])].name, plans[int(inputs.pool[inputs.next_turn[i]])].name
            return (f"closed loop: a session's turns go to more than one pool (request {i} to {a}, its next turn to "
                    f"{b}), so one pool's replay releases another's arrivals")
    return None


def pool_work(inputs: EngineInputs) -> np.ndarray:
    """Each pool's work, in request-equivalents (see WORK_S)."""
    npool = len(inputs.pool_replicas)
    requests = np.bincount(inputs.pool, minlength=npool).astype(np.float64)
    tokens = np.bincount(inputs.pool, weights=inputs.output_tokens, minlength=npool)
    return requests + tokens / TOKENS_PER_WORK


def pool_groups(inputs: EngineInputs, jobs: int) -> list[list[int]]:
    """The pools in at most `jobs` groups of about equal work (largest first, each to the lightest
    group); every group has work, each group's pools in fleet order."""
    work = pool_work(inputs)
    busy = [int(p) for p in np.argsort(-work, kind="stable") if work[p] > 0]
    groups: list[list[int]] = [[] for _ in range(max(1, min(jobs, len(busy))))]
    load = [0.0] * len(groups)
    for p in busy + [p for p in range(len(work)) if work[p] <= 0]:
        g = min(range(len(groups)), key=lambda k: (load[k], k))
        groups[g].append(p)
        load[g] += work[p]
    return sorted(sorted(g) for g in groups)


def _too_little_work(inputs: EngineInputs, jobs: int, tick_us: int) -> str | None:
    groups = pool_groups(inputs, jobs)
    if len(groups) < 2:
        return "fewer than two pools have requests"
    work = pool_work(inputs)
    loads = [float(work[g].sum()) for g in groups]
    saved_s = (sum(loads) - max(loads)) * WORK_S
    ticks = int(inputs.arrival_us[-1]) // tick_us + 1
    cost_s = (len(groups) - 1) * ticks * TICK_S + len(groups) * WORKER_S
    if saved_s < PAYS_OFF * cost_s:
        return (f"too little work to share: about {saved_s:.2f} s of it would move to other workers, which would "
                f"cost about {cost_s:.2f} s ({len(groups)} workers each running the {ticks:,} ticks)")
    return None


@dataclasses.dataclass(frozen=True)
class Group:
    """A group of pools as their own fleet: the engine's inputs, and where its requests and
    replicas are in the whole fleet's."""

    pools: np.ndarray  # fleet pool index of each of the group's pools
    inputs: EngineInputs
    requests: np.ndarray  # fleet request index of each of the group's requests
    replicas: np.ndarray  # fleet replica id of each of the group's replicas


def group_of(inputs: EngineInputs, pools: list[int]) -> Group:
    """The group's inputs: its requests (in fleet order) and pools, with their ids renumbered."""
    pools_a = np.asarray(pools, np.int64)
    local = np.full(len(inputs.pool_replicas), -1, np.int64)
    local[pools_a] = np.arange(len(pools_a))
    requests = np.nonzero(local[inputs.pool] >= 0)[0]
    first = inputs.pool_first_replica
    replicas = np.concatenate([np.arange(first[p], first[p] + inputs.pool_replicas[p]) for p in pools_a])
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(inputs):
        value = getattr(inputs, f.name)
        if not isinstance(value, np.ndarray) or f.name in WHOLE_FIELDS:
            continue
        if f.name in REQUEST_FIELDS:
            changes[f.name] = value[requests]
        elif f.name.startswith("pool_"):
            changes[f.name] = value[pools_a]
        else:  # a new field: say where it belongs before it is split wrongly
            raise TypeError(f"EngineInputs.{f.name}: not known to replay/fleet/parallel.py as per request or per pool")
    changes["pool"] = local[inputs.pool[requests]]
    if inputs.next_turn is not None:
        renumber = np.full(inputs.num_requests, -1, np.int64)
        renumber[requests] = np.arange(len(requests))
        nxt = inputs.next_turn[requests]
        changes["next_turn"] = np.where(nxt >= 0, renumber[np.maximum(nxt, 0)], -1)
    return Group(pools_a, dataclasses.replace(inputs, **changes), requests, replicas)


def group_control(control: FleetControl, group: Group) -> FleetControl:
    """The fleet's control plane for the group's pools alone (their policies' state with them)."""
    sub = group.inputs
    pools = []
    for i, p in enumerate(group.pools):
        pc = control.pools[int(p)]
        slots = np.arange(sub.pool_first_replica[i], sub.pool_first_replica[i] + sub.pool_replicas[i])
        pools.append(dataclasses.replace(pc, index=i, slots=slots))
    return FleetControl(pools, len(sub.replica_pool), control.tick_us, sub.arrival_us, sub.prompt_tokens,
                        sub.output_tokens, sub.pool, None, closed_loop=control.closed_loop)


@dataclasses.dataclass(frozen=True)
class _Run:
    """What every worker runs: the engine, the fleet's control plane and the run's bounds."""

    engine: str
    control: FleetControl
    num_pools: int
    tick_us: int
    last_arrival_us: int
    limit_us: int


def simulate_pools(inputs: EngineInputs, pool_index: np.ndarray, plans: list, cfg: FleetConfig, engine: str,
                   jobs: int, progress: Callable[[int, int], None] | None = None):
    """`cluster.simulate`'s RawRun, the pools replayed in up to `jobs` forked workers; None when
    the groups' events cannot be merged (the caller replays the fleet serially)."""
    from replay.fleet.cluster import RawRun, make_control
    from replay.fleet.poolmerge import merge_control_events, merge_events, merge_requests, merge_ticks

    tick_us = max(1, round(cfg.tick_s * 1e6))
    last_arrival = int(inputs.arrival_us[-1]) if inputs.num_requests else 0
    control = make_control(plans, inputs, cfg, tick_us)  # a policy's bad parameters fail here, as serially
    groups = [group_of(inputs, g) for g in pool_groups(inputs, jobs)]
    run = _Run(engine, control, len(plans), tick_us, last_arrival, last_arrival + round(cfg.max_drain_s * 1e6))
    from replay.engine.variants import at_least, features, variant_of

    with at_least(variant_of(features(inputs))):  # the fleet's kernels, warmed up: inherited by the forks
        results, end = _run_workers(groups, run, progress)
    events = merge_events(groups, results, inputs)
    if events is None:
        return None
    return RawRun(plans, pool_index, merge_ticks(groups, results, len(plans)), events,
                  merge_control_events(groups, results, plans), inputs.pool_replicas,
                  merge_requests(groups, results, inputs.num_requests), end, tick_us, workers=len(groups))


def _run_workers(groups: list[Group], run: _Run, progress) -> tuple[list[dict], int]:
    """Fork one worker per group; each runs to its own end and reports the tick; all then run
    to the last of those ticks and send their rows. (results in group order, the end tick)."""
    import warnings

    ctx = multiprocessing.get_context("fork")
    clock = ctx.RawArray("q", len(groups))  # each worker's simulated time, for the progress bar
    procs, conns = [], []
    try:
        for k, group in enumerate(groups):
            here, there = ctx.Pipe()
            proc = ctx.Process(target=_work, args=(there, clock, k, group, run), daemon=True,
                               name=f"llm-replay pools {','.join(map(str, group.pools))}")
            with warnings.catch_warnings():  # polars' warning on fork: the workers use no polars
                warnings.simplefilter("ignore")
                proc.start()
            there.close()
            procs.append(proc)
            conns.append(here)
        stops = _gather(conns, procs, groups, clock, progress, run.last_arrival_us)
        _raise_first(stops)
        end = max(t for _, t, _ in stops)
        for conn in conns:
            conn.send(end)
        done = _gather(conns, procs, groups, clock, progress, run.last_arrival_us)
        _raise_first(done)
        for proc in procs:  # each has sent its rows: let it exit on its own
            proc.join(timeout=10)
        return [payload for _, _, payload in done], end
    finally:
        for conn in conns:
            conn.close()
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join()


def _gather(conns, procs, groups, clock, progress, last_arrival_us: int) -> list[tuple[str, int, Any]]:
    """One message from every worker, calling `progress` with the slowest one's time meanwhile."""
    replies: list[Any] = [None] * len(conns)
    waiting = {conn: k for k, conn in enumerate(conns)}
    while waiting:
        for conn in wait(list(waiting), timeout=0.2):
            k = waiting.pop(conn)
            try:
                replies[k] = conn.recv()
            except EOFError:
                procs[k].join()
                raise RuntimeError(f"the worker replaying pools {groups[k].pools.tolist()} died (exit code "
                                   f"{procs[k].exitcode}): killed, or out of memory") from None
        if progress is not None:
            progress(min(clock), last_arrival_us)
    return replies


def _raise_first(replies: list[tuple[str, int, Any]]) -> None:
    """A worker's error, the one at the earliest tick (the serial run would have stopped there)."""
    errors = [(t, k, exc) for k, (what, t, exc) in enumerate(replies) if what == "error"]
    if errors:
        raise min(errors, key=lambda e: e[:2])[2]


def _work(conn, clock, k: int, group: Group, run: _Run) -> None:
    """A worker: the group's engine and control plane through the tick loop (see the module doc)."""
    loop = None
    try:
        from replay.fleet.cluster import make_engine

        eng = make_engine(run.engine, group.inputs)
        control = group_control(run.control, group)
        control.start(eng)

        def tell(t: int, _: int) -> None:
            clock[k] = t

        loop = TickLoop(eng, control, run.num_pools, run.tick_us, run.last_arrival_us,
                        run.limit_us, progress=tell, host_events=True)
        while not loop.tick():
            loop.check_drain()
        conn.send(("stopped", loop.t, None))
        end = conn.recv()
        while loop.t < end:
            loop.tick()
        conn.send(("done", loop.t, _rows(loop, eng)))
    except BaseException as exc:  # noqa: BLE001 - the parent raises it
        t = loop.t if loop is not None else 0
        try:
            conn.send(("error", t, exc))
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            conn.send(("error", t, RuntimeError(f"{type(exc).__name__}: {exc}")))
    finally:
        conn.close()


def _rows(loop: TickLoop, eng) -> dict[str, Any]:
    """Everything the merge needs of a worker's run."""
    ce = loop.control.events
    assert loop.host is not None
    return {
        "ticks": loop.tick_arrays(),
        "events": loop.engine_events(),
        "event_batches": np.array([len(b["t_us"]) for b in loop.events], np.int64),
        "host": concat_events(loop.host),
        "host_batches": np.array([len(b["t_us"]) for b in loop.host], np.int64),
        "control": (ce.t_us, ce.pool, ce.replica, ce.kind, ce.detail),
        "control_marks": np.array(loop.control_marks, np.int64),
        "requests": eng.request_columns(),
    }
