"""Transforms on canonical trace frames: time window, rate scaling, sampling, filters, merging.

Each returns a frame still in TRACE_SCHEMA with `request_id` renumbered 0..n-1. Times are int64
microseconds; config fields are in seconds (`*_s`) and token counts.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import polars as pl

from common.errors import TraceError
from traces.schema import OBSERVED_COLUMNS, SESSION_COLUMNS, TRACE_SCHEMA

RATE_SCALE_RANGE = (1e-6, 1e6)
MAX_SECONDS = 1e9  # 31 years: any time in seconds beyond it cannot be a trace time
MAX_TOKENS = 2**31 - 1  # token counts are int32 in the schema


@dataclasses.dataclass(frozen=True)
class WindowConfig:
    """Keep arrivals in [start_s, end_s) of trace time; the kept part starts at 0 (start_s -> 0)."""

    start_s: float = 0.0
    end_s: float | None = None

    def __post_init__(self):
        if not math.isfinite(self.start_s) or not 0 <= self.start_s <= MAX_SECONDS:
            raise ValueError(f"start_s={self.start_s!r} (expected a number of seconds in [0, {MAX_SECONDS:g}])")
        if self.end_s is not None and (not math.isfinite(self.end_s) or not self.start_s < self.end_s <= MAX_SECONDS):
            raise ValueError(f"end_s={self.end_s!r} (expected a number of seconds > start_s={self.start_s} "
                             f"and <= {MAX_SECONDS:g})")


@dataclasses.dataclass(frozen=True)
class SampleConfig:
    """Keep a random `fraction` of the requests or exactly `n` of them, chosen with `seed`."""

    fraction: float | None = None
    n: int | None = None
    seed: int = 0

    def __post_init__(self):
        if (self.fraction is None) == (self.n is None):
            raise ValueError("give exactly one of fraction and n")
        if self.fraction is not None and not (0 < self.fraction <= 1):
            raise ValueError(f"fraction={self.fraction!r} (expected a number in (0, 1])")
        if self.n is not None and self.n < 1:
            raise ValueError(f"n={self.n!r} (expected an integer >= 1)")
        if self.seed < 0:
            raise ValueError(f"seed={self.seed!r} (expected an integer >= 0)")


@dataclasses.dataclass(frozen=True)
class FilterConfig:
    """Keep requests whose token counts lie in the given inclusive bounds and whose workload and
    tenant are in the given lists (None = no constraint)."""

    min_prompt_tokens: int | None = None
    max_prompt_tokens: int | None = None
    min_output_tokens: int | None = None
    max_output_tokens: int | None = None
    workloads: tuple[str, ...] | None = None
    tenants: tuple[str, ...] | None = None

    def __post_init__(self):
        for kind in ("prompt", "output"):
            low = getattr(self, f"min_{kind}_tokens")
            high = getattr(self, f"max_{kind}_tokens")
            for name, value in ((f"min_{kind}_tokens", low), (f"max_{kind}_tokens", high)):
                if value is not None and not 0 <= value <= MAX_TOKENS:
                    raise ValueError(f"{name}={value!r} (expected a token count in [0, {MAX_TOKENS:,}])")
            if low is not None and high is not None and low > high:
                raise ValueError(f"min_{kind}_tokens={low} > max_{kind}_tokens={high} (expected min <= max)")
        for name in ("workloads", "tenants"):
            value = getattr(self, name)
            if value is not None and len(value) == 0:
                raise ValueError(f"{name} is an empty list (expected at least one label, or leave it out)")


def _renumber(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("request_id"))


def window(frame: pl.DataFrame, start_s: float = 0.0, end_s: float | None = None) -> pl.DataFrame:
    """Arrivals in [start_s, end_s), re-zeroed so that `start_s` becomes time 0."""
    cfg = WindowConfig(start_s, end_s)
    start_us = round(cfg.start_s * 1e6)
    keep = pl.col("arrival_us") >= start_us
    if cfg.end_s is not None:
        keep = keep & (pl.col("arrival_us") < round(cfg.end_s * 1e6))
    out = frame.filter(keep).with_columns(pl.col("arrival_us") - start_us)
    return _renumber(out)


def check_rate_scale(rate_scale: float) -> None:
    """A rate scale outside RATE_SCALE_RANGE stretches a trace past any span a replay can tick
    through (1e-300 makes every gap infinite) or folds a day into microseconds."""
    low, high = RATE_SCALE_RANGE
    if isinstance(rate_scale, bool) or not isinstance(rate_scale, (int, float)) \
            or not (math.isfinite(rate_scale) and low <= rate_scale <= high):
        raise ValueError(f"rate_scale={rate_scale!r} (expected a number in [{low:g}, {high:g}])")


def scale_rate(frame: pl.DataFrame, rate_scale: float) -> pl.DataFrame:
    """Divide every arrival time by `rate_scale`: 2.0 doubles the request rate, 0.5 halves it."""
    check_rate_scale(rate_scale)
    last_us = frame["arrival_us"].max() or 0
    if last_us / rate_scale >= 2**62:
        raise TraceError(f"rate_scale={rate_scale:g} would put the last arrival at {last_us / rate_scale / 1e6:.3g} s "
                         "(beyond what int64 microseconds hold); expected a larger rate_scale")
    scaled = (pl.col("arrival_us").cast(pl.Float64) / rate_scale).round(0).cast(pl.Int64)
    return frame.with_columns(scaled.alias("arrival_us"))


def sample(frame: pl.DataFrame, fraction: float | None = None, n: int | None = None,
           seed: int = 0) -> pl.DataFrame:
    """A deterministic random subset (same seed, same rows), kept in arrival order.
    `fraction` keeps round(fraction * rows) rows (at least 1). A trace with sessions is sampled
    by whole sessions (a request without one is a session of its own), since a session missing
    turns would release its later turns after the wrong finish: `fraction` then keeps that share
    of its sessions, and `n` keeps sessions in the seeded order until they hold `n` requests or
    more (the last one whole)."""
    cfg = SampleConfig(fraction, n, seed)
    rows = frame.height
    if cfg.n is not None and cfg.n > rows:
        raise TraceError(f"sample.n={cfg.n} is more than the {rows} requests available")
    rng = np.random.default_rng(cfg.seed)
    if "session_id" in frame.columns and frame["session_id"].null_count() < rows:
        return _renumber(frame[_whole_sessions(frame["session_id"], cfg, rng)])
    count = cfg.n if cfg.n is not None else max(1, round(cfg.fraction * rows))
    chosen = np.sort(rng.permutation(rows)[:count])
    return _renumber(frame[chosen])


def _whole_sessions(session_id: pl.Series, cfg: SampleConfig, rng: np.random.Generator) -> np.ndarray:
    """Row indices (sorted) of the sessions `sample` keeps."""
    rows = session_id.len()
    # One unit per session id and per row without a session (numbered in sorted order).
    keys = pl.DataFrame({"s": session_id, "row": np.arange(rows)}).select(
        pl.when(pl.col("s").is_null()).then(pl.lit("\0") + pl.col("row").cast(pl.String)).otherwise(pl.col("s"))
        .rank("dense").cast(pl.Int64) - 1)
    unit = keys.to_series().to_numpy()
    units = int(unit.max()) + 1
    order = rng.permutation(units)
    if cfg.fraction is not None:
        keep = order[:max(1, round(cfg.fraction * units))]
    else:
        sizes = np.bincount(unit, minlength=units)[order]
        keep = order[:int(np.searchsorted(np.cumsum(sizes), cfg.n)) + 1]
    chosen = np.zeros(units, dtype=bool)
    chosen[keep] = True
    return np.flatnonzero(chosen[unit])


def filter_rows(frame: pl.DataFrame, cfg: FilterConfig) -> pl.DataFrame:
    """Rows meeting every bound and label list of `cfg`."""
    keep = pl.lit(True)
    for kind in ("prompt", "output"):
        col = pl.col(f"{kind}_tokens")
        low, high = getattr(cfg, f"min_{kind}_tokens"), getattr(cfg, f"max_{kind}_tokens")
        if low is not None:
            keep = keep & (col >= low)
        if high is not None:
            keep = keep & (col <= high)
    if cfg.workloads is not None:
        keep = keep & pl.col("workload").is_in(list(cfg.workloads))
    if cfg.tenants is not None:
        keep = keep & pl.col("tenant").is_in(list(cfg.tenants))
    return _renumber(frame.filter(keep))


def merge(frames: list[pl.DataFrame], offsets_us: list[int] | None = None) -> pl.DataFrame:
    """One stream from several traces (each shifted by its offset), sorted by arrival; ties keep
    the order of `frames`. Label the sources first (their `workload` column) to tell them apart."""
    offsets_us = offsets_us or [0] * len(frames)
    # a request log's observed columns survive only when every source has them
    kept = list(TRACE_SCHEMA) + [c for c in OBSERVED_COLUMNS if all(c in f.columns for f in frames)]
    # a session's think time survives when any source has it (null for the others' rows)
    kept += [c for c in SESSION_COLUMNS if any(c in f.columns for f in frames)]
    shifted = [
        f.with_columns(*[pl.lit(None, dtype=SESSION_COLUMNS[c]).alias(c) for c in kept
                         if c in SESSION_COLUMNS and c not in f.columns])
        .select(kept).with_columns(pl.col("arrival_us") + off)
        for f, off in zip(frames, offsets_us, strict=True)
    ]
    merged = pl.concat(shifted, how="vertical").sort("arrival_us", maintain_order=True)
    return _renumber(merged)


def label(frame: pl.DataFrame, workload: str) -> pl.DataFrame:
    """Every row's workload set to `workload`."""
    return frame.with_columns(pl.lit(workload, dtype=pl.String).alias("workload"))
