"""A run directory as the dashboard reads it: one float64 array per metric per scope (the fleet
or a pool), indexed by tick, plus the event and request frames. Times are int64 microseconds
from the first arrival; a tick row at t covers (t - tick, t].

Reads the files of README "Run outputs" only, finished (DIR/*.parquet) or live (DIR/live/, see
replay/live.py); never the engine. Anything unreadable is a UserError naming the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import yaml

from traces.errors import UserError

LIVE_DIR = "live"  # replay/live.py: LIVE_DIR; kept as a constant here so tui imports no engine
STATUS_FILE = "status.json"
RUN_FILES = ("ticks.parquet", "events.parquet", "requests.parquet", "config.yaml")
TICK_COLUMNS = (
    "t_us", "pool", "replicas_active", "replicas_loading", "replicas_draining", "gpus", "waiting", "running",
    "kv_used_blocks", "kv_total_blocks", "arrivals", "rejected", "preemptions", "prompt_tokens_per_s",
    "output_tokens_per_s", "gpu_busy", "cost_usd", "cost_per_mtok_out_usd", "ttft_p50_ms", "ttft_p99_ms",
    "slo_attainment",
)
EVENT_COLUMNS = ("t_us", "pool", "replica", "kind", "detail", "request_id")
REQUEST_COLUMNS = (
    "request_id", "workload", "pool", "replica", "arrival_us", "prompt_tokens", "output_tokens", "cached_tokens",
    "first_scheduled_us", "first_token_us", "finished_us", "ttft_us", "preemptions", "status", "reject_reason",
    "slo_met",
)
EMPTY_REQUESTS = {c: pl.Int64 for c in REQUEST_COLUMNS} | {
    "workload": pl.String, "pool": pl.String, "status": pl.String, "reject_reason": pl.String, "slo_met": pl.Boolean,
    "tpot_us": pl.Float64}
# Per-request kinds of --detailed-events: shown in a request's life, not in the event log.
REQUEST_KINDS = ("arrive", "schedule", "first_token", "finish")
SUMMED = ("waiting", "running", "replicas_active", "replicas_loading", "replicas_draining", "gpus",
          "arrivals", "rejected", "preemptions", "prompt_tokens_per_s", "output_tokens_per_s", "cost_usd")
FLEET = "fleet"


@dataclass(frozen=True)
class LiveStatus:
    state: str  # running | writing | failed (a finished run has no status)
    seq: int
    done_us: int
    end_us: int
    error: str | None = None


@dataclass
class RunData:
    path: Path
    t_us: np.ndarray  # int64 [T], tick end times
    tick_us: int
    window_us: int
    pools: list[str]
    series: dict[str, dict[str, np.ndarray]]  # scope -> metric -> float64 [T]
    events: pl.DataFrame  # the event log's kinds (not --detailed-events' per-request ones)
    requests: pl.DataFrame
    slo: dict
    live: LiveStatus | None = None
    _all_events: pl.DataFrame | None = field(default=None, repr=False)
    _firsts: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.path.name or str(self.path)

    @property
    def scopes(self) -> list[str]:
        return [FLEET, *self.pools] if len(self.pools) > 1 else [FLEET]

    @property
    def end_us(self) -> int:
        return int(self.t_us[-1]) if len(self.t_us) else 0

    def has_scope(self, scope: str) -> bool:
        return scope in self.series

    def index_at(self, t_us: int) -> int | None:
        """The tick whose interval holds t (the last one past the end); None before any tick."""
        if not len(self.t_us):
            return None
        return int(min(np.searchsorted(self.t_us, t_us, side="left"), len(self.t_us) - 1))

    def scaling_times_in(self, scope: str) -> np.ndarray:
        """When the autoscalers decided to scale (every pool's for the fleet)."""
        ev = self.events.filter(pl.col("kind").is_in(["scale_up", "scale_down"]))
        if scope != FLEET:
            ev = ev.filter(pl.col("pool") == scope)
        return np.unique(ev["t_us"].to_numpy())

    def request_events(self, request_id: int) -> pl.DataFrame:
        frame = self._all_events if self._all_events is not None else self.events
        return frame.filter(pl.col("request_id") == request_id)

    def firsts(self) -> tuple[np.ndarray, np.ndarray]:
        """First-token times and TTFTs (ms) of every request that got one, by time (computed by
        the loader, off the interface's thread, for a run of several pools)."""
        if self._firsts is None:
            got = self.requests.filter(pl.col("first_token_us").is_not_null()).sort("first_token_us")
            self._firsts = (got["first_token_us"].to_numpy(), got["ttft_us"].to_numpy() / 1000.0)
        return self._firsts

    def fleet_ttft(self, lo_us: np.ndarray, hi_us: np.ndarray, qs=(0.5, 0.99)) -> np.ndarray:
        """TTFT percentiles (ms) over first tokens in (lo - window, hi], per (lo, hi): the
        trailing-window definition of the tick columns when lo == hi, and the window covering a
        chart column otherwise. For a fleet of several pools, whose percentiles do not add up."""
        times, values = self.firsts()
        a = np.searchsorted(times, np.asarray(lo_us) - self.window_us, side="right")
        b = np.searchsorted(times, np.asarray(hi_us), side="right")
        out = np.full((len(a), len(qs)), np.nan)
        for i in range(len(a)):
            if b[i] > a[i]:
                out[i] = np.percentile(values[a[i]:b[i]], [q * 100 for q in qs])
        return out


def _read_parquet(path: Path, needed: tuple[str, ...]) -> pl.DataFrame:
    try:
        frame = pl.read_parquet(path)
    except FileNotFoundError:
        raise UserError(f"{path}: missing; a run directory holds {', '.join(RUN_FILES)}") from None
    except Exception as exc:  # polars raises several types for a file that is not parquet
        raise UserError(f"{path}: not a readable parquet file ({type(exc).__name__}: {str(exc)[:120]})") from None
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise UserError(f"{path}: missing column {missing[0]!r} (columns expected: README 'Run outputs'; "
                        "was it written by llm-replay?)")
    return frame


def _read_status(path: Path) -> LiveStatus:
    try:
        body = json.loads(path.read_text())
        return LiveStatus(str(body["state"]), int(body["seq"]), int(body["done_us"]), int(body["end_us"]),
                          body.get("error"))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a live run status ({exc})") from None


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
    missing = [name for name in RUN_FILES if not (path / name).is_file()]
    if missing:
        inside = sorted(p.name for p in path.iterdir() if p.is_dir() and (p / "ticks.parquet").is_file())
        hint = f"; it holds the runs {', '.join(inside)}" if inside else ""
        raise UserError(f"{path}: not a run directory (missing {', '.join(missing)}); expected the --out of "
                        f"llm-replay run{hint}")
    return path, None


def load_run(path: Path | str) -> RunData:
    path = Path(path)
    src, status_file = run_source(path)
    if status_file is None:
        return _load_files(path, src, None)
    for _ in range(5):  # a flush may land between our reads: read until the status holds still
        status = _read_status(status_file)
        if status.seq == 0 or not (src / "ticks.parquet").is_file():
            return _load_files(path, src, status, empty=True)
        data = _load_files(path, src, status)
        if _read_status(status_file).seq == status.seq:
            return data
    return data


def _load_config(file: Path) -> dict:
    try:
        cfg = yaml.safe_load(file.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"{file}: not a readable config ({exc})") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{file}: expected a mapping, got {type(cfg).__name__}")
    return cfg


def _load_files(path: Path, src: Path, live: LiveStatus | None, empty: bool = False) -> RunData:
    cfg = _load_config(src / "config.yaml")
    tick_us = max(1, round(float(cfg.get("tick_s", 1.0)) * 1e6))
    window_us = round(float(cfg.get("metrics_window_s", 60.0)) * 1e6)
    slo = cfg.get("slo") or {}
    config_pools = [str(p.get("name")) for p in cfg.get("pools") or [] if isinstance(p, dict)]
    if empty:
        ticks = pl.DataFrame(schema={"t_us": pl.Int64, "pool": pl.String})
        events = pl.DataFrame(schema={c: pl.String if c in ("pool", "kind", "detail") else pl.Int64
                                      for c in EVENT_COLUMNS})
        requests = pl.DataFrame(schema=EMPTY_REQUESTS)
        return RunData(path, np.zeros(0, np.int64), tick_us, window_us, config_pools, {}, events, requests, slo, live)
    ticks = _read_parquet(src / "ticks.parquet", TICK_COLUMNS)
    events = _read_parquet(src / "events.parquet", EVENT_COLUMNS)
    requests = _read_parquet(src / "requests.parquet", REQUEST_COLUMNS)
    present = ticks["pool"].unique().to_list()
    pools = [p for p in config_pools if p in present] + sorted(p for p in present if p not in config_pools)
    t_us, series = _series(src / "ticks.parquet", ticks, pools, tick_us, window_us)
    # One pool is the fleet; several add up (TTFT percentiles excepted: see RunData.fleet_ttft).
    series[FLEET] = _fleet(series, pools, t_us, tick_us, window_us, requests) if len(pools) > 1 else series[pools[0]]
    log = events.filter(~pl.col("kind").is_in(REQUEST_KINDS))
    data = RunData(path, t_us, tick_us, window_us, pools, series, log, requests, slo, live,
                   _all_events=events if log.height != events.height else None)
    if len(pools) > 1:
        data.firsts()
    return data


def _series(file: Path, ticks: pl.DataFrame, pools: list[str], tick_us: int, window_us: int):
    """[T] arrays per pool: the file is one row per pool per tick, so a sort and a reshape."""
    npool = len(pools)
    ticks = ticks.sort(["t_us", "pool"])
    if npool == 0 or ticks.height % npool:
        raise UserError(f"{file}: {ticks.height} rows for {npool} pools; expected one row per pool per tick")
    t_all = ticks["t_us"].to_numpy().reshape(-1, npool)
    if not (t_all == t_all[:, :1]).all():
        raise UserError(f"{file}: ticks do not have one row per pool at each t_us")
    order = [sorted(pools).index(p) for p in pools]  # file order (by name) -> display order
    tick_s = tick_us / 1e6
    series: dict[str, dict[str, np.ndarray]] = {p: {} for p in pools}
    cols = {c: ticks[c].cast(pl.Float64).to_numpy().reshape(-1, npool)[:, order] for c in TICK_COLUMNS[2:]}
    for j, pool in enumerate(pools):
        s = {c: np.ascontiguousarray(v[:, j]) for c, v in cols.items()}
        s["kv_usage"] = np.where(s["kv_total_blocks"] > 0, s["kv_used_blocks"] / np.maximum(s["kv_total_blocks"], 1),
                                 0.0)
        s["arrivals_per_s"] = s["arrivals"] / tick_s
        s["cost_per_mtok_cum_usd"] = _per_mtok(s["cost_usd"], np.cumsum(s["output_tokens_per_s"] * tick_s))
        s["serving"] = s["replicas_active"] + s["replicas_draining"]
        series[pool] = s
    return t_all[:, 0].astype(np.int64), series


def _per_mtok(cost: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    out = np.full(len(cost), np.nan)
    np.divide(cost * 1e6, tokens, out=out, where=tokens > 0)
    return out


def _fleet(series: dict, pools: list[str], t_us: np.ndarray, tick_us: int, window_us: int,
           requests: pl.DataFrame) -> dict:
    """Fleet columns from the pools': sums, block- and replica-weighted shares, the windowed cost
    per M output tokens as replay.metrics defines it, and windowed SLO attainment from requests
    (TTFT percentiles do not add up over pools: RunData.fleet_ttft computes them on demand)."""
    fleet = {name: sum(series[p][name] for p in pools) for name in (*SUMMED, "kv_used_blocks", "kv_total_blocks",
                                                                     "serving")}
    fleet["kv_usage"] = np.where(fleet["kv_total_blocks"] > 0,
                                 fleet["kv_used_blocks"] / np.maximum(fleet["kv_total_blocks"], 1), 0.0)
    busy = sum(series[p]["gpu_busy"] * series[p]["serving"] for p in pools)
    fleet["gpu_busy"] = np.where(fleet["serving"] > 0, busy / np.maximum(fleet["serving"], 1), 0.0)
    tick_s = tick_us / 1e6
    win = max(1, round(window_us / tick_us))
    out_tokens = np.concatenate(([0.0], np.cumsum(fleet["output_tokens_per_s"] * tick_s)))
    cost = np.concatenate(([0.0], fleet["cost_usd"]))
    idx = np.arange(1, len(cost))
    lo = np.maximum(idx - win, 0)
    fleet["cost_per_mtok_out_usd"] = _per_mtok(cost[idx] - cost[lo], out_tokens[idx] - out_tokens[lo])
    fleet["cost_per_mtok_cum_usd"] = _per_mtok(fleet["cost_usd"], out_tokens[1:])
    fleet["arrivals_per_s"] = fleet["arrivals"] / tick_s
    fleet["slo_attainment"] = _window_attainment(requests, t_us, window_us)
    fleet["ttft_p50_ms"] = fleet["ttft_p99_ms"] = None  # computed per chart column: RunData.fleet_ttft
    return fleet


def _window_attainment(requests: pl.DataFrame, t_us: np.ndarray, window_us: int) -> np.ndarray:
    """Share of requests ending in (t - window, t] that met their SLO (replay.metrics' rule)."""
    done = (requests.filter(pl.col("status") != "unfinished")
            .select(ended_us=pl.coalesce("finished_us", "arrival_us"), met=pl.col("slo_met"))
            .sort("ended_us"))
    ended = done["ended_us"].to_numpy()
    met = np.concatenate(([0], np.cumsum(done["met"].to_numpy())))
    lo = np.searchsorted(ended, t_us - window_us, side="right")
    hi = np.searchsorted(ended, t_us, side="right")
    count = hi - lo
    out = np.full(len(t_us), np.nan)
    np.divide(met[hi] - met[lo], count, out=out, where=count > 0)
    return out
