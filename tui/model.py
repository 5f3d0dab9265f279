"""What the dashboard shows and where its cursor is: one or two runs on one time axis, the scope
(fleet or a pool), playback. Navigation (seek, jumps) lives here, free of Textual, so panels stay
pure functions of a Model and tests need no terminal. Times are int64 microseconds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tui.charts import column_edges, column_of, downsample
from tui.data import FLEET, RunData
from tui.observed import SCORED_ONLY
from tui.observed_view import replayed_at, replayed_columns
from tui.views import WORKLOAD_PREFIX, workload_of, workload_values, workloads

SPEEDS = (1, 2, 5, 10, 30, 60, 120, 300, 600)  # simulated seconds per wall second
DEFAULT_SPEED = 3
# "SLO breach": windowed SLO attainment (README "Run outputs") under this share.
SLO_OBJECTIVE = 0.99
MINUTE_US = 60_000_000
# "First SLO breach" and the timeline's "!" look past the start-up transient: by default the first
# metrics window (whose attainment is over the few requests that ended yet), else `tui --warmup S`.
DEFAULT_WARMUP = None


@dataclass
class View:
    cursor_us: int = 0
    scope: str = FLEET
    playing: bool = False
    speed_index: int = DEFAULT_SPEED
    following: bool = False  # live: the cursor stays on the newest tick
    metric_offset: int = 0  # first metric row shown when they do not all fit
    decisions_only: bool = False  # event log: scaling and replica lifecycle only
    message: str = ""  # the outcome of the last jump ("no scaling event after 3:10")


class Model:
    """runs[0] is the run; runs[1], when present, the one it is compared with."""

    def __init__(self, runs: list[RunData], at_us: int | None = None, warmup_us: int | None = DEFAULT_WARMUP,
                 observed=None):
        self.view = View()
        # tui.observed.Overlay of an export, scored against runs[0] (tui/observed_view.py draws it)
        self.observed = observed
        self._warmup_us = warmup_us
        self.runs: list[RunData] = []
        self._cache: dict = {}
        self.set_runs(runs)
        if at_us is not None:
            self.seek_to(at_us)
        else:
            self.view.cursor_us = self.axis[-1] if self.live and len(self.axis) else self.t_first
            self.view.following = self.live

    # -- data -------------------------------------------------------------------------------
    def set_runs(self, runs: list[RunData]) -> None:
        """New data (a live run's next flush): keep the cursor, or follow the newest tick."""
        old = getattr(self, "runs", [])
        self.runs = runs
        # A run that only grew (a live run's next chunks) keeps its chart columns: those up to its
        # old end are final (tick rows never change), so only the rest is recomputed. Any other
        # change drops them.
        grew = {k for k, r in enumerate(runs) if k < len(old) and r.path == old[k].path
                and len(r.t_us) >= len(old[k].t_us) and r.pools == old[k].pools}
        self._cache = {key: v for key, v in self._cache.items() if key[0] in grew}
        ticks = [r.t_us for r in runs if len(r.t_us)]
        if len(ticks) == 1:
            self.axis = ticks[0]  # sorted and unique already
        else:
            self.axis = np.unique(np.concatenate(ticks)) if ticks else np.zeros(0, np.int64)
        if self.view.scope not in self.scopes and workload_of(self.view.scope) not in self.workloads:
            self.view.scope = FLEET
        if self.view.following and len(self.axis):
            self.view.cursor_us = int(self.axis[-1])

    @property
    def compare(self) -> bool:
        return len(self.runs) > 1

    @property
    def live(self) -> bool:
        return any(r.live is not None and r.live.state != "failed" for r in self.runs)

    @property
    def scopes(self) -> list[str]:
        out: list[str] = []
        for r in self.runs:
            out += [s for s in r.scopes if s not in out]
        return out

    @property
    def workloads(self) -> list[str]:
        """The workload labels of any run's requests (the per-workload view's scopes)."""
        return sorted({w for r in self.runs for w in workloads(r)})

    @property
    def warmup_us(self) -> int:
        return self._warmup_us if self._warmup_us is not None else self.runs[0].window_us

    @property
    def event_scope(self) -> str:
        """Whose events a view shows: a workload's requests may go to any pool, so the fleet's."""
        return FLEET if workload_of(self.view.scope) is not None else self.view.scope

    def has_scope(self, run: RunData) -> bool:
        """Whether a run has the current scope: a pool it has, or a workload among its requests."""
        wl = workload_of(self.view.scope)
        return wl in workloads(run) if wl is not None else self.view.scope in run.series

    def slo_series(self, run: RunData) -> np.ndarray | None:
        """Windowed SLO attainment of the scope at each of the run's ticks (None without the scope)."""
        if not self.has_scope(run):
            return None
        wl = workload_of(self.view.scope)
        if wl is None:
            return run.series[self.view.scope]["slo_attainment"]
        key = ("slo-ticks", wl, len(run.t_us), run.table.height)
        if key not in run._memo:
            run._memo[key] = workload_values(run, wl, "slo_attainment", run.t_us, run.t_us, ("slo_attainment",))
        return run._memo[key]

    def first_breach(self) -> int | None:
        """The first tick of the first run, past the warm-up, whose windowed attainment is under the objective."""
        run = self.runs[0]
        slo = self.slo_series(run)
        if slo is None or not len(run.t_us):
            return None
        hit = np.flatnonzero((slo < SLO_OBJECTIVE) & (run.t_us >= self.warmup_us))
        return int(hit[0]) if len(hit) else None

    @property
    def t_first(self) -> int:
        return int(self.axis[0]) if len(self.axis) else 0

    @property
    def t_end(self) -> int:
        """The chart's right edge: the last tick, or for a live run the last arrival it will reach."""
        ends = [r.end_us for r in self.runs]
        ends += [r.live.end_us for r in self.runs if r.live is not None and r.live.state != "failed"]
        return max([*ends, 1])

    def column_values(self, run: RunData, key: str, width: int, how: str) -> np.ndarray:
        """A metric of the current scope, one value per chart column (cached per run, scope,
        width and axis; after a live run grows, only the columns from its old end on are redone)."""
        scope = self.view.scope
        if key in SCORED_ONLY:  # a row only an export brings: the replayed side of its scoring
            return replayed_columns(self, key, width, how) if run is self.runs[0] else np.full(width, np.nan)
        k = next(i for i, r in enumerate(self.runs) if r is run)
        cache_key = (k, scope, key, width, how, self.t_end)
        edges = column_edges(0, self.t_end, width)
        held = self._cache.get(cache_key)
        if held is not None and held[1] == run.end_us:
            return held[0]
        if held is None:
            values = self._columns(run, scope, key, edges, how)
        else:
            c0 = max(column_of(held[1], 0, self.t_end, width) - 1, 0)  # the old last tick's column grows too
            values = held[0].copy()
            values[c0:] = self._columns(run, scope, key, edges[c0:], how)
        self._cache[cache_key] = (values, run.end_us)
        return values

    @staticmethod
    def _columns(run: RunData, scope: str, key: str, edges: np.ndarray, how: str) -> np.ndarray:
        """Chart columns between consecutive `edges`."""
        wl = workload_of(scope)
        if wl is not None:
            if wl not in workloads(run):
                return np.full(len(edges) - 1, np.nan)
            lo = np.minimum(edges[:-1] + 1, run.end_us)
            values = workload_values(run, wl, key, lo, edges[1:])
            values[edges[:-1] >= run.end_us] = np.nan
            return values
        series = run.series.get(scope)
        if series is None:
            return np.full(len(edges) - 1, np.nan)
        if series.get(key) is None:  # fleet TTFT of several pools: from the requests
            q = 0 if key == "ttft_p50_ms" else 1
            lo = np.minimum(edges[:-1] + 1, run.end_us)
            values = run.fleet_ttft(lo, edges[1:])[:, q]
            values[edges[:-1] >= run.end_us] = np.nan
            return values
        return downsample(run.t_us, series[key], edges, how)

    def value_at(self, run: RunData, key: str) -> float | None:
        """The metric of the current scope at the cursor (None where the run has no such tick)."""
        if key in SCORED_ONLY:
            return replayed_at(self, key) if run is self.runs[0] else None
        i = run.index_at(self.view.cursor_us)
        wl = workload_of(self.view.scope)
        if wl is not None:
            if i is None or self.view.cursor_us > run.end_us or wl not in workloads(run):
                return None
            t = run.t_us[i:i + 1]
            value = workload_values(run, wl, key, t, t)[0]
            return None if np.isnan(value) else float(value)
        series = run.series.get(self.view.scope)
        if series is None or i is None or self.view.cursor_us > run.end_us:
            return None
        if series.get(key) is None:
            t = int(run.t_us[i])
            value = run.fleet_ttft(np.array([t]), np.array([t]))[0, 0 if key == "ttft_p50_ms" else 1]
        else:
            value = series[key][i]
        return None if np.isnan(value) else float(value)

    # -- navigation -------------------------------------------------------------------------
    def seek_to(self, t_us: int) -> None:
        """Put the cursor on the tick whose interval holds t (clamped to the run)."""
        v = self.view
        if not len(self.axis):
            v.cursor_us = 0
            return
        i = min(int(np.searchsorted(self.axis, t_us, side="left")), len(self.axis) - 1)
        v.cursor_us = int(self.axis[i])
        v.following = self.live and i == len(self.axis) - 1

    def seek_ticks(self, n: int) -> None:
        if not len(self.axis):
            return
        i = int(np.searchsorted(self.axis, self.view.cursor_us, side="left")) + n
        self.seek_to(int(self.axis[min(max(i, 0), len(self.axis) - 1)]))

    def seek_by(self, delta_us: int) -> None:
        self.seek_to(self.view.cursor_us + delta_us)

    def home(self) -> None:
        self.seek_to(self.t_first)

    def end(self) -> None:
        self.seek_to(int(self.axis[-1]) if len(self.axis) else 0)

    def advance(self, wall_s: float) -> None:
        """Playback: move the cursor by `speed` simulated seconds per wall second; stop at the end
        (a live run keeps following its newest tick instead)."""
        v = self.view
        if not v.playing or not len(self.axis):
            return
        target = v.cursor_us + round(SPEEDS[v.speed_index] * wall_s * 1e6)
        if target >= self.axis[-1]:
            self.end()
            v.playing = self.live
        else:
            self.seek_to(target)

    def _say(self, text: str) -> None:
        self.view.message = text

    def jump_first_breach(self) -> bool:
        """First tick (of the first run, in the scope) past the warm-up whose windowed SLO attainment
        is under the objective."""
        run = self.runs[0]
        slo = self.slo_series(run)
        if slo is None or not len(run.t_us):
            return False
        i = self.first_breach()
        warm = f" after the {self.warmup_us / 1e6:g} s warm-up" if self.warmup_us else ""
        if i is None:
            self._say(f"no SLO breach{warm}: windowed attainment never under {SLO_OBJECTIVE:.0%}")
            return False
        self.seek_to(int(run.t_us[i]))
        self._say(f"first SLO breach{warm}: attainment {slo[i]:.1%} < {SLO_OBJECTIVE:.0%}")
        return True

    def jump_worst_window(self) -> bool:
        """The tick with the lowest windowed SLO attainment (the first of equals); TTFT p99 breaks ties."""
        run = self.runs[0]
        raw = self.slo_series(run)
        if raw is None or not len(run.t_us) or np.isnan(raw).all():
            self._say("no window with finished requests")
            return False
        slo = np.nan_to_num(raw, nan=np.inf)
        p99 = (run.series.get(self.view.scope) or {}).get("ttft_p99_ms")
        candidates = np.flatnonzero(slo == slo.min())
        if p99 is not None and len(candidates) > 1:
            candidates = candidates[np.argsort(-np.nan_to_num(p99[candidates], nan=-1.0), kind="stable")]
        i = int(candidates[0])
        self.seek_to(int(run.t_us[i]))
        self._say(f"worst window: SLO attainment {slo[i]:.1%}")
        return True

    def _scaling_times(self) -> np.ndarray:
        times = [r.scaling_times_in(self.event_scope) for r in self.runs]
        return np.unique(np.concatenate(times)) if times else np.zeros(0, np.int64)

    def jump_scaling(self, direction: int) -> bool:
        """The next (or previous) scale_up / scale_down decision of any run, in the scope."""
        times = self._scaling_times()
        cur = self.view.cursor_us
        later = times[times > cur] if direction > 0 else times[times < cur]
        if not len(later):
            self._say("no scaling event " + ("after" if direction > 0 else "before") + " the cursor")
            return False
        self.seek_to(int(later[0] if direction > 0 else later[-1]))
        self._say("scaling event")
        return True

    def cycle_scope(self, step: int) -> None:
        scopes = self.scopes
        i = scopes.index(self.view.scope) if self.view.scope in scopes else 0
        self.view.scope = scopes[(i + step) % len(scopes)]
        self.view.metric_offset = 0

    def cycle_workload(self, step: int) -> None:
        """The per-workload view: the fleet, then each workload label of either run."""
        scopes = [FLEET, *(WORKLOAD_PREFIX + w for w in self.workloads)]
        i = scopes.index(self.view.scope) if self.view.scope in scopes else 0
        self.view.scope = scopes[(i + step) % len(scopes)]
        self.view.metric_offset = 0

    def change_speed(self, step: int) -> None:
        self.view.speed_index = min(max(self.view.speed_index + step, 0), len(SPEEDS) - 1)
