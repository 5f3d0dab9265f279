"""Live run directories: while a replay runs, `DIR/live/` holds the run so far (the same parquet
files and config.yaml as a finished run, plus status.json), each file replaced atomically at every
flush. The finished run then replaces DIR in one rename (replay/outputs.py), live/ included.

The dashboard follows DIR by reading live/status.json (`seq` changes at every flush). Frames are
computed by replay.metrics, the code that writes finished runs, so a live view is the final one
for every tick whose window has closed. Times are int64 microseconds of simulated time.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import polars as pl
import yaml

from replay.cluster import PoolPlan, RawRun, replica_slots, split_requests
from replay.config import FleetConfig
from replay.control import ControlEvents
from replay.engine_common import R_ACTIVE, R_DRAINING, R_STARTING, SNAPSHOT_COLUMNS
from replay.metrics import event_frame, request_frame, tick_frame

LIVE_DIR = "live"
STATUS_FILE = "status.json"
# A flush rewrites the whole run so far; waiting this many times its cost between flushes keeps
# the live overhead of a long replay near 1 / (1 + FLUSH_COST_FACTOR) of its wall time.
FLUSH_COST_FACTOR = 4.0


def live_dir(run_dir: Path) -> Path:
    return Path(run_dir) / LIVE_DIR


def write_atomic(path: Path, write) -> None:
    """`write(tmp_path)` then one rename, so a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


class LiveWriter:
    """The cluster loop's `on_tick` hook: keeps each tick's rows and, at most every
    `min_interval_s` of wall time (longer when flushing is slow), rewrites DIR/live/."""

    def __init__(self, run_dir: Path, trace: pl.DataFrame, cfg: FleetConfig, plans: list[PoolPlan],
                 config_source: str = "config", min_interval_s: float = 0.5,
                 cost_factor: float = FLUSH_COST_FACTOR):
        self.dir = live_dir(run_dir)
        self.trace = trace
        self.cfg = cfg
        self.plans = plans
        self.pool_index = split_requests(trace, cfg, plans, config_source)
        self.slots = np.array([replica_slots(p.config) for p in plans], np.int64)
        self.tick_us = max(1, round(cfg.tick_s * 1e6))
        self.min_interval_s = min_interval_s
        self.cost_factor = cost_factor
        self.seq = 0
        self.done_us = 0
        self.end_us = int(trace["arrival_us"].max() or 0) if trace.height else 0
        self._rows: dict[str, list] = {k: [] for k in ("pools", "counts", "states", "gpus", "events")}
        self._control: ControlEvents = ControlEvents()
        self._request_columns = None
        self._next_flush = 0.0
        self._started = time.monotonic()

    def start(self) -> None:
        """Create DIR/live/ with the config and a status saying the replay started."""
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.dir / "config.yaml",
                     lambda p: p.write_text(yaml.safe_dump(self.cfg.to_dict(), sort_keys=False)))
        self.status("running")

    def status(self, state: str, error: str | None = None) -> None:
        body = {"state": state, "seq": self.seq, "done_us": self.done_us, "end_us": self.end_us,
                "wall_s": round(time.monotonic() - self._started, 3)}
        if error is not None:
            body["error"] = error
        write_atomic(self.dir / STATUS_FILE, lambda p: p.write_text(json.dumps(body) + "\n"))

    def on_tick(self, *, t_us, end_us, pools, counts, states, gpus, events, control_events, request_columns,
                **_later) -> None:
        for key, value in (("pools", pools), ("counts", counts), ("states", states), ("gpus", gpus),
                           ("events", events)):
            self._rows[key].append(value)
        self.done_us, self.end_us = int(t_us), int(end_us)
        self._control = control_events
        self._request_columns = request_columns
        if time.monotonic() >= self._next_flush:
            self.flush()

    def raw_so_far(self) -> RawRun:
        """What `simulate` returns at its end, for the ticks seen so far (its assembly, repeated:
        tests/tui/test_live.py holds the two equal)."""
        rows = self._rows
        per_pool = np.stack(rows["pools"])  # [tick, pool, column]
        counts = np.stack(rows["counts"])
        states = np.stack(rows["states"])
        ticks = {name: per_pool[:, :, k] for k, name in enumerate(SNAPSHOT_COLUMNS)}
        ticks["arrivals"], ticks["rejected"] = counts[:, :, 0], counts[:, :, 1]
        ntick = len(rows["pools"])
        ticks["t_us"] = np.repeat((np.arange(1, ntick + 1) * self.tick_us)[:, None], len(self.plans), axis=1)
        ticks["replicas_loading"] = states[:, :, R_STARTING]
        ticks["replicas_active"] = states[:, :, R_ACTIVE]
        ticks["replicas_draining"] = states[:, :, R_DRAINING]
        ticks["gpus"] = np.stack(rows["gpus"])
        ev = {k: np.concatenate([e[k] for e in rows["events"]]) for k in rows["events"][0]}
        c = self._control
        control = ControlEvents(list(c.t_us), list(c.pool), list(c.replica), list(c.kind), list(c.detail))
        return RawRun(self.plans, self.pool_index, ticks, ev, control, self.slots, self._request_columns(),
                      self.done_us, self.tick_us)

    def flush(self) -> None:
        if not self._rows["pools"]:
            return
        began = time.monotonic()
        raw = self.raw_so_far()
        requests = request_frame(self.trace, raw, self.cfg)
        ticks = tick_frame(raw, requests, self.cfg)
        events = event_frame(raw)
        arrived = requests.filter(pl.col("arrival_us") <= self.done_us)
        for name, frame in (("ticks", ticks), ("events", events), ("requests", arrived)):
            write_atomic(self.dir / f"{name}.parquet", frame.write_parquet)
        self.seq += 1
        self.status("running")
        cost = time.monotonic() - began
        self._next_flush = time.monotonic() + max(self.min_interval_s, self.cost_factor * cost)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
