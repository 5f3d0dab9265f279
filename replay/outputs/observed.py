"""A run beside what was observed: the replayed series of every signal traces/observed knows,
built from the run's ticks and requests, scored against an observed export on the run's grid.

The replayed side goes through the very queries the observed side does (traces.observed.align):
the run is written out as the series a vLLM fleet's Prometheus would have scraped once per
tick, one target per pool, and aligned with the same lookback, rate window and quantile
windows. So a definition cannot drift between the two sides:

- gauges (`waiting`, `running`, `kv_usage`, `gpu_busy`, `replicas`): the tick's value
  (`replicas` = replicas_active + replicas_loading: kube_deployment_status_replicas is the
  Deployment's status.replicas, its non-terminated pods, ready or not, so a draining replica,
  terminating, is not counted; the export writes the same, replay/outputs/openmetrics.py);
- counters (`prompt_tokens_per_s`, `output_tokens_per_s`, `preemptions_per_s`,
  `finished_per_s`): the per-tick counts summed into a counter sampled at each tick, then
  `rate(x[rate_window_s])`;
- latency quantiles (`ttft_s_p50` ... `e2e_s_p99`): each request observed into a histogram
  with the observed export's bucket bounds (vLLM's own when the export has none,
  vllm/v1/metrics/loggers.py PrometheusStatLogger.__init__), then
  `histogram_quantile(q, rate(x_bucket[rate_window_s]))` once per window of rate_window_s.
  TTFT is observed at the first token (first_token_us - arrival_us) and E2E at the finish
  (finished_us - arrival_us), as vLLM observes them; requests.parquet keeps a request's mean
  inter-token time (tpot_us), not each interval, so its output_tokens - 1 intervals are
  observed at that mean, at its finish.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import polars as pl

from traces.observed import (Divergence, Grid, Mapped, Observation, ObservedConfig, Scrapes, align, score_all,
                              unmatched)

# vLLM's bucket bounds in seconds (vllm/v1/metrics/loggers.py, PrometheusStatLogger.__init__:
# the TTFT, inter-token latency and request latency histograms), +Inf added as Prometheus does.
VLLM_BOUNDS = {
    "ttft_s": (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, math.inf),
    "itl_s": (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
              40.0, 80.0, math.inf),
    "e2e_s": (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
              480.0, 960.0, 1920.0, 7680.0, math.inf),
}
GAUGES = ("waiting", "running", "kv_usage", "gpu_busy", "replicas")
# signal -> (ticks column, multiplier to a count per tick: a rate column times tick_s)
COUNTERS = {"prompt_tokens_per_s": ("prompt_tokens_per_s", True), "output_tokens_per_s": ("output_tokens_per_s", True),
            "preemptions_per_s": ("preemptions", False), "finished_per_s": ("finished", False)}
_SOURCE = "replayed"


def run_grid(ticks: pl.DataFrame, tick_s: float) -> Grid:
    """The run's tick grid: one tick per distinct t_us (every pool has a row at each)."""
    t_us = np.unique(ticks["t_us"].to_numpy())
    if len(t_us) == 0:
        return Grid(tick_s, tick_s, 1)
    return Grid(float(t_us[0]) / 1e6, tick_s, len(t_us))


# what the latency histograms read of the requests (a lazy frame of them is read a batch at a time)
REQUEST_COLUMNS = ("pool", "status", "arrival_us", "first_token_us", "finished_us", "tpot_us", "output_tokens")
BATCH_ROWS = 1 << 18
HISTOGRAMS = ("ttft_s", "itl_s", "e2e_s")


def _observations(requests: pl.DataFrame, pool: str) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """signal -> (when observed, us; value, s; weight) of one pool's requests."""
    r = requests.filter(pl.col("pool") == pool)
    first = r.filter(pl.col("first_token_us").is_not_null())
    done = r.filter(pl.col("status") == "finished")
    decode = done.filter(pl.col("tpot_us").is_not_null() & (pl.col("output_tokens") > 1))
    as_np = (lambda f, c: f[c].cast(pl.Float64).to_numpy())
    return {
        "ttft_s": (as_np(first, "first_token_us"), (as_np(first, "first_token_us") - as_np(first, "arrival_us")) / 1e6,
                   np.ones(first.height)),
        "itl_s": (as_np(decode, "finished_us"), as_np(decode, "tpot_us") / 1e6, as_np(decode, "output_tokens") - 1),
        "e2e_s": (as_np(done, "finished_us"), (as_np(done, "finished_us") - as_np(done, "arrival_us")) / 1e6,
                  np.ones(done.height)),
    }


def _bucket_counts(requests: pl.DataFrame | pl.LazyFrame, ticks_us: dict[str, np.ndarray],
                   les: dict[str, np.ndarray]) -> dict[tuple[str, str], np.ndarray]:
    """(pool, signal) -> cumulative bucket counters at each of the pool's ticks, (ticks, bounds):
    an observation counts from the first tick at or after it, in every bucket whose upper bound
    `le` it does not exceed. A lazy frame (a run's requests.parquet) is read a batch at a time,
    holding only the counts: the weights are whole numbers (a request, its decode intervals), so
    their sums are exact in any order and the counters those of the frame read whole."""
    counts = {(pool, signal): np.zeros((len(t), len(les[signal]))) for pool, t in ticks_us.items() for signal in les}
    batches = ([requests] if isinstance(requests, pl.DataFrame) else
               requests.select(REQUEST_COLUMNS).collect_batches(chunk_size=BATCH_ROWS, engine="streaming"))
    for batch in batches:
        for pool, t in ticks_us.items():
            for signal, (when, value, weight) in _observations(batch, pool).items():
                at = np.searchsorted(t, when, side="left")
                slot = np.searchsorted(les[signal], value, side="left")
                keep = at < len(t)
                got, slot = counts[(pool, signal)], slot[keep]
                if len(slot) and slot.max() >= got.shape[1]:  # (over the last bound: as np.add.at of 2-D indices)
                    raise IndexError(f"{signal}: a value past its histogram's last bound")
                np.add.at(got.reshape(-1), at[keep] * got.shape[1] + slot, weight[keep])  # (1-D: numpy's fast path)
    return {key: np.cumsum(np.cumsum(c, axis=0), axis=1) for key, c in counts.items()}


def replayed_mapped(ticks: pl.DataFrame, requests: pl.DataFrame | pl.LazyFrame, pools: Sequence[str], tick_s: float,
                    bounds: dict[str, Sequence[float]] | None = None) -> Mapped:
    """The run as the series a Prometheus would hold: one target per pool, a sample per tick.
    `requests`: the run's, or a lazy frame of them (read a batch at a time: _bucket_counts)."""
    bounds = {**VLLM_BOUNDS, **(bounds or {})}
    rows, ids, ts, vs = [], [], [], []

    def add(metric: str, signal: str, kind: str, combine: str, pool: str, t: np.ndarray, v: np.ndarray,
            le: float | None = None) -> None:
        sid = len(rows)
        rows.append((sid, metric, signal, kind, combine, 1.0, pool, "", le, _SOURCE))
        ids.append(np.full(len(t), sid, np.uint32))
        ts.append(t)
        vs.append(np.asarray(v, dtype=np.float64))

    frames = {pool: ticks.filter(pl.col("pool") == pool).sort("t_us") for pool in pools}
    les = {signal: np.array(sorted(set(bounds[signal])), dtype=np.float64) for signal in HISTOGRAMS}
    counters = _bucket_counts(requests, {pool: f["t_us"].to_numpy() for pool, f in frames.items()}, les)
    for pool, frame in frames.items():
        t = frame["t_us"].to_numpy() / 1e6
        col = (lambda name: frame[name].cast(pl.Float64).fill_null(0.0).to_numpy()
               if name in frame.columns else np.zeros(frame.height))
        for signal in GAUGES:
            value = (col("replicas_active") + col("replicas_loading") if signal == "replicas" else col(signal))
            add(signal, signal, "gauge", "sum", pool, t, value)
        for signal, (name, per_s) in COUNTERS.items():
            add(signal, signal, "counter", "sum", pool, t, np.cumsum(col(name) * (tick_s if per_s else 1.0)))
        for signal in HISTOGRAMS:
            for j, le in enumerate(les[signal]):
                add(signal, signal, "histogram", "sum", pool, t, counters[(pool, signal)][:, j], float(le))
    series = pl.DataFrame(rows, orient="row", schema={
        "series": pl.UInt32, "metric": pl.String, "signal": pl.String, "kind": pl.String, "combine": pl.String,
        "scale": pl.Float64, "pool": pl.String, "replica": pl.String, "le": pl.Float64, "file": pl.String})
    cat = (lambda parts, dt: np.concatenate(parts) if parts else np.empty(0, dt))
    samples = pl.DataFrame({"series": pl.Series(cat(ids, np.uint32)), "t": pl.Series(cat(ts, np.float64)),
                            "value": pl.Series(cat(vs, np.float64))})
    return Mapped(series, Scrapes.from_frame(samples, len(rows)), {}, 0, (), ())


def observed_bounds(mapped: Mapped) -> dict[str, tuple[float, ...]]:
    """The bucket bounds the observed export used, per histogram signal."""
    hist = mapped.series.filter(pl.col("kind") == "histogram")
    return {signal: tuple(sorted(set(group["le"].to_list())))
            for (signal,), group in hist.group_by("signal") if group.height}


def replayed_series(ticks: pl.DataFrame, requests: pl.DataFrame | pl.LazyFrame, pools: Sequence[str], grid: Grid,
                    config: ObservedConfig, bounds: dict[str, Sequence[float]] | None = None
                    ) -> dict[tuple, np.ndarray]:
    """(signal, pool) -> the replayed value at each tick of `grid`, every signal of the library."""
    return align(replayed_mapped(ticks, requests, pools, grid.tick_s, bounds), grid, config).values


def _plain(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def divergence_section(observation: Observation, replayed: dict[tuple, np.ndarray], config: ObservedConfig,
                       files: Sequence[str]) -> dict:
    """summary.json's `observed`: per signal and pool the Divergence fields, then what was left
    out (metrics not known or not compared, samples outside the window, signals on one side only)."""
    observed = observation.aligned.values
    scores: dict[tuple, Divergence] = score_all(observed, replayed, observation.aligned.grid, config.window_s)
    signals: dict[str, dict[str, dict]] = {}
    for (signal, pool), d in scores.items():
        signals.setdefault(signal, {})[pool] = {k: _plain(v) for k, v in d.to_dict().items()}
    only_observed, only_replayed = unmatched(observed, replayed)
    return {
        "files": [str(f) for f in files],
        "offset_s": config.offset_s,
        "window_s": config.window_s,
        "rate_window_s": config.rate_window_s,
        "signals": signals,
        "unknown_metrics": list(observation.mapped.unknown),
        "unused_metrics": list(observation.mapped.unused),
        "dropped_samples": observation.mapped.dropped,
        "observed_only": ["/".join(k) for k in only_observed],
        "not_observed": ["/".join(k) for k in only_replayed],
    }


def observed_config(cfg_observed: ObservedConfig | None, source: str, pools: Sequence[str]) -> ObservedConfig:
    """The config's `observed:` section (its defaults when absent), its `pools` naming pools of
    the fleet, with the wall-clock start of the trace that the samples' timestamps need. Traces
    do not keep one: the loader starts every trace's clock at its first arrival
    (traces/schema.py finish), and merges and windows move it, so `offset_s` is required."""
    from common.errors import ConfigError

    config = cfg_observed or ObservedConfig()
    for key, pool in config.pools.items():
        if pool not in pools:
            raise ConfigError(f"{source}: observed.pools.{key}: {pool!r} is not a pool of the fleet "
                              f"(pools: {', '.join(pools)})")
    if config.offset_s is None:
        raise ConfigError(f"{source}: observed.offset_s: not set; expected the Unix time (seconds) of the trace's "
                          "time 0, its first arrival (a trace's clock starts at 0, so observed samples, in wall "
                          "time, need it to be placed)")
    return config


def score_run(observed, config: ObservedConfig, ticks: pl.DataFrame, requests: pl.DataFrame,
              pools: Sequence[str], tick_s: float) -> tuple[dict, list[str]]:
    """(summary.json's `observed` section, the lines to print about what was left out) of a run
    against `observed` (traces.observed.read_observed of the files)."""
    from traces.observed import select

    grid = run_grid(ticks, tick_s)
    window = (grid.start_s, grid.start_s + grid.tick_s * (grid.n - 1))
    mapped = select(observed, config, pools, window)
    observation = Observation(align(mapped, grid, config), mapped)
    replayed = replayed_series(ticks, requests, pools, grid, config, observed_bounds(mapped))
    section = divergence_section(observation, replayed, config, observed.files)
    notes = observation.notes()
    if section["not_observed"]:
        signals = sorted({key.split("/")[0] for key in section["not_observed"]})
        notes.append(f"observed: replayed, not in the export: {', '.join(signals)}")
    return section, notes
