"""The pool workers' rows merged into the run the whole fleet's engine makes (parallel.py says
why each merge reproduces it): tick columns side by side, request rows by index, the engine's
events by the loop's (time, kind, replica) key within each tick's batch, and the control
plane's events pool by pool within each tick's phases."""

from __future__ import annotations

from typing import Any

import numpy as np

from replay.engine.common import (EV_ARRIVE, EV_FINISH, EV_FIRST_TOKEN, EV_PREEMPT, EV_REJECT, EV_SCHEDULE,
                                  EV_SWAP_OUT, EVENT_NAMES, EngineInputs)
from replay.fleet.control import ControlEvents
from replay.fleet.parallel import Group
from replay.fleet.tickloop import EVENT_KEYS

# The loop item each logged event belongs to (engine/loop.py's kinds): 0 a step end, 2 an arrival,
# 3 a scheduling; -1 an event this module cannot place (the fleet then runs serially).
_ITEM = np.full(len(EVENT_NAMES), -1, np.int64)
_ITEM[[EV_FINISH, EV_FIRST_TOKEN]] = 0
_ITEM[[EV_ARRIVE, EV_REJECT]] = 2
_ITEM[[EV_SCHEDULE, EV_PREEMPT, EV_SWAP_OUT]] = 3

REPLICA_COLUMNS = ("replica", "prefill_replica")  # request columns that hold a replica id (-1: none)


def merge_ticks(groups: list[Group], results: list[dict], num_pools: int) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, first in results[0]["ticks"].items():
        column = np.empty((first.shape[0], num_pools), first.dtype)
        for group, result in zip(groups, results):
            column[:, group.pools] = result["ticks"][name]
        out[name] = column
    return out


def merge_requests(groups: list[Group], results: list[dict], num_requests: int) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, first in results[0]["requests"].items():
        column = np.empty(num_requests, first.dtype)
        for group, result in zip(groups, results):
            values = result["requests"][name]
            if name in REPLICA_COLUMNS:
                values = np.where(values >= 0, group.replicas[np.maximum(values, 0)], values)
            column[group.requests] = values
        out[name] = column
    return out


def _fleet_ids(group: Group, ev: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A group's events with the fleet's replica and request ids."""
    out = dict(ev)
    out["replica"] = np.where(ev["replica"] >= 0, group.replicas[np.maximum(ev["replica"], 0)], ev["replica"])
    out["request"] = group.requests[ev["request"]] if len(ev["request"]) else ev["request"]
    return out


def merge_events(groups: list[Group], results: list[dict], inputs: EngineInputs) -> dict[str, np.ndarray] | None:
    """The engine's events as the fleet's engine logs them, tick batch by tick batch: first what
    the control plane's tick before placed (held requests, pool by pool), then the tick's own
    events in the loop's item order; None when a group's own events are not in that order."""
    replica_pool = inputs.replica_pool
    parts, keys = [], []
    for group, result in zip(groups, results):
        ticks = len(result["event_batches"])
        ev = _fleet_ids(group, result["events"])
        batch = np.repeat(np.arange(ticks), result["event_batches"])
        item = _ITEM[ev["kind"]]
        if (item < 0).any():
            return None
        ident = np.where(item == 2, ev["request"], ev["replica"])
        key = np.stack([batch, np.ones_like(batch), ev["t_us"], item, ident])
        if not _ordered(key):
            return None
        parts.append(ev)
        keys.append(key)
        # The control plane's placements at tick k are at the head of batch k + 1; the last
        # tick's are never taken (the run ends there), as in cluster.simulate's loop.
        host = _fleet_ids(group, result["host"])
        hbatch = np.repeat(np.arange(1, ticks + 1), result["host_batches"])
        keep = hbatch < ticks
        host = {k: v[keep] for k, v in host.items()}
        hbatch = hbatch[keep]
        pool = np.where(host["replica"] >= 0, replica_pool[np.maximum(host["replica"], 0)],
                        inputs.pool[host["request"]] if len(host["request"]) else host["request"])
        zero = np.zeros_like(hbatch)
        parts.append(host)
        keys.append(np.stack([hbatch, zero, pool, zero, zero]))
    events = {k: np.concatenate([p[k] for p in parts]) for k in EVENT_KEYS}
    key = np.concatenate(keys, axis=1)
    # lexsort is stable: equal keys (one loop item, hence one group) keep the group's order
    order = np.lexsort(key[::-1])
    return {k: events[k][order] for k in EVENT_KEYS}


def _ordered(key: np.ndarray) -> bool:
    """Whether the columns of `key` are in lexicographic order."""
    if key.shape[1] < 2:
        return True
    a, b = key[:, :-1], key[:, 1:]
    diff = b != a
    first = np.argmax(diff, axis=0)  # the first row where two neighbours differ
    cols = np.arange(a.shape[1])
    same = ~diff.any(axis=0)
    return bool(np.all(same | (b[first, cols] > a[first, cols])))


def merge_control_events(groups: list[Group], results: list[dict], plans: list) -> ControlEvents:
    """The control plane's events in FleetControl's order: the start's pool by pool, then each
    tick's activations pool by pool, then its drains and decisions pool by pool."""
    index = {p.name: p.index for p in plans}
    columns: list[list[Any]] = [[], [], [], [], []]
    keys = []
    for group, result in zip(groups, results):
        t_us, pool, replica, kind, detail = result["control"]
        marks = result["control_marks"]
        tick = np.repeat(np.arange(len(marks)), np.diff(marks, prepend=0))
        phase = np.array([k != "replica_active" for k in kind], np.int64)
        phase[tick == 0] = 0  # the start logs activations only
        keys.append(np.stack([tick, phase, np.array([index[p] for p in pool], np.int64)]) if len(pool)
                    else np.zeros((3, 0), np.int64))
        fleet_replica = [None if r is None else int(group.replicas[r]) for r in replica]
        for column, values in zip(columns, (t_us, pool, fleet_replica, kind, detail)):
            column.extend(values)
    key = np.concatenate(keys, axis=1)
    order = np.lexsort(key[::-1]).tolist()
    out = ControlEvents()
    out.t_us, out.pool, out.replica, out.kind, out.detail = ([column[i] for i in order] for column in columns)
    return out
