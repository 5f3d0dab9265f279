"""Live run directories: while a replay runs, `DIR/live/` holds the run so far as immutable
chunks, so a reader only ever reads what is new. The finished run then replaces DIR in one rename
(replay/outputs/write.py), live/ included.

    live/config.yaml            the resolved config (written first)
    live/status.json            {"state", "seq", "done_us", "end_us", "pid", "pid_start", ...}; seq =
                                chunks written; pid, pid_start: the writer (replay.outputs.rundir), so a
                                reader tells a killed writer from a slow one
    live/chunk-000001/          one per flush, renamed into place whole, never changed again:
        ticks.parquet           tick rows of the ticks (previous flush's done_us, done_us]
        events.parquet          events with t_us in that interval
        requests.parquet        requests that ended (finished, or rejected) by done_us, each once
        firsts.parquet          request_id, pool, first_token_us, ttft_us of the first tokens
                                seen since the previous flush, each request once
    live/inflight-000001.parquet  requests arrived by done_us and not in any chunk's requests
                                (their state at done_us); the newest two are kept

Tick rows are final once written: every window of replay.fleet.metrics looks back only, and a tick's
requests (first tokens, ends) are known when the replay has reached it. The concatenated chunks
are the finished run's rows (tests/tui/test_live.py). Times are int64 microseconds.
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

from replay.fleet.cluster import PoolPlan, RawRun, replica_slots
from replay.fleet.split import split_requests
from replay.fleet.ticks import tick_arrays
from replay.config import FleetConfig
from replay.fleet.control import ControlEvents
from replay.fleet.metrics import event_frame, request_frame, tick_frame
from replay.outputs.rundir import writer_tag
from replay.outputs.schema import LIVE_DIR, SCHEMA_METADATA, STATUS_FILE, chunk_name, inflight_name

INFLIGHT_KEPT = 2
# A flush recomputes the run so far (it writes only what is new); waiting this many times its
# cost between flushes keeps the live overhead of a long replay near 1 / (1 + FLUSH_COST_FACTOR).
FLUSH_COST_FACTOR = 4.0


def live_dir(run_dir: Path) -> Path:
    return Path(run_dir) / LIVE_DIR


def write_atomic(path: Path, write) -> None:
    """`write(tmp_path)` then one rename, so a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def write_chunk(live: Path, seq: int, ticks: pl.DataFrame, events: pl.DataFrame, ended: pl.DataFrame,
                firsts: pl.DataFrame, inflight: pl.DataFrame) -> None:
    """Chunk `seq` (renamed into place whole), then its in-flight file; the caller then writes the
    status that makes them visible and drops older in-flight files."""
    chunk = live / chunk_name(seq)
    tmp = live / f".{chunk.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    meta = SCHEMA_METADATA  # the dashboard refuses a chunk of a schema it does not know, as a finished run's
    ticks.write_parquet(tmp / "ticks.parquet", metadata=meta)
    events.write_parquet(tmp / "events.parquet", metadata=meta)
    ended.write_parquet(tmp / "requests.parquet", metadata=meta)
    firsts.sort("first_token_us", "request_id").write_parquet(tmp / "firsts.parquet", metadata=meta)
    os.replace(tmp, chunk)
    write_atomic(live / inflight_name(seq), lambda path: inflight.write_parquet(path, metadata=meta))


def drop_old_inflight(live: Path, seq: int) -> None:
    """Keep the newest INFLIGHT_KEPT in-flight files: a reader of an older status reads on."""
    for old in range(seq - INFLIGHT_KEPT, 0, -1):
        path = live / inflight_name(old)
        if not path.exists():
            break
        path.unlink()


def ended_us() -> pl.Expr:
    """When a request left the system: its finish, or its arrival for a rejection (replay.fleet.metrics'
    window rule); null while it is in flight."""
    return pl.when(pl.col("status") == "unfinished").then(None).otherwise(pl.coalesce("finished_us", "arrival_us"))


class LiveWriter:
    """The cluster loop's `on_tick` hook: keeps each tick's rows and, at most every
    `min_interval_s` of wall time (longer when flushing is slow), appends a chunk to DIR/live/."""

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
        self.flushed_us = -1  # done_us of the last chunk (events at 0 come first)
        self.end_us = int(trace["arrival_us"].max() or 0) if trace.height else 0
        self._ended = np.zeros(trace.height, bool)  # in a chunk's requests already
        self._first = np.zeros(trace.height, bool)  # in a chunk's firsts already
        self._rows: dict[str, list] = {k: [] for k in ("pools", "counts", "states", "gpus", "events")}
        self._control: ControlEvents = ControlEvents()
        self._request_columns = None
        self._next_flush = 0.0
        self._started = time.monotonic()
        self._writer = writer_tag()

    def start(self) -> None:
        """Create DIR/live/ with the config and a status saying the replay started."""
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.dir / "config.yaml",
                     lambda p: p.write_text(yaml.safe_dump(self.cfg.to_dict(), sort_keys=False)))
        self.status("running")

    def status(self, state: str, error: str | None = None, **extra) -> None:
        """state: running | compiling (with `compile_estimate_s`) | writing | failed (with `error`)."""
        body = {"state": state, "seq": self.seq, "done_us": self.done_us, "end_us": self.end_us,
                "wall_s": round(time.monotonic() - self._started, 3),
                "pid": self._writer[0], "pid_start": self._writer[1], **extra}
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
        """What `simulate` returns at its end, for the ticks seen so far."""
        rows = self._rows
        ticks = tick_arrays(rows["pools"], rows["counts"], rows["states"], rows["gpus"], self.tick_us)
        ev = {k: np.concatenate([e[k] for e in rows["events"]]) for k in rows["events"][0]}
        c = self._control
        control = ControlEvents(list(c.t_us), list(c.pool), list(c.replica), list(c.kind), list(c.detail))
        return RawRun(self.plans, self.pool_index, ticks, ev, control, self.slots, self._request_columns(),
                      self.done_us, self.tick_us)

    def flush(self) -> None:
        """Append what happened since the last chunk: (flushed_us, done_us]."""
        if not self._rows["pools"] or self.done_us <= self.flushed_us:
            return
        began = time.monotonic()
        raw = self.raw_so_far()
        requests = request_frame(self.trace, raw, self.cfg)
        lo, hi = self.flushed_us, self.done_us
        in_span = (pl.col("t_us") > lo) & (pl.col("t_us") <= hi)
        ticks = tick_frame(raw, requests, self.cfg).filter(in_span)
        events = event_frame(raw).filter(in_span)
        arrived = pl.col("arrival_us") <= hi
        ended = requests.select((arrived & (ended_us() <= hi)).fill_null(False)).to_series().to_numpy()
        new_ended = ended & ~self._ended
        first = requests.select((pl.col("first_token_us") <= hi).fill_null(False)).to_series().to_numpy()
        new_first = first & ~self._first
        arrived_mask = requests.select(arrived).to_series().to_numpy()
        firsts = requests.filter(new_first).select("request_id", "pool", "first_token_us", "ttft_us")
        self._ended |= new_ended
        self._first |= new_first
        self.seq += 1
        write_chunk(self.dir, self.seq, ticks, events, requests.filter(new_ended), firsts,
                    requests.filter(arrived_mask & ~self._ended))
        self.flushed_us = hi
        self.status("running")
        drop_old_inflight(self.dir, self.seq)
        cost = time.monotonic() - began
        self._next_flush = time.monotonic() + max(self.min_interval_s, self.cost_factor * cost)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
