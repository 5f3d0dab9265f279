"""A run directory as the dashboard reads it: one float64 array per metric per scope (the fleet
or a pool), indexed by tick, plus the event and request frames. Times are int64 microseconds
from the first arrival; a tick row at t covers (t - tick, t].

Reads the files of README "Run outputs" only, finished (DIR/*.parquet) or live (DIR/live/, the
chunks of replay/fleet/live.py); never the engine. Anything unreadable is a UserError naming the file.

Both go through a RunBuilder, which turns rows into arrays in O(new rows): a finished run is one
append; a live run is followed chunk by chunk (LiveFollower), so each reload reads and computes
only what the replay added since the last one, never the whole run again.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import polars as pl

from common.errors import UserError
from common.files import kind_of
from common.yamlfile import read_yaml
from replay.outputs import schema as run_schema
from replay.outputs.schema import CHUNK_FILES, CONFIG_FILE, LIVE_DIR, STATUS_FILE, SUMMARY_FILE, chunk_name, inflight_name
from tui.arrays import EndedCounts, Grow, SortedTimes, ended_counts
from tui.percentiles import percentiles_by_pass, window_percentiles
from tui.request_table import RequestTable, columns_in as _columns_in, open_requests, rows_in as _rows_in
from tui.validate import (EVENTS, FIRSTS, REQUESTS, TICKS, Reads, check_config, check_frame,
                          check_summary, check_version, summary_saturation)

# The writer's layout (replay/outputs/schema.py). What a finished run must hold to be drawn; summary.json
# is checked when there (a cut-short one is a damaged run) and gives the pools' saturation.
RUN_FILES = (run_schema.TICKS_FILE, run_schema.EVENTS_FILE, run_schema.REQUESTS_FILE, CONFIG_FILE)
# the columns read (tui/validate.py names them among the writer's)
TICK_COLUMNS = TICKS.names
EVENT_COLUMNS = EVENTS.names
REQUEST_COLUMNS = REQUESTS.names
FIRST_COLUMNS = FIRSTS.names
# What opening reads of requests.parquet, for a fleet of several pools only, in one streaming pass
# that keeps no column: when the ended requests ended and whether they met their SLO, counted per
# tick (the fleet's windowed attainment). First tokens (its TTFT percentiles) are read when a chart
# first asks; a pool's series are its ticks'. Each view queries the rows it shows (tui/views.py,
# tui/requests.py, tui/observed.py), none reads a column whole.
ENDED = ("status", "finished_us", "arrival_us", "slo_met")
# the frames of a live run before its first chunk, of the writer's dtypes
EMPTY_REQUESTS = run_schema.REQUESTS.dtypes
EMPTY_EVENTS = run_schema.EVENTS.dtypes
# Per-request kinds of --detailed-events: shown in a request's life, not in the event log.
REQUEST_KINDS = run_schema.REQUEST_EVENT_KINDS
SUMMED = ("waiting", "running", "replicas_active", "replicas_loading", "replicas_draining", "gpus",
          "arrivals", "rejected", "preemptions", "prompt_tokens_per_s", "output_tokens_per_s", "cost_usd")
FLEET = "fleet"
# A fleet's TTFT percentiles (RunData.fleet_ttft) from first tokens kept, up to so many requests;
# past it from those of each query's windows, read about FIRSTS_PER_PASS at a time.
KEEP_FIRSTS = 2_000_000
FIRSTS_PER_PASS = 1_000_000


@dataclass(frozen=True)
class LiveStatus:
    state: str  # running | compiling | writing | failed (a finished run has no status)
    seq: int
    done_us: int
    end_us: int
    error: str | None = None
    pid: int | None = None  # the writer (process id and start time), when it recorded itself
    pid_start: int | None = None
    compile_estimate_s: float | None = None  # while compiling: how long the first compile takes


@dataclass
class RunData:
    path: Path
    t_us: np.ndarray  # int64 [T], tick end times
    tick_us: int
    window_us: int
    pools: list[str]
    series: dict[str, dict[str, np.ndarray]]  # scope -> metric -> float64 [T]
    events: pl.DataFrame  # the event log's kinds (not --detailed-events' per-request ones)
    table: RequestTable  # requests.parquet, each column read when a view first asks for it
    slo: dict
    live: LiveStatus | None = None
    saturation: dict[str, str] = field(default_factory=dict)  # pool -> class, from summary.json (finished runs)
    block_size: dict[str, int] = field(default_factory=dict)  # pool -> KV block size in tokens, from config.yaml
    _all_events: pl.DataFrame | None = field(default=None, repr=False)
    _firsts: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    _memo: dict = field(default_factory=dict, repr=False)  # queries every redraw asks (the data never changes)

    @property
    def requests(self) -> pl.DataFrame:  # every column of every request (no view asks: they query `table`)
        return self.table.all()

    @property
    def name(self) -> str:
        return self.path.name or str(self.path)

    @property
    def scopes(self) -> list[str]:
        return [FLEET, *self.pools] if len(self.pools) > 1 else [FLEET]

    @property
    def end_us(self) -> int:
        return int(self.t_us[-1]) if len(self.t_us) else 0

    @property
    def pass_span_us(self) -> int:
        """A span of the run that holds about FIRSTS_PER_PASS requests (what a pass reads at a time)."""
        return max(self.end_us, 1) * FIRSTS_PER_PASS // max(self.table.height, 1)

    def has_scope(self, scope: str) -> bool:
        return scope in self.series

    def index_at(self, t_us: int) -> int | None:
        """The tick whose interval holds t (the last one past the end); None before any tick."""
        if not len(self.t_us):
            return None
        return int(min(np.searchsorted(self.t_us, t_us, side="left"), len(self.t_us) - 1))

    def scaling_events(self, scope: str) -> tuple[np.ndarray, list[str]]:
        """(times, kinds) of the autoscalers' scale_up / scale_down decisions (every pool's for the
        fleet), by time."""
        key = ("scaling", scope)
        if key not in self._memo:
            ev = self.events.filter(pl.col("kind").is_in(["scale_up", "scale_down"]))
            if scope != FLEET:
                ev = ev.filter(pl.col("pool") == scope)
            self._memo[key] = (ev["t_us"].to_numpy(), ev["kind"].to_list())
        return self._memo[key]

    def scaling_times_in(self, scope: str) -> np.ndarray:
        """When the autoscalers decided to scale (every pool's for the fleet)."""
        return np.unique(self.scaling_events(scope)[0])

    def log_in(self, scope: str, decisions_only: bool) -> tuple[pl.DataFrame, np.ndarray]:
        """The event log of a scope (only scaling decisions and replica state changes with
        `decisions_only`), and its times."""
        key = ("log", scope, decisions_only)
        if key not in self._memo:
            ev = self.events
            if scope != FLEET:
                ev = ev.filter(pl.col("pool") == scope)
            if decisions_only:
                ev = ev.filter(pl.col("kind").str.starts_with("scale") | pl.col("kind").str.starts_with("replica"))
            ev = ev.rechunk()
            self._memo[key] = (ev, ev["t_us"].to_numpy())
        return self._memo[key]

    def request_events(self, request_id: int) -> pl.DataFrame:
        frame = self._all_events if self._all_events is not None else self.events
        return frame.filter(pl.col("request_id") == request_id)

    def firsts(self) -> tuple[np.ndarray, np.ndarray]:
        """First-token times and TTFTs (ms) of every request that got one, by time: a live run's
        as the follower read them, a finished run's read when first asked (a fleet's TTFT)."""
        if self._firsts is None:
            got = self.table.select("first_token_us", "ttft_us", keep=False)
            if got["first_token_us"].null_count():
                got = got.drop_nulls("first_token_us")
            t, ttft = got["first_token_us"].to_numpy(), got["ttft_us"].to_numpy()
            del got
            if (np.diff(t) < 0).any():  # (numpy's stable sort: 2x polars' here)
                order = np.argsort(t, kind="stable")
                t, ttft = t[order], ttft[order]
                del order
            self._firsts = (t, ttft / 1000.0)
        return self._firsts

    def fleet_ttft(self, lo_us: np.ndarray, hi_us: np.ndarray, qs=(0.5, 0.99)) -> np.ndarray:
        """TTFT percentiles (ms) over first tokens in (lo - window, hi], per (lo, hi): the
        trailing-window definition of the tick columns when lo == hi, and the window covering a
        chart column otherwise. For a fleet of several pools, whose percentiles do not add up.
        A finished run of more than KEEP_FIRSTS requests keeps no first token: each query reads
        those of its windows (the cursor's: one window; a chart's: a span of time at a time)."""
        if self._firsts is None and self.table.height > KEEP_FIRSTS:
            lo, hi = np.asarray(lo_us, np.int64), np.asarray(hi_us, np.int64)
            percents = tuple(q * 100 for q in qs)
            key = ("ttft", percents, lo.tobytes(), hi.tobytes())
            if key not in self._memo:
                self._memo[key] = self._ttft_read(lo, hi, percents)
            return self._memo[key]
        times, values = self.firsts()
        a = np.searchsorted(times, np.asarray(lo_us) - self.window_us, side="right")
        b = np.searchsorted(times, np.asarray(hi_us), side="right")
        return window_percentiles(values, a, b, [q * 100 for q in qs], lambda: self.order_of("ttft", values))

    def _ttft_read(self, lo: np.ndarray, hi: np.ndarray, percents: tuple[float, ...]) -> np.ndarray:
        def read(t0: int, t1: int) -> tuple[np.ndarray, np.ndarray]:
            got = self.table.query(lambda req: req.select("first_token_us", "ttft_us").filter(
                (pl.col("first_token_us") > t0) & (pl.col("first_token_us") <= t1)).sort("first_token_us"))
            return got["first_token_us"].to_numpy(), got["ttft_us"].to_numpy() / 1000.0

        return percentiles_by_pass(read, lo, hi, self.window_us, percents, self.pass_span_us)

    def order_of(self, name: str, values: np.ndarray) -> np.ndarray:
        """np.argsort(values), kept while `values` (a signal named `name`) is the same array."""
        key = ("order", name, len(values), values.__array_interface__["data"][0])
        if key not in self._memo:
            self._memo[key] = np.argsort(values)
        return self._memo[key]

    def cumsum_of(self, name: str, values: np.ndarray) -> np.ndarray:
        """[0, values' running sums]: how much the first k of them sum to (a signal by time), kept
        as order_of keeps its order."""
        key = ("cumsum", name, len(values), values.__array_interface__["data"][0])
        if key not in self._memo:
            self._memo[key] = np.concatenate(([0.0], np.cumsum(values)))
        return self._memo[key]


def _read_parquet(path: Path, schema: Reads) -> pl.DataFrame:
    try:
        frame = pl.read_parquet(path)
        metadata = pl.read_parquet_metadata(path)
    except FileNotFoundError:
        raise UserError(f"{path}: missing; a run directory holds {', '.join(RUN_FILES)}") from None
    except Exception as exc:  # polars raises several types for a file that is not parquet
        raise UserError(f"{path}: not a readable parquet file ({type(exc).__name__}: {str(exc)[:120]})") from None
    check_version(path, metadata)  # before the columns: a newer schema explains a missing one
    check_frame(path, frame, schema)
    return frame


def _read_status(path: Path) -> LiveStatus:
    try:
        body = json.loads(path.read_text())
        pid, start = body.get("pid"), body.get("pid_start")
        return LiveStatus(str(body["state"]), int(body["seq"]), int(body["done_us"]), int(body["end_us"]),
                          body.get("error"), None if pid is None else int(pid), None if start is None else int(start),
                          None if body.get("compile_estimate_s") is None else float(body["compile_estimate_s"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a live run status ({exc})") from None


def _writer_exited(status: LiveStatus) -> bool:
    """A live run whose writer is gone (killed: it records a failure otherwise), as opposed to one
    that is slow. A status without its writer (an older llm-replay) is taken as alive."""
    from replay.outputs.rundir import writer_alive

    return (status.state != "failed" and status.pid is not None and status.pid_start is not None
            and not writer_alive(status.pid, status.pid_start))


def run_source(path: Path) -> tuple[Path, Path | None]:
    """(directory holding the files, status file or None). A live replay's DIR/live/ wins over
    files already in DIR (the run that --force will replace)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such run directory")
    if not path.is_dir():
        raise UserError(f"{path}: is a file; expected a run directory (the --out of llm-replay run)")
    status = path / LIVE_DIR / STATUS_FILE
    if status.is_file():
        return path / LIVE_DIR, status
    for name in RUN_FILES:
        # stat only, never open: a FIFO would block, a link to /dev/zero would be read forever
        file = path / name
        try:
            mode = os.stat(file).st_mode
        except OSError:
            continue  # missing, or a dangling link: reported as missing below
        if not stat.S_ISREG(mode):
            link = f" (a symbolic link to {os.readlink(file)})" if file.is_symlink() else ""
            raise UserError(f"{file}: is {kind_of(mode)}{link}, not a regular file; expected the --out of "
                            "llm-replay run")
    missing = [name for name in RUN_FILES if not (path / name).is_file()]
    if missing:
        inside = sorted(p.name for p in path.iterdir() if p.is_dir() and (p / TICKS.table.file).is_file())
        hint = f"; it holds the runs {', '.join(inside)}" if inside else ""
        raise UserError(f"{path}: not a run directory (missing {', '.join(missing)}); expected the --out of "
                        f"llm-replay run{hint}")
    return path, None


def load_run(path: Path | str) -> RunData:
    """A run directory, finished or live (then as far as it is written)."""
    path = Path(path)
    src, status_file = run_source(path)
    if status_file is None:
        return _load_finished(path, src)
    return LiveFollower(path).data


def load_run_config(path: Path) -> dict:
    """A run directory's config.yaml (a live run's, under live/, while it is written)."""
    src, _ = run_source(path)
    return _load_config(src / CONFIG_FILE)


def _load_config(file: Path) -> dict:
    """A run's config.yaml through the bounded YAML reader every input uses (a regular file,
    bounded size, depth and alias expansion: a crafted run directory cannot blow up the dashboard)."""
    return check_config(file, read_yaml(file, "run config") or {})


def _ended(requests: pl.DataFrame) -> pl.DataFrame:
    """(ended_us, met) of requests that left the system (finished, or rejected at arrival: the
    window rule of replay.fleet.metrics), by time."""
    return _by_time(requests.filter(pl.col("status") != "unfinished")
                    .select(ended_us=pl.coalesce("finished_us", "arrival_us"), met=pl.col("slo_met")), "ended_us")


def _by_time(frame: pl.DataFrame, col: str) -> pl.DataFrame:
    """`frame` sorted by the integer column `col`, ties in order (numpy's stable sort: 2x polars' here)."""
    return frame[np.argsort(frame[col].to_numpy(), kind="stable")]


def _saturation_in(src: Path) -> dict[str, str]:
    """The pools' saturation classes of a finished run's summary.json (checked whole when there)."""
    if not (src / SUMMARY_FILE).is_file():
        return {}
    return summary_saturation(src / SUMMARY_FILE, check_summary(src / SUMMARY_FILE))


def _load_finished(path: Path, src: Path) -> RunData:
    builder = RunBuilder(path, _load_config(src / CONFIG_FILE))
    saturation = _saturation_in(src)
    ticks = _read_parquet(src / TICKS.table.file, TICKS)
    events = _read_parquet(src / EVENTS.table.file, EVENTS)
    opening = None
    if ticks["pool"].n_unique() > 1:  # the fleet's attainment: requests ended by each tick and a window before
        t = ticks["t_us"].unique().to_numpy()
        edges = np.unique(np.concatenate((t, t - builder.window_us)))
        opening = lambda scan: ended_counts(scan.select(ENDED), edges)  # noqa: E731
    # checked whole in one streaming pass; no column kept (each view reads its own when first shown)
    table, builder.ended_counts = open_requests(src / REQUESTS.table.file, REQUESTS, opening, _read_parquet)
    builder.add_ticks(ticks, src / TICKS.table.file)
    builder.add_events(events)
    data = builder.snapshot(table, None)
    data.saturation = saturation
    return data


class RunBuilder:
    """Rows to arrays, incrementally: requests (ended ones, first tokens) first, then the ticks
    they complete, then snapshots. Each append computes only the new rows' values."""

    def __init__(self, path: Path, cfg: dict):
        self.path = path
        self.tick_us = max(1, round(float(cfg.get("tick_s", 1.0)) * 1e6))
        self.window_us = round(float(cfg.get("metrics_window_s", 60.0)) * 1e6)
        self.slo = cfg.get("slo") or {}
        self.config_pools = [str(p.get("name")) for p in cfg.get("pools") or [] if isinstance(p, dict)]
        self.block_size = {str(p.get("name")): int((p.get("engine") or {}).get("block_size") or 16)
                           for p in cfg.get("pools") or [] if isinstance(p, dict)}
        self.pools: list[str] | None = None
        self.t = Grow(np.int64)
        self.cols: dict[str, dict[str, Grow]] = {}
        self.ended = SortedTimes(np.int64)  # (ended_us, 1 if met else 0), as a live run's chunks bring them
        self.ended_counts: EndedCounts | None = None  # or a finished run's, counted by edge as it opened
        self.firsts = SortedTimes()  # (first_token_us, TTFT ms)
        self.events: list[pl.DataFrame] = []
        self.log: list[pl.DataFrame] = []
        self.event_rows = 0
        self.has_request_kinds = False

    # -- appends ---------------------------------------------------------------------------------
    def add_requests(self, ended: pl.DataFrame, first_us: np.ndarray, ttft_ms: np.ndarray) -> None:
        self.ended.append(ended["ended_us"].to_numpy(), ended["met"].cast(pl.Int64).to_numpy())
        self.firsts.append(first_us, ttft_ms)

    def add_events(self, events: pl.DataFrame) -> None:
        if not events.height:
            return
        log = events.filter(~pl.col("kind").is_in(REQUEST_KINDS))
        self.has_request_kinds |= log.height != events.height
        self.events.append(events)
        self.log.append(log)
        self.event_rows += events.height

    def add_ticks(self, ticks: pl.DataFrame, file: Path) -> None:
        if not ticks.height:
            return
        present = ticks["pool"].unique().to_list()
        stray = sorted(p for p in present if self.config_pools and p not in self.config_pools)
        if stray:
            raise UserError(f"{file}: rows for pool {stray[0]!r}, which the run's config.yaml does not have "
                            f"(its pools: {', '.join(self.config_pools)})")
        if self.pools is None:
            self.pools = ([p for p in self.config_pools if p in present]
                          + sorted(p for p in present if p not in self.config_pools))
            self.cols = {s: {} for s in [*self.pools, FLEET]}
        elif sorted(present) != sorted(self.pools):
            raise UserError(f"{file}: pools {sorted(present)}; earlier ticks had {sorted(self.pools)}")
        pools = self.pools
        npool = len(pools)
        ticks = ticks.sort(["t_us", "pool"])
        if ticks.height % npool:
            raise UserError(f"{file}: {ticks.height} rows for {npool} pools; expected one row per pool per tick")
        t_all = ticks["t_us"].to_numpy().reshape(-1, npool)
        if not (t_all == t_all[:, :1]).all():
            raise UserError(f"{file}: ticks do not have one row per pool at each t_us")
        t_new = t_all[:, 0].astype(np.int64)
        if self.t.n and t_new[0] <= self.t.last():
            raise UserError(f"{file}: ticks from {t_new[0]} us repeat or precede those already read")
        order = [sorted(pools).index(p) for p in pools]  # file order (by name) -> display order
        tick_s = self.tick_us / 1e6
        n0 = self.t.n
        self.t.append(t_new)
        raw = {c: ticks[c].cast(pl.Float64).to_numpy().reshape(-1, npool)[:, order] for c in TICK_COLUMNS[2:]}
        new: dict[str, dict[str, np.ndarray]] = {}
        for j, pool in enumerate(pools):
            s = {c: np.ascontiguousarray(v[:, j]) for c, v in raw.items()}
            s["kv_usage"] = _share(s["kv_used_blocks"], s["kv_total_blocks"])
            s["arrivals_per_s"] = s["arrivals"] / tick_s
            s["serving"] = s["replicas_active"] + s["replicas_draining"]
            s["out_tokens_cum"] = self._last(pool, "out_tokens_cum") + np.cumsum(s["output_tokens_per_s"] * tick_s)
            s["cost_per_mtok_cum_usd"] = _per_mtok(s["cost_usd"], s["out_tokens_cum"])
            new[pool] = s
        if npool > 1:
            new[FLEET] = self._fleet(new, n0, t_new)
        for scope, s in new.items():
            cols = self.cols[scope]
            for key, values in s.items():
                cols.setdefault(key, Grow()).append(values)

    def _last(self, scope: str, key: str) -> float:
        g = self.cols.get(scope, {}).get(key)
        return float(g.last()) if g is not None else 0.0

    def _fleet(self, new: dict, n0: int, t_new: np.ndarray) -> dict:
        """Fleet rows from the pools' new rows: sums, block- and replica-weighted shares, the
        windowed cost per M output tokens as replay.fleet.metrics defines it, windowed SLO attainment
        from ended requests (TTFT percentiles do not add up over pools: RunData.fleet_ttft)."""
        pools = self.pools
        fleet = {k: sum(new[p][k] for p in pools)
                 for k in (*SUMMED, "kv_used_blocks", "kv_total_blocks", "serving", "out_tokens_cum")}
        fleet["kv_usage"] = _share(fleet["kv_used_blocks"], fleet["kv_total_blocks"])
        busy = sum(new[p]["gpu_busy"] * new[p]["serving"] for p in pools)
        fleet["gpu_busy"] = _share(busy, fleet["serving"])
        # the window reaches back into rows already held: row i's starts after row i - win
        win = max(1, round(self.window_us / self.tick_us))
        base = max(n0 - win, 0)
        held = self.cols[FLEET] if n0 else {}
        cost = np.concatenate((held["cost_usd"].view()[base:] if n0 else [], fleet["cost_usd"]))
        out = np.concatenate((held["out_tokens_cum"].view()[base:] if n0 else [], fleet["out_tokens_cum"]))
        start = np.arange(n0, n0 + len(t_new)) - win
        ok = start >= 0
        at = np.where(ok, start - base, 0)
        cost_win = fleet["cost_usd"] - np.where(ok, cost[at], 0.0)
        out_win = fleet["out_tokens_cum"] - np.where(ok, out[at], 0.0)
        fleet["cost_per_mtok_out_usd"] = _per_mtok(cost_win, out_win)
        fleet["cost_per_mtok_cum_usd"] = _per_mtok(fleet["cost_usd"], fleet["out_tokens_cum"])
        fleet["arrivals_per_s"] = fleet["arrivals"] / (self.tick_us / 1e6)
        fleet["slo_attainment"] = self._attainment(t_new)
        return fleet

    def _attainment(self, t_us: np.ndarray) -> np.ndarray:
        """Share of requests ending in (t - window, t] that met their SLO (replay.fleet.metrics' rule)."""
        if self.ended_counts is not None:
            (lo, met_lo), (hi, met_hi) = self.ended_counts.at(t_us - self.window_us), self.ended_counts.at(t_us)
        else:
            ended = self.ended.t.view()
            met = np.concatenate(([0], np.cumsum(self.ended.v.view())))
            lo = np.searchsorted(ended, t_us - self.window_us, side="right")
            hi = np.searchsorted(ended, t_us, side="right")
            met_lo, met_hi = met[lo], met[hi]
        count = hi - lo
        out = np.full(len(t_us), np.nan)
        np.divide(met_hi - met_lo, count, out=out, where=count > 0)
        return out

    # -- snapshots -------------------------------------------------------------------------------
    @property
    def tick_rows(self) -> int:
        return self.t.n * len(self.pools or ())

    def snapshot(self, requests: pl.DataFrame | RequestTable, live: LiveStatus | None) -> RunData:
        if self.pools is None:  # no tick yet
            series: dict = {}
            pools = self.config_pools
        else:
            pools = self.pools
            series = {scope: {k: g.view() for k, g in cols.items()} for scope, cols in self.cols.items()}
            if len(pools) == 1:  # one pool is the fleet
                series[FLEET] = series[pools[0]]
            else:
                series[FLEET]["ttft_p50_ms"] = series[FLEET]["ttft_p99_ms"] = None  # RunData.fleet_ttft
        # one chunk each (polars queries over hundreds of small chunks are slow), merged as they come
        for frames in (self.events, self.log):
            if len(frames) > 1:
                frames[:] = [pl.concat(frames, rechunk=True)]
        all_events = _concat(self.events, EMPTY_EVENTS)
        log = _concat(self.log, EMPTY_EVENTS)
        # a live run's first tokens as its chunks brought them; a finished run's read when asked
        firsts = (self.firsts.t.view(), self.firsts.v.view()) if isinstance(requests, pl.DataFrame) else None
        if isinstance(requests, pl.DataFrame):
            requests = RequestTable.of_frame(requests)
        return RunData(self.path, self.t.view(), self.tick_us, self.window_us, list(pools), series, log, requests,
                       self.slo, live, _all_events=all_events if self.has_request_kinds else None,
                       _firsts=firsts, block_size=self.block_size)


def _concat(frames: list[pl.DataFrame], schema: dict) -> pl.DataFrame:
    if not frames:
        return pl.DataFrame(schema=schema)
    return frames[0] if len(frames) == 1 else pl.concat(frames, rechunk=False)


def _share(part: np.ndarray, whole: np.ndarray) -> np.ndarray:
    return np.where(whole > 0, part / np.maximum(whole, 1), 0.0)


def _per_mtok(cost: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    out = np.full(len(cost), np.nan)
    np.divide(cost * 1e6, tokens, out=out, where=tokens > 0)
    return out


class LiveFollower:
    """A run directory followed while a replay writes it: each `poll()` reads the chunks added
    since the last one and the newest in-flight requests (replay/fleet/live.py), and returns the run so
    far, or None when nothing changed. When the finished run replaces the live directory, the data
    already read is kept if it is that run's (same row counts), so finishing costs no reload."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.builder: RunBuilder | None = None
        self.read_seq = 0
        self.requests: list[pl.DataFrame] = []
        self.inflight: pl.DataFrame | None = None
        self.seen: tuple | None = None
        self.finished = False
        self.status: LiveStatus | None = None
        self.data: RunData = self._load()  # the first read always returns the run

    def poll(self) -> RunData | None:
        if self.finished:
            return None
        data = self._load()
        if data is not None:
            self.data = data
        return data

    def _load(self) -> RunData | None:
        src, status_file = run_source(self.path)
        if status_file is None:  # the finished run replaced the live directory
            self.finished = True
            return self._finish(src)
        if self.builder is None:
            self.builder = RunBuilder(self.path, _load_config(src / CONFIG_FILE))
        for _ in range(5):  # a flush may drop the in-flight file we are about to read: read on
            status = _read_status(status_file)
            if _writer_exited(status):
                if run_source(self.path)[1] is None:  # it put the finished run in place, then exited
                    return self._load()
                status = replace(status, state="failed", error=f"writer exited: the replay (pid {status.pid}) "
                                 "stopped before its end; shown as far as it was written")
            if (status.seq, status.state) == self.seen:
                return None
            # The in-flight file first: the writer keeps only the newest two, so reading many
            # chunks before it (a first open on a busy machine) let it go every time, and five
            # tries failed ("flushed faster than the dashboard could read"); chunks stay.
            inflight = None
            if status.seq:
                file = src / inflight_name(status.seq)
                try:
                    inflight = _read_parquet(file, REQUESTS)
                except UserError:
                    if file.is_file():
                        raise
                    continue  # dropped between the status and here: read the status again
            chunks = [self._read_chunk(src, k) for k in range(self.read_seq + 1, status.seq + 1)]
            for ticks, events, requests, firsts in chunks:  # everything read: now append
                b = self.builder
                b.add_requests(_ended(requests), firsts["first_token_us"].to_numpy(),
                               firsts["ttft_us"].to_numpy() / 1000.0)
                b.add_ticks(ticks, src)
                b.add_events(events)
                if requests.height:
                    self.requests.append(requests)
            self.read_seq, self.seen, self.status = status.seq, (status.seq, status.state), status
            if inflight is not None:
                self.inflight = inflight
            parts = self.requests + ([self.inflight] if self.inflight is not None and self.inflight.height else [])
            return self.builder.snapshot(_concat(parts, EMPTY_REQUESTS), status)
        raise UserError(f"{status_file}: the replay flushed faster than the dashboard could read; retrying")

    def _read_chunk(self, src: Path, k: int) -> tuple[pl.DataFrame, ...]:
        chunk = src / chunk_name(k)
        if not chunk.is_dir():
            raise UserError(f"{chunk}: missing; the live run's chunks end early (status.json says more)")
        needed = {"ticks": TICKS, "events": EVENTS, "requests": REQUESTS, "firsts": FIRSTS}
        return tuple(_read_parquet(chunk / f"{name}.parquet", needed[name]) for name in CHUNK_FILES)

    def _finish(self, src: Path) -> RunData:
        b = self.builder
        if b is not None and self.seen is not None and self.seen[1] == "writing":
            held = sum(f.height for f in self.requests) + (self.inflight.height if self.inflight is not None else 0)
            # the same rows, and no column the live chunks lack (a request log's observed TTFT/E2E)
            if (_rows_in(src / TICKS.table.file) == b.tick_rows and _rows_in(src / REQUESTS.table.file) == held
                    and _rows_in(src / EVENTS.table.file) == b.event_rows
                    and _columns_in(src / REQUESTS.table.file) == self.data.table.columns):
                return RunData(**{**self.data.__dict__, "live": None, "saturation": _saturation_in(src)})
        return _load_finished(self.path, src)
