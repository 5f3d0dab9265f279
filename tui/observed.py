"""An observed export over the dashboard: the observed series of each chart the dashboard has a
signal for, and once the run is scored, the replayed side on the same grid, the divergence
section (as `validate RUN --observed` reports it) and where the two part.

The export is read, mapped to the run's pools and checked against the run's window before the
dashboard starts (bad input is one line, exit 2, as for `validate RUN --observed`). Scoring needs
the run whole: its ticks, and its requests' latencies counted into histogram buckets per tick (a
pass over requests.parquet a batch at a time, holding only the counts). A finished run is scored
as it opens; a live one (`run --tui --observed`) shows the observed line from the start and is
scored when its replay ends.

Where they part: over the divergence windows (`observed.window_s`), a window whose relative gap
|replayed - observed| / max(|observed|, |replayed|, PEAK_FLOOR x the larger side's peak) exceeds
the threshold (DEFAULT_THRESHOLD, `tui --diverge-threshold`) is marked. The share is 0 for equal
values and at most 1 (one side 0, the other not: a queue the fleet never had), so one threshold
fits every signal whatever its unit; the floor keeps a window where both are near 0 (a queue of
0.03 against none, on a chart that peaks at 12) from counting as parted.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl

from common.errors import UserError

DEFAULT_THRESHOLD = 0.25
PEAK_FLOOR = 0.1
LIVE_SPAN_MAX_S = 7 * 86400  # a live run's grid before its replay says how far it goes
FLEET = "fleet"


@dataclasses.dataclass(frozen=True)
class Signal:
    """A dashboard metric row's observed counterpart: the signal, the factor from the signal's
    unit to the row's (TTFT seconds to ms), and whether the fleet's value is the pools' sum (a
    share or a quantile of several pools is not: drawn per pool only)."""

    signal: str
    factor: float = 1.0
    summed: bool = True


# dashboard metric key -> its observed signal; "gpus" (replicas, GPUs) draws the replica count
# (kube_deployment_status_replicas: active + loading replicas) and "preemptions" is per tick.
SIGNALS = {
    "waiting": Signal("waiting"),
    "running": Signal("running"),
    "kv_usage": Signal("kv_usage", summed=False),
    "gpus": Signal("replicas"),
    "gpu_busy": Signal("gpu_busy", summed=False),
    "prompt_tokens_per_s": Signal("prompt_tokens_per_s"),
    "output_tokens_per_s": Signal("output_tokens_per_s"),
    "ttft_p50_ms": Signal("ttft_s_p50", 1000.0, False),
    "ttft_p99_ms": Signal("ttft_s_p99", 1000.0, False),
    "preemptions": Signal("preemptions_per_s"),  # x tick_s: per tick, as the row
    # rows the dashboard shows only with an export (their replayed side comes from the scoring)
    "itl_p50_ms": Signal("itl_s_p50", 1000.0, False),
    "itl_p99_ms": Signal("itl_s_p99", 1000.0, False),
    "e2e_p50_ms": Signal("e2e_s_p50", 1000.0, False),
    "e2e_p99_ms": Signal("e2e_s_p99", 1000.0, False),
}
# what replay.outputs.observed reads of ticks.parquet
_TICK_COLUMNS = ("t_us", "pool", "waiting", "running", "kv_usage", "gpu_busy", "replicas_active", "replicas_loading",
                 "prompt_tokens_per_s", "output_tokens_per_s", "preemptions", "finished")
# the rows above whose replayed side the run's ticks do not hold
SCORED_ONLY = ("itl_p50_ms", "itl_p99_ms", "e2e_p50_ms", "e2e_p99_ms")


@dataclasses.dataclass
class Overlay:
    files: tuple[str, ...]
    config: object  # traces.observed.ObservedConfig
    source: str  # where the `observed:` section came from, for messages
    pools: list[str]
    tick_s: float
    threshold: float
    raw: object  # traces.observed.Observed, as read
    t_us: np.ndarray  # the grid's ticks
    observed: dict[tuple, np.ndarray]  # (signal, pool) -> value per tick, the signal's unit
    replayed: dict[tuple, np.ndarray] | None = None  # the same on the same grid, once scored
    section: dict | None = None  # summary.json's `observed` of the run against the export
    notes: list[str] = dataclasses.field(default_factory=list)
    error: str | None = None  # scoring failed (the run's window does not hold the export)
    aligned_as: tuple = ()  # (Mapped, Aligned) of the grid the observed side is on
    _memo: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def scored(self) -> bool:
        return self.section is not None

    def _pool(self, scope: str) -> str | None:
        if scope == FLEET:
            return self.pools[0] if len(self.pools) == 1 else None
        return scope if scope in self.pools else None

    def _side(self, values: dict[tuple, np.ndarray] | None, scope: str, key: str) -> np.ndarray | None:
        spec = SIGNALS.get(key)
        if spec is None or values is None:
            return None
        factor = spec.factor * (self.tick_s if key == "preemptions" else 1.0)
        pool = self._pool(scope)
        if pool is not None:
            got = values.get((spec.signal, pool))
            return None if got is None else got * factor
        if scope != FLEET or not spec.summed:
            return None
        parts = [values[(spec.signal, p)] for p in self.pools if (spec.signal, p) in values]
        if not parts:
            return None
        stack = np.vstack(parts)
        # the fleet's value where some pool has one (a pool without is absent, not 0)
        total = np.where(np.isfinite(stack).any(axis=0), np.nansum(stack, axis=0), np.nan)
        return total * factor

    def series(self, scope: str, key: str) -> np.ndarray | None:
        """The observed value of a dashboard row in `scope` at each tick (None: no signal there)."""
        memo = ("obs", scope, key)
        if memo not in self._memo:
            self._memo[memo] = self._side(self.observed, scope, key)
        return self._memo[memo]

    def replayed_series(self, scope: str, key: str) -> np.ndarray | None:
        memo = ("rep", scope, key)
        if memo not in self._memo:
            self._memo[memo] = self._side(self.replayed, scope, key)
        return self._memo[memo]

    def marks(self, scope: str, key: str) -> np.ndarray | None:
        """Per tick: whether its divergence window parts by more than the threshold (None until
        scored, or without the signal)."""
        memo = ("marks", scope, key)
        if memo not in self._memo:
            obs, rep = self.series(scope, key), self.replayed_series(scope, key)
            self._memo[memo] = None if obs is None or rep is None else \
                parted(obs, rep, self.window_ticks, self.threshold)
        return self._memo[memo]

    @property
    def window_ticks(self) -> int:
        return max(1, round(self.config.window_s / self.tick_s))

    def index_at(self, t_us: int) -> int | None:
        if not len(self.t_us) or t_us > self.t_us[-1] or t_us <= self.t_us[0] - round(self.tick_s * 1e6):
            return None
        return int(min(np.searchsorted(self.t_us, t_us, side="left"), len(self.t_us) - 1))


def parted(observed: np.ndarray, replayed: np.ndarray, per: int, threshold: float) -> np.ndarray:
    """Per tick, whether the window of `per` ticks it is in (from the first tick, as
    traces.observed.divergence windows them) has a relative gap over `threshold`."""
    from traces.observed.divergence import window_means

    obs, rep, last = window_means(observed, replayed, per)
    peak = max(float(np.max(np.abs(obs), initial=0.0)), float(np.max(np.abs(rep), initial=0.0)))
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.abs(rep - obs) / np.maximum(np.maximum(np.abs(obs), np.abs(rep)), PEAK_FLOOR * peak)
    hot = np.zeros(-(-len(observed) // per), dtype=bool)
    hot[last[np.nan_to_num(rel, nan=0.0) > threshold] // per] = True
    return np.repeat(hot, per)[: len(observed)]


def section_of(run_dir: Path, data: dict):
    """The run's `observed:` section (its config.yaml's; defaults where absent), as `validate RUN
    --observed` reads it."""
    from traces.observed import ObservedConfig

    source = str(run_dir / "config.yaml")
    return ObservedConfig.from_mapping(data.get("observed"), "observed", source), source


def load_overlay(paths: Sequence[str], run, cfg: dict, threshold: float = DEFAULT_THRESHOLD) -> Overlay:
    """The export `paths` read against `run` (a tui.data.RunData; `cfg` its config.yaml), aligned
    on the run's grid; not yet scored. Every mistake in the files or the section: a UserError."""
    from replay.cli.observed import read_observed_files

    if not (math.isfinite(threshold) and 0 < threshold <= 1):
        raise UserError(f"--diverge-threshold {threshold:g}: expected a share of the larger value, "
                        "more than 0 and at most 1 (e.g. 0.25)")
    section, source = section_of(Path(run.path), cfg)
    pools = list(run.pools) or [str(p.get("name")) for p in cfg.get("pools") or [] if isinstance(p, dict)]
    config, raw = read_observed_files(list(paths), section, source, pools)
    tick_s = run.tick_us / 1e6
    overlay = Overlay(tuple(str(p) for p in paths), config, source, pools, tick_s, threshold, raw,
                      np.zeros(0, np.int64), {})
    if run.live is None:
        start, n = int(run.t_us[0]) if len(run.t_us) else run.tick_us, len(run.t_us)
    else:  # the ticks the replay will reach: to its last arrival, and its drain
        drain_s = float(cfg.get("max_drain_s", 3600.0) or 0.0)
        end_s = run.live.end_us / 1e6 + drain_s
        if not run.live.end_us:  # before the replay's first status: as far as the export goes
            last = raw.samples["t"].max()
            end_s = min(float(last) - config.offset_s, LIVE_SPAN_MAX_S) if last is not None else drain_s
        start, n = run.tick_us, max(1, math.ceil(end_s / tick_s))
    _align(overlay, start / 1e6, max(n, 1))
    return overlay


def _align(overlay: Overlay, start_s: float, n: int) -> None:
    """Map and align the export on the grid of `n` ticks from `start_s` (kept when it is on it)."""
    from traces.observed import Grid, align, select

    grid = Grid(start_s, overlay.tick_s, n)
    if overlay.aligned_as and overlay.aligned_as[1].grid == grid:
        return
    mapped = select(overlay.raw, overlay.config, overlay.pools, (grid.start_s, grid.start_s + grid.tick_s * (n - 1)))
    aligned = align(mapped, grid, overlay.config)
    overlay.t_us = np.round(grid.times() * 1e6).astype(np.int64)
    overlay.observed, overlay.aligned_as = aligned.values, (mapped, aligned)
    overlay._memo.clear()


def score(overlay: Overlay, ticks: pl.DataFrame, requests: pl.DataFrame | pl.LazyFrame) -> Overlay:
    """The overlay against the finished run (its ticks, its requests or a lazy frame of them): re-aligned on the
    run's grid, with the replayed side, the divergence section and the notes `validate` prints."""
    from replay.outputs.observed import divergence_section, observed_bounds, replayed_series, run_grid
    from traces.observed import Observation

    out = dataclasses.replace(overlay, _memo={})
    grid = run_grid(ticks, overlay.tick_s)
    _align(out, grid.start_s, grid.n)
    mapped, aligned = out.aligned_as
    observation = Observation(aligned, mapped)
    out.replayed = replayed_series(ticks, requests, out.pools, grid, out.config, observed_bounds(mapped))
    out.section = divergence_section(observation, out.replayed, out.config, out.raw.files or out.files)
    out.notes = observation.notes()
    out._memo.clear()
    return out


def score_run_dir(overlay: Overlay, run_dir: Path, requests: pl.DataFrame | pl.LazyFrame | None = None) -> Overlay:
    """`score` of a finished run directory (`requests`: its requests.parquet as held or scanned);
    its window not holding the export is kept as the overlay's error (the dashboard is up by
    then: a message, not an exit)."""
    from replay.outputs import schema

    try:
        ticks = pl.read_parquet(Path(run_dir) / schema.TICKS_FILE, columns=list(_TICK_COLUMNS))
        if requests is None:
            requests = pl.scan_parquet(Path(run_dir) / schema.REQUESTS_FILE, glob=False)
        return score(overlay, ticks, requests)
    except (UserError, OSError, pl.exceptions.PolarsError) as exc:
        return dataclasses.replace(overlay, error=str(exc), _memo={})


def score_data(overlay: Overlay, run) -> Overlay:
    """`score_run_dir` of the run the dashboard opened (a tui.data.RunData): its requests as the
    table reads them (the file as it was opened), a batch at a time, no column held."""
    return run.table.over(lambda requests: score_run_dir(overlay, run.path, requests))
